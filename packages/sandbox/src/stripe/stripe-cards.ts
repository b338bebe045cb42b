/**
 * Stripe's test payment methods (docs.stripe.com/testing): names such as `pm_card_visa` that test
 * code gives as a payment method. Each names a kind of test card, not a PaymentMethod: for every
 * request that names one, Stripe makes a new PaymentMethod (`pm_…`, the card's details on it,
 * attached to no customer), as a card collected by Stripe.js would be, and the intent, its
 * confirmation's error and `last_payment_error` carry that id, never the name. A name Stripe has
 * no test card for is an unknown payment method (400 `resource_missing`).
 *
 * The cards here are those the tests use and the common brands; their outcomes on confirmation:
 * declined ones, and cards whose issuer asks the customer to authenticate (3D Secure). Such a card
 * leaves the intent in `requires_action`, uncharged; where the customer cannot act (`off_session`)
 * or the caller said it cannot (`error_on_requires_action`), Stripe fails the confirmation instead
 * with a 402 `authentication_required` and the intent waits for another payment method
 * (docs.stripe.com/declines/codes, docs.stripe.com/api/errors).
 *
 * A payment method given inline (`payment_method_data`) is made for the request too, as Stripe
 * makes it: its type and billing details as given, a card by its number (the last four digits and
 * the expiry kept, as numbers), by a token made with `POST /v1/tokens` (its card, stripe-tokens.ts)
 * or by a test token (`tok_visa`, the card of `pm_card_visa`). Not modelled: the card's fingerprint
 * and checks, a brand read from a number given inline (`unknown`), the outcomes of test card
 * numbers (a card given by number is charged).
 */

/** A payment error as Stripe reports it, in the 402 and on the intent's `last_payment_error`. */
export type CardError = { type: "card_error"; code: string; decline_code: string; message: string };

/** What a test card does when an intent made with it is confirmed: succeed (none), decline, or ask to authenticate. */
type Outcome = { decline: CardError } | { authenticate: true } | undefined;

interface TestCard {
  /** The card's brand and last four digits, as the PaymentMethod made for it shows them. */
  readonly brand: string;
  readonly last4: string;
  readonly outcome?: Outcome;
}

const declined = (decline_code: string, message: string): Outcome => ({
  decline: { type: "card_error", code: "card_declined", decline_code, message },
});

const TEST_CARDS: Readonly<Record<string, TestCard>> = {
  pm_card_visa: { brand: "visa", last4: "4242" },
  pm_card_mastercard: { brand: "mastercard", last4: "4444" },
  pm_card_amex: { brand: "amex", last4: "0005" },
  pm_card_chargeDeclined: {
    brand: "visa",
    last4: "0002",
    outcome: declined("generic_decline", "Your card was declined."),
  },
  pm_card_chargeDeclinedInsufficientFunds: {
    brand: "visa",
    last4: "9995",
    outcome: declined("insufficient_funds", "Your card has insufficient funds."),
  },
  pm_card_authenticationRequired: { brand: "visa", last4: "3184", outcome: { authenticate: true } },
  pm_card_threeDSecure2Required: { brand: "visa", last4: "3220", outcome: { authenticate: true } },
};

export const AUTHENTICATION_REQUIRED: CardError = {
  type: "card_error",
  code: "authentication_required",
  decline_code: "authentication_required",
  message: "Your card was declined. This transaction requires authentication.",
};

/** Whether `name` is given as a test card's name (Stripe's `pm_card_` names), known or not. */
export const isTestCardName = (name: string): boolean => name.startsWith("pm_card_");

/** The test card `name` names, if Stripe has one by that name. */
export function testCard(name: string): TestCard | undefined {
  return Object.hasOwn(TEST_CARDS, name) ? TEST_CARDS[name] : undefined;
}

/** A PaymentMethod's fields but the id and its type's details: billing details as given, none attached. */
function methodFields(type: string, created: number, billing: Record<string, unknown>) {
  const address = billing.address;
  return {
    object: "payment_method",
    type,
    created,
    customer: null,
    metadata: {},
    billing_details: {
      email: billing.email ?? null,
      name: billing.name ?? null,
      phone: billing.phone ?? null,
      address: typeof address === "object" && address !== null ? { ...address } : null,
    },
  };
}

/** The PaymentMethod Stripe makes for one use of a test card: its fields but the id. */
export function paymentMethodFields(card: TestCard, created: number, billing: Record<string, unknown> = {}) {
  return {
    ...methodFields("card", created, billing),
    card: { brand: card.brand, last4: card.last4, country: "US", funding: "credit" },
  };
}

/** A failure of the request's parameters, as the caller's `invalid` makes one. */
type Refuse = (param: string, code: string, message: string) => unknown;

/**
 * The PaymentMethod Stripe makes from `payment_method_data` (see the module comment): its fields
 * but the id, the test card it is, if it is one (for its outcome), and the token it is made from,
 * if one `tokens` keeps (its caller marks it used once the payment method is made); `refuse` for
 * data Stripe refuses.
 */
export function inlinePaymentMethod(
  data: Record<string, unknown>,
  created: number,
  refuse: Refuse,
  tokens: (id: string) => Record<string, unknown> | undefined,
): { fields: Record<string, unknown>; test?: TestCard; token?: Record<string, unknown> } {
  const billing = (data.billing_details ?? {}) as Record<string, unknown>;
  if (typeof data.type !== "string")
    throw refuse(
      "payment_method_data[type]",
      "parameter_missing",
      "Missing required param: payment_method_data[type].",
    );
  if (data.type !== "card")
    return { fields: { ...methodFields(data.type, created, billing), [data.type]: data[data.type] ?? {} } };
  const card = (data.card ?? {}) as Record<string, unknown>;
  if (typeof card.token === "string") {
    const kept = tokens(card.token);
    if (kept) {
      // A token is used once (docs.stripe.com/api/tokens): its second use is refused, nothing made.
      if (kept.used === true)
        throw refuse(
          "payment_method_data[card][token]",
          "token_already_used",
          `You cannot use a Stripe token more than once: ${card.token}.`,
        );
      const base = paymentMethodFields({ brand: "unknown", last4: "" }, created, billing);
      return { fields: { ...base, card: { ...base.card, ...methodCardOf(kept) } }, token: kept };
    }
    const test = card.token.startsWith("tok_") ? testCard(`pm_card_${card.token.slice(4)}`) : undefined;
    if (!test) throw refuse("payment_method_data[card][token]", "resource_missing", `No such token: '${card.token}'`);
    return { fields: paymentMethodFields(test, created, billing), test };
  }
  const number = typeof card.number === "string" ? card.number.replace(/\s/g, "") : "";
  if (!/^\d{12,19}$/.test(number))
    throw refuse(
      "payment_method_data[card][number]",
      "parameter_missing",
      "Missing required param: payment_method_data[card][number].",
    );
  const base = paymentMethodFields({ brand: "unknown", last4: number.slice(-4) }, created, billing);
  // Stripe keeps the expiry as numbers, a two-digit year as its year in this century.
  const year = Number(card.exp_year);
  const expiry = { exp_month: Number(card.exp_month), exp_year: year < 100 ? 2000 + year : year };
  return { fields: { ...base, card: { ...base.card, ...expiry } } };
}

/** A Card object's brand as a PaymentMethod's card names it (`Visa` is `visa`); others `unknown`. */
const METHOD_BRANDS: Readonly<Record<string, string>> = {
  Visa: "visa",
  MasterCard: "mastercard",
  "American Express": "amex",
  Discover: "discover",
  "Diners Club": "diners",
  JCB: "jcb",
  UnionPay: "unionpay",
};

/** What the PaymentMethod made from a token's card keeps of it: brand (by its names), last four digits, expiry. */
export function methodCardOf(token: Record<string, unknown>): {
  brand: string;
  last4: string;
  exp_month: number;
  exp_year: number;
} {
  const card = token.card as { brand: string; last4: string; exp_month: number; exp_year: number };
  return {
    brand: METHOD_BRANDS[card.brand] ?? "unknown",
    last4: card.last4,
    exp_month: card.exp_month,
    exp_year: card.exp_year,
  };
}
