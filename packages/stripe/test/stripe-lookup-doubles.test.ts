/**
 * What a Stripe lookup finds with our key that is not simply this operation's one charge (h163):
 * two payment intents with our key made while our requests could run, and an intent with our key
 * made with another payment method than the args name. Before, the first was settled as the one
 * found, in silence, and the second was taken as this operation's charge. Through the real SDK and
 * the sandbox, on SQLite and Postgres.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { openTestLedger, type TestLedgerOptions } from "@idem/core/testing";
import type { StripeSandbox } from "@idem/sandbox";
import { DIALECTS, ledgersFor } from "@idem/testkit";
import { CARD } from "./cards.js";
import { actionsOn, type SandboxServer, startSandbox } from "./sandbox.js";

let sandbox: StripeSandbox;
let server: SandboxServer;
let skew = 0;
const advance = (ms: number) => {
  skew += ms;
  sandbox.advance(ms);
};
beforeAll(async () => {
  ({ sandbox, server } = await startSandbox());
});
afterAll(() => sandbox.close());

const stripe = () => actionsOn(server);
let n = 0;
const tenant = (dialect: string) => `dbl${++n}-${dialect}-${Math.random().toString(36).slice(2, 7)}`;

for (const dialect of DIALECTS) {
  describe(`a Stripe lookup that finds more than this operation's charge, on ${dialect}`, () => {
    const db = ledgersFor(dialect, openTestLedger, { defaults: { poolSize: 2 } as TestLedgerOptions, prepare: true });
    const ledger = (o: TestLedgerOptions = {}) => db.open({ clock: () => Date.now() + skew, ...o });

    it("two intents with our key made during our attempts: settled as found, and a person is alerted to both", async () => {
      const s = stripe();
      const l = await ledger({ budget: { attempts: 1 }, actions: [s.paymentIntentsCreate] });
      const t = tenant(dialect);
      // Our charge committed, and Stripe saved a 500 under our key: a lookup settles it, not a replay.
      sandbox.faults.add({ kind: "error_after_commit", match: { method: "POST", path: "/v1/payment_intents" } });
      const first = await l.run(s.paymentIntentsCreate, { tenant: t, key: ["order", "o-2"], args: CARD });
      sandbox.faults.clear();
      expect(first).toMatchObject({ status: "pending_verification", state: "unknown" });
      const ours = sandbox.objects.all("payment_intents").at(-1)!;
      // A second charge with our key while the operation is open (another process, a key Stripe forgot).
      const second = await s.client.paymentIntents.create({
        ...CARD,
        metadata: { idem_operation: ours.metadata.idem_operation! },
      });
      const id = first.status === "pending_verification" ? first.operationId : "";
      const settled = await l.daemon.settle({ tenant: t, id });
      const { operation } = await l.get({ tenant: t, id });
      const alerted = (await l.daemon.alertsDue({ limit: 100 })).some((a) => a.id === id);
      // Before: { status: "succeeded", reason: "reconciled: the effect was found", alerted: false }.
      expect({ status: settled.status, reason: operation.reason, alerted }).toMatchObject({
        status: "succeeded",
        reason: expect.stringMatching(new RegExp(`^two effects: .*${ours.id}.*${second.id}`)),
        alerted: true,
      });
    });

    it("an intent with our key made with another payment method: not this operation's charge, a person decides", async () => {
      // As an earlier operation's key (pruned from the ledger since) reused for a charge of the same
      // amount to another card: Stripe answers 400 idempotency_error, and the lookup finds the other card's intent.
      const s = stripe();
      const l = await ledger({ retentionMs: 60_000, actions: [s.paymentIntentsCreate] });
      const t = tenant(dialect);
      const key = ["charge", "in_7"];
      const first = await l.run(s.paymentIntentsCreate, {
        tenant: t,
        key,
        args: { ...CARD, payment_method: "pm_1BobsVisa" },
      });
      expect(first.status).toBe("succeeded");
      advance(2 * 60_000);
      expect(await l.admin.prune({ tenant: t })).toBe(1);
      const before = sandbox.count("payment_intents");
      const again = await l.run(s.paymentIntentsCreate, {
        tenant: t,
        key,
        args: { ...CARD, payment_method: "pm_1AlicesVisa" },
      });
      expect(sandbox.count("payment_intents") - before).toBe(0); // Alice's card was never charged
      // Before: { status: "succeeded", receipt: Bob's intent }.
      expect(again).toMatchObject({ status: "pending_verification", state: "needs_review" });
      const { operation } = await l.get({ tenant: t, id: again.operationId });
      expect(operation.reason).toMatch(
        /made with the payment method pm_1BobsVisa where this operation names pm_1AlicesVisa/,
      );
    });

    it("an intent with our key made with another card given inline: not this operation's charge, a person decides", async () => {
      // As above, the card given inline (payment_method_data): Stripe makes a new payment method
      // from it for each request, so only what it keeps of the card tells them apart.
      const s = stripe();
      const l = await ledger({ retentionMs: 60_000, actions: [s.paymentIntentsCreate] });
      const t = tenant(dialect);
      const key = ["charge", "in_8"];
      const inline = (number: string) =>
        ({
          ...CARD,
          payment_method: undefined,
          payment_method_data: { type: "card", card: { number, exp_month: 12, exp_year: 2034, cvc: "123" } },
        }) as unknown as typeof CARD;
      expect((await l.run(s.paymentIntentsCreate, { tenant: t, key, args: inline("4242424242424242") })).status).toBe(
        "succeeded",
      );
      advance(2 * 60_000);
      expect(await l.admin.prune({ tenant: t })).toBe(1);
      const before = sandbox.count("payment_intents");
      const again = await l.run(s.paymentIntentsCreate, { tenant: t, key, args: inline("5555555555554444") });
      expect(sandbox.count("payment_intents") - before).toBe(0); // the other card was never charged
      // Before: { status: "succeeded", receipt: the first card's intent }.
      expect(again).toMatchObject({ status: "pending_verification", state: "needs_review" });
      const { operation } = await l.get({ tenant: t, id: again.operationId });
      expect(operation.reason).toMatch(/\(the card ending 4242\), not the card this operation gives inline/);
    });
  });
}
