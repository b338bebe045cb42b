/**
 * Stripe refuses a `Stripe-Version` it does not know with a 400 ("Invalid Stripe API version: …")
 * before its idempotency layer: nothing is saved under the key, nothing runs. That refusal is of
 * this process's setup (its `apiVersion`), not of the request: it says nothing about an earlier
 * attempt with our key, and a person must fix it. A charge whose answer was lost, replayed by a
 * ledger whose actions send a version Stripe does not know (a daemon configured with a misspelled
 * one), stays unknown and alerted, never `failed` ("nothing happened") while the card was charged;
 * settled under a real version, it is the one charge. A fresh call under such a version fails,
 * alerted, naming the version. Through the real stripe SDK to the Stripe sandbox, counted at the
 * target (its payment intents), on SQLite and Postgres.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { openTestLedger, type TestLedgerOptions } from "@idem/core/testing";
import { StripeSandbox } from "@idem/sandbox";
import { DIALECTS, ledgersFor } from "@idem/testkit";
import { stripeActions, type StripeConfig } from "@idem/stripe";
import { CARD } from "./cards.js";

/**
 * A release's date without its name (2024-12-18.acacia): the version a misspelled config sends.
 * Written as a version, on the calendar, so taken when the actions are made (stripe-config.test:
 * one that is not, 2024-13-45, is refused there); Stripe refuses it.
 */
const NO_SUCH_VERSION = "2024-12-18";

let sandbox: StripeSandbox;
let server: { port: number; apiKey: string };
beforeAll(async () => {
  sandbox = new StripeSandbox();
  server = await sandbox.start();
});
afterAll(() => sandbox.close());

const stripe = (extra: Partial<StripeConfig> = {}) =>
  stripeActions({
    apiKey: server.apiKey,
    host: "127.0.0.1",
    port: server.port,
    protocol: "http",
    timeoutMs: 5_000,
    ...extra,
  });
let skew = 0; // how far the ledger's clock (op.now for the adapter) is moved forward, with the sandbox's
const advance = (ms: number) => {
  skew += ms;
  sandbox.advance(ms);
};
const tenant = () => `v-${Math.random().toString(36).slice(2, 8)}`;
const intentsWith = (key: string) =>
  sandbox.objects.all("payment_intents").filter((pi) => pi.metadata?.idem_operation === key);

for (const dialect of DIALECTS) {
  describe(`a Stripe API version Stripe does not know, on ${dialect}`, () => {
    const db = ledgersFor(dialect, openTestLedger, { defaults: { poolSize: 2 } as TestLedgerOptions, prepare: true });

    it("a charge whose answer was lost, replayed under it: unknown and alerted, not failed; then settled under a real version, charged once", async () => {
      const agent = stripe();
      const t = tenant();
      const l = await db.open({ budget: { attempts: 1 }, actions: [agent.paymentIntentsCreate] });
      // Dropped after the charge committed, and again on stripe-node's own resend of it.
      sandbox.faults.add({ kind: "drop_after_commit", match: { path: "/v1/payment_intents" }, times: 2 });
      const out = await l
        .run(agent.paymentIntentsCreate, { tenant: t, key: ["invoice", "in_1"], args: CARD })
        .finally(() => sandbox.faults.clear());
      expect(out).toMatchObject({ status: "pending_verification", state: "unknown" });
      const id = out.status === "pending_verification" ? out.operationId : "";
      const { operation } = await l.get({ tenant: t, id });
      expect(intentsWith(operation.key)).toHaveLength(1);
      const sent = () =>
        sandbox.requests
          .filter((r) => r.method === "POST" && r.idempotencyKey === operation.key)
          .map(
            (r) => `${r.status}${r.replayed ? " replayed" : ""} ${r.stripeVersion === NO_SUCH_VERSION ? "bad" : "ok"}`,
          );

      // Settled by a ledger whose Stripe actions send a version Stripe does not know: each replay
      // with our key (as many as the settle's budget) is refused before Stripe reads the key.
      const bad = stripe({ apiVersion: NO_SUCH_VERSION });
      const misconfigured = await db.open({ actions: [bad.paymentIntentsCreate] });
      const refused = await misconfigured.daemon.settle({ tenant: t, id });
      expect(sent().slice(0, 2)).toEqual(["dropped ok", "dropped replayed ok"]);
      expect(new Set(sent().slice(2))).toEqual(new Set(["400 bad"]));
      // Before: failed ("permanent: … Invalid Stripe API version"), replayed to every caller as nothing done.
      expect(refused).toMatchObject({ status: "pending_verification", state: "unknown" });
      const after = await l.get({ tenant: t, id });
      expect(after.operation.reason).toMatch(/API version .*Invalid Stripe API version: 2024-12-18/);
      expect((await l.daemon.alertsDue({ limit: 1_000 })).some((a) => a.id === id)).toBe(true);
      // A caller through that ledger reads "pending verification", not "failed".
      expect(
        await misconfigured.run(bad.paymentIntentsCreate, { tenant: t, key: ["invoice", "in_1"], args: CARD }),
      ).toMatchObject({ status: "pending_verification" });
      expect(intentsWith(operation.key)).toHaveLength(1);

      // Once a real version is set again, the replay with our key returns the charge Stripe saved.
      const settled = await l.daemon.settle({ tenant: t, id });
      expect(settled).toMatchObject({ status: "succeeded", receipt: { id: intentsWith(operation.key)[0]!.id } });
      expect(intentsWith(operation.key)).toHaveLength(1);
    });

    it("a fresh call under it: failed and alerted, nothing charged, the reason naming the API version", async () => {
      const misconfigured = stripe({ apiVersion: NO_SUCH_VERSION });
      const l = await db.open({ actions: [misconfigured.paymentIntentsCreate] });
      const t = tenant();
      const before = sandbox.count("payment_intents");
      const out = await l.run(misconfigured.paymentIntentsCreate, { tenant: t, key: ["invoice", "in_2"], args: CARD });
      expect(sandbox.requests.at(-1)).toMatchObject({ status: 400, stripeVersion: NO_SUCH_VERSION });
      // Before: failed without an alert, as a validation error: no person would hear of it.
      expect(out).toMatchObject({
        status: "failed",
        error: {
          kind: "permanent",
          alert: true,
          reason: expect.stringMatching(/its apiVersion setting.*Invalid Stripe API version: 2024-12-18/),
        },
      });
      const [op] = await l.admin.list({ tenant: t });
      expect((await l.daemon.alertsDue({ limit: 1_000 })).some((a) => a.id === op!.id)).toBe(true);
      expect(sandbox.count("payment_intents") - before).toBe(0);
    });
  });

  describe(`a Stripe API version from before 2019-02-11 (a payment intent's old status names), on ${dialect}`, () => {
    const db = ledgersFor(dialect, openTestLedger, { defaults: { poolSize: 2 } as TestLedgerOptions, prepare: true });
    // Before 2019-02-11 Stripe names an intent waiting for another payment method `requires_source`
    // and one waiting for the customer `requires_source_action`
    // (docs.stripe.com/changelog/2019-02-11/renames-several-statuses-payment-intents).
    const OLD_VERSION = "2018-11-08";
    /** Confirmed as an integration of that time does: the card is the only payment method type. */
    const declined = {
      amount: 2000,
      currency: "usd",
      payment_method: "pm_card_chargeDeclined",
      confirm: true,
      payment_method_types: ["card"],
    };
    const open = (actions: ReturnType<typeof stripe>) =>
      db.open({ clock: () => Date.now() + skew, budget: { attempts: 1 }, actions: [actions.paymentIntentsCreate] });

    it("a declined charge whose answer was lost, found past the key window: failed with the decline, as answered, not succeeded", async () => {
      const agent = stripe({ apiVersion: OLD_VERSION });
      const l = await open(agent);
      const t = tenant();
      // Answered, the decline is a failure under that version too.
      const answered = await l.run(agent.paymentIntentsCreate, { tenant: t, key: ["answered"], args: declined });
      expect(answered).toMatchObject({
        status: "failed",
        error: { kind: "permanent", evidence: { code: "card_declined", decline_code: "generic_decline" } },
      });
      // Stripe declines it and saves the 402 under our key; the answer is lost, and on stripe-node's resend.
      sandbox.faults.add({ kind: "drop_after_commit", match: { path: "/v1/payment_intents" }, times: 2 });
      const out = await l
        .run(agent.paymentIntentsCreate, { tenant: t, key: ["lost"], args: declined })
        .finally(() => sandbox.faults.clear());
      expect(out).toMatchObject({ status: "pending_verification", state: "unknown" });
      const id = out.status === "pending_verification" ? out.operationId : "";
      const { operation } = await l.get({ tenant: t, id });
      expect(intentsWith(operation.key)).toHaveLength(1);
      advance(25 * 3_600_000); // past the key window: the lookup finds the intent, waiting for another card
      const settled = await l.daemon.settle({ tenant: t, id });
      expect(settled).toMatchObject({
        status: "failed",
        error: {
          kind: "permanent",
          reason: expect.stringMatching(/declined .*\(card_declined generic_decline\)/),
          evidence: { code: "card_declined", decline_code: "generic_decline" },
        },
      });
      expect(
        sandbox.objects.all("charges").filter((c) => c.payment_intent === intentsWith(operation.key)[0]!.id),
      ).toEqual([]);
    });
  });
}
