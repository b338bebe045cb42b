#!/usr/bin/env node
// The test command of the README and of CI: runs every test with vitest and ends with the line
// "N passed, N failed[, N skipped]" computed from vitest's JSON report (vitest's own summary is
// not a format CI reads). Exits non-zero when anything failed or no test ran.
import { spawnSync } from "node:child_process";
import { existsSync, mkdirSync, readFileSync, rmSync } from "node:fs";

import { ensureSystemPackages } from "./system-deps.mjs";

ensureSystemPackages();

const report = "test-results/vitest.json";
rmSync(report, { force: true });
mkdirSync("test-results", { recursive: true });

const run = spawnSync(
  process.execPath,
  [
    "node_modules/vitest/vitest.mjs",
    "run",
    "--reporter=default",
    "--reporter=json",
    `--outputFile.json=${report}`,
    ...process.argv.slice(2),
  ],
  { stdio: "inherit" },
);

if (!existsSync(report)) {
  console.error(`vitest wrote no report (exit ${run.status ?? run.signal})`);
  process.exit(run.status || 1);
}
const r = JSON.parse(readFileSync(report, "utf8"));
// A file that failed to load or whose hooks failed has no failed test of its own: count it.
const brokenFiles = r.testResults.filter(
  (f) => f.status === "failed" && !f.assertionResults.some((a) => a.status === "failed"),
).length;
const passed = r.numPassedTests;
// vitest fails a run on an error outside any test (an unhandled rejection, a socket error no one
// listened to): the report has no failed test for it, so it is counted here as one.
const outside = run.status !== 0 && r.numFailedTests + brokenFiles === 0 ? 1 : 0;
if (outside) console.error("the run failed outside any test (see the errors above)");
const failed = r.numFailedTests + brokenFiles + outside;
const skipped = r.numPendingTests + r.numTodoTests;
console.log(`${passed} passed, ${failed} failed${skipped ? `, ${skipped} skipped` : ""}`);
process.exit(run.status !== 0 || failed > 0 || passed === 0 ? run.status || 1 : 0);
