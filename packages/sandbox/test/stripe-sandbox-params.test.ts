/**
 * The Stripe sandbox refuses what Stripe refuses before executing a request, through the real
 * stripe SDK: a top-level parameter the endpoint does not take (400 `parameter_unknown`, naming
 * it), and a `Stripe-Account` it does not know (403 `account_invalid`: it knows no connected
 * account). Neither runs nor saves anything under the request's key.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import Stripe from "stripe";
import { StripeSandbox } from "@idem/sandbox";

let sandbox: StripeSandbox;
let client: Stripe;
beforeAll(async () => {
  sandbox = new StripeSandbox();
  const started = await sandbox.start();
  client = new Stripe(started.apiKey, {
    host: "127.0.0.1",
    port: started.port,
    protocol: "http",
    maxNetworkRetries: 0,
    timeout: 3_000,
  });
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
