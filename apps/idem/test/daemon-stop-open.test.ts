/**
 * A stop that comes while `idem daemon` (a real process) is still opening its ledger, on SQLite and
 * Postgres, in its loop and in one pass (`--once`): a database that takes the connection and never
 * answers (SQLite's file locked by another connection, Postgres behind a proxy that forwards
 * nothing). The stop's bound (`daemon.stopTimeoutMs`) runs from the signal, as `idem mcp`'s does:
 * it exits 1 at the bound, saying the ledger did not open. Before, the daemon's bound started only
 * once its ledger had opened: the loop waited for the open to give up by itself (10 s), then
 * exited 0 as if stopped at once; a pass waited as long, then failed on the open's own error.
 */
import { afterEach, describe, expect, it } from "vitest";
import { existsSync } from "node:fs";
import { join } from "node:path";
import { DIALECTS, freePort, scaled, startChild, tempDir } from "@idem/testkit";
import { CLI, CONFIG, unopenable, until } from "./support.js";

const released: (() => Promise<void>)[] = [];
afterEach(async () => {
  for (const release of released.splice(0)) await release();
});

for (const dialect of DIALECTS)
  describe(`idem daemon stopped while its ledger is still opening, on ${dialect}`, () => {
    for (const [mode, args] of [
      ["the loop", []],
      ["one pass (--once)", ["--once"]],
    ] as const)
      it(
        `${mode}: SIGTERM exits 1 within daemon.stopTimeoutMs of the signal, saying the ledger did not open, not when the open gives up`,
        async () => {
          const { url, release } = await unopenable(dialect);
          released.push(release);
          const loaded = join(tempDir(), "loaded");
          // Killed when the test ends (startChild), passed or failed.
          const daemon = startChild(CLI, ["--config", CONFIG, "daemon", "--name", `d-stop-open-${dialect}`, ...args], {
            LEDGER_URL: url,
            EFFECT_DIR: tempDir(),
            ALERTS: "log",
            METRICS_PORT: String(await freePort()),
            STOP_TIMEOUT_MS: "1500",
            LOADED_FILE: loaded,
          });
          // The config is loaded: the stop signals are heard, and the ledger's open is next.
          await until(() => existsSync(loaded), 60_000, "idem daemon to load its config");
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
  });
