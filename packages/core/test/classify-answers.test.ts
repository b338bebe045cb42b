/**
 * A JavaScript action's `classify` may return anything, as its `reconcile` may resolve to anything
 * (see failures.test.ts, "a lookup that answers no verdict"): what is not a classification must
 * not turn the call into a TypeError with the row left running for a lease. The request was sent
 * and its error not understood: an ambiguous outcome, as when classify throws.
 */
import { describe, expect, it } from "vitest";
import { defineAction } from "@idem/core";
import { DIALECTS } from "@idem/testkit";
import { ledgers, uniqueTenant } from "./support/ledgers.js";

for (const dialect of DIALECTS) {
  describe(`classify answering no classification, ${dialect}`, () => {
    const db = ledgers(dialect);

    it("a classify that returns nothing is an ambiguous outcome, not a TypeError with the row left running", async () => {
      let sent = 0;
      const mail = defineAction<{ to: string }, { id: string }>({
        type: "mail",
        capabilities: { lookup: true },
        execute: async () => {
          sent += 1;
          throw new Error("socket hang up");
        },
        classify: (() => undefined) as never, // a JavaScript classify with a missing return
        reconcile: async () => ({ found: false, proof: "inconclusive", reason: "index lags" }),
      });
      const ledger = await db.open({ actions: [mail], budget: { attempts: 1 } });
      const tenant = uniqueTenant();
      const out = await ledger.run(mail, { tenant, key: ["k"], args: { to: "x" } }).catch((e: unknown) => e);
      // Before: TypeError "Cannot read properties of undefined (reading 'kind')", the row running.
      expect(out).toMatchObject({ status: "pending_verification", state: "unknown" });
      const [op] = await ledger.admin.list({ tenant });
      expect(op).toMatchObject({ status: "unknown" });
      expect(sent).toBe(1);
    });
  });
}
