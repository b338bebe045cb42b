/**
 * The Stripe sandbox keeps Stripe's documented idempotency, list and refund semantics, checked
 * with the real stripe SDK over HTTP (no ledger involved).
 */
import { once } from "node:events";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import Stripe from "stripe";
import { StripeSandbox } from "@idem/sandbox";
import { startStripeSandbox } from "./stripe-client.js";

let sandbox: StripeSandbox;
let client: Stripe;
let port = 0;
let apiKey = "";
beforeAll(async () => {
  ({ sandbox, client, port, apiKey } = await startStripeSandbox());
});
afterAll(() => sandbox.close());

// Confirmed on the server: no redirect-based payment method, so no return_url (see "confirmation" below).
const card = {
  amount: 1500,
  currency: "eur",
  payment_method: "pm_card_visa",
  confirm: true,
  automatic_payment_methods: { enabled: true, allow_redirects: "never" as const },
};
let k = 0;
const key = () => `sandbox-test-${++k}`;

describe("Stripe sandbox idempotency", () => {
  it("saves the first response and replays it with Idempotent-Replayed", async () => {
    const idempotencyKey = key();
    const a = await client.paymentIntents.create(card, { idempotencyKey });
    const b = await client.paymentIntents.create(card, { idempotencyKey });
    expect(b.id).toBe(a.id);
    expect(a.lastResponse.headers["idempotent-replayed"]).toBeUndefined();
    expect(b.lastResponse.headers["idempotent-replayed"]).toBe("true");
    expect(sandbox.objects.all("payment_intents").filter((p) => p.id === a.id)).toHaveLength(1);
  });

  it("refuses the same key with other parameters (400 idempotency_error)", async () => {
    const idempotencyKey = key();
    await client.customers.create({ email: "a@example.com" }, { idempotencyKey });
    const err = await client.customers.create({ email: "b@example.com" }, { idempotencyKey }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(Stripe.errors.StripeIdempotencyError);
    expect(err).toMatchObject({ statusCode: 400 });
  });

  it("answers 409 idempotency_key_in_use while the first request executes", async () => {
    const idempotencyKey = key();
    // Held until released, not for a while: the second request comes while the first executes
    // however slow the machine. The first's own timeout is past the hold's.
    sandbox.faults.add({ kind: "delay_before_commit", match: { path: "/v1/customers" }, delayMs: 30_000 });
    const held = once(sandbox.events, "held");
    const first = client.customers.create({ email: "slow@example.com" }, { idempotencyKey, timeout: 60_000 });
    expect(await held).toEqual([{ path: "/v1/customers", idempotencyKey }]);
    const second = await client.customers
      .create({ email: "slow@example.com" }, { idempotencyKey })
      .catch((e: unknown) => e);
    expect(second).toMatchObject({ statusCode: 409, code: "idempotency_key_in_use" });
    expect(sandbox.releaseHeldRequests()).toBe(1);
    const created = await first;
    const third = await client.customers.create({ email: "slow@example.com" }, { idempotencyKey });
    expect(third.id).toBe(created.id);
    expect(sandbox.objects.all("customers").filter((c) => c.email === "slow@example.com")).toHaveLength(1);
  });

  it("forgets keys after 24 hours", async () => {
    const idempotencyKey = key();
    const a = await client.customers.create({ email: "old@example.com" }, { idempotencyKey });
    sandbox.advance(24 * 3_600_000 + 1_000);
    const b = await client.customers.create({ email: "old@example.com" }, { idempotencyKey });
    expect(b.id).not.toBe(a.id);
  });

  it("refuses a key reused on another endpoint (400 idempotency_error), whatever the parameters", async () => {
    // "Idempotency errors occur when an Idempotency-Key is re-used on a request that does not match
    // the first request's API endpoint and parameters" (Stripe's ApiErrorType.IDEMPOTENCY_ERROR).
    const idempotencyKey = key();
    await client.customers.create({ description: "x" }, { idempotencyKey });
    const err = await client.products.create({ name: "x" }, { idempotencyKey }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(Stripe.errors.StripeIdempotencyError);
    expect(err).toMatchObject({ statusCode: 400 });
    expect(sandbox.count("products")).toBe(0);
  });

  it("keeps a key past 24 hours when keyRetentionMs says so (Stripe prunes keys at least 24 h old, not at 24 h)", async () => {
    const late = new StripeSandbox({ keyRetentionMs: 48 * 3_600_000 });
    const at = await late.start();
    try {
      const c = new Stripe(at.apiKey, { host: "127.0.0.1", port: at.port, protocol: "http", maxNetworkRetries: 0 });
      const idempotencyKey = key();
      const a = await c.customers.create({ email: "kept@example.com" }, { idempotencyKey });
      late.advance(30 * 3_600_000);
      const b = await c.customers.create({ email: "kept@example.com" }, { idempotencyKey });
      expect(b.id).toBe(a.id);
      expect(b.lastResponse.headers["idempotent-replayed"]).toBe("true");
      late.advance(19 * 3_600_000);
      const d = await c.customers.create({ email: "kept@example.com" }, { idempotencyKey });
      expect(d.id).not.toBe(a.id);
    } finally {
      await late.close();
    }
  });

  it("saves a 500 that came before the effect (error_before_effect): replayed, nothing done", async () => {
    const idempotencyKey = key();
    const before = sandbox.count("customers");
    sandbox.faults.add({ kind: "error_before_effect", match: { path: "/v1/customers" } });
    const e1 = await client.customers
      .create({ email: "broke@example.com" }, { idempotencyKey })
      .catch((e: unknown) => e);
    const e2 = await client.customers
      .create({ email: "broke@example.com" }, { idempotencyKey })
      .catch((e: unknown) => e);
    expect(e1).toMatchObject({ statusCode: 500 });
    expect((e1 as Stripe.errors.StripeError).headers?.["idempotent-replayed"]).toBeUndefined();
    expect(e2).toMatchObject({ statusCode: 500 });
    expect((e2 as Stripe.errors.StripeError).headers?.["idempotent-replayed"]).toBe("true");
    expect(sandbox.count("customers")).toBe(before);
  });

  it("does not save 401, 429 or validation failures under the key", async () => {
    const idempotencyKey = key();
    sandbox.faults.add({ kind: "rate_limit", match: { path: "/v1/payment_intents" }, retryAfterSec: 2 });
    const limited = await client.paymentIntents.create(card, { idempotencyKey }).catch((e: unknown) => e);
    expect(limited).toBeInstanceOf(Stripe.errors.StripeRateLimitError);
    expect((limited as Stripe.errors.StripeError).headers?.["retry-after"]).toBe("2");
    const invalid = await client.paymentIntents
      .create({ ...card, amount: 10 }, { idempotencyKey })
      .catch((e: unknown) => e);
    expect(invalid).toMatchObject({ statusCode: 400, code: "amount_too_small" });
    const ok = await client.paymentIntents.create(card, { idempotencyKey }); // the same key, now executing for real
    expect(ok.lastResponse.headers["idempotent-replayed"]).toBeUndefined();
  });

  it("answers a rate limit as a 400 rate_limit to an API version before 2015-09-08, as Stripe did, saving nothing", async () => {
    const old = new Stripe(apiKey, {
      host: "127.0.0.1",
      port,
      protocol: "http",
      maxNetworkRetries: 0,
      apiVersion: "2015-08-19" as Stripe.LatestApiVersion,
    });
    const idempotencyKey = key();
    sandbox.faults.add({ kind: "rate_limit", match: { path: "/v1/customers" } });
    const limited = await old.customers.create({ email: "l@example.com" }, { idempotencyKey }).catch((e: unknown) => e);
    expect(limited).toBeInstanceOf(Stripe.errors.StripeRateLimitError); // stripe-node reads it so
    expect(limited).toMatchObject({ statusCode: 400, code: "rate_limit" });
    const ok = await old.customers.create({ email: "l@example.com" }, { idempotencyKey });
    expect(ok.lastResponse.headers["idempotent-replayed"]).toBeUndefined();
  });

  it("saves a decline (the endpoint executed) and a 500 after commit", async () => {
    const declineKey = key();
    const e1 = await client.paymentIntents
      .create({ ...card, payment_method: "pm_card_chargeDeclined" }, { idempotencyKey: declineKey })
      .catch((e: unknown) => e);
    const e2 = await client.paymentIntents
      .create({ ...card, payment_method: "pm_card_chargeDeclined" }, { idempotencyKey: declineKey })
      .catch((e: unknown) => e);
    expect(e1).toMatchObject({ statusCode: 402, code: "card_declined", decline_code: "generic_decline" });
    expect(e2).toMatchObject({ statusCode: 402 });
    expect((e2 as Stripe.errors.StripeError).headers?.["idempotent-replayed"]).toBe("true");

    const errorKey = key();
    const before = sandbox.count("payment_intents");
    sandbox.faults.add({ kind: "error_after_commit", match: { path: "/v1/payment_intents" } });
    const s1 = await client.paymentIntents.create(card, { idempotencyKey: errorKey }).catch((e: unknown) => e);
    const s2 = await client.paymentIntents.create(card, { idempotencyKey: errorKey }).catch((e: unknown) => e);
    expect(s1).toMatchObject({ statusCode: 500 });
    expect(s2).toMatchObject({ statusCode: 500 });
    expect(sandbox.count("payment_intents") - before).toBe(1);
  });

  it("searches metadata, and hides objects younger than the search lag", async () => {
    sandbox.searchLagMs = 60_000;
    try {
      const c = await client.customers.create(
        { email: "s@example.com", metadata: { idem_operation: "abc" } },
        { idempotencyKey: key() },
      );
      expect((await client.customers.search({ query: "metadata['idem_operation']:'abc'" })).data).toHaveLength(0);
      sandbox.advance(61_000);
      const found = await client.customers.search({ query: "metadata['idem_operation']:'abc'" });
      expect(found.data.map((x) => x.id)).toEqual([c.id]);
    } finally {
      sandbox.searchLagMs = 0;
    }
  });

  it("pages Search with limit (1 to 100, default 10), has_more, next_page and page", async () => {
    const tag = `paged-${key()}`;
    const made: string[] = [];
    for (let i = 0; i < 12; i++) made.push((await client.customers.create({ metadata: { tag } })).id);
    const query = `metadata['tag']:'${tag}'`;
    // Before: every hit on one page, has_more false.
    const first = await client.customers.search({ query, limit: 5 });
    expect(first).toMatchObject({ object: "search_result", has_more: true, next_page: expect.any(String) });
    expect(first.data.map((c) => c.id)).toEqual(made.slice(0, 5)); // Stripe documents no order: oldest first here
    const second = await client.customers.search({ query, limit: 5, page: first.next_page! });
    expect(second.data.map((c) => c.id)).toEqual(made.slice(5, 10));
    const last = await client.customers.search({ query, limit: 5, page: second.next_page! });
    expect(last).toMatchObject({ has_more: false, next_page: null });
    expect(last.data.map((c) => c.id)).toEqual(made.slice(10));
    expect((await client.customers.search({ query })).data).toHaveLength(10); // default limit
    expect(
      (await client.customers.search({ query, limit: 5 }).autoPagingToArray({ limit: 100 })).map((c) => c.id),
    ).toEqual(made);
    await expect(client.customers.search({ query, limit: 101 })).rejects.toMatchObject({
      statusCode: 400,
      param: "limit",
    });
    await expect(client.customers.search({ query, page: "not-a-cursor" })).rejects.toMatchObject({
      statusCode: 400,
      param: "page",
    });
  });

  it("shows an update in Search only after the lag, as it does a creation (new or updated data lags)", async () => {
    const [before, after] = [`upd-${key()}`, `upd-${key()}`];
    const search = async (tag: string) =>
      (await client.paymentIntents.search({ query: `metadata['tag']:'${tag}'` })).data;
    const pi = await client.paymentIntents.create({ amount: 900, currency: "usd", metadata: { tag: before } });
    sandbox.searchLagMs = 60_000;
    try {
      sandbox.advance(61_000);
      expect((await search(before)).map((p) => p.id)).toEqual([pi.id]);
      await client.paymentIntents.update(pi.id, { metadata: { tag: after }, description: "changed" });
      // Within the lag the index holds the intent as it was before the update.
      // Before: found by its new tag at once.
      expect(await search(after)).toEqual([]);
      expect(await search(before)).toMatchObject([{ id: pi.id, description: null, metadata: { tag: before } }]);
      expect(await client.paymentIntents.retrieve(pi.id)).toMatchObject({ description: "changed" }); // a read by id is not behind
      sandbox.advance(61_000);
      expect(await search(after)).toMatchObject([{ id: pi.id, description: "changed" }]);
      expect(await search(before)).toEqual([]);
    } finally {
      sandbox.searchLagMs = 0;
    }
  });

  it("rejects a wrong API key with 401", async () => {
    const other = new Stripe("sk_test_wrong", { host: "127.0.0.1", port, protocol: "http", maxNetworkRetries: 0 });
    await expect(other.customers.create({ email: "x@example.com" })).rejects.toBeInstanceOf(
      Stripe.errors.StripeAuthenticationError,
    );
  });
});

describe("Stripe sandbox API versions", () => {
  const under = (apiVersion: string) =>
    new Stripe(apiKey, {
      host: "127.0.0.1",
      port,
      protocol: "http",
      maxNetworkRetries: 0,
      apiVersion: apiVersion as Stripe.LatestApiVersion,
    });
  /** The day after the date of stripe-node's pinned default, with its release's name: not released yet. */
  const afterDefault = () => {
    const [date, name] = Stripe.API_VERSION.split(".");
    const next = new Date(Date.parse(`${date}T00:00:00Z`) + 86_400_000).toISOString().slice(0, 10);
    return `${next}.${name}`;
  };

  it.each([
    ["not a calendar date", "2024-13-45"],
    ["a day its month does not have", "2023-02-30"],
    ["a date not written YYYY-MM-DD", "2019-2-19"],
    ["a release since acacia without its name", "2024-12-18"],
    ["a date before acacia with a release's name", "2024-06-20.basil"],
    ["a date with another release's name", "2025-04-30.acacia"],
    ["a date before Stripe's first version", "2011-06-20"],
    ["a date after the newest version known (stripe-node's default)", afterDefault()],
    ["a word", "latest"],
    ["a version with a beta the sandbox does not know", "2024-06-20; some_beta=v1"],
  ])(
    "refuses %s (%s) with Stripe's 400, before the idempotency layer: nothing saved, nothing run",
    async (_what, version) => {
      const idempotencyKey = key();
      const before = sandbox.count("customers");
      const refused = await under(version)
        .customers.create({ email: "v@example.com" }, { idempotencyKey })
        .catch((e: unknown) => e);
      expect(refused).toBeInstanceOf(Stripe.errors.StripeInvalidRequestError);
      expect(refused).toMatchObject({
        statusCode: 400,
        rawType: "invalid_request_error",
        code: undefined,
        message: `Invalid Stripe API version: ${version}`,
      });
      expect(sandbox.requests.at(-1)).toMatchObject({ status: 400, stripeVersion: version, idempotencyKey });
      expect(sandbox.count("customers")).toBe(before);
      // The same key and parameters under the SDK's version run for the first time.
      const ok = await client.customers.create({ email: "v@example.com" }, { idempotencyKey });
      expect(ok.lastResponse.headers["idempotent-replayed"]).toBeUndefined();
      expect(sandbox.count("customers")).toBe(before + 1);
    },
  );

  it.each([
    ["stripe-node's default", Stripe.API_VERSION],
    ["Stripe's first version", "2011-06-21"],
    ["a version before acacia", "2024-06-20"],
    ["acacia's first version", "2024-09-30.acacia"],
    ["a basil version", "2025-04-30.basil"],
  ])("takes %s (%s)", async (_what, version) => {
    const made = await under(version).customers.create({ email: "w@example.com" }, { idempotencyKey: key() });
    expect(made.lastResponse.headers["idempotent-replayed"]).toBeUndefined();
    expect(sandbox.requests.at(-1)).toMatchObject({ status: 200, stripeVersion: version });
  });
});

describe("Stripe sandbox: a payment intent's statuses as the request's API version names them", () => {
  // docs.stripe.com/changelog/2019-02-11/renames-several-statuses-payment-intents
  const declined = { ...card, payment_method: "pm_card_chargeDeclined" };
  const waiting = { ...card, payment_method: "pm_card_authenticationRequired" };
  const under = (apiVersion: string) =>
    new Stripe(apiKey, {
      host: "127.0.0.1",
      port,
      protocol: "http",
      maxNetworkRetries: 0,
      apiVersion: apiVersion as Stripe.LatestApiVersion,
    });

  it("before 2019-02-11: requires_source and requires_source_action, in the answer, the decline, a retrieve, a list and Search", async () => {
    const old = under("2018-11-08");
    const refused = await old.paymentIntents.create(declined, { idempotencyKey: key() }).catch((e: unknown) => e);
    expect(refused).toMatchObject({ statusCode: 402, payment_intent: { status: "requires_source" } });
    const id = (refused as { payment_intent: { id: string } }).payment_intent.id;
    expect((await old.paymentIntents.retrieve(id)).status).toBe("requires_source");
    expect(sandbox.objects.get("payment_intents", id)?.status).toBe("requires_payment_method"); // kept as it is
    const pending = await old.paymentIntents.create(waiting, { idempotencyKey: key() });
    expect(pending.status).toBe("requires_source_action");
    const listed = await old.paymentIntents.list({ limit: 100 });
    expect(listed.data.find((p) => p.id === id)?.status).toBe("requires_source");
    const found = await old.paymentIntents.search({ query: `status:'requires_payment_method'`, limit: 100 });
    expect(found.data.find((p) => p.id === id)?.status).toBe("requires_source");
    // Under today's versions the same intents read by today's names.
    expect((await client.paymentIntents.retrieve(id)).status).toBe("requires_payment_method");
    expect((await client.paymentIntents.retrieve(pending.id)).status).toBe("requires_action");
    expect((await under("2019-02-11").paymentIntents.retrieve(id)).status).toBe("requires_payment_method");
  });
});

describe("Stripe sandbox lists and refunds", () => {
  const paid = async (amount = 20_000) => client.paymentIntents.create({ ...card, amount }, { idempotencyKey: key() });

  it("a confirmed, succeeded PaymentIntent has a latest_charge that can be read", async () => {
    const pi = await paid();
    expect(pi.latest_charge).toMatch(/^ch_/);
    const charge = await client.charges.retrieve(pi.latest_charge as string);
    expect(charge).toMatchObject({ object: "charge", payment_intent: pi.id, amount: pi.amount, status: "succeeded" });
  });

  it("refunds by charge or by payment_intent, each listed under both filters", async () => {
    const pi = await paid();
    const charge = pi.latest_charge as string;
    const byCharge = await client.refunds.create({ charge, amount: 100 }, { idempotencyKey: key() });
    const byIntent = await client.refunds.create({ payment_intent: pi.id, amount: 200 }, { idempotencyKey: key() });
    expect(byCharge).toMatchObject({ charge, payment_intent: pi.id });
    expect(byIntent).toMatchObject({ charge, payment_intent: pi.id });
    const ids = [byIntent.id, byCharge.id]; // newest first
    expect((await client.refunds.list({ charge })).data.map((r) => r.id)).toEqual(ids);
    expect((await client.refunds.list({ payment_intent: pi.id })).data.map((r) => r.id)).toEqual(ids);
    await expect(client.refunds.create({ charge: "ch_missing", amount: 1 })).rejects.toMatchObject({
      statusCode: 400,
      code: "resource_missing",
    });
    await expect(client.refunds.create({ amount: 1 })).rejects.toMatchObject({
      statusCode: 400,
      code: "parameter_missing",
    });
  });

  it("filters a list on one exact created timestamp, as on a range", async () => {
    const c = await client.customers.create({ metadata: { tag: key() } });
    // Before: nothing ("1767225600", as the form encodes it, compared with the number).
    expect((await client.customers.list({ created: c.created, limit: 100 })).data.map((o) => o.id)).toContain(c.id);
    expect(
      (await client.customers.list({ created: { gte: c.created, lte: c.created }, limit: 100 })).data.map((o) => o.id),
    ).toContain(c.id);
    expect((await client.customers.list({ created: c.created + 1, limit: 100 })).data.map((o) => o.id)).not.toContain(
      c.id,
    );
  });

  it("pages newest first with limit, starting_after, ending_before and has_more", async () => {
    const pi = await paid();
    const made: string[] = [];
    for (let i = 0; i < 5; i++)
      made.push((await client.refunds.create({ payment_intent: pi.id, amount: 10 }, { idempotencyKey: key() })).id);
    const newest = [...made].reverse();
    const first = await client.refunds.list({ payment_intent: pi.id, limit: 2 });
    expect(first.data.map((r) => r.id)).toEqual(newest.slice(0, 2));
    expect(first.has_more).toBe(true);
    const second = await client.refunds.list({ payment_intent: pi.id, limit: 2, starting_after: newest[1]! });
    expect(second.data.map((r) => r.id)).toEqual(newest.slice(2, 4));
    const last = await client.refunds.list({ payment_intent: pi.id, limit: 2, starting_after: newest[3]! });
    expect(last).toMatchObject({ has_more: false, data: [{ id: newest[4] }] });
    const back = await client.refunds.list({ payment_intent: pi.id, limit: 2, ending_before: newest[3]! });
    expect(back.data.map((r) => r.id)).toEqual(newest.slice(1, 3));
    expect(back.has_more).toBe(true);
    expect(
      await client.refunds.list({ payment_intent: pi.id, limit: 2 }).autoPagingToArray({ limit: 100 }),
    ).toHaveLength(5);
    expect((await client.refunds.list({ payment_intent: pi.id })).data).toHaveLength(5); // default limit 10
    await expect(client.refunds.list({ limit: 101 })).rejects.toMatchObject({ statusCode: 400 });
    await expect(client.refunds.list({ starting_after: "re_missing" })).rejects.toMatchObject({
      statusCode: 400,
      code: "resource_missing",
    });
    await expect(client.refunds.list({ starting_after: newest[0]!, ending_before: newest[1]! })).rejects.toMatchObject({
      statusCode: 400,
    });
  });
});

describe("Stripe sandbox confirmation and test payment methods", () => {
  const failure = (p: Promise<unknown>) =>
    p.then(() => undefined).catch((e: unknown) => e as Stripe.errors.StripeError);
  const onlyCards = { allowed_payment_method_types: ["card" as const] };
  const confirmed = (payment_method: string) => ({ amount: 2000, currency: "usd", payment_method, confirm: true });

  it("refuses a confirm that may redirect without a return_url (400), as Stripe does since 2023-08-16", async () => {
    const before = sandbox.count("payment_intents");
    const err = await failure(client.paymentIntents.create(confirmed("pm_card_visa"), { idempotencyKey: key() }));
    expect(err).toBeInstanceOf(Stripe.errors.StripeInvalidRequestError);
    expect(err).toMatchObject({ statusCode: 400, type: "StripeInvalidRequestError" });
    expect(err?.message).toMatch(/^A `return_url` must be specified because this Payment Intent is configured/);
    expect(sandbox.count("payment_intents") - before).toBe(0);
    // what Stripe accepts instead: no redirects, a return_url, off-session, or only cards
    for (const extra of [
      { automatic_payment_methods: { enabled: true, allow_redirects: "never" as const } },
      { return_url: "https://example.com/back" },
      { off_session: true },
      onlyCards,
    ]) {
      const pi = await client.paymentIntents.create(
        { ...confirmed("pm_card_visa"), ...extra },
        { idempotencyKey: key() },
      );
      expect(pi.status).toBe("succeeded");
    }
  });

  it("refuses error_on_requires_action with automatic payment methods, and takes it with only cards", async () => {
    const err = await failure(
      client.paymentIntents.create(
        { ...card, payment_method: "pm_card_threeDSecure2Required", error_on_requires_action: true },
        { idempotencyKey: key() },
      ),
    );
    expect(err).toMatchObject({ statusCode: 400, param: "error_on_requires_action" });
    const pi = await client.paymentIntents.create(
      { ...confirmed("pm_card_visa"), ...onlyCards, error_on_requires_action: true },
      { idempotencyKey: key() },
    );
    expect(pi).toMatchObject({ status: "succeeded", latest_charge: expect.stringMatching(/^ch_/) });
  });

  it("declines pm_card_chargeDeclinedInsufficientFunds (402 insufficient_funds), the intent in the error and saved under the key", async () => {
    const idempotencyKey = key();
    const charges = sandbox.count("charges");
    const args = { ...confirmed("pm_card_chargeDeclinedInsufficientFunds"), ...onlyCards };
    const err = await failure(client.paymentIntents.create(args, { idempotencyKey }));
    expect(err).toBeInstanceOf(Stripe.errors.StripeCardError);
    expect(err).toMatchObject({ statusCode: 402, code: "card_declined", decline_code: "insufficient_funds" });
    // The card it was tried on is named by the error and on the intent, which itself waits for another:
    // the payment method Stripe made for the test card's name, with the card's details.
    const card = {
      id: expect.stringMatching(/^pm_(?!card_)/),
      object: "payment_method",
      card: { brand: "visa", last4: "9995" },
    };
    expect(err?.payment_method).toMatchObject(card);
    expect(err?.payment_intent).toMatchObject({
      status: "requires_payment_method",
      payment_method: null,
      last_payment_error: { code: "card_declined", decline_code: "insufficient_funds", payment_method: card },
    });
    const again = await failure(client.paymentIntents.create(args, { idempotencyKey }));
    expect(again?.headers?.["idempotent-replayed"]).toBe("true");
    expect(sandbox.count("charges") - charges).toBe(0);
  });

  it("an update clears a declined intent's last_payment_error, and a new payment method needs a confirmation again", async () => {
    const args = { ...confirmed("pm_card_chargeDeclined"), ...onlyCards };
    const err = await failure(client.paymentIntents.create(args, { idempotencyKey: key() }));
    const id = (err as { payment_intent?: { id: string } }).payment_intent!.id;
    expect(await client.paymentIntents.retrieve(id)).toMatchObject({
      status: "requires_payment_method",
      last_payment_error: { code: "card_declined" },
    });
    expect(await client.paymentIntents.update(id, { description: "any update" })).toMatchObject({
      status: "requires_payment_method",
      last_payment_error: null,
    });
    const updated = await client.paymentIntents.update(id, { payment_method: "pm_card_visa" });
    expect(updated).toMatchObject({ status: "requires_confirmation", payment_method: expect.stringMatching(/^pm_/) });
    expect(updated.payment_method).not.toBe("pm_card_visa");
  });

  it("makes a payment method of its own for each use of a test card's name, retrievable with the card's details", async () => {
    // docs.stripe.com/testing: `pm_card_visa` names a kind of test card; each request that names it
    // gets a new PaymentMethod (pm_…), as a card collected by Stripe.js would be. Before, the
    // sandbox kept the name as the intent's payment_method, which Stripe never does.
    const a = await client.paymentIntents.create(card, { idempotencyKey: key() });
    const b = await client.paymentIntents.create(card, { idempotencyKey: key() });
    const ids = [a.payment_method, b.payment_method];
    for (const id of ids) expect(id).toMatch(/^pm_(?!card_)/);
    expect(ids[0]).not.toBe(ids[1]);
    expect(await client.paymentMethods.retrieve(ids[0] as string)).toMatchObject({
      id: ids[0],
      object: "payment_method",
      type: "card",
      card: { brand: "visa", last4: "4242" },
      customer: null,
    });
    // The same request replayed under its key names the same payment method, made once.
    const idempotencyKey = key();
    const first = await client.paymentIntents.create(card, { idempotencyKey });
    const made = sandbox.count("payment_methods");
    expect((await client.paymentIntents.create(card, { idempotencyKey })).payment_method).toBe(first.payment_method);
    expect(sandbox.count("payment_methods")).toBe(made);
    // A name Stripe has no test card for is refused before anything runs, as an unknown id is.
    const unknown = await failure(
      client.paymentIntents.create({ ...card, payment_method: "pm_card_nonesuch" }, { idempotencyKey: key() }),
    );
    expect(unknown).toMatchObject({ statusCode: 400, code: "resource_missing", param: "payment_method" });
  });

  it("makes the payment method of payment_method_data for the request: a card by number or a test token, its billing details as given", async () => {
    const billing_details = { name: "Bob", email: "bob@example.com" };
    const byNumber = await client.paymentIntents.create(
      {
        amount: 1500,
        currency: "eur",
        confirm: true,
        automatic_payment_methods: { enabled: true, allow_redirects: "never" },
        payment_method_data: {
          type: "card",
          card: { number: "4000 0566 5566 5556", exp_month: 12, exp_year: 34, cvc: "123" },
          billing_details,
        } as unknown as Stripe.PaymentIntentCreateParams.PaymentMethodData,
      },
      { idempotencyKey: key() },
    );
    expect(byNumber).toMatchObject({ status: "succeeded", payment_method: expect.stringMatching(/^pm_/) });
    expect(await client.paymentMethods.retrieve(byNumber.payment_method as string)).toMatchObject({
      type: "card",
      card: { last4: "5556", exp_month: 12, exp_year: 2034 },
      billing_details,
    });
    const byToken = await failure(
      client.paymentIntents.create(
        {
          amount: 1500,
          currency: "eur",
          confirm: true,
          automatic_payment_methods: { enabled: true, allow_redirects: "never" },
          payment_method_data: {
            type: "card",
            card: { token: "tok_chargeDeclined" },
          } as unknown as Stripe.PaymentIntentCreateParams.PaymentMethodData,
        },
        { idempotencyKey: key() },
      ),
    );
    expect(byToken).toMatchObject({
      statusCode: 402,
      code: "card_declined",
      payment_method: { card: { last4: "0002" } },
    });
  });

  it("refuses payment_method and payment_method_data together, making nothing: Stripe takes one payment method", async () => {
    // Before: the sandbox took payment_method and dropped the inline card, where Stripe refuses
    // the request (a 400, nothing made, the refusal saved under the key as any 400 is).
    const [intents, methods] = [sandbox.count("payment_intents"), sandbox.count("payment_methods")];
    const idempotencyKey = key();
    const both = () =>
      failure(
        client.paymentIntents.create(
          {
            ...confirmed("pm_card_visa"),
            automatic_payment_methods: { enabled: true, allow_redirects: "never" },
            payment_method_data: {
              type: "card",
              card: { token: "tok_mastercard" },
            } as unknown as Stripe.PaymentIntentCreateParams.PaymentMethodData,
          },
          { idempotencyKey },
        ),
      );
    const refused = await both();
    expect(refused).toBeInstanceOf(Stripe.errors.StripeInvalidRequestError);
    expect(refused).toMatchObject({ statusCode: 400, param: "payment_method_data" });
    expect((await both())?.message).toBe(refused?.message);
    expect([sandbox.count("payment_intents"), sandbox.count("payment_methods")]).toEqual([intents, methods]);
  });

  it("resolves a test token given inline to its card, as Stripe does: tok_visa is a Visa ending 4242, tok_mastercard a Mastercard ending 4444", async () => {
    for (const [token, brand, last4] of [
      ["tok_visa", "visa", "4242"],
      ["tok_mastercard", "mastercard", "4444"],
    ] as const) {
      const pi = await client.paymentIntents.create(
        {
          amount: 1500,
          currency: "eur",
          confirm: true,
          automatic_payment_methods: { enabled: true, allow_redirects: "never" },
          payment_method_data: {
            type: "card",
            card: { token },
          } as unknown as Stripe.PaymentIntentCreateParams.PaymentMethodData,
        },
        { idempotencyKey: key() },
      );
      expect(await client.paymentMethods.retrieve(pi.payment_method as string)).toMatchObject({
        type: "card",
        card: { brand, last4 },
      });
    }
  });

  for (const pm of ["pm_card_authenticationRequired", "pm_card_threeDSecure2Required"]) {
    it(`leaves ${pm} waiting for the customer's authentication (requires_action), nothing charged`, async () => {
      const charges = sandbox.count("charges");
      const pi = await client.paymentIntents.create({ ...confirmed(pm), ...onlyCards }, { idempotencyKey: key() });
      expect(pi).toMatchObject({
        status: "requires_action",
        next_action: { type: "use_stripe_sdk" },
        amount_received: 0,
        latest_charge: null,
      });
      expect(sandbox.count("charges") - charges).toBe(0);
    });

    it(`fails ${pm} with 402 authentication_required under error_on_requires_action or off_session`, async () => {
      const charges = sandbox.count("charges");
      for (const extra of [{ ...onlyCards, error_on_requires_action: true }, { off_session: true }]) {
        const err = await failure(
          client.paymentIntents.create({ ...confirmed(pm), ...extra }, { idempotencyKey: key() }),
        );
        expect(err).toBeInstanceOf(Stripe.errors.StripeCardError);
        expect(err).toMatchObject({ statusCode: 402, code: "authentication_required" });
        const intent = (err as { payment_intent?: { id: string } }).payment_intent!;
        expect(await client.paymentIntents.retrieve(intent.id)).toMatchObject({
          status: "requires_payment_method",
          last_payment_error: { code: "authentication_required" },
        });
      }
      expect(sandbox.count("charges") - charges).toBe(0);
    });
  }
});
