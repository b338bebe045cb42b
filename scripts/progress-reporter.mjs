// A vitest reporter for scripts/test.mjs: it keeps, in a small JSON file, what has passed and
// failed so far and what is running now (file, test or hook, since when). The file is all the
// watchdog needs when vitest stops making progress: it names the stuck test and gives the counts
// of the tests that did run, without trusting a vitest process that may be the one hanging.
import { mkdirSync, renameSync, writeFileSync } from "node:fs";
import { dirname, relative } from "node:path";

export default class ProgressReporter {
  constructor(options = {}) {
    this.file = options.file ?? "test-results/progress.json";
    this.counts = { passed: 0, failed: 0, skipped: 0 };
    /** What runs now, by id: a test case or a hook, with its file and start. */
    this.running = new Map();
  }

  onTestRunStart() {
    this.write();
  }
  onTestModuleQueued(module) {
    this.running.set(module.id, { kind: "file", file: this.name(module), what: "(loading)", since: Date.now() });
    this.write();
  }
  onTestModuleStart(module) {
    this.running.set(module.id, { kind: "file", file: this.name(module), what: "(the file)", since: Date.now() });
    this.write();
  }
  onTestModuleEnd(module) {
    this.running.delete(module.id);
    this.write();
  }
  onHookStart(hook) {
    this.running.set(`hook:${hook.entity.id}:${hook.name}`, {
      kind: "hook",
      file: this.name(hook.entity.module ?? hook.entity),
      what: `${hook.name} of ${hook.entity.fullName ?? hook.entity.moduleId ?? "the file"}`,
      since: Date.now(),
    });
    this.write();
  }
  onHookEnd(hook) {
    this.running.delete(`hook:${hook.entity.id}:${hook.name}`);
    this.write();
  }
  onTestCaseReady(test) {
    this.running.set(test.id, { kind: "test", file: this.name(test.module), what: test.fullName, since: Date.now() });
    this.write();
  }
  onTestCaseResult(test) {
    this.running.delete(test.id);
    const state = test.result().state;
    if (state === "passed") this.counts.passed++;
    else if (state === "failed") this.counts.failed++;
    else this.counts.skipped++;
    this.write();
  }

  /** Errors outside any test (an unhandled rejection, a socket error no one listened to). */
  onTestRunEnd(_modules, unhandledErrors = []) {
    this.counts.unhandled = unhandledErrors.length;
    this.write();
  }

  name(module) {
    return module?.moduleId ? relative(process.cwd(), module.moduleId) : "?";
  }
  /** Written whole and renamed, so that a reader never sees half a file. */
  write() {
    const body = { at: Date.now(), ...this.counts, running: [...this.running.values()] };
    mkdirSync(dirname(this.file), { recursive: true });
    writeFileSync(`${this.file}.tmp`, JSON.stringify(body));
    renameSync(`${this.file}.tmp`, this.file);
  }
}
