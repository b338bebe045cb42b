// System packages the demo and the suites need, installed with apt where missing (as root):
// Dovecot, a real IMAP server for the mail sandbox; Chromium, the browser the console's tests drive.
import { spawnSync } from "node:child_process";

const SYSTEM_PACKAGES = [
  { command: "dovecot", apt: "dovecot-imapd" },
  { command: "chromium", apt: "chromium" },
];

/** Installs the missing ones of `commands` (default: all of them). */
export function ensureSystemPackages(commands = SYSTEM_PACKAGES.map((p) => p.command)) {
  const missing = SYSTEM_PACKAGES.filter(
    (p) => commands.includes(p.command) && spawnSync("sh", ["-c", `command -v ${p.command}`]).status !== 0,
  );
  if (!missing.length) return;
  const names = missing.map((p) => p.apt).join(" ");
  if (process.getuid?.() !== 0) {
    console.error(`missing system packages: ${names}; install them (apt-get install ${names}) or run as root`);
    process.exit(1);
  }
  console.log(`installing ${names} with apt-get`);
  const env = { ...process.env, DEBIAN_FRONTEND: "noninteractive" };
  for (const args of [
    ["update", "-q"],
    ["install", "-y", "-q", ...missing.map((p) => p.apt)],
  ]) {
    const r = spawnSync("apt-get", args, { stdio: "inherit", env });
    if (r.status !== 0) process.exit(r.status ?? 1);
  }
}

// `node scripts/system-deps.mjs [command…]`: the demo needs only dovecot.
if (import.meta.url === `file://${process.argv[1]}`) {
  ensureSystemPackages(process.argv.length > 2 ? process.argv.slice(2) : undefined);
}
