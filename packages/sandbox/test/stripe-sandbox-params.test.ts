/**
 * The Stripe sandbox refuses what Stripe refuses before executing a request, through the real
 * stripe SDK: a top-level parameter the endpoint does not take (400 `parameter_unknown`, naming
 * it), and a `Stripe-Account` it does not know (403 `account_invalid`: one `connectAccount` did
 * not add). Neither runs nor saves anything under the request's key.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import Stripe from "stripe";
import type { StripeSandbox } from "@idem/sandbox";
import { startStripeSandbox } from "./stripe-client.js";

let sandbox: StripeSandbox;
let client: Stripe;
beforeAll(async () => {
  ({ sandbox, client } = await startStripeSandbox());
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
const key = () => `params-test-${++k}`;
/** A parameter no endpoint takes, as a caller would slip it in. */
const odd = <T>(params: T, name = "idempotencyKey") => ({ ...params, [name]: "x" }) as T;
const unknown = (param: string) => ({
  statusCode: 400,
  type: "StripeInvalidRequestError",
  rawType: "invalid_request_error",
  code: "parameter_unknown",
  param,
  message: `Received unknown parameter: ${param}`,
});

describe("Stripe sandbox: unknown parameters", () => {
  it("refuses an unknown parameter to a create (400 parameter_unknown), nothing made, nothing saved under the key", async () => {
    const idempotencyKey = key();
    const before = sandbox.count("payment_intents");
    const err = await client.paymentIntents.create(odd(card), { idempotencyKey }).catch((e: unknown) => e);
    expect(err).toMatchObject(unknown("idempotencyKey"));
    expect(sandbox.count("payment_intents")).toBe(before);
    // Not saved: the same key with the parameters Stripe takes runs.
    const pi = await client.paymentIntents.create(card, { idempotencyKey });
    expect(pi.lastResponse.headers["idempotent-replayed"]).toBeUndefined();
    expect(sandbox.count("payment_intents")).toBe(before + 1);
  });

  it("refuses one to each endpoint it implements: customers, refunds, updates, lists, Search, retrieves", async () => {
    const customer = await client.customers.create({
      email: "p@example.com",
      phone: "+1555",
      preferred_locales: ["en"],
    });
    const pi = await client.paymentIntents.create(card);
    const calls: [string, () => Promise<unknown>][] = [
      ["emial", () => client.customers.create(odd({ email: "q@example.com" }, "emial"))],
      ["amuont", () => client.refunds.create(odd({ payment_intent: pi.id }, "amuont"))],
      ["nmae", () => client.customers.update(customer.id, odd({ name: "N" }, "nmae"))],
      ["timeout", () => client.paymentIntents.update(pi.id, odd({ description: "d" }, "timeout"))],
      ["colour", () => client.customers.list(odd({ limit: 3 }, "colour"))],
      ["amount", () => client.refunds.list(odd({ payment_intent: pi.id }, "amount"))],
      ["status", () => client.charges.list(odd({ payment_intent: pi.id }, "status"))],
      ["apiKey", () => client.paymentIntents.search(odd({ query: "status:'succeeded'" }, "apiKey"))],
      ["stripeVersion", () => client.customers.retrieve(customer.id, odd({}, "stripeVersion"))],
    ];
    for (const [param, call] of calls) {
      const err = await call().then(
        () => "taken",
        (e: unknown) => e,
      );
      expect(err, param).toMatchObject(unknown(param));
    }
    expect(sandbox.objects.get("customers", customer.id)).toMatchObject({ name: null });
  });

  it("takes the parameters Stripe documents for them, and anything for a resource it only keeps as given", async () => {
    const pi = await client.paymentIntents.create({ ...card, description: "d", receipt_email: "r@example.com" });
    await client.refunds.create({ payment_intent: pi.id, amount: 100, reason: "requested_by_customer" });
    await client.customers.list({ limit: 2, created: { gte: 0 }, email: "p@example.com" });
    await client.charges.list({ payment_intent: pi.id, limit: 1 });
    await client.refunds.list({ charge: String(pi.latest_charge), created: { gte: 0 } });
    await client.paymentIntents.retrieve(pi.id, { expand: ["latest_charge"] });
    const product = await client.products.create({ name: "Tea", shippable: false });
    expect(product).toMatchObject({ name: "Tea" });
  });
});

describe("Stripe sandbox: a connected account", () => {
  it("answers a Stripe-Account it does not know as Stripe does (403 account_invalid), nothing made or saved", async () => {
    const idempotencyKey = key();
    const before = sandbox.count("customers");
    const err = await client.customers
      .create({ email: "c@example.com" }, { idempotencyKey, stripeAccount: "acct_1Unknown" })
      .catch((e: unknown) => e);
    expect(err).toBeInstanceOf(Stripe.errors.StripePermissionError);
    expect(err).toMatchObject({
      statusCode: 403,
      rawType: "invalid_request_error",
      code: "account_invalid",
      message: expect.stringMatching(
        /^The provided key 'sk_test_\*+\w{4}' does not have access to account 'acct_1Unknown' \(or that account does not exist\)/,
      ),
    });
    expect(sandbox.requests.at(-1)).toMatchObject({ status: 403, stripeAccount: "acct_1Unknown" });
    expect(sandbox.count("customers")).toBe(before);
    const made = await client.customers.create({ email: "c@example.com" }, { idempotencyKey });
    expect(made.lastResponse.headers["idempotent-replayed"]).toBeUndefined();
  });
});

describe("Stripe sandbox: a connected account named by Stripe-Context (h163)", () => {
  it("answers it as a Stripe-Account (403 account_invalid), nothing made or saved", async () => {
    const idempotencyKey = key();
    const before = sandbox.count("customers");
    const err = await client.customers
      .create({ email: "d@example.com" }, { idempotencyKey, stripeContext: "acct_1Unknown" })
      .catch((e: unknown) => e);
    expect(err).toBeInstanceOf(Stripe.errors.StripePermissionError);
    expect(err).toMatchObject({
      statusCode: 403,
      rawType: "invalid_request_error",
      code: "account_invalid",
      message: expect.stringMatching(
        /^The provided key 'sk_test_\*+\w{4}' does not have access to account 'acct_1Unknown'/,
      ),
    });
    expect(sandbox.requests.at(-1)).toMatchObject({ status: 403, stripeContext: "acct_1Unknown" });
    expect(sandbox.count("customers")).toBe(before);
    const made = await client.customers.create({ email: "d@example.com" }, { idempotencyKey });
    expect(made.lastResponse.headers["idempotent-replayed"]).toBeUndefined();
  });
});

describe("Stripe sandbox: nested parameters (h163)", () => {
  it("refuses an unknown name inside a parameter it checks (400 parameter_unknown naming its path), nothing made or saved", async () => {
    const idempotencyKey = key();
    const before = sandbox.count("payment_intents");
    const apm = { enabled: true, allow_redirects: "never", colour: "red" } as never;
    const err = await client.paymentIntents
      .create({ ...card, automatic_payment_methods: apm }, { idempotencyKey })
      .catch((e: unknown) => e);
    expect(err).toMatchObject(unknown("automatic_payment_methods[colour]"));
    expect(sandbox.count("payment_intents")).toBe(before);
    const pi = await client.paymentIntents.create(card, { idempotencyKey });
    expect(pi.lastResponse.headers["idempotent-replayed"]).toBeUndefined();
    const calls: [string, () => Promise<unknown>][] = [
      ["created[after]", () => client.customers.list({ created: { gte: 0, after: 1 } as never })],
      ["address[town]", () => client.customers.create({ address: { city: "Oslo", town: "x" } as never })],
      [
        "shipping[address][town]",
        () => client.customers.create({ shipping: { name: "N", address: { city: "Oslo", town: "x" } as never } }),
      ],
      ["created[after]", () => client.refunds.list({ payment_intent: pi.id, created: { after: 1 } as never })],
    ];
    for (const [param, call] of calls) {
      const e = await call().then(
        () => "taken",
        (x: unknown) => x,
      );
      expect(e, param).toMatchObject(unknown(param));
    }
  });

  it("takes the nested names Stripe documents, and any key in metadata", async () => {
    await client.customers.create({
      address: { city: "Oslo", country: "NO", line1: "l1", line2: "l2", postal_code: "0150", state: "O" },
      shipping: { name: "N", phone: "+47", address: { city: "Oslo", country: "NO" } },
      metadata: { anything: "goes", idem_operation: "k" },
    });
    await client.customers.list({ created: { gt: 0, gte: 0, lt: 2 ** 31, lte: 2 ** 31 } });
  });
});

describe("Stripe sandbox: answers Stripe gives for what is not there (h163)", () => {
  it("an update to a missing object is 404 resource_missing naming it, as a retrieve is; nothing saved under the key", async () => {
    const idempotencyKey = key();
    for (const [what, call] of [
      ["customer", () => client.customers.update("cus_missing", { name: "N" }, { idempotencyKey })],
      ["payment_intent", () => client.paymentIntents.update("pi_missing", { description: "d" })],
      ["product", () => client.products.update("prod_missing", { name: "Tea" })],
    ] as const) {
      const err = await call().catch((e: unknown) => e);
      expect(err, what).toBeInstanceOf(Stripe.errors.StripeInvalidRequestError);
      expect(err, what).toMatchObject({
        statusCode: 404,
        rawType: "invalid_request_error",
        code: "resource_missing",
        param: "id",
        message: `No such ${what}: '${what === "customer" ? "cus" : what === "product" ? "prod" : "pi"}_missing'`,
      });
    }
    const made = await client.customers.create({ email: "e@example.com" }, { idempotencyKey });
    expect(made.lastResponse.headers["idempotent-replayed"]).toBeUndefined();
  });

  it("has no Search of refunds (Stripe has none): /v1/refunds/search is a refund's id, and there is no such refund", async () => {
    const err = await client.rawRequest("GET", "/v1/refunds/search").catch((e: unknown) => e);
    expect(err).toMatchObject({ statusCode: 404, code: "resource_missing", message: "No such refund: 'search'" });
    const query = await client
      .rawRequest("GET", `/v1/refunds/search?query=${encodeURIComponent("metadata['idem_operation']:'k'")}`)
      .catch((e: unknown) => e);
    expect(query).toMatchObject({ statusCode: 400, code: "parameter_unknown", param: "query" });
  });
});
