/**
 * An operation deleted while the daemon settles it (prune took it once it completed, or a person
 * deleted it): the settlement ends with `OperationNotFoundError`, as a settlement of an operation
 * already gone does. A `LedgerUnavailableError` there told the daemon its database was down: it
 * ended the tick, left the rest of its claim waiting for `claimMs`, and reported an outage
 * (`/healthz` 503, `idem_ledger_up 0`). Found by operator-races.test.ts (seed 44985 on Postgres).
 */
import { describe, expect, it } from "vitest";
import { sql } from "kysely";
import { setTimeout as sleep } from "node:timers/promises";
import { defineAction, LedgerUnavailableError, OperationNotFoundError } from "@idem/core";
import { databaseOf, openTestLedger } from "@idem/core/testing";
import { DIALECTS } from "@idem/testkit";
import { dialectFor, hooked } from "./support/dialects.js";
import { ledgers, uniqueTenant } from "./support/ledgers.js";

for (const dialect of DIALECTS) {
  describe(`an operation deleted while it is settled, ${dialect}`, () => {
    const db = ledgers(dialect);

    it("ends the settlement as not found, not as the database being unavailable", async () => {
      let timeout: ((error: Error) => void) | undefined;
      const mail = defineAction<{ to: string }, { id: string }>({
        type: "mail",
        capabilities: { lookup: true },
        execute: () => new Promise((_resolve, reject) => (timeout = reject)),
        reconcile: async () => ({ found: false, proof: "absent", reason: "none" }),
      });
      let at = 1_900_000_000_000;
      const clock = () => at;
      const leaseMs = 60_000;
      const caller = await db.open({ clock, leaseMs });
      const tenant = uniqueTenant();
      const run = caller.run(mail, { tenant, key: ["m"], args: { to: "x" } }).catch((e: unknown) => e);
      for (let i = 0; i < 2_000 && !timeout; i++) await sleep(1); // its request is out
      const [op] = await caller.admin.list({ tenant, status: "running" });
      expect(op).toBeDefined();
      at += 2 * leaseMs; // the caller's worker stalled: its lease ran out
      // The daemon's first write (its takeover) finds the row deleted just before it: prune, or a person.
      let armed = true;
      const daemon = await openTestLedger(
        hooked(await dialectFor(dialect, db.url(), { groupCommit: false }), {
          async query(q, run) {
            if (armed && /^update/i.test(q.sql.trimStart())) {
              armed = false;
              await sql`DELETE FROM idem_operations WHERE id = ${op!.id}`.execute(databaseOf(caller));
            }
            return run();
          },
        }),
        { clock, leaseMs, actions: [mail] },
      );
      const settled = await daemon.daemon.settle({ tenant, id: op!.id, actor: "daemon" }).catch((e: unknown) => e);
      expect(armed).toBe(false);
      // Before: LedgerUnavailableError "the operation disappeared while it was being settled".
      expect(settled).not.toBeInstanceOf(LedgerUnavailableError);
      expect(settled).toBeInstanceOf(OperationNotFoundError);
      timeout!(new Error("socket closed after the body was sent")); // the stalled worker's late answer
      await run;
      await daemon.close();
    });
  });
}
