/**
 * The charge tool (`charge_invoice`) through the ledger and the real SDK against the Stripe
 * sandbox, on SQLite and Postgres: what a card that is not charged reads as, and that its confirms
 * are ones Stripe takes. Effects are counted at the target: the sandbox's charges.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { openTestLedger, type TestLedgerOptions } from "@idem/core/testing";
import type { StripeSandbox } from "@idem/sandbox";
import { DIALECTS, ledgersFor } from "@idem/testkit";
import { stripeActions, stripeTools } from "@idem/stripe";
import { actionsOn, type SandboxServer, startSandbox } from "./sandbox.js";

let sandbox: StripeSandbox;
let server: SandboxServer;
beforeAll(async () => {
  ({ sandbox, server } = await startSandbox());
});
afterAll(() => sandbox.close());

const stripe = () => actionsOn(server);
let n = 0;
const tenant = () => `tools-${++n}-${Math.random().toString(36).slice(2, 7)}`;
const chargesOf = (pi: string) => sandbox.objects.all("charges").filter((c) => c.payment_intent === pi);

for (const dialect of DIALECTS) {
  describe(`charge_invoice on ${dialect}`, () => {
    const db = ledgersFor(dialect, openTestLedger, { defaults: { poolSize: 2 } as TestLedgerOptions, prepare: true });

    async function charge(input: Record<string, unknown>) {
      const s = stripe();
      const tool = stripeTools(s).charge;
      const l = await db.open({ actions: [tool.action] });
      const parsed = tool.input.parse({ invoiceId: `in_${tenant()}`, amount: 2000, currency: "usd", ...input });
      const before = sandbox.count("charges");
      const out = await l.run(tool.action, { tenant: tenant(), key: tool.key(parsed), args: tool.args(parsed) });
      return { out, charged: sandbox.count("charges") - before, pi: sandbox.objects.all("payment_intents").at(-1)! };
    }

    for (const paymentMethod of ["pm_card_visa", "pm_card_chargeDeclinedInsufficientFunds"])
      for (const customer of [undefined, "cus_saved"])
        it(`${paymentMethod}${customer ? " (a customer's saved card, off-session)" : ""}: a confirm Stripe takes, with its real outcome`, async () => {
          const { out, charged, pi } = await charge({ paymentMethod, customer });
          if (paymentMethod === "pm_card_visa") {
            expect(out).toMatchObject({ status: "succeeded", receipt: { status: "succeeded" } });
            expect(charged).toBe(1);
          } else {
            // The intent Stripe created and declined is named, for the operator the model tells.
            expect(out).toMatchObject({
              status: "failed",
              error: {
                kind: "permanent",
                reason: expect.stringMatching(new RegExp(`card_declined.*insufficient_funds.*payment intent ${pi.id}`)),
              },
            });
            expect(charged).toBe(0);
          }
        });

    for (const paymentMethod of ["pm_card_threeDSecure2Required", "pm_card_authenticationRequired"])
      for (const customer of [undefined, "cus_saved"])
        it(`${paymentMethod}${customer ? " off-session" : ""}: failed (authentication required), never read as done, nothing charged`, async () => {
          const { out, charged, pi } = await charge({ paymentMethod, customer });
          // Before: 200 requires_action read as "succeeded" (the model told "Done"), nothing collected.
          expect(out).toMatchObject({
            status: "failed",
            error: { kind: "permanent", reason: expect.stringMatching(/authentication_required/) },
          });
          expect(charged).toBe(0);
          expect(pi).toMatchObject({ status: "requires_payment_method", amount_received: 0 });
          expect(chargesOf(pi.id)).toHaveLength(0);
        });
  });
}

describe("charge_invoice's request", () => {
  const tool = stripeTools(stripeActions({ apiKey: "sk_test_x" })).charge;
  const args = (input: Record<string, unknown>) =>
    tool.args(tool.input.parse({ invoiceId: "in_1", amount: 500, currency: "EUR", ...input }));

  it("without a customer present, confirms only cards and fails rather than wait for an authentication", () => {
    expect(args({ paymentMethod: "pm_1" })).toEqual({
      amount: 500,
      currency: "eur",
      metadata: { invoice_id: "in_1" },
      payment_method: "pm_1",
      confirm: true,
      allowed_payment_method_types: ["card"],
      error_on_requires_action: true,
    });
  });

  it("with a customer's saved payment method, confirms only a card, off-session (Stripe fails what needs the customer)", () => {
    // Before: no list of types, so a saved bank debit was confirmed too: 200 `processing`,
    // nothing collected for days, and the model read "Done" for "the card is charged now".
    expect(args({ paymentMethod: "pm_1", customer: "cus_1" })).toEqual({
      amount: 500,
      currency: "eur",
      metadata: { invoice_id: "in_1" },
      customer: "cus_1",
      payment_method: "pm_1",
      confirm: true,
      allowed_payment_method_types: ["card"],
      off_session: true,
    });
  });

  it("without a payment method, confirms nothing", () => {
    expect(args({})).toEqual({ amount: 500, currency: "eur", metadata: { invoice_id: "in_1" } });
  });
});

describe("charge_invoice's summary of the payment intent", () => {
  const tool = stripeTools(stripeActions({ apiKey: "sk_test_x" })).charge;
  const read = (status: string | null) =>
    tool.summarize({ id: "pi_1", object: "payment_intent", status, requestId: null, replayed: false });

  it("reads succeeded as it is: the invoice is paid", () => {
    expect(read("succeeded")).toEqual({ id: "pi_1", status: "succeeded" });
  });

  // Any status can come back: an intent without a payment method is the customer's to pay, a
  // lookup reads an intent as it is now, a person records what they found. The call reads "Done".
  it.each([
    ["processing", /not collected yet.*may still fail/],
    ["requires_payment_method", /not charged: .*waits for the customer to pay/],
    ["requires_confirmation", /not charged/],
    ["requires_action", /not charged: .*authenticate/],
    ["requires_capture", /authorized, not collected/],
    ["canceled", /not charged: .*canceled/],
    // The names an API version before 2019-02-11 gives the two waiting statuses.
    ["requires_source", /not charged: .*waits for the customer to pay/],
    ["requires_source_action", /not charged: .*authenticate/],
    ["a_status_stripe_adds_later", /not known to be paid: .*a_status_stripe_adds_later/],
    [null, /not known to be paid/],
  ])("says %s is not paid", (status, note) => {
    expect(read(status)).toEqual({ id: "pi_1", status, note: expect.stringMatching(note) });
  });
});
