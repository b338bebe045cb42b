#!/usr/bin/env node
// The test command of the README and of CI: runs every test with vitest and ends with the line
// "N passed, N failed[, N skipped]" computed from vitest's JSON report (vitest's own summary is
// not a format CI reads). Exits non-zero when anything failed or no test ran.
//
// A watchdog stands over the run: when no test or hook has started or ended for a long time (a
// hang no test timeout caught), or the run outlives its deadline, it names what was running, kills
// vitest with every process of its group, and counts the stuck tests as failed, so a hang ends
// in a failure that says where instead of a CI timeout that says nothing.
import { spawn } from "node:child_process";
import { existsSync, mkdirSync, readdirSync, readFileSync, rmSync } from "node:fs";

import { ensureSystemPackages } from "./system-deps.mjs";

ensureSystemPackages();

const minutes = (name, fallback) => {
  const n = Number(process.env[name] || fallback);
  return (n > 0 ? n : fallback) * 60_000;
};
/** Longer than any test's own timeout: 420 s for the longest, times up to 4 on a loaded machine. */
const STALL_MS = minutes("IDEM_TEST_STALL_MINUTES", 30);
/** The whole run; CI allows 90 minutes for install, build and tests together. */
const DEADLINE_MS = minutes("IDEM_TEST_DEADLINE_MINUTES", 70);

const report = "test-results/vitest.json";
const progress = "test-results/progress.json";
rmSync(report, { force: true });
rmSync(progress, { force: true });
mkdirSync("test-results", { recursive: true });

// Its own process group, so that the watchdog can kill vitest, its workers and what they spawned.
const vitest = spawn(
  process.execPath,
  [
    "node_modules/vitest/vitest.mjs",
    "run",
    "--reporter=default",
    "--reporter=json",
    `--outputFile.json=${report}`,
    "--reporter=./scripts/progress-reporter.mjs",
    ...process.argv.slice(2),
  ],
  { stdio: "inherit", detached: true },
);
const group = vitest.pid;
const killGroup = (signal) => {
  try {
    process.kill(-group, signal);
  } catch {
    // the group is gone already
  }
};
// vitest has a group of its own, so a Ctrl-C or a closed terminal reaches only us: pass it on,
// and what has not ended a few seconds later is killed.
for (const [signal, code] of [
  ["SIGINT", 130],
  ["SIGTERM", 143],
  ["SIGHUP", 129],
]) {
  process.on(signal, () => {
    killGroup(signal);
    const end = () => {
      killGroup("SIGKILL");
      process.exit(code);
    };
    setTimeout(end, 5_000);
    vitest.once("exit", end);
  });
}

const started = Date.now();
let stuck; // the progress when the watchdog stopped the run
const readProgress = () => {
  try {
    return JSON.parse(readFileSync(progress, "utf8"));
  } catch {
    return undefined; // not written yet
  }
};
const watchdog = setInterval(() => {
  if (stuck) return; // said once; the group is being killed
  const p = readProgress();
  const now = Date.now();
  const quiet = now - (p?.at ?? started);
  const why =
    quiet > STALL_MS
      ? `nothing started or ended for ${Math.round(quiet / 1000)} s`
      : now - started > DEADLINE_MS
        ? `the run passed its deadline of ${DEADLINE_MS / 60_000} minutes`
        : undefined;
  if (!why) return;
  stuck = p ?? { passed: 0, failed: 0, skipped: 0, running: [] };
  console.error(`\n[test watchdog] ${why}; running then:`);
  for (const r of p?.running ?? [])
    console.error(`  ${r.file} > ${r.what} (for ${Math.round((now - r.since) / 1000)} s)`);
  console.error("[test watchdog] killing vitest and every process of its group");
  killGroup("SIGKILL");
}, 10_000);

const code = await new Promise((resolve) => vitest.on("exit", (c, s) => resolve(c ?? (s ? 1 : 0))));
clearInterval(watchdog);
reapLeftovers();

if (stuck && !existsSync(report)) {
  // vitest wrote no report: count from the progress file, every test that was running as failed.
  const { passed, failed, skipped, running } = stuck;
  const hung = Math.max(1, running.filter((r) => r.kind === "test").length);
  console.log(`${passed} passed, ${failed + hung} failed${skipped ? `, ${skipped} skipped` : ""}`);
  process.exit(1);
}
if (!existsSync(report)) {
  console.error(`vitest wrote no report (exit ${code})`);
  process.exit(code || 1);
}
const r = JSON.parse(readFileSync(report, "utf8"));
// A file that failed to load or whose hooks failed has no failed test of its own: count it.
const brokenFiles = r.testResults.filter(
  (f) => f.status === "failed" && !f.assertionResults.some((a) => a.status === "failed"),
).length;
const passed = r.numPassedTests;
// vitest fails a run on an error outside any test (an unhandled rejection, a socket error no one
// listened to): the report has no failed test for it, so it is counted here as one.
// A run the watchdog stopped after the report was written (a hang at teardown) is one such failure.
// vitest may also exit 0 after reporting such errors: the progress reporter counts them.
const unhandled = readProgress()?.unhandled ?? 0;
const outside = Math.max(unhandled, (code !== 0 || stuck) && r.numFailedTests + brokenFiles === 0 ? 1 : 0);
if (outside) console.error("the run failed outside any test (see the errors above)");
const failed = r.numFailedTests + brokenFiles + outside;
const skipped = r.numPendingTests + r.numTodoTests;
console.log(`${passed} passed, ${failed} failed${skipped ? `, ${skipped} skipped` : ""}`);
process.exit(code !== 0 || failed > 0 || passed === 0 ? code || 1 : 0);

/**
 * Processes of vitest's group still alive after it exited were left behind by a test (each test
 * must kill what it spawned): named here, then killed, so that none outlives the run holding a
 * port, a database or CI's output open. Linux only (/proc); elsewhere the group is just killed.
 */
function reapLeftovers() {
  const left = [];
  try {
    for (const e of readdirSync("/proc")) {
      if (!/^\d+$/.test(e)) continue;
      try {
        const stat = readFileSync(`/proc/${e}/stat`, "utf8");
        const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
        if (Number(fields[2]) === group && fields[0] !== "Z")
          left.push(`${e} ${readFileSync(`/proc/${e}/cmdline`, "utf8").replaceAll("\0", " ").slice(0, 160)}`);
      } catch {
        // gone meanwhile
      }
    }
  } catch {
    // no /proc
  }
  if (left.length) console.error(`[test watchdog] left running by the tests, now killed:\n  ${left.join("\n  ")}`);
  killGroup("SIGKILL");
}
