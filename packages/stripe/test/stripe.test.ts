/**
 * The Stripe adapter through the real stripe SDK over HTTP to the Stripe sandbox, on SQLite and
 * Postgres. Effects are counted at the target: the sandbox's PaymentIntents.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createServer, type AddressInfo, type Socket } from "node:net";
import { fileURLToPath } from "node:url";
import { ArgsMismatchError, describeResult, InvalidValueError, openLedger } from "@idem/core";
import { openTestLedger, type TestLedgerOptions } from "@idem/core/testing";
import { StripeSandbox, type StripeObject } from "@idem/sandbox";
import { DIALECTS, kill9, ledgersFor, scaled, startChild } from "@idem/testkit";
import { stripeActions, type StripeConfig } from "@idem/stripe";
import { CARD } from "./cards.js";

const WORKER = fileURLToPath(new URL("./children/stripe-worker.ts", import.meta.url));
const HOUR = 3_600_000;

/** A card that needs 3DS, confirmed as the charge tool does: Stripe fails it (402) rather than wait. */
const FAIL_FAST_3DS = {
  amount: 2000,
  currency: "usd",
  payment_method: "pm_card_threeDSecure2Required",
  confirm: true,
  allowed_payment_method_types: ["card"],
  error_on_requires_action: true,
};

let sandbox: StripeSandbox;
let server: { port: number; apiKey: string };
let skew = 0; // how far the ledger's clock (op.now for the adapter) is moved forward, with the sandbox's
const advance = (ms: number) => {
  skew += ms;
  sandbox.advance(ms);
};

beforeAll(async () => {
  sandbox = new StripeSandbox();
  server = await sandbox.start();
});
afterAll(() => sandbox.close());

function stripe(extra: Partial<StripeConfig> = {}) {
  return stripeActions({
    apiKey: server.apiKey,
    host: "127.0.0.1",
    port: server.port,
    protocol: "http",
    timeoutMs: 5_000,
    ...extra,
  });
}
const piCount = () => sandbox.count("payment_intents");
/**
 * The customer fails the card's authentication (3D Secure) in their browser, after the intent
 * answered requires_action: Stripe returns the intent to requires_payment_method and records the
 * failure on it, naming the payment method that failed (as Stripe's intents show it).
 */
const failAuthentication = (pi: StripeObject) =>
  Object.assign(pi, {
    status: "requires_payment_method",
    payment_method: null,
    next_action: null,
    last_payment_error: {
      type: "invalid_request_error",
      code: "payment_intent_authentication_failure",
      message:
        "The provided PaymentMethod has failed authentication. You can provide payment_method_data or a new PaymentMethod to attempt to fulfill this PaymentIntent again.",
      payment_method: { id: pi.payment_method, object: "payment_method", type: "card" },
    },
  });
const requestsFor = (key: string) => sandbox.requests.filter((r) => r.idempotencyKey === key);
let n = 0;
const tenant = () => `t${++n}-${Math.random().toString(36).slice(2, 7)}`;

for (const dialect of DIALECTS) {
  describe(`Stripe on ${dialect}`, () => {
    const db = ledgersFor(dialect, openTestLedger, { defaults: { poolSize: 2 } as TestLedgerOptions, prepare: true });
    const ledger = (o: TestLedgerOptions = {}) => db.open({ clock: () => Date.now() + skew, ...o });

    it("a duplicate call returns the first PaymentIntent and sends nothing", async () => {
      const l = await ledger();
      const s = stripe();
      const before = piCount();
      const t = tenant();
      const first = await l.run(s.paymentIntentsCreate, { tenant: t, key: ["order-1"], args: CARD });
      const sent = sandbox.requests.length;
      const again = await l.run(s.paymentIntentsCreate, { tenant: t, key: ["order-1"], args: CARD });
      expect(first).toMatchObject({
        status: "succeeded",
        replayed: false,
        receipt: { object: "payment_intent", status: "succeeded", replayed: false },
      });
      expect(again).toMatchObject({ status: "succeeded", replayed: true });
      expect(
        again.status === "succeeded" && first.status === "succeeded" && again.receipt!.id === first.receipt!.id,
      ).toBe(true);
      expect(piCount() - before).toBe(1);
      expect(sandbox.requests.length).toBe(sent);
      const pi = sandbox.objects.all("payment_intents").at(-1)!;
      const op = (await l.get({ tenant: t, id: first.operationId })).operation;
      expect(pi.metadata).toEqual({ idem_operation: op.key });
      expect(requestsFor(op.key)).toHaveLength(1); // our key, not stripe-node's automatic one
    });

    it("16 concurrent workers on one key create one PaymentIntent, and all get its id", async () => {
      const workers = await Promise.all(Array.from({ length: 16 }, () => ledger({ waitMs: 20_000 })));
      const s = stripe();
      const before = piCount();
      const t = tenant();
      const results = await Promise.all(
        workers.map((l) => l.run(s.paymentIntentsCreate, { tenant: t, key: ["race"], args: CARD })),
      );
      expect(piCount() - before).toBe(1);
      const ids = new Set(results.map((r) => (r.status === "succeeded" ? r.receipt!.id : r.status)));
      expect(ids.size).toBe(1);
      expect([...ids][0]).toMatch(/^pi_/);
    });

    it("connection closed after commit: unknown, then the replay by key finds the one PaymentIntent", async () => {
      const l = await ledger({ budget: { baseDelayMs: 10 } });
      const s = stripe();
      const before = piCount();
      const t = tenant();
      // twice: stripe-node retries a reset connection once by itself, with our key
      sandbox.faults.add({ kind: "drop_after_commit", match: { path: "/v1/payment_intents" }, times: 2 });
      const out = await l.run(s.paymentIntentsCreate, { tenant: t, key: ["dropped"], args: CARD });
      expect(out).toMatchObject({ status: "succeeded", receipt: { replayed: true } });
      expect(piCount() - before).toBe(1);
      const created = sandbox.objects.all("payment_intents").at(-1)!;
      expect(out.status === "succeeded" && out.receipt!.id).toBe(created.id);
      const { events } = await l.get({ tenant: t, id: out.operationId });
      expect(events.map((e) => e.to)).toContain("unknown");
      const later = await l.run(s.paymentIntentsCreate, { tenant: t, key: ["dropped"], args: CARD });
      expect(later.status === "succeeded" && later.receipt!.id).toBe(created.id);
    });

    it("connection closed after commit, stripe-node's resend refused 401 (the key rolled meanwhile): unknown and alerted, not failed", async () => {
      // helper-112: the 401 answers the resend only, before Stripe reads the key; the first send charged.
      const l = await ledger({ budget: { attempts: 1 } });
      const s = stripe();
      const before = piCount();
      const t = tenant();
      sandbox.faults.add({ kind: "drop_after_commit", match: { path: "/v1/payment_intents" } });
      sandbox.faults.add({ kind: "unauthorized", match: { path: "/v1/payment_intents" }, skip: 1 });
      const out = await l
        .run(s.paymentIntentsCreate, { tenant: t, key: ["rolled"], args: CARD })
        .finally(() => sandbox.faults.clear());
      expect(piCount() - before).toBe(1);
      expect(sandbox.requests.slice(-2).map((r) => r.status)).toEqual(["dropped", 401]);
      // Before: failed ("permanent: 401"), replayed to every caller, though the card was charged.
      expect(out).toMatchObject({ status: "pending_verification", state: "unknown" });
      const { operation } = await l.get({ tenant: t, id: out.operationId });
      expect(operation.reason).toMatch(/sent the request again after its connection closed.*401|Invalid API Key/);
      expect((await l.daemon.alertsDue({ limit: 100 })).some((a) => a.id === out.operationId)).toBe(true);
    });

    it("a 500 saved under the key is looked up, and a lagging search is not taken as absence", async () => {
      sandbox.searchLagMs = 60_000;
      try {
        const l = await ledger({ actions: [] });
        const s = stripe({ searchLagMs: 60_000 });
        const before = piCount();
        const t = tenant();
        sandbox.faults.add({ kind: "error_after_commit", match: { path: "/v1/payment_intents" } });
        const out = await l.run(s.paymentIntentsCreate, { tenant: t, key: ["saved-500"], args: CARD });
        expect(out).toMatchObject({ status: "pending_verification", state: "unknown" });
        expect(piCount() - before).toBe(1);
        const withActions = await ledger({ actions: [s.paymentIntentsCreate] });
        // Still inside the lag: not found proves nothing
        expect(await withActions.daemon.settle({ tenant: t, id: out.operationId })).toMatchObject({
          status: "pending_verification",
          state: "unknown",
        });
        advance(61_000);
        const settled = await withActions.daemon.settle({ tenant: t, id: out.operationId });
        expect(settled).toMatchObject({
          status: "succeeded",
          receipt: { id: sandbox.objects.all("payment_intents").at(-1)!.id, requestId: null },
        });
        expect(piCount() - before).toBe(1);
      } finally {
        sandbox.searchLagMs = 0;
      }
    });

    it("past the 24 h key window an unknown outcome is settled by search, not by a replay", async () => {
      const s = stripe();
      const l = await ledger({ budget: { attempts: 1 }, actions: [s.paymentIntentsCreate] });
      const before = piCount();
      const t = tenant();
      sandbox.faults.add({ kind: "drop_after_commit", match: { path: "/v1/payment_intents" }, times: 2 });
      const out = await l.run(s.paymentIntentsCreate, { tenant: t, key: ["old"], args: CARD });
      expect(out).toMatchObject({ status: "pending_verification", state: "unknown" });
      advance(25 * HOUR); // Stripe has forgotten the key: a replay would create a second intent
      const sent = sandbox.requests.filter((r) => r.method === "POST").length;
      const settled = await l.daemon.settle({ tenant: t, id: out.operationId });
      expect(settled).toMatchObject({ status: "succeeded", receipt: { object: "payment_intent" } });
      expect(piCount() - before).toBe(1);
      expect(sandbox.requests.filter((r) => r.method === "POST").length).toBe(sent);
    });

    it("a reset after commit that stripe-node retries into a 503 stays unknown: not charged again past the key window", async () => {
      const s = stripe();
      const l = await ledger({ budget: { attempts: 1 }, actions: [s.paymentIntentsCreate] });
      const before = piCount();
      const t = tenant();
      // The charge commits and its connection resets; stripe-node's own retry (with our key) meets a 503.
      sandbox.faults.add({ kind: "drop_after_commit", match: { path: "/v1/payment_intents" } });
      sandbox.faults.add({ kind: "unavailable", match: { path: "/v1/payment_intents" }, skip: 1 });
      const out = await l.run(s.paymentIntentsCreate, { tenant: t, key: ["retried-503"], args: CARD });
      // The 503 says nothing of the first request: unknown, not "pending, nothing was done".
      expect(out).toMatchObject({ status: "pending_verification", state: "unknown" });
      expect(piCount() - before).toBe(1);
      advance(25 * HOUR); // Stripe has forgotten the key: a replay would create a second intent
      const settled = await l.daemon.settle({ tenant: t, id: out.operationId });
      expect(settled).toMatchObject({ status: "succeeded", receipt: { object: "payment_intent" } });
      expect(piCount() - before).toBe(1);
    });

    it("a 503 Stripe saved under our key after the charge: its replay is read as unknown, not charged again past the key window", async () => {
      const s = stripe();
      const l = await ledger({ budget: { attempts: 2, baseDelayMs: 1 }, actions: [s.paymentIntentsCreate] });
      const before = piCount();
      const t = tenant();
      // The charge commits and Stripe saves a 503 under our key: the first answer cannot tell, the
      // replay of the second attempt says it is a saved answer (Idempotent-Replayed: true).
      sandbox.faults.add({ kind: "error_after_commit", status: 503, match: { path: "/v1/payment_intents" } });
      const out = await l.run(s.paymentIntentsCreate, { tenant: t, key: ["saved-503"], args: CARD });
      expect(out).toMatchObject({ status: "pending_verification", state: "unknown" });
      const key = sandbox.requests.filter((r) => r.path === "/v1/payment_intents").at(-1)!.idempotencyKey!;
      expect(requestsFor(key).map((r) => [r.status, r.replayed])).toEqual([
        [503, false],
        [503, true],
      ]);
      expect(piCount() - before).toBe(1);
      advance(25 * HOUR); // Stripe has forgotten the key: running it again would create a second intent
      const settled = await l.daemon.settle({ tenant: t, id: out.operationId });
      expect(settled).toMatchObject({ status: "succeeded", receipt: { object: "payment_intent" } });
      expect(piCount() - before).toBe(1);
    });

    it("a 503 answered after the charge committed, on the only attempt: unknown, not charged again past the key window", async () => {
      const s = stripe();
      const l = await ledger({ budget: { attempts: 1 }, actions: [s.paymentIntentsCreate] });
      const before = piCount();
      const t = tenant();
      // Stripe began executing, charged, and answered 503 (saved under our key; this is its first answer, no replay header).
      sandbox.faults.add({ kind: "error_after_commit", status: 503, match: { path: "/v1/payment_intents" } });
      const out = await l.run(s.paymentIntentsCreate, { tenant: t, key: ["first-503"], args: CARD });
      expect(out).toMatchObject({ status: "pending_verification", state: "unknown" });
      advance(25 * HOUR); // Stripe has forgotten the key: running it again would charge again
      const again = await l.run(s.paymentIntentsCreate, { tenant: t, key: ["first-503"], args: CARD });
      expect(again).toMatchObject({ status: "succeeded", receipt: { object: "payment_intent", requestId: null } });
      expect(piCount() - before).toBe(1);
    });

    it("an incident: two 503s before execution, then a 503 after the charge, within the default budget: unknown, charged once", async () => {
      const s = stripe();
      const l = await ledger({ budget: { baseDelayMs: 5 }, actions: [s.paymentIntentsCreate] });
      const before = piCount();
      const t = tenant();
      sandbox.faults.add({ kind: "unavailable", match: { path: "/v1/payment_intents" }, times: 2 });
      sandbox.faults.add({ kind: "error_after_commit", status: 503, match: { path: "/v1/payment_intents" } });
      const out = await l.run(s.paymentIntentsCreate, { tenant: t, key: ["incident-503"], args: CARD });
      expect(out).toMatchObject({ status: "pending_verification", state: "unknown" });
      advance(25 * HOUR);
      const settled = await l.daemon.settle({ tenant: t, id: out.operationId });
      expect(settled).toMatchObject({ status: "succeeded", receipt: { object: "payment_intent" } });
      expect(piCount() - before).toBe(1);
    });

    it("a refund answered 503 after it committed, on the only attempt: unknown, not refunded again past the key window", async () => {
      const s = stripe();
      const l = await ledger({ budget: { attempts: 1 }, actions: [s.refundsCreate] });
      const t = tenant();
      const pi = await s.client.paymentIntents.create({ ...CARD, amount: 10_000 });
      const before = sandbox.count("refunds");
      sandbox.faults.add({ kind: "error_after_commit", status: 503, match: { path: "/v1/refunds" } });
      const args = { payment_intent: pi.id, amount: 3000 };
      const out = await l.run(s.refundsCreate, { tenant: t, key: ["refund", pi.id], args });
      expect(out).toMatchObject({ status: "pending_verification", state: "unknown" });
      advance(25 * HOUR);
      const again = await l.run(s.refundsCreate, { tenant: t, key: ["refund", pi.id], args });
      expect(again).toMatchObject({ status: "succeeded", receipt: { object: "refund" } });
      expect(sandbox.count("refunds") - before).toBe(1);
      expect(sandbox.objects.get("payment_intents", pi.id)).toMatchObject({ amount_refunded: 3000 });
    });

    for (const offMin of [6, -11])
      it(`the ledger's clock ${offMin} min off Stripe's, an answer lost, past the key window: a person decides, not charged again`, async () => {
        const s = stripe();
        const l = await db.open({
          clock: () => Date.now() + skew + offMin * 60_000,
          budget: { attempts: 1 },
          actions: [s.paymentIntentsCreate],
        });
        const before = piCount();
        const t = tenant();
        sandbox.faults.add({ kind: "drop_after_commit", match: { path: "/v1/payment_intents" }, times: 2 });
        const out = await l.run(s.paymentIntentsCreate, { tenant: t, key: ["skewed"], args: CARD });
        expect(out).toMatchObject({ status: "pending_verification", state: "unknown" });
        advance(25 * HOUR);
        const settled = await l.daemon.settle({ tenant: t, id: out.operationId });
        expect(settled).toMatchObject({
          status: "pending_verification",
          state: "needs_review",
          reason: expect.stringMatching(/carries our key but was created .* outside our attempts' window .*clock/),
        });
        expect(piCount() - before).toBe(1);
      });

    it("a charge left waiting for the customer's authentication reads the same answered or found past the key window: succeeded, requires_action, nothing charged", async () => {
      const s = stripe();
      const l = await ledger({ budget: { attempts: 1 }, actions: [s.paymentIntentsCreate] });
      const t = tenant();
      // No error_on_requires_action: Stripe answers 200 requires_action, a created intent that
      // waits for the customer (the charge tool's note says so; this raw action lets it).
      const args = { ...CARD, payment_method: "pm_card_threeDSecure2Required" };
      const waiting = { status: "succeeded", receipt: { object: "payment_intent", status: "requires_action" } };
      const answered = await l.run(s.paymentIntentsCreate, { tenant: t, key: ["needs-3ds", "answered"], args });
      expect(answered).toMatchObject(waiting);
      // The same request whose answer is lost, found by the lookup once Stripe forgot the key.
      sandbox.faults.add({ kind: "drop_after_commit", match: { path: "/v1/payment_intents" }, times: 2 });
      const out = await l.run(s.paymentIntentsCreate, { tenant: t, key: ["needs-3ds", "lost"], args });
      expect(out).toMatchObject({ status: "pending_verification", state: "unknown" });
      const pi = sandbox.objects.all("payment_intents").at(-1)!;
      advance(25 * HOUR);
      // Before: needs_review ("waiting for the customer to authenticate … cancel it"), where the
      // answer itself had been recorded succeeded.
      expect(await l.daemon.settle({ tenant: t, id: out.operationId })).toMatchObject({
        ...waiting,
        receipt: { ...waiting.receipt, id: pi.id, requestId: null },
      });
      for (const r of [answered, out])
        expect(
          sandbox.objects.all("charges").filter((c) => r.status === "succeeded" && c.payment_intent === r.receipt!.id),
        ).toHaveLength(0);
    });

    it("an intent found waiting for authentication that our request could not have left so (it asked Stripe to fail instead): a person decides", async () => {
      const s = stripe();
      const l = await ledger({ budget: { attempts: 1 }, actions: [s.paymentIntentsCreate] });
      const t = tenant();
      // As the charge tool confirms: Stripe fails the confirmation (402 authentication_required)
      // rather than wait; the answer is lost.
      const args = FAIL_FAST_3DS;
      sandbox.faults.add({ kind: "drop_after_commit", match: { path: "/v1/payment_intents" }, times: 2 });
      const out = await l.run(s.paymentIntentsCreate, { tenant: t, key: ["fail-fast-3ds"], args });
      expect(out).toMatchObject({ status: "pending_verification", state: "unknown" });
      const pi = sandbox.objects.all("payment_intents").at(-1)!;
      expect(pi).toMatchObject({ status: "requires_payment_method" });
      // The application confirmed it again since, with the customer there to authenticate.
      Object.assign(pi, {
        status: "requires_action",
        payment_method: "pm_1ConfirmedAgain3DS",
        last_payment_error: null,
      });
      advance(25 * HOUR);
      expect(await l.daemon.settle({ tenant: t, id: out.operationId })).toMatchObject({
        status: "pending_verification",
        state: "needs_review",
        reason: expect.stringMatching(/requires_action/),
      });
    });

    it("a charge left waiting for authentication that the customer then fails reads the same answered or found past the key window: succeeded, the intent waiting for another payment method", async () => {
      const s = stripe();
      const l = await ledger({ budget: { attempts: 1 }, actions: [s.paymentIntentsCreate] });
      const t = tenant();
      const args = { ...CARD, payment_method: "pm_card_threeDSecure2Required" };
      const answered = await l.run(s.paymentIntentsCreate, { tenant: t, key: ["3ds-failed", "answered"], args });
      expect(answered).toMatchObject({ status: "succeeded", receipt: { status: "requires_action" } });
      failAuthentication(sandbox.objects.all("payment_intents").at(-1)!);
      // The answered path: the intent was created; what the customer did since changes nothing recorded.
      expect(await l.run(s.paymentIntentsCreate, { tenant: t, key: ["3ds-failed", "answered"], args })).toMatchObject({
        status: "succeeded",
        replayed: true,
      });
      sandbox.faults.add({ kind: "drop_after_commit", match: { path: "/v1/payment_intents" }, times: 2 });
      const out = await l.run(s.paymentIntentsCreate, { tenant: t, key: ["3ds-failed", "lost"], args });
      expect(out).toMatchObject({ status: "pending_verification", state: "unknown" });
      const pi = sandbox.objects.all("payment_intents").at(-1)!;
      failAuthentication(pi);
      advance(25 * HOUR);
      // Before: failed, "Stripe declined the payment intent … (payment_intent_authentication_failure)",
      // where the answer itself (200 requires_action) had been recorded succeeded.
      expect(await l.daemon.settle({ tenant: t, id: out.operationId })).toMatchObject({
        status: "succeeded",
        receipt: { id: pi.id, object: "payment_intent", status: "requires_payment_method", requestId: null },
      });
      const made = [answered.status === "succeeded" ? answered.receipt!.id : "", pi.id];
      expect(sandbox.objects.all("charges").filter((c) => made.includes(String(c.payment_intent)))).toHaveLength(0);
    });

    it("an authentication failure found on an intent our request asked Stripe to fail rather than wait: confirmed again since, a person decides", async () => {
      const s = stripe();
      const l = await ledger({ budget: { attempts: 1 }, actions: [s.paymentIntentsCreate] });
      const t = tenant();
      const args = FAIL_FAST_3DS;
      // Stripe answers 402 authentication_required (never requires_action); the answer is lost.
      sandbox.faults.add({ kind: "drop_after_commit", match: { path: "/v1/payment_intents" }, times: 2 });
      const out = await l.run(s.paymentIntentsCreate, { tenant: t, key: ["fail-fast-3ds-failed"], args });
      expect(out).toMatchObject({ status: "pending_verification", state: "unknown" });
      // The customer's client confirmed it again since, and the customer failed the authentication.
      const pi = sandbox.objects.all("payment_intents").at(-1)!;
      failAuthentication(Object.assign(pi, { payment_method: "pm_1ConfirmedAgain3DS" }));
      advance(25 * HOUR);
      // Before: failed, read as our confirmation's decline.
      expect(await l.daemon.settle({ tenant: t, id: out.operationId })).toMatchObject({
        status: "pending_verification",
        state: "needs_review",
        reason: expect.stringMatching(/payment_intent_authentication_failure/),
      });
    });

    it("a person resolving it as succeeded records the payment intent they found as its receipt, checked as one", async () => {
      const s = stripe();
      const l = await ledger({ budget: { attempts: 1 }, actions: [s.paymentIntentsCreate] });
      const t = tenant();
      const args = { ...CARD, payment_method: "pm_card_chargeDeclined" };
      sandbox.faults.add({ kind: "drop_after_commit", match: { path: "/v1/payment_intents" }, times: 2 });
      const out = await l.run(s.paymentIntentsCreate, { tenant: t, key: ["resolved-by-a-person"], args });
      expect(out).toMatchObject({ status: "pending_verification", state: "unknown" });
      advance(25 * HOUR);
      // Declined, then another card attached since: whether our confirmation was declined cannot be told.
      const pi = sandbox.objects.all("payment_intents").at(-1)!;
      await s.client.paymentIntents.update(pi.id, { payment_method: "pm_card_visa" });
      expect(await l.daemon.settle({ tenant: t, id: out.operationId })).toMatchObject({ state: "needs_review" });
      pi.status = "succeeded"; // confirmed with the other card later; the person finds it paid
      const resolve = (receipt: unknown) =>
        l.admin.resolve({
          tenant: t,
          id: out.operationId,
          outcome: "succeeded",
          actor: "ops",
          reason: "paid",
          receipt,
        });
      // Not a payment intent: refused, nothing recorded.
      await expect(resolve({ id: "cus_1", object: "customer", status: null })).rejects.toMatchObject({
        name: "InvalidValueError",
        path: "receipt.object",
      });
      // Before: InvalidValueError "action stripe.paymentIntents.create (operation …) has no receipt
      // schema registered with this ledger", and the operation replayed `receipt: null`.
      // Naming its own object among the others: refused. Before: `others` was dropped, so a person
      // could not record a second charge they found, and its late answer was alerted again.
      await expect(
        resolve({ id: pi.id, object: "payment_intent", status: "succeeded", others: [pi.id] }),
      ).rejects.toMatchObject({ name: "InvalidValueError", path: "receipt.others" });
      await resolve({ id: pi.id, object: "payment_intent", status: "succeeded", card: "4242", others: ["pi_second"] });
      expect(await l.run(s.paymentIntentsCreate, { tenant: t, key: ["resolved-by-a-person"], args })).toMatchObject({
        status: "succeeded",
        receipt: { id: pi.id, object: "payment_intent", status: "succeeded", requestId: null, replayed: false },
      });
      // Only the receipt's fields are kept.
      expect((await l.get({ tenant: t, id: out.operationId })).operation.result).toEqual({
        id: pi.id,
        object: "payment_intent",
        status: "succeeded",
        requestId: null,
        replayed: false,
        others: ["pi_second"],
      });
    });

    it("a declined charge whose answer was lost, found past the key window: failed with the decline, not succeeded", async () => {
      const s = stripe();
      const l = await ledger({ budget: { attempts: 1 }, actions: [s.paymentIntentsCreate] });
      const before = piCount();
      const t = tenant();
      const declined = { ...CARD, payment_method: "pm_card_chargeDeclined" };
      // Stripe creates the intent, declines it and saves the 402 under our key; the answer is lost.
      sandbox.faults.add({ kind: "drop_after_commit", match: { path: "/v1/payment_intents" }, times: 2 });
      const out = await l.run(s.paymentIntentsCreate, { tenant: t, key: ["declined"], args: declined });
      expect(out).toMatchObject({ status: "pending_verification", state: "unknown" });
      advance(25 * HOUR); // past the key window: the lookup finds the intent, waiting for another card
      const settled = await l.daemon.settle({ tenant: t, id: out.operationId });
      // As the request's own answer said (a replay inside the window answers the same 402).
      expect(settled).toMatchObject({
        status: "failed",
        error: { kind: "permanent", reason: expect.stringMatching(/declined .* \(card_declined generic_decline\)/) },
      });
      expect(await l.run(s.paymentIntentsCreate, { tenant: t, key: ["declined"], args: declined })).toMatchObject({
        status: "failed",
        replayed: true,
      });
      expect(piCount() - before).toBe(1);
      expect(
        sandbox.objects
          .all("charges")
          .filter((c) => c.payment_intent === sandbox.objects.all("payment_intents").at(-1)!.id),
      ).toHaveLength(0);
    });

    it("a declined charge sent with confirm as a form value (the string true), its answer lost, found past the key window: failed with the decline, as answered", async () => {
      // stripe-node form-encodes its params, so confirm "true" is the confirmation Stripe runs (as
      // the lookup already reads an amount "2000"); the answer to it was the 402 decline.
      const s = stripe();
      const l = await ledger({ budget: { attempts: 1 }, actions: [s.paymentIntentsCreate] });
      const t = tenant();
      const declined = { ...CARD, confirm: "true", payment_method: "pm_card_chargeDeclined" } as unknown as typeof CARD;
      sandbox.faults.add({ kind: "drop_after_commit", match: { path: "/v1/payment_intents" }, times: 2 });
      const out = await l.run(s.paymentIntentsCreate, { tenant: t, key: ["declined-form"], args: declined });
      expect(out).toMatchObject({ status: "pending_verification", state: "unknown" });
      advance(25 * HOUR);
      const settled = await l.daemon.settle({ tenant: t, id: out.operationId });
      expect(settled).toMatchObject({
        status: "failed",
        error: { kind: "permanent", reason: expect.stringMatching(/card_declined generic_decline/) },
      });
    });

    it("a declined charge whose answer was lost and whose intent changed since (another card attached), Search still behind the change: a person decides, not failed", async () => {
      const s = stripe();
      const l = await ledger({ budget: { attempts: 1 }, actions: [s.paymentIntentsCreate] });
      const t = tenant();
      const declined = { ...CARD, payment_method: "pm_card_chargeDeclined" };
      sandbox.faults.add({ kind: "drop_after_commit", match: { path: "/v1/payment_intents" }, times: 2 });
      const out = await l.run(s.paymentIntentsCreate, { tenant: t, key: ["declined-then-updated"], args: declined });
      expect(out).toMatchObject({ status: "pending_verification", state: "unknown" });
      advance(25 * HOUR);
      sandbox.searchLagMs = 60_000;
      try {
        // The application attached another card: waiting for confirmation, its decline cleared
        // (Stripe clears last_payment_error on any update). Search still shows the decline.
        const pi = sandbox.objects.all("payment_intents").at(-1)!;
        await s.client.paymentIntents.update(pi.id, { payment_method: "pm_card_visa" });
        const [indexed] = (
          await s.client.paymentIntents.search({ query: `metadata['idem_operation']:'${pi.metadata.idem_operation}'` })
        ).data;
        expect(indexed).toMatchObject({
          id: pi.id,
          status: "requires_payment_method",
          last_payment_error: { code: "card_declined" },
        });
        const settled = await l.daemon.settle({ tenant: t, id: out.operationId });
        // Read from Search alone, the decline would fail the operation: the intent is read again by id.
        expect(settled).toMatchObject({
          status: "pending_verification",
          state: "needs_review",
          reason: expect.stringMatching(/created with confirm, now requires_confirmation/),
        });
      } finally {
        sandbox.searchLagMs = 0;
      }
    });

    it("an intent created without confirm, declined later by the customer's own confirmation, is still our effect", async () => {
      const s = stripe();
      const l = await ledger({ budget: { attempts: 1 }, actions: [s.paymentIntentsCreate] });
      const t = tenant();
      sandbox.faults.add({ kind: "drop_after_commit", match: { path: "/v1/payment_intents" }, times: 2 });
      const args = { amount: 2000, currency: "usd" };
      const out = await l.run(s.paymentIntentsCreate, { tenant: t, key: ["unconfirmed"], args });
      expect(out).toMatchObject({ status: "pending_verification", state: "unknown" });
      const pi = sandbox.objects.all("payment_intents").at(-1)!;
      pi.last_payment_error = { type: "card_error", code: "card_declined", message: "Your card was declined." };
      advance(25 * HOUR);
      const settled = await l.daemon.settle({ tenant: t, id: out.operationId });
      expect(settled).toMatchObject({ status: "succeeded", receipt: { id: pi.id, status: "requires_payment_method" } });
    });

    it("past the 24 h window, with Search behind (an incident): found in the list, not charged again", async () => {
      const s = stripe();
      const l = await ledger({ budget: { attempts: 1 }, actions: [s.paymentIntentsCreate] });
      const before = piCount();
      const t = tenant();
      sandbox.faults.add({ kind: "drop_after_commit", match: { path: "/v1/payment_intents" }, times: 2 });
      const out = await l.run(s.paymentIntentsCreate, { tenant: t, key: ["incident"], args: CARD });
      expect(out).toMatchObject({ status: "pending_verification", state: "unknown" });
      advance(25 * HOUR); // Stripe has forgotten the key: a replay would create a second intent
      sandbox.searchLagMs = 26 * HOUR; // nothing of the last day is in Search yet
      try {
        const settled = await l.daemon.settle({ tenant: t, id: out.operationId });
        expect(settled).toMatchObject({
          status: "succeeded",
          receipt: { id: sandbox.objects.all("payment_intents").at(-1)!.id },
        });
        expect(piCount() - before).toBe(1);
      } finally {
        sandbox.searchLagMs = 0;
      }
    });

    it("past the 24 h window, with Search refused (not offered, or down): found in the list, not charged again", async () => {
      const s = stripe();
      const l = await ledger({ budget: { attempts: 1 }, actions: [s.paymentIntentsCreate] });
      const before = piCount();
      const t = tenant();
      sandbox.faults.add({ kind: "drop_after_commit", match: { path: "/v1/payment_intents" }, times: 2 });
      const out = await l.run(s.paymentIntentsCreate, { tenant: t, key: ["no-search"], args: CARD });
      expect(out).toMatchObject({ status: "pending_verification", state: "unknown" });
      advance(25 * HOUR);
      sandbox.faults.add({ kind: "unavailable", match: { path: "/search" }, times: 1_000 });
      try {
        const settled = await l.daemon.settle({ tenant: t, id: out.operationId });
        expect(settled).toMatchObject({
          status: "succeeded",
          receipt: { id: sandbox.objects.all("payment_intents").at(-1)!.id },
        });
        expect(piCount() - before).toBe(1);
      } finally {
        sandbox.faults.clear();
      }
    });

    it(
      "SIGKILL while the request was on its way, Search refused past the 24 h window: proven absent by the list, created once",
      async () => {
        const t = tenant();
        // Stripe behind a connection that takes the request and never answers: nothing is created.
        const sockets = new Set<Socket>();
        let arrived!: () => void;
        const sent = new Promise<void>((r) => (arrived = r));
        const hole = createServer((socket) => {
          sockets.add(socket);
          socket.on("data", () => arrived());
        });
        await new Promise<void>((r) => hole.listen(0, "127.0.0.1", r));
        const child = startChild(WORKER, [], {
          LEDGER_URL: db.url(),
          TENANT: t,
          KEY: "killed-on-the-way",
          STRIPE_PORT: String((hole.address() as AddressInfo).port),
          STRIPE_KEY: server.apiKey,
          LEASE_MS: "1500",
        });
        try {
          await sent;
          await kill9(child);
        } finally {
          for (const socket of sockets) socket.destroy();
          await new Promise((r) => hole.close(r));
        }
        const s = stripe();
        const l = await ledger({ actions: [s.paymentIntentsCreate] });
        const [row] = await l.admin.list({ tenant: t });
        expect(row).toMatchObject({ status: "running", attempt: 1 });
        advance(25 * HOUR); // its lease long over, and any key window
        const before = piCount();
        sandbox.faults.add({ kind: "unavailable", match: { path: "/search" }, times: 1_000 });
        try {
          const settled = await l.daemon.settle({ tenant: t, id: row!.id });
          expect(settled).toMatchObject({ status: "succeeded", attempt: 3 }); // 2 looked it up, 3 created it
          const { events } = await l.get({ tenant: t, id: row!.id });
          expect(events.map((e) => e.reason).join("\n")).toMatch(/Stripe Search failed .*; not in the list/);
          expect(piCount() - before).toBe(1);
        } finally {
          sandbox.faults.clear();
        }
      },
      scaled(60_000),
    );

    it("503s before anything ran: unknown (a 503 may follow a charge), and past the 24 h window proven absent and created once with the same key", async () => {
      const s = stripe();
      const l = await ledger({ actions: [s.paymentIntentsCreate] });
      const t = tenant();
      sandbox.faults.add({ kind: "unavailable", match: { path: "/v1/payment_intents" }, times: 3 });
      const out = await l.run(s.paymentIntentsCreate, {
        tenant: t,
        key: ["never-sent"],
        args: CARD,
        budget: { attempts: 1 },
      });
      expect(out).toMatchObject({ status: "pending_verification", state: "unknown" });
      sandbox.faults.clear();
      const before = piCount();
      advance(25 * HOUR);
      const settled = await l.daemon.settle({ tenant: t, id: out.operationId });
      expect(settled).toMatchObject({ status: "succeeded" });
      expect(piCount() - before).toBe(1);
    });

    it("429 waits as long as Retry-After says, then succeeds once", async () => {
      const l = await ledger();
      const before = piCount();
      sandbox.faults.add({ kind: "rate_limit", match: { path: "/v1/payment_intents" }, retryAfterSec: 1 });
      const started = Date.now();
      const out = await l.run(stripe().paymentIntentsCreate, { tenant: tenant(), key: ["busy"], args: CARD });
      expect(out.status).toBe("succeeded");
      expect(Date.now() - started).toBeGreaterThanOrEqual(1_000);
      expect(piCount() - before).toBe(1);
    });

    // API versions before 2015-09-08 answered a rate limit as a 400 with the code rate_limit (the
    // sandbox does so for them); stripe-node reads it as a StripeRateLimitError.
    const OLD_API = "2015-08-19";

    it("a 400 rate_limit (an API version before 2015-09-08) to a first attempt: retried after the wait, not failed for good", async () => {
      const l = await ledger({ budget: { attempts: 3, baseDelayMs: 10 } });
      const before = piCount();
      sandbox.faults.add({ kind: "rate_limit", match: { path: "/v1/payment_intents" }, retryAfterSec: 1 });
      const t = tenant();
      const out = await l.run(stripe({ apiVersion: OLD_API }).paymentIntentsCreate, {
        tenant: t,
        key: ["busy-400"],
        args: CARD,
      });
      // Before: failed, "StripeRateLimitError rate_limit: …" (permanent), and nothing was charged.
      expect(out.status === "failed" ? `failed: ${out.error.kind}: ${out.error.reason}` : out.status).toBe("succeeded");
      const key = (await l.get({ tenant: t, id: out.operationId })).operation.key;
      expect(requestsFor(key).map((r) => r.status)).toEqual([400, 200]);
      expect(piCount() - before).toBe(1);
    });

    it("a 400 rate_limit answering the replay of a charge that committed: not recorded failed, settled by the next replay", async () => {
      const s = stripe({ apiVersion: OLD_API });
      const l = await ledger({ budget: { attempts: 1 }, actions: [s.paymentIntentsCreate] });
      const t = tenant();
      const before = piCount();
      // The charge commits, its answer is lost (twice: stripe-node retries a reset once by itself).
      sandbox.faults.add({ kind: "drop_after_commit", match: { path: "/v1/payment_intents" }, times: 2 });
      const out = await l.run(s.paymentIntentsCreate, { tenant: t, key: ["limited-replay"], args: CARD });
      expect(out).toMatchObject({ status: "pending_verification", state: "unknown" });
      const pi = sandbox.objects.all("payment_intents").at(-1)!;
      expect(pi.status).toBe("succeeded"); // the card was charged
      sandbox.faults.add({ kind: "rate_limit", match: { path: "/v1/payment_intents" } }); // the replay meets the limiter
      const key = (await l.get({ tenant: t, id: out.operationId })).operation.key;
      const settled = await l.daemon.settle({ tenant: t, id: out.operationId });
      expect(requestsFor(key).at(-1)).toMatchObject({ status: 400 });
      // Before: { status: "failed", error: { kind: "permanent" } }: "failed" for a card that was charged.
      expect(settled).toMatchObject({ status: "pending_verification", state: "unknown" });
      const later = await l.daemon.settle({ tenant: t, id: out.operationId });
      expect(later).toMatchObject({ status: "succeeded", receipt: { id: pi.id, replayed: true } });
      expect(piCount() - before).toBe(1);
    });

    it("a decline fails without a retry, names the payment intent Stripe created, and is replayed as failed", async () => {
      const l = await ledger();
      const s = stripe();
      const t = tenant();
      const args = { ...CARD, payment_method: "pm_card_chargeDeclined" };
      const out = await l.run(s.paymentIntentsCreate, { tenant: t, key: ["declined"], args });
      expect(out).toMatchObject({ status: "failed", error: { kind: "permanent" } });
      expect(out.status === "failed" && out.error.reason).toMatch(/card_declined.*generic_decline/);
      expect(out.status === "failed" && out.error.providerRequestId).toMatch(/^req_/);
      // Stripe created the intent and declined it: the stored failure, and what a model reads of
      // it, name the intent an operator finds in the dashboard. Before: the request id only.
      const pi = sandbox.objects.all("payment_intents").at(-1)!;
      expect(pi).toMatchObject({ status: "requires_payment_method", last_payment_error: { code: "card_declined" } });
      expect((await l.get({ tenant: t, id: out.operationId })).operation.error).toMatchObject({
        reason: expect.stringContaining(`payment intent ${pi.id}`),
      });
      expect(describeResult(out)).toContain(pi.id);
      const key = (await l.get({ tenant: t, id: out.operationId })).operation.key;
      expect(requestsFor(key)).toHaveLength(1);
      expect(await l.run(s.paymentIntentsCreate, { tenant: t, key: ["declined"], args })).toMatchObject({
        status: "failed",
        replayed: true,
      });
      expect(requestsFor(key)).toHaveLength(1);
    });

    it("a decline's payment intent, code and decline code are fields of the failure: on the caller's result, the stored operation and the model's sentence", async () => {
      const l = await ledger();
      const s = stripe();
      const t = tenant();
      const args = { ...CARD, payment_method: "pm_card_chargeDeclinedInsufficientFunds" };
      const out = await l.run(s.paymentIntentsCreate, { tenant: t, key: ["declined-evidence"], args });
      const pi = sandbox.objects.all("payment_intents").at(-1)!;
      const evidence = { payment_intent: pi.id, code: "card_declined", decline_code: "insufficient_funds" };
      // Before: in the reason's text only.
      expect(out).toMatchObject({ status: "failed", error: { kind: "permanent", evidence } });
      expect((await l.get({ tenant: t, id: out.operationId })).operation.error).toMatchObject({ evidence });
      expect(describeResult(out)).toContain(
        `payment_intent: ${pi.id}; code: card_declined; decline_code: insufficient_funds`,
      );
      expect(await l.run(s.paymentIntentsCreate, { tenant: t, key: ["declined-evidence"], args })).toMatchObject({
        status: "failed",
        replayed: true,
        error: { evidence },
      });
    });

    it("a decline whose answer was lost, found past the key window: the lookup gives the same evidence fields as the answer", async () => {
      const s = stripe();
      const l = await ledger({ budget: { attempts: 1 }, actions: [s.paymentIntentsCreate] });
      const t = tenant();
      const args = { ...CARD, payment_method: "pm_card_chargeDeclinedInsufficientFunds" };
      sandbox.faults.add({ kind: "drop_after_commit", match: { path: "/v1/payment_intents" }, times: 2 });
      const out = await l.run(s.paymentIntentsCreate, { tenant: t, key: ["declined-found-evidence"], args });
      expect(out).toMatchObject({ status: "pending_verification", state: "unknown" });
      const pi = sandbox.objects.all("payment_intents").at(-1)!;
      advance(25 * HOUR); // past the key window: the lookup finds the intent, waiting for another card
      const settled = await l.daemon.settle({ tenant: t, id: out.operationId });
      const evidence = { payment_intent: pi.id, code: "card_declined", decline_code: "insufficient_funds" };
      // Before: in the reason's text only.
      expect(settled).toMatchObject({ status: "failed", error: { kind: "permanent", evidence } });
      expect((await l.get({ tenant: t, id: out.operationId })).operation).toMatchObject({
        status: "failed",
        error: { evidence },
      });
      expect(await l.run(s.paymentIntentsCreate, { tenant: t, key: ["declined-found-evidence"], args })).toMatchObject({
        status: "failed",
        replayed: true,
        error: { evidence },
      });
    });

    it("a reused key with other args fails closed before any request leaves", async () => {
      const l = await ledger();
      const s = stripe();
      const t = tenant();
      await l.run(s.paymentIntentsCreate, { tenant: t, key: ["o-9"], args: CARD });
      const sent = sandbox.requests.length;
      await expect(
        l.run(s.paymentIntentsCreate, { tenant: t, key: ["o-9"], args: { ...CARD, amount: 9_999 } }),
      ).rejects.toBeInstanceOf(ArgsMismatchError);
      expect(sandbox.requests.length).toBe(sent);
    });

    it("a wrong API key fails permanently and is flagged for an alert", async () => {
      const l = await ledger();
      const out = await l.run(stripe({ apiKey: "sk_test_wrong" }).customersCreate, {
        tenant: tenant(),
        key: ["c"],
        args: { email: "a@example.com" },
      });
      expect(out).toMatchObject({ status: "failed", error: { kind: "permanent", alert: true } });
    });

    it("a refund, a customer and a generic POST are created once each", async () => {
      const l = await ledger();
      const s = stripe();
      const t = tenant();
      const pi = await l.run(s.paymentIntentsCreate, { tenant: t, key: ["r-pi"], args: CARD });
      const piId = pi.status === "succeeded" ? pi.receipt!.id : "";
      const refunds = sandbox.count("refunds");
      const customers = sandbox.count("customers");
      const products = sandbox.count("products");
      for (let i = 0; i < 2; i++) {
        expect(
          await l.run(s.refundsCreate, {
            tenant: t,
            key: ["refund", piId],
            args: { payment_intent: piId, amount: 500 },
          }),
        ).toMatchObject({ status: "succeeded" });
        expect(
          await l.run(s.customersCreate, { tenant: t, key: ["cust", "ada"], args: { email: "ada@example.com" } }),
        ).toMatchObject({ status: "succeeded" });
        expect(
          await l.run(s.post("/v1/products"), { tenant: t, key: ["prod", "x"], args: { name: "X" } }),
        ).toMatchObject({ status: "succeeded" });
      }
      expect(sandbox.count("refunds") - refunds).toBe(1);
      expect(sandbox.count("customers") - customers).toBe(1);
      expect(sandbox.count("products") - products).toBe(1);
    });

    it("12 calls in flight on one client: each once, and no listener-leak warning", async () => {
      const l = await ledger();
      const s = stripe();
      const t = tenant();
      const warnings: string[] = [];
      const onWarning = (w: Error) => warnings.push(w.name);
      process.on("warning", onWarning);
      try {
        const before = piCount();
        const outs = await Promise.all(
          Array.from({ length: 12 }, (_, i) =>
            l.run(s.paymentIntentsCreate, { tenant: t, key: ["many", i], args: CARD }),
          ),
        );
        expect(outs.map((o) => o.status)).toEqual(Array(12).fill("succeeded"));
        expect(piCount() - before).toBe(12);
        await new Promise((r) => setImmediate(r)); // warnings are emitted on the next tick
        expect(warnings).not.toContain("MaxListenersExceededWarning");
      } finally {
        process.off("warning", onWarning);
      }
    });

    it("a generic POST that updates an object leaves the marker its creating operation looks it up by", async () => {
      const l = await ledger();
      const s = stripe();
      const t = tenant();
      const created = await l.run(s.paymentIntentsCreate, { tenant: t, key: ["pi-updated"], args: CARD });
      const id = created.status === "succeeded" ? created.receipt!.id : "";
      const key = (await l.get({ tenant: t, id: created.operationId })).operation.key;
      const updated = await l.run(s.post(`/v1/payment_intents/${id}`), {
        tenant: t,
        key: ["pi-described", id],
        args: { description: "order 1234" },
      });
      expect(updated).toMatchObject({ status: "succeeded", receipt: { id } });
      expect(sandbox.objects.get("payment_intents", id)).toMatchObject({
        description: "order 1234",
        metadata: { idem_operation: key },
      });
    });

    it("a refund by charge is created once, with our key in its metadata", async () => {
      const l = await ledger();
      const s = stripe();
      const t = tenant();
      const pi = await l.run(s.paymentIntentsCreate, { tenant: t, key: ["c-pi"], args: CARD });
      const charge = sandbox.objects.get("payment_intents", pi.status === "succeeded" ? pi.receipt!.id : "")!
        .latest_charge as string;
      const before = sandbox.count("refunds");
      for (let i = 0; i < 2; i++) {
        expect(
          await l.run(s.refundsCreate, { tenant: t, key: ["refund", charge], args: { charge, amount: 700 } }),
        ).toMatchObject({ status: "succeeded", receipt: { object: "refund" } });
      }
      expect(sandbox.count("refunds") - before).toBe(1);
      expect(sandbox.objects.all("refunds").at(-1)).toMatchObject({
        charge,
        amount: 700,
        metadata: { idem_operation: expect.any(String) },
      });
    });

    it("a key reused for another customer, the earlier operation pruned, inside Stripe's key window (400 idempotency_error): not read as done with the other customer's intent", async () => {
      // An app that keeps completed operations a short while (retentionMs): the invoice was charged
      // to the wrong customer, and is charged again, to the right one, under the same key 2 min
      // later. Stripe still holds the key and answers 400 idempotency_error; the intent the lookup
      // finds with our key is for the same amount, but the other customer's.
      const s = stripe();
      const l = await ledger({ retentionMs: 60_000, actions: [s.paymentIntentsCreate] });
      const t = tenant();
      const [wrong, right] = [await s.client.customers.create({}), await s.client.customers.create({})];
      const key = ["charge", "in_customer"];
      const first = await l.run(s.paymentIntentsCreate, { tenant: t, key, args: { ...CARD, customer: wrong.id } });
      expect(first.status).toBe("succeeded");
      advance(2 * 60_000);
      expect(await l.admin.prune({ tenant: t })).toBe(1);
      const before = piCount();
      const again = await l.run(s.paymentIntentsCreate, { tenant: t, key, args: { ...CARD, customer: right.id } });
      expect(sandbox.requests.findLast((r) => r.method === "POST")).toMatchObject({ status: 400 }); // idempotency_error
      expect(piCount() - before).toBe(0); // the right customer was not charged
      // Before: succeeded, naming the wrong customer's intent.
      expect(again).toMatchObject({ status: "pending_verification", state: "needs_review" });
      const { operation } = await l.get({ tenant: t, id: again.operationId });
      expect(operation.reason).toContain(`for the customer ${wrong.id} where this operation asks ${right.id}`);
    });

    it("a key reused with a customer where the earlier, pruned operation named none, or the other way round (400 idempotency_error): not read as done", async () => {
      // The review of b849609: the customer check compared two ids only, so an intent with our key
      // and no customer (a guest charge) was taken as this customer's charge, and one of a customer
      // as a charge that named none, the card asked for never charged.
      const s = stripe();
      const l = await ledger({ retentionMs: 60_000, actions: [s.paymentIntentsCreate] });
      const t = tenant();
      const customer = await s.client.customers.create({});
      for (const [name, earlier, later] of [
        ["guest, then the customer", {}, { customer: customer.id }],
        ["the customer, then a guest", { customer: customer.id }, {}],
      ] as const) {
        const key = ["charge", "in_holder", name];
        const first = await l.run(s.paymentIntentsCreate, { tenant: t, key, args: { ...CARD, ...earlier } });
        expect(first.status, name).toBe("succeeded");
        advance(2 * 60_000);
        expect(await l.admin.prune({ tenant: t }), name).toBe(1);
        const before = piCount();
        const again = await l.run(s.paymentIntentsCreate, { tenant: t, key, args: { ...CARD, ...later } });
        expect(
          sandbox.requests.findLast((r) => r.method === "POST"),
          name,
        ).toMatchObject({ status: 400 }); // idempotency_error
        expect(piCount() - before, name).toBe(0);
        expect(again, name).toMatchObject({ status: "pending_verification", state: "needs_review" });
      }
    });

    it(
      "SIGKILL after the request reached Stripe: after the lease, the replay by key yields the same PaymentIntent",
      async () => {
        const t = tenant();
        const before = piCount();
        sandbox.faults.add({ kind: "delay_after_commit", match: { path: "/v1/payment_intents" }, delayMs: 60_000 });
        const committed = new Promise<{ object: { id: string } }>((resolve) => sandbox.events.once("commit", resolve));
        // Long enough that the killed worker's lease cannot run out by itself during the test: it
        // runs out only because the test's ledger reads the database clock moved past it.
        const leaseMs = 60_000;
        const child = startChild(WORKER, [], {
          LEDGER_URL: db.url(),
          TENANT: t,
          KEY: "killed",
          STRIPE_PORT: String(server.port),
          STRIPE_KEY: server.apiKey,
          LEASE_MS: String(leaseMs),
        });
        const { object } = await committed;
        await kill9(child);
        expect(piCount() - before).toBe(1);
        // The database clock, as the killed worker had (earlier tests moved the test clock by days,
        // past Stripe's key window), moved forward past the worker's lease: no wait for it to run out.
        const watcher = await db.open();
        const [row] = await watcher.admin.list({ tenant: t });
        expect(row).toMatchObject({ status: "running", attempt: 1 });
        const s = stripe();
        const sent = sandbox.requests.length;
        // Inside the lease, the operation is the killed worker's: nothing is sent.
        const held = await watcher.run(s.paymentIntentsCreate, { tenant: t, key: ["killed"], args: CARD, waitMs: 0 });
        expect(held).toMatchObject({ status: "pending_verification", state: "running" });
        expect(sandbox.requests.length).toBe(sent);
        const l = await db.open({ clock: () => Date.now() + leaseMs + 1_000 });
        const out = await l.run(s.paymentIntentsCreate, { tenant: t, key: ["killed"], args: CARD });
        expect(out).toMatchObject({ status: "succeeded", attempt: 2, receipt: { id: object.id, replayed: true } });
        expect(piCount() - before).toBe(1);
      },
      scaled(60_000),
    );
  });
}

/** What `fn` throws, undefined when it returns. */
function refusal(fn: () => unknown): unknown {
  try {
    fn();
    return undefined;
  } catch (error) {
    return error;
  }
}

describe("a generic POST's path", () => {
  it("is refused where the action is defined unless it begins with a single '/': stripe-node would refuse it before sending", () => {
    const s = stripe();
    const sent = sandbox.requests.length;
    // Before: defined, and each run read "outcome unknown (ambiguous: not a Stripe error: Error:
    // Request path must be a string beginning with a single "/" …); verification continues",
    // though nothing had left the process.
    for (const path of ["v1/products", "//v1/products", ""]) {
      const refused = refusal(() => s.post(path));
      expect(refused, path).toBeInstanceOf(InvalidValueError);
      expect(refused).toMatchObject({ path: "path", reason: expect.stringContaining(JSON.stringify(path)) });
    }
    expect(s.post("/v1/products").type).toBe("stripe.post:/v1/products");
    expect(sandbox.requests.length).toBe(sent);
  });

  it("is refused where the action is defined for API v2: its idempotency is not v1's, which this adapter reads", () => {
    const s = stripe();
    const sent = sandbox.requests.length;
    // Before: defined. A v2 retry with our key finishes failed work instead of returning a saved
    // answer (docs.stripe.com/api/idempotent_requests), so a 500 would be read as saved under the
    // key, and its errors and windows are not those this adapter's classification was checked on.
    for (const path of ["/v2/core/accounts", "/v2", "/V2/core/event_destinations"]) {
      const refused = refusal(() => s.post(path));
      expect(refused, path).toBeInstanceOf(InvalidValueError);
      expect(refused).toMatchObject({ path: "path", reason: expect.stringMatching(/v2.*idempoten/) });
    }
    expect(s.post("/v1/v2_lookalike").type).toBe("stripe.post:/v1/v2_lookalike");
    expect(sandbox.requests.length).toBe(sent);
  });

  it("gives no effect id: an update names the same object each time it takes effect, and two must stay two", () => {
    const s = stripe();
    // Before: the object id, so after the key window a takeover's second add_lines and the first
    // attempt's late answer (one invoice) would have been taken for one effect, not alerted.
    expect(s.post("/v1/invoices/in_1/add_lines").effectId).toBeUndefined();
    const receipt = { id: "pi_1", object: "payment_intent", status: "succeeded", requestId: "req_1", replayed: false };
    expect(s.paymentIntentsCreate.effectId?.(receipt)).toBe("pi_1");
    // A lookup's receipt of two intents with our key names both (stripe-late-answer.test.ts).
    expect(s.paymentIntentsCreate.effectId?.({ ...receipt, others: ["pi_2"] })).toEqual(["pi_1", "pi_2"]);
  });
});

describe("Stripe test mode (live, opt-in)", () => {
  const key = process.env.STRIPE_SECRET_KEY;
  const reason = !key
    ? "STRIPE_SECRET_KEY is not set"
    : !key.startsWith("sk_test_")
      ? "STRIPE_SECRET_KEY is not a test-mode key (sk_test_…)"
      : "";
  if (reason) console.log(`[skipped] live Stripe test: ${reason}`);
  it.skipIf(reason !== "")("creates one PaymentIntent for a duplicated call against real Stripe", async () => {
    const l = await openLedger(`sqlite::memory:`);
    const s = stripeActions({ apiKey: key! });
    const input = { tenant: "live-test", key: ["idem-live", Date.now()], args: CARD };
    const first = await l.run(s.paymentIntentsCreate, input);
    const again = await l.run(s.paymentIntentsCreate, input);
    expect(first.status).toBe("succeeded");
    expect(again).toMatchObject({ status: "succeeded", replayed: true });
    const op = (await l.get({ tenant: "live-test", id: first.operationId })).operation;
    const found = await s.client.paymentIntents.list({ limit: 10 });
    expect(found.data.filter((p) => p.metadata.idem_operation === op.key)).toHaveLength(1);
    await l.close();
  });
});
