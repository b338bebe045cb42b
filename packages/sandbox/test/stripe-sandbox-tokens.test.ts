/**
 * Card tokens in the Stripe sandbox, as Stripe documents them (docs.stripe.com/api/tokens), through
 * the real stripe SDK: made from card details (`POST /v1/tokens`), retrieved (`GET /v1/tokens/:id`),
 * used once by a payment method given inline. Before, a POST to /v1/tokens was kept as given (no
 * card, an id `toke_…`) and any token but Stripe's test ones was "No such token".
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type Stripe from "stripe";
import type { StripeSandbox } from "@idem/sandbox";
import { startStripeSandbox } from "./stripe-client.js";

let sandbox: StripeSandbox;
let client: Stripe;
let port: number;
let apiKey: string;
beforeAll(async () => {
  ({ sandbox, client, port, apiKey } = await startStripeSandbox());
});
afterAll(() => sandbox.close());

let k = 0;
const key = () => `tokens-test-${++k}`;
const failure = (p: Promise<unknown>) =>
  p.then(
    () => undefined,
    (e: unknown) => e as Stripe.errors.StripeError,
  );
const card = (number: string) => ({ card: { number, exp_month: "12", exp_year: "34", cvc: "123" } });
/** A charge of the card given inline by `token`. */
const chargeBy = (token: string, extra: Partial<Stripe.PaymentIntentCreateParams> = {}) =>
  client.paymentIntents.create(
    {
      amount: 1500,
      currency: "eur",
      confirm: true,
      automatic_payment_methods: { enabled: true, allow_redirects: "never" },
      payment_method_data: {
        type: "card",
        card: { token },
      } as unknown as Stripe.PaymentIntentCreateParams.PaymentMethodData,
      ...extra,
    },
    { idempotencyKey: key() },
  );

describe("Stripe sandbox: card tokens", () => {
  it("makes a token from card details and retrieves it: its card's brand as a Card names it, last four digits, expiry", async () => {
    for (const [number, brand] of [
      ["4242424242424242", "Visa"],
      ["5555555555554444", "MasterCard"],
      ["378282246310005", "American Express"],
    ] as const) {
      const made = await client.tokens.create(card(number), { idempotencyKey: key() });
      expect(made).toMatchObject({
        id: expect.stringMatching(/^tok_/),
        object: "token",
        type: "card",
        used: false,
        livemode: false,
        card: {
          id: expect.stringMatching(/^card_/),
          object: "card",
          brand,
          last4: number.slice(-4),
          exp_month: 12,
          exp_year: 2034,
        },
      });
      expect(await client.tokens.retrieve(made.id)).toEqual(made);
    }
    expect(await failure(client.tokens.retrieve("tok_1N3T00LkdIwHu7ixt44h1F8k"))).toMatchObject({
      statusCode: 404,
      code: "resource_missing",
      message: "No such token: 'tok_1N3T00LkdIwHu7ixt44h1F8k'",
    });
  });

  it("a token given inline makes a payment method of its card and is used; given again, Stripe refuses it and makes nothing", async () => {
    const token = (await client.tokens.create(card("5555555555554444"), { idempotencyKey: key() })).id;
    const pi = await chargeBy(token);
    expect(pi).toMatchObject({ status: "succeeded" });
    expect(await client.paymentMethods.retrieve(pi.payment_method as string)).toMatchObject({
      type: "card",
      card: { brand: "mastercard", last4: "4444", exp_month: 12, exp_year: 2034 },
    });
    expect(await client.tokens.retrieve(token)).toMatchObject({ used: true });
    const [intents, methods] = [sandbox.count("payment_intents"), sandbox.count("payment_methods")];
    expect(await failure(chargeBy(token))).toMatchObject({
      statusCode: 400,
      code: "token_already_used",
      param: "payment_method_data[card][token]",
    });
    expect([sandbox.count("payment_intents"), sandbox.count("payment_methods")]).toEqual([intents, methods]);
  });

  it("a request refused before it runs does not use the token", async () => {
    const token = (await client.tokens.create(card("4242424242424242"), { idempotencyKey: key() })).id;
    // No return_url, redirects allowed: refused before anything is made.
    const refused = await failure(chargeBy(token, { automatic_payment_methods: { enabled: true } }));
    expect(refused).toMatchObject({ statusCode: 400, param: "return_url" });
    expect(await client.tokens.retrieve(token)).toMatchObject({ used: false });
    expect(await chargeBy(token)).toMatchObject({ status: "succeeded" });
  });

  it("refuses what Stripe refuses: a missing expiry (400), a number that is no card's (402 incorrect_number), an unknown card field; tokens are not listed", async () => {
    const before = sandbox.count("tokens");
    const noMonth = { card: { number: "4242424242424242", exp_year: "34" } } as unknown as Stripe.TokenCreateParams;
    expect(await failure(client.tokens.create(noMonth, { idempotencyKey: key() }))).toMatchObject({
      statusCode: 400,
      code: "parameter_missing",
      param: "card[exp_month]",
    });
    expect(await failure(client.tokens.create(card("4242424242424241"), { idempotencyKey: key() }))).toMatchObject({
      statusCode: 402,
      type: "StripeCardError",
      code: "incorrect_number",
    });
    const odd = { card: { ...card("4242424242424242").card, colour: "red" } } as unknown as Stripe.TokenCreateParams;
    expect(await failure(client.tokens.create(odd, { idempotencyKey: key() }))).toMatchObject({
      statusCode: 400,
      code: "parameter_unknown",
      param: "card[colour]",
    });
    expect(sandbox.count("tokens")).toBe(before);
    // Stripe has no list of tokens: an unrecognized URL.
    const list = await fetch(`http://127.0.0.1:${port}/v1/tokens`, { headers: { authorization: `Bearer ${apiKey}` } });
    expect(list.status).toBe(404);
  });
});
