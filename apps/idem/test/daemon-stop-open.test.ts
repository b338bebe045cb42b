/**
 * A stop that comes while `idem daemon` (a real process) is still opening its ledger, on SQLite and
 * Postgres, in its loop and in one pass (`--once`): a database that takes the connection and never
 * answers (SQLite's file locked by another connection, Postgres behind a proxy that forwards
 * nothing). The stop's bound (`daemon.stopTimeoutMs`) runs from the signal, as `idem mcp`'s does:
 * it exits 1 at the bound, saying the ledger did not open. Before, the daemon's bound started only
 * once its ledger had opened: the loop waited for the open to give up by itself (10 s), then
 * exited 0 as if stopped at once; a pass waited as long, then failed on the open's own error.
 * Ctrl-C again while it opens exits at once, saying nothing was claimed (not that work in flight
 * was left to its lease). A pass whose open fails on its own after a stop (Postgres: the proxy cut)
 * failed, as without the stop: before, it exited 0 saying it stopped before its database was
 * reachable, though a pass does not wait for its database.
 */
import { afterEach, describe, expect, it } from "vitest";
import { existsSync } from "node:fs";
import { join } from "node:path";
import { DIALECTS, freePort, scaled, startChild, tempDir, type Child, type TestDialect } from "@idem/testkit";
import { CLI, CONFIG, unopenable, until } from "./support.js";

const released: (() => Promise<void>)[] = [];
afterEach(async () => {
  for (const release of released.splice(0)) await release();
});

/**
 * `idem daemon` (the fixture's config, alerts to the log alone, `args`) on a ledger that does not
 * open (support.ts `unopenable`; `release()` lets it, the test's end too), once its config is
 * loaded: the stop signals are heard, and the ledger's open is next. Killed when the test ends
 * (startChild), passed or failed.
 */
async function daemonOpening(
  dialect: TestDialect,
  args: string[],
  stopTimeoutMs: number,
): Promise<{ daemon: Child; release: () => Promise<void> }> {
  const { url, release } = await unopenable(dialect);
  released.push(release);
  const loaded = join(tempDir(), "loaded");
  const daemon = startChild(CLI, ["--config", CONFIG, "daemon", "--name", `d-stop-open-${dialect}`, ...args], {
    LEDGER_URL: url,
    EFFECT_DIR: tempDir(),
    ALERTS: "log",
    METRICS_PORT: String(await freePort()),
    STOP_TIMEOUT_MS: String(stopTimeoutMs),
    LOADED_FILE: loaded,
  });
  await until(() => existsSync(loaded), 60_000, "idem daemon to load its config");
  return { daemon, release };
}

/**
 * Sends `name` to the child until a signal after the first is heard as another one (past
 * REPEAT_SIGNAL_MS, stop-signals.ts): the first, the stop, was heard by then. `heard`: what
 * the child says of that later one.
 */
async function signalUntilHeardAgain(child: Child, name: NodeJS.Signals, heard: (lines: string[]) => boolean) {
  await until(
    () => {
      if (child.proc.exitCode === null && child.proc.signalCode === null) child.proc.kill(name);
      return heard(child.lines) || child.proc.exitCode !== null;
    },
    60_000,
    `a ${name} after the first to be heard`,
  );
}

for (const dialect of DIALECTS)
  describe(`idem daemon stopped while its ledger is still opening, on ${dialect}`, () => {
    for (const [mode, args] of [
      ["the loop", []],
      ["one pass (--once)", ["--once"]],
    ] as const)
      it(
        `${mode}: SIGTERM exits 1 within daemon.stopTimeoutMs of the signal, saying the ledger did not open, not when the open gives up`,
        async () => {
          const { daemon } = await daemonOpening(dialect, [...args], 1500);
          daemon.proc.kill("SIGTERM");
          const { code, stderr } = await daemon.exited;
          const said = daemon.lines.join("\n");
          expect(code, `${stderr}\n${said}`).toBe(1);
          expect(said).toContain(
            "the ledger did not open within 1500 ms of the stop (the database not answering, or a loaded machine): exiting; nothing was claimed or settled",
          );
          // Not the open's own failure once it gave up, nor a stop said to be clean.
          expect(`${stderr}\n${said}`).not.toMatch(/cannot (open|connect)|stopped before its database was reachable/);
        },
        scaled(120_000),
      );

    it(
      "the loop: Ctrl-C again while its ledger opens exits at once (130), saying nothing was claimed, not that work in flight was left",
      async () => {
        const { daemon } = await daemonOpening(dialect, [], scaled(60_000));
        await signalUntilHeardAgain(daemon, "SIGINT", (lines) => lines.some((l) => l.includes("interrupted again")));
        const { code, stderr } = await daemon.exited;
        const said = daemon.lines.join("\n");
        expect(code, `${stderr}\n${said}`).toBe(130);
        // Before: "…; the work in flight is left to its lease, and settled once that expires".
        expect(said).toContain(
          "interrupted again while stopping: exiting at once; the ledger was still opening: nothing was claimed or settled",
        );
        expect(said).not.toContain("left to its lease");
      },
      scaled(120_000),
    );
  });

describe("idem daemon --once stopped while its open fails on its own, on postgres", () => {
  it(
    "fails (exit 1) on the open's own error, as unstopped: not 'stopped before its database was reachable' (a pass does not wait for it)",
    async () => {
      const { daemon, release } = await daemonOpening("postgres", ["--once"], scaled(60_000));
      // Stopped while its open waits on a database that does not answer…
      await signalUntilHeardAgain(daemon, "SIGTERM", (lines) => lines.some((l) => l.includes("already stopping")));
      // …which then cuts the connection: the open fails at once.
      await release();
      const { code, stderr } = await daemon.exited;
      const said = daemon.lines.join("\n");
      // Before: exit 0, "daemon stopped before its database was reachable", the open's error unsaid.
      expect(code, `${stderr}\n${said}`).toBe(1);
      expect(`${stderr}\n${said}`).not.toContain("stopped before its database was reachable");
      expect(stderr).toMatch(/^idem: cannot connect to Postgres ledger/m); // the open's own failure, said
    },
    scaled(120_000),
  );
});
