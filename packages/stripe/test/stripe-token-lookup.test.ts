/**
 * A charge whose card is given inline by a token Stripe made (`POST /v1/tokens`, as Stripe.js
 * makes one), found by a lookup: the token's card, read from Stripe (`GET /v1/tokens/:id`), is
 * compared with the intent's payment method by brand and last four digits, as a test token's is.
 * Before, any token but Stripe's test ones went to a person. Through the real SDK and the sandbox,
 * on SQLite and Postgres.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { openTestLedger, type TestLedgerOptions } from "@idem/core/testing";
import type { StripeSandbox } from "@idem/sandbox";
import { DIALECTS, ledgersFor } from "@idem/testkit";
import { CARD } from "./cards.js";
import { actionsOn, type SandboxServer, startSandbox } from "./sandbox.js";

const HOUR = 3_600_000;
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
const tenant = (dialect: string) => `tok${++n}-${dialect}-${Math.random().toString(36).slice(2, 7)}`;

/** A token for the card `number`, as Stripe.js would make it (a `tok_…` id of Stripe's own). */
const tokenFor = async (number: string) =>
  (await stripe().client.tokens.create({ card: { number, exp_month: "12", exp_year: "2034", cvc: "123" } })).id;

/** A charge of the card given inline by `token`, as the charge tool's args give it. */
const byToken = (token: string) =>
  ({
    ...CARD,
    payment_method: undefined,
    payment_method_data: { type: "card", card: { token } },
  }) as unknown as typeof CARD;

for (const dialect of DIALECTS) {
  describe(`a Stripe lookup of a charge by a token Stripe made, on ${dialect}`, () => {
    const db = ledgersFor(dialect, openTestLedger, { defaults: { poolSize: 2 } as TestLedgerOptions, prepare: true });
    const ledger = (o: TestLedgerOptions = {}) => db.open({ clock: () => Date.now() + skew, ...o });

    it("its answer lost after Stripe charged: the lookup reads the token's card, the same card, and settles succeeded with the one charge", async () => {
      const s = stripe();
      const l = await ledger({ budget: { attempts: 1 }, actions: [s.paymentIntentsCreate] });
      const t = tenant(dialect);
      const token = await tokenFor("5555555555554444");
      // twice: stripe-node resends a reset connection once by itself, with our key
      sandbox.faults.add({ kind: "drop_after_commit", match: { path: "/v1/payment_intents" }, times: 2 });
      const out = await l.run(s.paymentIntentsCreate, { tenant: t, key: ["order", "tok-1"], args: byToken(token) });
      expect(out).toMatchObject({ status: "pending_verification", state: "unknown" });
      const pi = sandbox.objects.all("payment_intents").at(-1)!;
      advance(25 * HOUR); // Stripe forgot the key: a lookup, not a replay, settles it
      const before = sandbox.count("payment_intents");
      // Before: needs_review ("by the token tok_…, whose card cannot be compared"), for the card asked for.
      expect(await l.daemon.settle({ tenant: t, id: out.operationId })).toMatchObject({
        status: "succeeded",
        receipt: { id: pi.id, object: "payment_intent", status: "succeeded", requestId: null },
      });
      expect(sandbox.count("payment_intents")).toBe(before);
      expect(sandbox.objects.all("charges").filter((c) => c.payment_intent === pi.id)).toHaveLength(1);
      expect(sandbox.requests.some((r) => r.method === "GET" && r.path === `/v1/tokens/${token}`)).toBe(true);
    });

    it("an intent with our key made with another card's token: not this operation's charge, a person decides", async () => {
      const s = stripe();
      const l = await ledger({ retentionMs: 60_000, actions: [s.paymentIntentsCreate] });
      const t = tenant(dialect);
      const key = ["charge", "tok-2"];
      const visa = byToken(await tokenFor("4242424242424242"));
      expect((await l.run(s.paymentIntentsCreate, { tenant: t, key, args: visa })).status).toBe("succeeded");
      // An earlier operation with the same key, pruned from the ledger; ours gives a Mastercard.
      advance(2 * 60_000);
      expect(await l.admin.prune({ tenant: t })).toBe(1);
      const before = sandbox.count("payment_intents");
      const mastercard = byToken(await tokenFor("5555555555554444"));
      const again = await l.run(s.paymentIntentsCreate, { tenant: t, key, args: mastercard });
      expect(sandbox.count("payment_intents") - before).toBe(0); // the Mastercard was never charged
      expect(again).toMatchObject({ status: "pending_verification", state: "needs_review" });
      const { operation } = await l.get({ tenant: t, id: again.operationId });
      expect(operation.reason).toMatch(
        /\(the card ending 4242\), not the card this operation gives inline \(another card brand, card number\)/,
      );
    });
  });
}
