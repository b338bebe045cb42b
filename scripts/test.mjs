#!/usr/bin/env node
// The test command of the README and of CI: runs every test with vitest and ends with the line
// "N passed, N failed[, N skipped]" computed from vitest's JSON report (vitest's own summary is
// not a format CI reads). Exits non-zero when anything failed or no test ran.
import { spawnSync } from "node:child_process";
import { existsSync, mkdirSync, readFileSync, rmSync } from "node:fs";

// System packages the suites need: Dovecot (a real IMAP server for the email suites).
const SYSTEM_PACKAGES = [{ command: "dovecot", apt: "dovecot-imapd" }];
const missing = SYSTEM_PACKAGES.filter((p) => spawnSync("sh", ["-c", `command -v ${p.command}`]).status !== 0);
if (missing.length) {
  const names = missing.map((p) => p.apt).join(" ");
  if (process.getuid?.() !== 0) {
    console.error(`missing system packages: ${names}; install them (apt-get install ${names}) or run as root`);
    process.exit(1);
  }
  console.log(`installing ${names} with apt-get`);
  const env = { ...process.env, DEBIAN_FRONTEND: "noninteractive" };
  for (const args of [["update", "-q"], ["install", "-y", "-q", ...missing.map((p) => p.apt)]]) {
    const r = spawnSync("apt-get", args, { stdio: "inherit", env });
    if (r.status !== 0) process.exit(r.status ?? 1);
  }
}

const report = "test-results/vitest.json";
rmSync(report, { force: true });
mkdirSync("test-results", { recursive: true });

const run = spawnSync(
  process.execPath,
  ["node_modules/vitest/vitest.mjs", "run", "--reporter=default", "--reporter=json", `--outputFile.json=${report}`, ...process.argv.slice(2)],
  { stdio: "inherit" },
);

if (!existsSync(report)) {
  console.error(`vitest wrote no report (exit ${run.status ?? run.signal})`);
  process.exit(run.status || 1);
}
const r = JSON.parse(readFileSync(report, "utf8"));
// A file that failed to load or whose hooks failed has no failed test of its own: count it.
const brokenFiles = r.testResults.filter((f) => f.status === "failed" && !f.assertionResults.some((a) => a.status === "failed")).length;
const passed = r.numPassedTests;
const failed = r.numFailedTests + brokenFiles;
const skipped = r.numPendingTests + r.numTodoTests;
console.log(`${passed} passed, ${failed} failed` + (skipped ? `, ${skipped} skipped` : ""));
process.exit(run.status !== 0 || failed > 0 || passed === 0 ? run.status || 1 : 0);
