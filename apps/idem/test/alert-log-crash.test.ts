/**
 * A daemon killed (SIGKILL) while its log sink delivers an alert, on SQLite and Postgres: the
 * line was written, the delivery left running. A log line written twice is harmless and cannot
 * be looked up, so the sink's action says it is safe to repeat (`capabilities.repeatable`): the
 * next pass writes it again, once, and the delivery succeeds. Before, the replay policy sent it to
 * a person (needs_review): with alerts to the log alone, a review whose own alert is a log line.
 */
import { describe, expect, it } from "vitest";
import { fileURLToPath } from "node:url";
import { defineAction, openLedger } from "@idem/core";
import { DIALECTS, freshDatabase, kill9, scaled, startChild, tempDir } from "@idem/testkit";
import { CONFIG, idem, until } from "./support.js";

const CRASHER = fileURLToPath(new URL("./fixtures/log-crash.ts", import.meta.url));
const ALERTS_TENANT = "idem-alerts";

/** The log lines of alerts about operation `id` in a process's output. */
const alertLines = (out: string, id: string) =>
  out
    .split("\n")
    .filter((l) => l.startsWith("{"))
    .map((l) => JSON.parse(l) as { alert?: { operationId: string } })
    .filter((l) => l.alert?.operationId === id);

for (const dialect of DIALECTS) {
  describe(`a daemon killed while it logs an alert, on ${dialect}`, () => {
    it(
      "the next pass writes the line again, once, and the delivery succeeds: no person asked to review a log line",
      async () => {
        const url = await freshDatabase(dialect);
        const ledger = await openLedger(url, { budget: { attempts: 1 } });
        try {
          // An effect whose answer was lost, which nothing can check: a person decides, and is alerted.
          const lost = defineAction({
            type: "file.neither",
            capabilities: {},
            execute: async () => {
              throw new Error("socket closed after the body");
            },
          });
          const out = await ledger.run(lost, { tenant: "crash-log", key: ["k"], args: { note: "x" } });
          expect(out).toMatchObject({ status: "pending_verification", state: "needs_review" });
          const id = (out as { operationId: string }).operationId;

          const crashed = startChild(CRASHER, [], { LEDGER_URL: url, LEASE_MS: "1000" });
          await crashed.waitFor(/^crash-point$/, 60_000);
          await kill9(crashed);
          expect(alertLines(crashed.lines.join("\n"), id)).toHaveLength(1);
          const [delivery] = await ledger.admin.list({ tenant: ALERTS_TENANT });
          expect(delivery).toMatchObject({ action: "idem.alert.log", status: "running" });
          // Its lease expired by the database's clock: a dead daemon's delivery, due for the next pass.
          await until(
            async () => (await ledger.admin.now()) > (delivery!.leaseExpiresAt ?? 0),
            30_000,
            "the crashed delivery's lease to expire",
          );

          const env = { LEDGER_URL: url, ALERTS: "log", EFFECT_DIR: tempDir() };
          const pass = await idem(["--config", CONFIG, "daemon", "--once", "--name", "d-after-crash"], env);
          // Before: exit 1, the delivery in needs_review ("alert delivery to log did not succeed").
          expect(pass.code, pass.stdout + pass.stderr).toBe(0);
          expect(alertLines(pass.stdout, id)).toHaveLength(1);
          const [after] = await ledger.admin.list({ tenant: ALERTS_TENANT });
          expect(after).toMatchObject({ id: delivery!.id, status: "succeeded" });

          // Delivered: a later pass writes nothing more about it.
          const again = await idem(["--config", CONFIG, "daemon", "--once", "--name", "d-later"], env);
          expect(again.code, again.stdout + again.stderr).toBe(0);
          expect(alertLines(again.stdout, id)).toHaveLength(0);
        } finally {
          await ledger.close();
        }
      },
      scaled(180_000),
    );
  });
}
