/**
 * Connect's connected accounts: an operation names the account it acts on (`stripeAccount` in its
 * args, or the adapter's config), and every request of it, the write, its replay with our key and
 * each lookup (Search, lists, retrieves), goes to that account with the `Stripe-Account` header,
 * where its objects and its idempotency key live. The account is in the args' hash (the same key
 * with another account fails closed) and in the receipt. `stripeContext` stays refused. Through
 * the real stripe SDK against the sandbox, on SQLite and Postgres.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { ArgsMismatchError, InvalidValueError } from "@idem/core";
import { openTestLedger, type TestLedgerOptions } from "@idem/core/testing";
import { StripeSandbox } from "@idem/sandbox";
import { DIALECTS, ledgersFor } from "@idem/testkit";
import { stripeActions, type StripeActions, type StripeConfig } from "@idem/stripe";
import { CARD } from "./cards.js";

const HOUR = 3_600_000;
const ACCOUNT = "acct_1ConnectedAcct";
const OTHER = "acct_1OtherConnected";

let sandbox: StripeSandbox;
let server: { port: number; apiKey: string };
let skew = 0;
/** The ledger's clock and Stripe's, moved together (Stripe forgets a key after 24 h). */
const advance = (ms: number) => {
  skew += ms;
  sandbox.advance(ms);
};
beforeAll(async () => {
  sandbox = new StripeSandbox();
  sandbox.connectAccount(ACCOUNT);
  sandbox.connectAccount(OTHER);
  server = await sandbox.start();
});
afterAll(() => sandbox.close());

/** The actions as a JavaScript caller makes them: with settings TypeScript would not let through. */
const stripe = (more: Record<string, unknown> = {}) =>
  stripeActions({
    apiKey: server.apiKey,
    host: "127.0.0.1",
    port: server.port,
    protocol: "http",
    timeoutMs: 5_000,
    ...more,
  } as StripeConfig);
/** Payment intents on `account` (the platform's when none). */
const piCount = (account?: string) => sandbox.count("payment_intents", account);
let n = 0;
const tenant = () => `t${++n}-${Math.random().toString(36).slice(2, 7)}`;
/** The requests the sandbox received from the `sent`th on. */
const since = (sent: number) => sandbox.requests.slice(sent);

/** Each action with args it would send, and how a caller would add stripe-node's option to them. */
const ACTIONS: [string, (s: StripeActions) => StripeActions["customersCreate"], Record<string, unknown>][] = [
  ["customersCreate", (s) => s.customersCreate, { email: "a@example.com" }],
  ["paymentIntentsCreate", (s) => s.paymentIntentsCreate as never, { ...CARD }],
  ["refundsCreate", (s) => s.refundsCreate as never, { payment_intent: "pi_123" }],
  ["post(/v1/products)", (s) => s.post("/v1/products") as never, { name: "Tea" }],
];

for (const dialect of DIALECTS) {
  describe(`a connected account on ${dialect}`, () => {
    const db = ledgersFor(dialect, openTestLedger, { defaults: { poolSize: 2 } as TestLedgerOptions, prepare: true });
    const ledger = (o: TestLedgerOptions = {}) => db.open({ clock: () => Date.now() + skew, ...o });

    it("stripeAccount in the args: the charge is made on that account, the receipt names it", async () => {
      const l = await ledger();
      const [platform, connected] = [piCount(), piCount(ACCOUNT)];
      const sent = sandbox.requests.length;
      const out = await l.run(stripe().paymentIntentsCreate, {
        tenant: tenant(),
        key: ["order", "connected-1"],
        args: { ...CARD, stripeAccount: ACCOUNT },
      });
      // Before: refused (InvalidValueError args.stripeAccount, "connected accounts are not supported").
      expect(out).toMatchObject({
        status: "succeeded",
        receipt: { object: "payment_intent", status: "succeeded", account: ACCOUNT },
      });
      expect({ platform: piCount() - platform, connected: piCount(ACCOUNT) - connected }).toEqual({
        platform: 0,
        connected: 1,
      });
      expect(since(sent).map((r) => [r.method, r.path, r.stripeAccount, r.status])).toEqual([
        ["POST", "/v1/payment_intents", ACCOUNT, 200],
      ]);
      // Sent as the header, not as a parameter.
      const made = sandbox.objectsOf(ACCOUNT).all("payment_intents").at(-1)!;
      expect(out.status === "succeeded" && out.receipt?.id).toBe(made.id);
      expect(made).not.toHaveProperty("stripeAccount");
    });

    it("stripeAccount in the adapter's config: every action acts on it, the receipt names it", async () => {
      const l = await ledger();
      const before = sandbox.count("customers", ACCOUNT);
      const sent = sandbox.requests.length;
      const out = await l.run(stripe({ stripeAccount: ACCOUNT }).customersCreate, {
        tenant: tenant(),
        key: ["customer", "c-1"],
        args: { email: "c@example.com" },
      });
      expect(out).toMatchObject({ status: "succeeded", receipt: { object: "customer", account: ACCOUNT } });
      expect(sandbox.count("customers", ACCOUNT) - before).toBe(1);
      expect(since(sent).map((r) => r.stripeAccount)).toEqual([ACCOUNT]);
    });

    it("its answer lost after Stripe charged, past the key window: the lookup finds the one intent on the connected account, nothing charged again", async () => {
      const s = stripe();
      const l = await ledger({ budget: { attempts: 1 }, actions: [s.paymentIntentsCreate] });
      const t = tenant();
      const [platform, connected] = [piCount(), piCount(ACCOUNT)];
      // twice: stripe-node resends a reset connection once by itself, with our key
      sandbox.faults.add({ kind: "drop_after_commit", match: { path: "/v1/payment_intents" }, times: 2 });
      const args = { ...CARD, stripeAccount: ACCOUNT };
      const out = await l.run(s.paymentIntentsCreate, { tenant: t, key: ["order", "lost"], args });
      expect(out).toMatchObject({ status: "pending_verification", state: "unknown" });
      const pi = sandbox.objectsOf(ACCOUNT).all("payment_intents").at(-1)!;
      advance(25 * HOUR); // Stripe forgot the key: a lookup, not a replay, settles it
      const sent = sandbox.requests.length;
      const settled = await l.daemon.settle({ tenant: t, id: out.operationId });
      // Found by the lookup, on the account. A lookup read on the platform finds no intent there,
      // proves it absent, and the card is charged again: a second intent, answered (a request id).
      expect(settled).toMatchObject({
        status: "succeeded",
        receipt: { id: pi.id, object: "payment_intent", status: "succeeded", requestId: null, account: ACCOUNT },
      });
      expect({ platform: piCount() - platform, connected: piCount(ACCOUNT) - connected }).toEqual({
        platform: 0,
        connected: 1,
      });
      const lookups = since(sent);
      expect(lookups.length).toBeGreaterThan(0);
      expect(lookups.filter((r) => r.stripeAccount !== ACCOUNT)).toEqual([]);
      expect(lookups.filter((r) => r.method === "POST")).toEqual([]);
    });

    it("its answer lost inside the key window: the replay with our key goes to the same account and returns its intent", async () => {
      const s = stripe();
      const l = await ledger({ budget: { attempts: 1 }, actions: [s.paymentIntentsCreate] });
      const t = tenant();
      const connected = piCount(ACCOUNT);
      sandbox.faults.add({ kind: "drop_after_commit", match: { path: "/v1/payment_intents" }, times: 2 });
      const args = { ...CARD, stripeAccount: ACCOUNT };
      const out = await l.run(s.paymentIntentsCreate, { tenant: t, key: ["order", "replayed"], args });
      expect(out).toMatchObject({ status: "pending_verification", state: "unknown" });
      const pi = sandbox.objectsOf(ACCOUNT).all("payment_intents").at(-1)!;
      const sent = sandbox.requests.length;
      const settled = await l.daemon.settle({ tenant: t, id: out.operationId });
      expect(settled).toMatchObject({ status: "succeeded", receipt: { id: pi.id, replayed: true, account: ACCOUNT } });
      expect(piCount(ACCOUNT) - connected).toBe(1);
      expect(since(sent).map((r) => [r.method, r.stripeAccount, r.replayed])).toEqual([["POST", ACCOUNT, true]]);
    });

    it("the same key with another account fails closed (ArgsMismatchError): the other account is never charged", async () => {
      const l = await ledger();
      const t = tenant();
      const s = stripe();
      const key = ["order", "moved"];
      expect(
        await l.run(s.paymentIntentsCreate, { tenant: t, key, args: { ...CARD, stripeAccount: ACCOUNT } }),
      ).toMatchObject({
        status: "succeeded",
      });
      const [platform, other] = [piCount(), piCount(OTHER)];
      const sent = sandbox.requests.length;
      for (const args of [{ ...CARD, stripeAccount: OTHER }, { ...CARD }])
        await expect(l.run(s.paymentIntentsCreate, { tenant: t, key, args })).rejects.toBeInstanceOf(ArgsMismatchError);
      expect({ platform: piCount() - platform, other: piCount(OTHER) - other, sent: since(sent) }).toEqual({
        platform: 0,
        other: 0,
        sent: [],
      });
    });

    it("an operation keeps the account of its first send: a config changed since does not move its lookup", async () => {
      const first = stripe({ stripeAccount: ACCOUNT });
      const l = await ledger({ budget: { attempts: 1 }, actions: [first.paymentIntentsCreate] });
      const t = tenant();
      sandbox.faults.add({ kind: "drop_after_commit", match: { path: "/v1/payment_intents" }, times: 2 });
      const out = await l.run(first.paymentIntentsCreate, { tenant: t, key: ["order", "pinned"], args: CARD });
      expect(out).toMatchObject({ status: "pending_verification", state: "unknown" });
      const pi = sandbox.objectsOf(ACCOUNT).all("payment_intents").at(-1)!;
      advance(25 * HOUR);
      // The process restarts with another account configured: the operation's lookup stays on the first.
      const moved = stripe({ stripeAccount: OTHER });
      const l2 = await ledger({ budget: { attempts: 1 }, actions: [moved.paymentIntentsCreate] });
      const [platform, other] = [piCount(), piCount(OTHER)];
      const sent = sandbox.requests.length;
      expect(await l2.daemon.settle({ tenant: t, id: out.operationId })).toMatchObject({
        status: "succeeded",
        receipt: { id: pi.id, account: ACCOUNT },
      });
      expect({ platform: piCount() - platform, other: piCount(OTHER) - other }).toEqual({ platform: 0, other: 0 });
      expect(since(sent).filter((r) => r.stripeAccount !== ACCOUNT)).toEqual([]);
    });

    it("an operation refused before anything ran (429) keeps its account: the daemon, whose config names none, sends it there", async () => {
      const first = stripe({ stripeAccount: ACCOUNT });
      const l = await ledger({ budget: { attempts: 1 }, actions: [first.paymentIntentsCreate] });
      const t = tenant();
      sandbox.faults.add({ kind: "rate_limit", match: { path: "/v1/payment_intents" }, retryAfterSec: 1 });
      const out = await l.run(first.paymentIntentsCreate, { tenant: t, key: ["order", "limited"], args: CARD });
      expect(out).toMatchObject({ status: "pending_verification", state: "pending" });
      const daemon = stripe(); // as `idem daemon` makes the actions: no stripeAccount in its config
      const l2 = await ledger({ actions: [daemon.paymentIntentsCreate] });
      const [platform, connected] = [piCount(), piCount(ACCOUNT)];
      const sent = sandbox.requests.length;
      expect(await l2.daemon.settle({ tenant: t, id: out.operationId })).toMatchObject({
        status: "succeeded",
        receipt: { account: ACCOUNT },
      });
      expect({ platform: piCount() - platform, connected: piCount(ACCOUNT) - connected }).toEqual({
        platform: 0,
        connected: 1,
      });
      expect(since(sent).map((r) => [r.method, r.stripeAccount])).toEqual([["POST", ACCOUNT]]);
    });

    it("an operation whose reference names no account (as every one before accounts): a config naming one now does not move it off the platform", async () => {
      const platformOnly = stripe();
      const l = await ledger({ budget: { attempts: 1 }, actions: [platformOnly.paymentIntentsCreate] });
      const t = tenant();
      sandbox.faults.add({ kind: "drop_after_commit", match: { path: "/v1/payment_intents" }, times: 2 });
      const out = await l.run(platformOnly.paymentIntentsCreate, { tenant: t, key: ["order", "before"], args: CARD });
      expect(out).toMatchObject({ status: "pending_verification", state: "unknown" });
      const pi = sandbox.objects.all("payment_intents").at(-1)!;
      advance(25 * HOUR);
      // Upgraded, its config now names a connected account: the operation's lookup stays on the platform.
      const upgraded = stripe({ stripeAccount: ACCOUNT });
      const l2 = await ledger({ actions: [upgraded.paymentIntentsCreate] });
      const [platform, connected] = [piCount(), piCount(ACCOUNT)];
      const sent = sandbox.requests.length;
      const settled = await l2.daemon.settle({ tenant: t, id: out.operationId });
      expect(settled).toMatchObject({ status: "succeeded", receipt: { id: pi.id, requestId: null } });
      expect(settled.status === "succeeded" && settled.receipt).not.toHaveProperty("account");
      expect({ platform: piCount() - platform, connected: piCount(ACCOUNT) - connected }).toEqual({
        platform: 0,
        connected: 0,
      });
      expect(since(sent).filter((r) => r.stripeAccount !== undefined)).toEqual([]);
    });

    it("the lookup's consistent list read past its first page keeps the account on every page: ours, behind 120 newer intents, is found", async () => {
      const s = stripe();
      const l = await ledger({ budget: { attempts: 1 }, actions: [s.paymentIntentsCreate] });
      const t = tenant();
      sandbox.faults.add({ kind: "drop_after_commit", match: { path: "/v1/payment_intents" }, times: 2 });
      const args = { ...CARD, stripeAccount: ACCOUNT };
      const out = await l.run(s.paymentIntentsCreate, { tenant: t, key: ["order", "paged"], args });
      expect(out).toMatchObject({ status: "pending_verification", state: "unknown" });
      const pi = sandbox.objectsOf(ACCOUNT).all("payment_intents").at(-1)!;
      for (let i = 0; i < 120; i++)
        sandbox.objectsOf(ACCOUNT).create("payment_intents", { amount: 500, currency: "usd" });
      advance(25 * HOUR);
      const [platform, connected] = [piCount(), piCount(ACCOUNT)];
      const sent = sandbox.requests.length;
      sandbox.searchLagMs = 30 * 24 * HOUR; // Search far behind (an incident): the list decides
      let settled: Awaited<ReturnType<typeof l.daemon.settle>>;
      try {
        settled = await l.daemon.settle({ tenant: t, id: out.operationId });
      } finally {
        sandbox.searchLagMs = 0;
      }
      // A next page read on the platform would not hold it: proven absent, charged again.
      expect(settled).toMatchObject({ status: "succeeded", receipt: { id: pi.id, account: ACCOUNT } });
      expect({ platform: piCount() - platform, connected: piCount(ACCOUNT) - connected }).toEqual({
        platform: 0,
        connected: 0,
      });
      const lists = since(sent).filter((r) => r.method === "GET" && r.path === "/v1/payment_intents");
      expect(lists.length).toBeGreaterThanOrEqual(2);
      expect(since(sent).filter((r) => r.stripeAccount !== ACCOUNT)).toEqual([]);
    });

    it("a refund on the connected account of a payment made there, its answer lost past the key window: found among that payment's refunds on the account, nothing refunded again", async () => {
      const s = stripe();
      const l = await ledger({ budget: { attempts: 1 }, actions: [s.paymentIntentsCreate, s.refundsCreate] });
      const t = tenant();
      const paid = await l.run(s.paymentIntentsCreate, {
        tenant: t,
        key: ["order", "to-refund"],
        args: { ...CARD, stripeAccount: ACCOUNT },
      });
      expect(paid).toMatchObject({ status: "succeeded", receipt: { account: ACCOUNT } });
      const pi = paid.status === "succeeded" ? (paid.receipt?.id ?? "") : "";
      sandbox.faults.add({ kind: "drop_after_commit", match: { path: "/v1/refunds" }, times: 2 });
      const out = await l.run(s.refundsCreate, {
        tenant: t,
        key: ["refund", "to-refund"],
        args: { payment_intent: pi, amount: 500, stripeAccount: ACCOUNT },
      });
      expect(out).toMatchObject({ status: "pending_verification", state: "unknown" });
      const refund = sandbox.objectsOf(ACCOUNT).all("refunds").at(-1)!;
      advance(25 * HOUR);
      const sent = sandbox.requests.length;
      expect(await l.daemon.settle({ tenant: t, id: out.operationId })).toMatchObject({
        status: "succeeded",
        receipt: { id: refund.id, object: "refund", requestId: null, account: ACCOUNT },
      });
      expect(
        sandbox
          .objectsOf(ACCOUNT)
          .all("refunds")
          .filter((r) => r.payment_intent === pi),
      ).toHaveLength(1);
      expect(since(sent).map((r) => [r.method, r.path, r.stripeAccount])).toEqual([["GET", "/v1/refunds", ACCOUNT]]);
    });

    it("a refund naming no account of a payment made on a connected account: failed with Stripe's answer, nothing refunded anywhere", async () => {
      const s = stripe();
      const l = await ledger();
      const t = tenant();
      const paid = await l.run(s.paymentIntentsCreate, {
        tenant: t,
        key: ["order", "refund-elsewhere"],
        args: { ...CARD, stripeAccount: ACCOUNT },
      });
      expect(paid).toMatchObject({ status: "succeeded", receipt: { account: ACCOUNT } });
      const pi = paid.status === "succeeded" ? (paid.receipt?.id ?? "") : "";
      const refunds = [sandbox.count("refunds"), sandbox.count("refunds", ACCOUNT)];
      const out = await l.run(s.refundsCreate, {
        tenant: t,
        key: ["refund", "elsewhere"],
        args: { payment_intent: pi },
      });
      expect(out).toMatchObject({
        status: "failed",
        error: { kind: "permanent", reason: expect.stringContaining(`No such payment_intent: '${pi}'`) },
      });
      expect([sandbox.count("refunds"), sandbox.count("refunds", ACCOUNT)]).toEqual(refunds);
    });

    it("a generic POST on a connected account, its answer lost inside the key window: replayed with our key on that account", async () => {
      const s = stripe();
      const products = s.post("/v1/products");
      const l = await ledger({ budget: { attempts: 1 }, actions: [products] });
      const t = tenant();
      const before = [sandbox.count("products"), sandbox.count("products", ACCOUNT)];
      sandbox.faults.add({ kind: "drop_after_commit", match: { path: "/v1/products" }, times: 2 });
      const out = await l.run(products, {
        tenant: t,
        key: ["product", "tea"],
        args: { name: "Tea", stripeAccount: ACCOUNT },
      });
      expect(out).toMatchObject({ status: "pending_verification", state: "unknown" });
      const made = sandbox.objectsOf(ACCOUNT).all("products").at(-1)!;
      const sent = sandbox.requests.length;
      expect(await l.daemon.settle({ tenant: t, id: out.operationId })).toMatchObject({
        status: "succeeded",
        receipt: { id: made.id, replayed: true, account: ACCOUNT },
      });
      expect([sandbox.count("products") - before[0]!, sandbox.count("products", ACCOUNT) - before[1]!]).toEqual([0, 1]);
      expect(since(sent).map((r) => [r.method, r.stripeAccount, r.replayed])).toEqual([["POST", ACCOUNT, true]]);
    });

    it("a charge by a token made on the connected account, its answer lost past the key window: the lookup reads the token's card there and settles on the one charge", async () => {
      const s = stripe();
      const l = await ledger({ budget: { attempts: 1 }, actions: [s.paymentIntentsCreate] });
      const t = tenant();
      const card = { number: "5555555555554444", exp_month: "12", exp_year: "2034", cvc: "123" };
      const token = (await s.client.tokens.create({ card }, { stripeAccount: ACCOUNT })).id;
      sandbox.faults.add({ kind: "drop_after_commit", match: { path: "/v1/payment_intents" }, times: 2 });
      const args = {
        ...CARD,
        payment_method: undefined,
        payment_method_data: { type: "card", card: { token } },
        stripeAccount: ACCOUNT,
      } as unknown as typeof CARD;
      const out = await l.run(s.paymentIntentsCreate, { tenant: t, key: ["order", "by-token"], args });
      expect(out).toMatchObject({ status: "pending_verification", state: "unknown" });
      const pi = sandbox.objectsOf(ACCOUNT).all("payment_intents").at(-1)!;
      advance(25 * HOUR);
      const [platform, connected] = [piCount(), piCount(ACCOUNT)];
      const sent = sandbox.requests.length;
      // Read on the platform, the token is not there: its card cannot be compared, a person decides.
      expect(await l.daemon.settle({ tenant: t, id: out.operationId })).toMatchObject({
        status: "succeeded",
        receipt: { id: pi.id, requestId: null, account: ACCOUNT },
      });
      expect({ platform: piCount() - platform, connected: piCount(ACCOUNT) - connected }).toEqual({
        platform: 0,
        connected: 0,
      });
      expect(since(sent).filter((r) => r.path === `/v1/tokens/${token}`)).toMatchObject([
        { method: "GET", stripeAccount: ACCOUNT, status: 200 },
      ]);
    });

    it("a person's retry of a charge declined on the config's account, sent by a process whose config names none: on that account", async () => {
      const first = stripe({ stripeAccount: ACCOUNT });
      const l = await ledger({ actions: [first.paymentIntentsCreate] });
      const t = tenant();
      const args = { ...CARD, payment_method: "pm_card_chargeDeclined" } as const;
      const out = await l.run(first.paymentIntentsCreate, { tenant: t, key: ["order", "declined"], args });
      expect(out).toMatchObject({ status: "failed", error: { kind: "permanent" } });
      await l.admin.retry({ tenant: t, id: out.operationId, actor: "ops", reason: "the customer updated the card" });
      const daemon = stripe(); // `idem retry --now` makes the actions from the daemon's config: no account
      const l2 = await ledger({ actions: [daemon.paymentIntentsCreate] });
      const [platform, connected] = [piCount(), piCount(ACCOUNT)];
      const sent = sandbox.requests.length;
      // Stripe still holds the key on the account: its saved decline, replayed (on the platform: a new charge).
      expect(await l2.daemon.settle({ tenant: t, id: out.operationId })).toMatchObject({ status: "failed" });
      expect({ platform: piCount() - platform, connected: piCount(ACCOUNT) - connected }).toEqual({
        platform: 0,
        connected: 0,
      });
      expect(since(sent).map((r) => [r.method, r.stripeAccount, r.replayed])).toEqual([["POST", ACCOUNT, true]]);
    });

    it("with the config naming the account, args that name it too are other args than args naming none (ArgsMismatchError): nothing sent", async () => {
      const l = await ledger();
      const t = tenant();
      const s = stripe({ stripeAccount: ACCOUNT });
      const key = ["order", "named-twice"];
      expect(await l.run(s.paymentIntentsCreate, { tenant: t, key, args: CARD })).toMatchObject({
        status: "succeeded",
        receipt: { account: ACCOUNT },
      });
      const sent = sandbox.requests.length;
      await expect(
        l.run(s.paymentIntentsCreate, { tenant: t, key, args: { ...CARD, stripeAccount: ACCOUNT } }),
      ).rejects.toBeInstanceOf(ArgsMismatchError);
      expect(since(sent)).toEqual([]);
    });

    it("an account the key cannot reach: Stripe's 403 account_invalid, failed and alerted, nothing made", async () => {
      const l = await ledger();
      const before = sandbox.count("customers");
      const out = await l.run(stripe().customersCreate, {
        tenant: tenant(),
        key: ["customer", "nowhere"],
        args: { email: "n@example.com", stripeAccount: "acct_1NotConnected" },
      });
      expect(out).toMatchObject({
        status: "failed",
        error: {
          kind: "permanent",
          reason: expect.stringContaining("does not have access to account 'acct_1NotConnected'"),
        },
      });
      expect(sandbox.count("customers") - before).toBe(0);
      expect(sandbox.requests.at(-1)).toMatchObject({ status: 403, stripeAccount: "acct_1NotConnected" });
    });

    it.each([
      ["in the args", (v: unknown) => [stripe(), { ...CARD, stripeAccount: v }] as const, "args.stripeAccount"],
      ["in the config", (v: unknown) => [stripe({ stripeAccount: v }), CARD] as const, "stripeAccount"],
    ])(
      "an account %s that is not an account id is refused naming it, nothing written or sent",
      async (_, make, path) => {
        const l = await ledger();
        for (const bad of ["", "acct_", "cus_123", "acct_1 2", 42, " acct_1ConnectedAcct"]) {
          const t = tenant();
          const sent = sandbox.requests.length;
          const refused = await (async () => {
            const [s, args] = make(bad);
            return l.run(s.paymentIntentsCreate, { tenant: t, key: ["bad-account"], args: args as typeof CARD });
          })().catch((e: unknown) => e);
          expect(refused, JSON.stringify(bad)).toBeInstanceOf(InvalidValueError);
          expect(refused).toMatchObject({ path, reason: expect.stringContaining("acct_") });
          expect(since(sent)).toEqual([]);
          expect(await l.admin.list({ tenant: t })).toEqual([]);
        }
      },
    );

    it("an absent account (undefined) is the platform account, as stripe-node reads it", async () => {
      const l = await ledger();
      const s = stripe({ stripeAccount: undefined });
      const out = await l.run(s.paymentIntentsCreate, { tenant: tenant(), key: ["platform"], args: CARD });
      expect(out).toMatchObject({ status: "succeeded" });
      expect(out.status === "succeeded" && out.receipt).not.toHaveProperty("account");
      expect(sandbox.requests.at(-1)).toMatchObject({ status: 200, stripeAccount: undefined });
    });

    it("stripeContext in the adapter's config is refused when the actions are made, naming it; nothing is sent", async () => {
      const sent = sandbox.requests.length;
      let refused: unknown;
      try {
        stripe({ stripeContext: ACCOUNT });
      } catch (error) {
        refused = error;
      }
      expect(refused).toBeInstanceOf(InvalidValueError);
      expect(refused).toMatchObject({ path: "stripeContext", reason: expect.stringContaining("stripeAccount") });
      expect(since(sent)).toEqual([]);
    });

    for (const [name, pick, args] of ACTIONS)
      it(`${name}: stripeContext in the args is refused before anything is written or sent`, async () => {
        const l = await ledger();
        const t = tenant();
        const sent = sandbox.requests.length;
        const refused = await l
          .run(pick(stripe()), {
            tenant: t,
            key: ["context", name],
            args: { ...args, stripeContext: ACCOUNT } as never,
          })
          .catch((error: unknown) => error);
        expect(refused).toBeInstanceOf(InvalidValueError);
        expect(refused).toMatchObject({ path: "args.stripeContext", reason: expect.stringContaining("stripeAccount") });
        expect(since(sent)).toEqual([]);
        expect(await l.admin.list({ tenant: t })).toEqual([]);
      });

    it("stripeContext in args made by a function: failed as rejected before send, nothing sent", async () => {
      const l = await ledger();
      const sent = sandbox.requests.length;
      const out = await l.run(stripe().paymentIntentsCreate, {
        tenant: tenant(),
        key: ["context-lazy"],
        args: () => ({ ...CARD, stripeContext: ACCOUNT }) as typeof CARD,
      });
      expect(out).toMatchObject({
        status: "failed",
        error: { kind: "rejected", reason: expect.stringContaining("args.stripeContext") },
      });
      expect(since(sent)).toEqual([]);
    });
  });
}
