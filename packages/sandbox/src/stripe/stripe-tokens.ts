/**
 * Card tokens as Stripe documents them (docs.stripe.com/api/tokens): `POST /v1/tokens` with
 * `card[number]`, `card[exp_month]`, `card[exp_year]` (and optionally `cvc`, `name`, the
 * `address_…` fields) makes a token `tok_…` (`type: "card"`, `used: false`) holding a card object:
 * its brand as the Card object names it (`Visa`, `MasterCard`, `American Express`, …, `Unknown`,
 * read from the number's leading digits), last four digits, expiry as numbers, `funding` and
 * `country`. `GET /v1/tokens/:id` retrieves it, used or not. A token is used once: giving it inline
 * (`payment_method_data[card][token]`) makes a payment method of its card (the brand by the payment
 * method's names: `visa`, `mastercard`, `amex`, …), and the token is `used`; given again, Stripe
 * refuses it (400 `token_already_used`).
 *
 * The sandbox is an account whose secret key may send card numbers (Stripe lets an account enable
 * raw card data; most make tokens with Stripe.js instead). Stripe's test tokens (`tok_visa`) name a
 * test card, not a token kept (stripe-cards.ts): they are not retrieved here. A number failing the
 * Luhn check is a card error, as Stripe answers it (402 `incorrect_number`). Not modelled: tokens
 * of other kinds (bank accounts, PII, accounts, persons, CVC updates), refused 400 here; a card by
 * id (`card=card_…`, Connect); the card's checks and fingerprint; an expired card's refusal.
 */
/** A failure of the request's parameters (a 400), or a card error (a 402), as the caller makes one. */
type Refuse = (param: string, code: string, message: string) => unknown;

/** By the number's leading digits (the issuer ranges): the brand as Stripe's Card object names it. */
const BRANDS: readonly [RegExp, string][] = [
  [/^4/, "Visa"],
  [/^(5[1-5]|222[1-9]|22[3-9]\d|2[3-6]\d\d|27[01]\d|2720)/, "MasterCard"],
  [/^3[47]/, "American Express"],
  [/^(6011|64[4-9]|65)/, "Discover"],
  [/^(36|30[0-5]|3[89])/, "Diners Club"],
  [/^35(2[89]|[3-8]\d)/, "JCB"],
  [/^62/, "UnionPay"],
];

/** Whether `digits` pass the Luhn check, as every card number does. */
function luhn(digits: string): boolean {
  let sum = 0;
  for (let i = 0; i < digits.length; i++) {
    let d = Number(digits[digits.length - 1 - i]);
    if (i % 2 === 1) d = d * 2 > 9 ? d * 2 - 9 : d * 2;
    sum += d;
  }
  return sum % 10 === 0;
}

/**
 * The token Stripe makes of `params` (see the module comment): its fields but the id, the card's
 * own id given by `cardId`; `refuse` for what Stripe refuses before making anything, `cardError`
 * for a number that is no card's.
 */
export function tokenFields(
  params: Record<string, unknown>,
  created: number,
  cardId: string,
  refuse: Refuse,
  cardError: Refuse,
): Record<string, unknown> & { created: number; metadata: Record<string, string> } {
  const card = params.card;
  if (card === null || typeof card !== "object")
    throw refuse(
      "card",
      "parameter_missing",
      "The sandbox makes card tokens only: give card[number], card[exp_month] and card[exp_year].",
    );
  const c = card as Record<string, unknown>;
  for (const name of ["number", "exp_month", "exp_year"])
    if (c[name] === undefined || c[name] === "")
      throw refuse(`card[${name}]`, "parameter_missing", `Missing required param: card[${name}].`);
  const number = String(c.number).replace(/[\s-]/g, "");
  // A card error, as Stripe answers a number that is no card's (docs.stripe.com/error-codes).
  if (!/^\d{12,19}$/.test(number) || !luhn(number))
    throw cardError("number", "incorrect_number", "Your card number is incorrect.");
  const year = Number(c.exp_year);
  const text = (name: string) => (typeof c[name] === "string" ? c[name] : null);
  return {
    object: "token",
    type: "card",
    created,
    metadata: {},
    client_ip: null,
    used: false,
    card: {
      id: cardId,
      object: "card",
      brand: BRANDS.find(([digits]) => digits.test(number))?.[1] ?? "Unknown",
      last4: number.slice(-4),
      exp_month: Number(c.exp_month),
      exp_year: year < 100 ? 2000 + year : year,
      funding: "credit",
      country: "US",
      cvc_check: c.cvc === undefined ? null : "unchecked",
      name: text("name"),
      ...Object.fromEntries(
        ["address_city", "address_country", "address_line1", "address_line2", "address_state", "address_zip"].map(
          (f) => [f, text(f)],
        ),
      ),
      metadata: {},
    },
  };
}
