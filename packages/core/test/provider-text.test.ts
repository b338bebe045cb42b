/**
 * A provider's words are stored in a reason: a broken proxy or upstream that answers binary
 * garbage puts U+0000 in an error's message. Postgres refuses it in text and jsonb (22021); the
 * refusal read as the ledger being down, the write was retried for a lease, the caller was told
 * "the ledger database failed", and the row whose effect happened was left running (helper-116).
 * Stored with U+FFFD in its place, on both databases alike.
 */
import { describe, expect, it } from "vitest";
import { defineAction } from "@idem/core";
import { DIALECTS } from "@idem/testkit";
import { ledgers, uniqueTenant } from "./support/ledgers.js";

for (const dialect of DIALECTS) {
  describe(`a provider's words holding U+0000, on ${dialect}`, () => {
    const db = ledgers(dialect);

    it("an ambiguous error after the effect: unknown, with the reason stored, not 'the ledger database failed'", async () => {
      let effects = 0;
      const mail = defineAction<{ to: string }, { id: string }>({
        type: "nul.mail",
        capabilities: { lookup: true },
        execute: async () => {
          effects += 1; // the provider took it
          throw new Error("socket hang up after \u0000\u0001 (a proxy's binary answer)");
        },
        reconcile: async () => ({ found: false, proof: "inconclusive", reason: "index lags \u0000" }) as const,
      });
      const ledger = await db.open({ actions: [mail] });
      const tenant = uniqueTenant();
      const out = await ledger.run(mail, { tenant, key: ["k"], args: { to: "x" } }).catch((e: unknown) => e);
      expect(out).toMatchObject({ status: "pending_verification", state: "unknown" });
      const { operation, events } = await ledger.get({ tenant, id: (out as { operationId: string }).operationId });
      expect(operation.status).toBe("unknown");
      expect(events.map((e) => e.reason)).toContainEqual(expect.stringContaining("socket hang up after \uFFFD\u0001"));
      expect(operation.reason).toBe("inconclusive: index lags \uFFFD"); // the lookup's, which ran next
      expect(effects).toBe(1);
      // Half of an emoji (a provider's text cut inside a pair) reads back as written: U+FFFD.
      const cut = defineAction<{ to: string }, { id: string }>({
        type: "cut.mail",
        capabilities: {},
        execute: async () => {
          throw new Error("refused \uD83D");
        },
        classify: (e) => ({ kind: "permanent", reason: (e as Error).message }),
      });
      const refused = await ledger.run(cut, { tenant, key: ["c"], args: { to: "x" } });
      expect(refused).toMatchObject({ status: "failed", replayed: false });
      expect((await ledger.get({ tenant, id: refused.operationId })).operation.reason).toBe("refused \uFFFD");
      // The daemon's lookup, whose reason holds one too, is stored as well.
      const settled = await ledger.daemon.settle({ tenant, id: operation.id, actor: "daemon" });
      expect(settled).toMatchObject({ status: "pending_verification", state: "unknown" });
    });
  });
}
