/**
 * `idem prune` beside another prune of the same tenant (two cron jobs, an operator's run during
 * the nightly one): what it reports must be true. "Nothing more" (`more: false`) is a script's cue
 * that the tenant's expired operations are gone.
 */
import { describe, expect, it } from "vitest";
import { defineAction, openLedger } from "@idem/core";
import { databaseOf } from "@idem/core/testing";
import { DIALECTS, freshDatabase, scaled } from "@idem/testkit";
import { idem, until } from "./support.js";

const done = defineAction({ type: "sms.done", capabilities: {}, execute: async () => ({ ok: true }) });

for (const dialect of DIALECTS) {
  describe(`idem prune beside another prune, on ${dialect}`, { timeout: scaled(180_000) }, () => {
    it("a batch whose rows the other prune deleted while it waited for them is not read as none left: the rest are pruned, and said so", async () => {
      const url = await freshDatabase(dialect);
      const ledger = await openLedger(url, { retentionMs: 0 }); // completed rows are past retention at once
      try {
        const ids: string[] = [];
        for (let i = 0; i < 3; i++)
          ids.push((await ledger.run(done, { tenant: "acme", key: ["p", i], args: {} })).operationId);
        const db = databaseOf(ledger);
        // Expired one after another, so which row a batch of one takes first is known: ids[0].
        for (const [i, id] of ids.entries())
          await db
            .updateTable("idem_operations")
            .set({ expires_at: 1_000 * (i + 1) })
            .where("id", "=", id)
            .execute();
        // The other prune: its batch (the oldest row) deleted, not committed yet.
        let commit!: () => void;
        const committed = new Promise<void>((resolve) => (commit = resolve));
        let held!: () => void;
        const holding = new Promise<void>((resolve) => (held = resolve));
        const other = db.transaction().execute(async (trx) => {
          await trx.deleteFrom("idem_operations").where("id", "=", ids[0]!).execute();
          held();
          await committed;
        });
        await holding;
        const run = idem(["--ledger", url, "--json", "prune", "--tenant", "acme", "--batch", "1"]);
        if (dialect === "postgres")
          // This prune's batch chose the same row (the other's delete is not committed) and waits for its lock.
          await until(
            async () =>
              (
                await (db as any)
                  .selectFrom("pg_stat_activity")
                  .select("pid")
                  .where("wait_event_type", "=", "Lock")
                  .where("query", "like", 'delete from "idem_operations"%')
                  .execute()
              ).length > 0,
            60_000,
            "idem prune waiting for the other prune's lock",
          );
        // SQLite: one writer at a time; this prune's statement runs once the other committed.
        commit();
        await other;
        const out = await run;
        expect(out.code, out.stderr).toBe(0);
        // Before: {"pruned":0,"more":false}, with two expired operations left.
        expect(JSON.parse(out.stdout)).toEqual({ pruned: 2, more: false });
        expect(await ledger.admin.list({ tenant: "acme" })).toEqual([]);
      } finally {
        await ledger.close();
      }
    });
  });
}
