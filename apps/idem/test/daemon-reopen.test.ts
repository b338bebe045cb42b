/**
 * The daemon (in this process, `Daemon.run`) on a SQLite ledger whose file was replaced under it
 * (a backup renamed over it): its next tick's beat is refused by the ledger's file check (`reopen`,
 * which the ledger does not do by itself), no tick can ever write again, so the loop ends, saying
 * why at fatal, and `run()` rejects with that error, for `idem daemon` to exit 1 on it (a spawned
 * daemon whose file was deleted and made anew is outage.test.ts's). Not retried as an outage that
 * may pass: that held the daemon up, /healthz 503, for ever. SQLite only: a Postgres ledger has no
 * file of ours to replace.
 */
import { afterEach, describe, expect, it } from "vitest";
import { renameSync } from "node:fs";
import { join } from "node:path";
import { LedgerUnavailableError, openLedger } from "@idem/core";
import { Daemon, DaemonMetrics, parseConfig } from "@idem/cli";
import { freshDatabase, scaled, tempDir } from "@idem/testkit";
import { capturedLog } from "./support.js";

const cleanups: (() => Promise<void>)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

describe("the daemon on a SQLite ledger whose file is replaced under it", () => {
  it(
    "ends its loop, fatal, and run() rejects with the ledger's error (reopen, not by itself), not an outage retried for ever",
    async () => {
      const url = await freshDatabase("sqlite");
      const config = parseConfig({ ledger: url, alerts: { log: true }, daemon: { intervalMs: 50 } });
      const ledger = await openLedger(url);
      cleanups.push(() => ledger.close());
      const { log, lines } = capturedLog();
      const daemon = new Daemon(ledger, config, log, new DaemonMetrics(ledger, 1_000), "d-replaced");
      const run = daemon.run().then(
        () => "ended",
        (error: unknown) => error,
      );
      cleanups.push(async () => {
        daemon.stop();
        await run;
      });
      const backup = join(tempDir(), "backup.db");
      await (await openLedger(`sqlite:${backup}`)).close(); // a ledger of its own, closed
      renameSync(backup, url.slice("sqlite:".length));
      const error = await run;
      expect(error).toBeInstanceOf(LedgerUnavailableError);
      expect(error).toMatchObject({
        reopen: true,
        reopensItself: false,
        message: expect.stringMatching(/^the SQLite file .* was replaced since the ledger opened it/),
      });
      expect(lines.filter((l) => l.level >= 60)).toEqual([
        expect.objectContaining({
          msg: expect.stringMatching(
            /^the ledger must be opened again \(the SQLite file .* was replaced since the ledger opened it.*\): exiting; restart the daemon/,
          ),
        }),
      ]);
      expect(lines.map((l) => l.msg)).not.toContain("the ledger database is unavailable; retrying every interval");
    },
    scaled(60_000),
  );
});
