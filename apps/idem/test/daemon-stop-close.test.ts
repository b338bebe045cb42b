/**
 * A stop whose work ends, but whose ledger's close does not within `daemon.stopTimeoutMs`, on
 * SQLite and Postgres: the daemon's run of a provider that answers long after its effect is cut
 * off at the claim's end (unknown, recorded), and the ledger's close waits for that late answer
 * (up to a lease) to record it. Before, the stop's bound said "the work in flight did not end",
 * though the work had ended ("daemon stopped"); now it says the close did not finish.
 */
import { describe, expect, it } from "vitest";
import { join } from "node:path";
import { openLedger } from "@idem/core";
import { DIALECTS, freePort, freshDatabase, scaled, startChild, tempDir } from "@idem/testkit";
import { fileAction, lines } from "./fixtures/file-actions.js";
import { CLI, CONFIG, until } from "./support.js";

for (const dialect of DIALECTS) {
  describe(`a stop whose ledger's close outlasts its bound, on ${dialect}`, () => {
    it(
      "says the work ended and the close did not finish (exit 1), not 'the work in flight did not end'",
      async () => {
        const url = await freshDatabase(dialect);
        const dir = tempDir();
        const tenant = "stop-close";
        const agent = await openLedger(url, { budget: { attempts: 1 } });
        let id: string;
        try {
          // Known not done (a 503 before the provider executed): the daemon runs it.
          const refused = {
            ...fileAction("neither", dir),
            execute: async () => {
              throw new Error("503 before the provider executed");
            },
            classify: () => ({ kind: "transient", reason: "503", retryAfterMs: 0 }) as const,
          };
          const out = await agent.run(refused, { tenant, key: ["k"], args: { note: "x" } });
          expect(out).toMatchObject({ state: "pending" });
          id = (out as { operationId: string }).operationId;
        } finally {
          await agent.close();
        }
        // The run's answer comes 120 s after its effect; the claim (2 s) cuts the wait for it off,
        // and the close waits for it up to a lease (60 s): the stop's bound (10 s) ends the close.
        const daemon = startChild(CLI, ["--config", CONFIG, "daemon", "--name", `d-stop-close-${dialect}`], {
          LEDGER_URL: url,
          EFFECT_DIR: dir,
          ALERTS: "log",
          METRICS_PORT: String(await freePort()),
          EXECUTE_DELAY_MS: "120000",
          CLAIM_MS: "2000",
          LEASE_MS: "60000",
          STOP_TIMEOUT_MS: "10000",
        });
        try {
          await until(() => lines(join(dir, "effects")).length >= 1, 60_000, "the daemon's run to be in flight");
          daemon.proc.kill("SIGTERM");
          await daemon.waitFor(/"msg":"daemon stopped"/, 30_000); // the work ended
          const { code, stderr } = await daemon.exited;
          const said = daemon.lines.join("\n");
          expect(said).not.toMatch(/the work in flight did not end/);
          expect(said).toMatch(
            /the daemon's work ended, but closing the ledger did not finish within 10000 ms of the stop/,
          );
          expect(code, stderr).toBe(1);
          const ledger = await openLedger(url, { migrate: false });
          try {
            // Cut off and recorded (unknown, which nothing can check: a person's); its late answer is not.
            expect((await ledger.get({ tenant, id })).operation.status).toBe("needs_review");
          } finally {
            await ledger.close();
          }
        } finally {
          daemon.proc.kill("SIGKILL");
          await daemon.exited;
        }
      },
      scaled(120_000),
    );
  });
}
