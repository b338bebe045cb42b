/**
 * A stop whose work ends while the late answer of a request it cut off is still out, on SQLite and
 * Postgres: the daemon's run of a provider that answers long after its effect is cut off at the
 * claim's end (unknown, recorded), and the ledger's close waits for that late answer, to record
 * it, for what is left of `daemon.stopTimeoutMs`, not a lease. Before, the close waited up to a
 * lease (longer than the stop's bound) and the bound's exit cut it: "closing the ledger did not
 * finish", the ledger never closed and nothing named the operation whose answer was lost. Now the
 * ledger closes within the bound and the log names it; still exit 1 (the stop was not clean).
 */
import { describe, expect, it } from "vitest";
import { join } from "node:path";
import { openLedger } from "@idem/core";
import { DIALECTS, freePort, freshDatabase, scaled, startChild, tempDir } from "@idem/testkit";
import { fileAction, lines } from "./fixtures/file-actions.js";
import { CLI, CONFIG, until } from "./support.js";

for (const dialect of DIALECTS) {
  describe(`a stop with a late answer still out, on ${dialect}`, () => {
    it(
      "closes the ledger within the stop's bound and names the operation whose late answer was not awaited (exit 1)",
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
        // and the close waits for it: up to a lease (60 s) before, past the stop's bound (10 s).
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
          expect(said).not.toMatch(/the work in flight did not end|closing the ledger did not finish/);
          const unawaited = daemon.lines
            .filter((l) => l.startsWith("{"))
            .map((l) => JSON.parse(l) as { level: number; msg: string; lateAnswers?: unknown })
            .filter((l) => l.lateAnswers !== undefined);
          expect(unawaited).toEqual([
            expect.objectContaining({
              level: 50,
              lateAnswers: [{ tenant, id }],
              msg: expect.stringMatching(/the ledger closed without the late answer of 1 request\(s\) cut off \(op_/),
            }),
          ]);
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
