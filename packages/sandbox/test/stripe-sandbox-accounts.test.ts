/**
 * The Stripe sandbox keeps Connect's semantics for a connected account it was given
 * (`connectAccount`), checked with the real stripe SDK over HTTP: a request with `Stripe-Account`
 * acts on that account (docs.stripe.com/connect/authentication), whose objects are its own, and
 * whose idempotency keys are its own (the same key on two accounts is two requests); the answer
 * names the account (`Stripe-Account`, stripe-node's `lastResponse.stripeAccount`).
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import Stripe from "stripe";
import type { StripeSandbox } from "@idem/sandbox";
import { startStripeSandbox } from "./stripe-client.js";

const ACCOUNT = "acct_1SandboxConnected";
const OTHER = "acct_1SandboxOther";
let sandbox: StripeSandbox;
let client: Stripe;
beforeAll(async () => {
  ({ sandbox, client } = await startStripeSandbox());
  sandbox.connectAccount(ACCOUNT);
  sandbox.connectAccount(OTHER);
});
afterAll(() => sandbox.close());

const card = {
  amount: 1500,
  currency: "eur",
  payment_method: "pm_card_visa",
  confirm: true,
  automatic_payment_methods: { enabled: true, allow_redirects: "never" as const },
};
let k = 0;
const key = () => `accounts-test-${++k}`;

describe("Stripe sandbox: a connected account", () => {
  it("makes the object on the account named, and answers naming the account", async () => {
    const before = [sandbox.count("payment_intents"), sandbox.count("payment_intents", ACCOUNT)];
    const pi = await client.paymentIntents.create(card, { idempotencyKey: key(), stripeAccount: ACCOUNT });
    expect(pi.lastResponse.stripeAccount).toBe(ACCOUNT);
    expect([sandbox.count("payment_intents"), sandbox.count("payment_intents", ACCOUNT)]).toEqual([
      before[0],
      before[1]! + 1,
    ]);
    expect(sandbox.objectsOf(ACCOUNT).get("payment_intents", pi.id)).toMatchObject({ status: "succeeded" });
    expect(
      sandbox
        .objectsOf(ACCOUNT)
        .all("charges")
        .filter((c) => c.payment_intent === pi.id),
    ).toHaveLength(1);
  });

  it("keeps its objects its own: retrieved, listed and searched on it, not on the platform or another account", async () => {
    const marker = key();
    const pi = await client.paymentIntents.create(
      { ...card, metadata: { idem_operation: marker } },
      { idempotencyKey: key(), stripeAccount: ACCOUNT },
    );
    const search = { query: `metadata['idem_operation']:'${marker}'` };
    for (const stripeAccount of [ACCOUNT, OTHER, undefined]) {
      const on = stripeAccount === undefined ? {} : { stripeAccount };
      const here = stripeAccount === ACCOUNT;
      const got = await client.paymentIntents.retrieve(pi.id, {}, on).catch((e: unknown) => e);
      if (here) expect(got).toMatchObject({ id: pi.id });
      else expect(got).toMatchObject({ statusCode: 404, code: "resource_missing" });
      const listed = await client.paymentIntents.list({ limit: 100 }, on);
      expect(
        listed.data.some((p) => p.id === pi.id),
        String(stripeAccount),
      ).toBe(here);
      const found = await client.paymentIntents.search(search, on);
      expect(
        found.data.map((p) => p.id),
        String(stripeAccount),
      ).toEqual(here ? [pi.id] : []);
    }
    // A refund of it is made there too: the platform has no such payment intent.
    const refused = await client.refunds.create({ payment_intent: pi.id }).catch((e: unknown) => e);
    expect(refused).toMatchObject({ statusCode: 400, code: "resource_missing" });
    const refund = await client.refunds.create({ payment_intent: pi.id }, { stripeAccount: ACCOUNT });
    expect(sandbox.objectsOf(ACCOUNT).get("refunds", refund.id)).toMatchObject({ payment_intent: pi.id });
  });

  it("keeps idempotency keys per account: the same key on two accounts and the platform is three requests", async () => {
    const idempotencyKey = key();
    const a = await client.paymentIntents.create(card, { idempotencyKey, stripeAccount: ACCOUNT });
    const b = await client.paymentIntents.create(card, { idempotencyKey, stripeAccount: OTHER });
    const p = await client.paymentIntents.create(card, { idempotencyKey });
    expect(new Set([a.id, b.id, p.id]).size).toBe(3);
    for (const r of [a, b, p]) expect(r.lastResponse.headers["idempotent-replayed"]).toBeUndefined();
    // Each account replays its own answer.
    const again = await client.paymentIntents.create(card, { idempotencyKey, stripeAccount: ACCOUNT });
    expect(again.id).toBe(a.id);
    expect(again.lastResponse.headers["idempotent-replayed"]).toBe("true");
    // Other parameters under the key are refused on that account only.
    const other = await client.paymentIntents
      .create({ ...card, amount: 999 }, { idempotencyKey, stripeAccount: OTHER })
      .catch((e: unknown) => e);
    expect(other).toBeInstanceOf(Stripe.errors.StripeIdempotencyError);
  });

  it("an account it was not given stays Stripe's 403 account_invalid, whatever accounts it has", async () => {
    const before = sandbox.count("customers");
    const err = await client.customers
      .create({ email: "x@example.com" }, { idempotencyKey: key(), stripeAccount: "acct_1NotGiven" })
      .catch((e: unknown) => e);
    expect(err).toBeInstanceOf(Stripe.errors.StripePermissionError);
    expect(err).toMatchObject({ statusCode: 403, code: "account_invalid" });
    expect(sandbox.count("customers")).toBe(before);
  });
});
