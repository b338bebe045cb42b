/**
 * `admin.prune`'s `limit` bounds one statement's deletions (`idem prune --batch`, a script's own
 * batches). One that is no whole number of at least 1 is refused before any statement: on SQLite
 * `LIMIT -1` is no limit (every expired operation of the tenant went in one statement), and on
 * Postgres the database's refusal was reported as the database failing (`LedgerUnavailableError`:
 * a caller waits for it to come back, for ever).
 */
import { describe, expect, it } from "vitest";
import { defineAction, InvalidValueError } from "@idem/core";
import { DIALECTS } from "@idem/testkit";
import { ledgers, uniqueTenant } from "./support/ledgers.js";

const done = defineAction({ type: "sms.done", capabilities: {}, execute: async () => ({ ok: true }) });

for (const dialect of DIALECTS) {
  describe(`prune's limit, ${dialect}`, () => {
    const db = ledgers(dialect);

    it("refuses a limit that is no whole number of at least 1, deleting nothing; a valid one still bounds the batch", async () => {
      const ledger = await db.open({ retentionMs: 0 }); // completed operations are past retention at once
      const tenant = uniqueTenant();
      for (let i = 0; i < 5; i++) await ledger.run(done, { tenant, key: ["sms", i], args: {} });
      const left = async () => (await ledger.admin.list({ tenant, limit: 100 })).length;
      for (const limit of [-1, 0, 1.5, Number.NaN, Number.POSITIVE_INFINITY]) {
        const answer = await ledger.admin.prune({ tenant, limit }).catch((e: unknown) => e);
        expect(answer, `limit ${limit}`).toBeInstanceOf(InvalidValueError);
        expect((answer as Error).message).toMatch(/^limit: must be a whole number ≥ 1/);
        expect(await left(), `limit ${limit}`).toBe(5);
      }
      expect(await ledger.admin.prune({ tenant, limit: 2 })).toBe(2);
      expect(await ledger.admin.prune({ tenant })).toBe(3);
    });
  });
}
