/**
 * Whether the payment method a payment intent was made with is the one its args give, for a
 * lookup's judge (stripe-reconcile.ts): an intent with our key made with another card is not this
 * operation's charge. Given by id (`payment_method`), it is compared by id, except a test card's
 * name (TEST_PAYMENT_METHOD). Given inline (`payment_method_data`), Stripe makes a new payment
 * method from it for each request, so it is compared by what Stripe keeps of it: its type, the
 * billing details given, and a card number's last four digits and expiry, each read as Stripe
 * reads the form-encoded value ("12" is 12, a year "34" is 2034).
 *
 * A card given by token (`card[token]`) is compared by the card the token names, by brand and last
 * four digits: one of Stripe's test tokens (TEST_TOKENS: `tok_visa` is a Visa ending 4242) by the
 * table, any other (made by Stripe.js or `POST /v1/tokens`) by its card as Stripe gives it
 * (`GET /v1/tokens/:id`: one read per intent judged, a used token too). The payment method keeps no
 * token, so that is all the evidence there is, the same for both: an intent made with the same
 * brand and last four is taken as ours (another card of that brand ending the same would pass),
 * one with another is not. A token Stripe does not give (unknown, or the key may not read tokens),
 * or whose card is not told, leaves the intent to a person rather than read as charged on the card
 * asked for; a read that fails otherwise (connection, 5xx) fails the lookup, tried again.
 *
 * Not compared: `payment_method_options`, which say how the card is charged (3D Secure asked,
 * capture later, saved for later), not which card or how much: the intent's status, which the
 * receipt keeps, tells what came of them.
 */
import type Stripe from "stripe";
import type { StripeReads } from "./stripe-account.js";

/**
 * Stripe's test payment methods (`pm_card_visa`, docs.stripe.com/testing): each names a kind of
 * test card, for which Stripe makes a new payment method with an id of its own, so the intent
 * never carries the name given. Test mode only: live requests name real payment methods.
 */
const TEST_PAYMENT_METHOD = /^pm_card_/;

/**
 * The payment method the args name, if an intent's can be compared with it by id: a test
 * payment method's name never can (Stripe makes a new one for each use), nor "" (none).
 */
export const namedCard = (pm: unknown): string | undefined =>
  typeof pm === "string" && pm !== "" && !TEST_PAYMENT_METHOD.test(pm) ? pm : undefined;

/**
 * Stripe's test tokens (docs.stripe.com/testing), each the card it stands for: brand and last four
 * digits, as the payment method made from it shows them. Test mode only; a token not here is not
 * compared (see the module comment).
 */
const TEST_TOKENS: Readonly<Record<string, { brand: string; last4: string }>> = {
  tok_visa: { brand: "visa", last4: "4242" },
  tok_visa_debit: { brand: "visa", last4: "5556" },
  tok_mastercard: { brand: "mastercard", last4: "4444" },
  tok_mastercard_debit: { brand: "mastercard", last4: "8210" },
  tok_mastercard_prepaid: { brand: "mastercard", last4: "5100" },
  tok_amex: { brand: "amex", last4: "0005" },
  tok_discover: { brand: "discover", last4: "1117" },
  tok_chargeDeclined: { brand: "visa", last4: "0002" },
  tok_chargeDeclinedInsufficientFunds: { brand: "visa", last4: "9995" },
};

/**
 * A card's brand as a payment method names it, by the name a token's card (a Card object) gives
 * it (`Visa`, `MasterCard`, …): another name (`Unknown`, a brand with no payment method name) is
 * not compared.
 */
const METHOD_BRANDS: Readonly<Record<string, string>> = {
  Visa: "visa",
  MasterCard: "mastercard",
  "American Express": "amex",
  "Cartes Bancaires": "cartes_bancaires",
  Discover: "discover",
  "Diners Club": "diners",
  "Eftpos Australia": "eftpos_au",
  JCB: "jcb",
  UnionPay: "unionpay",
};

type TokenCard = { readonly brand: string | undefined; readonly last4: string };

/**
 * The card `token` names (see the module comment): a test token's from the table, any other's read
 * from Stripe, or why it cannot be told (Stripe's answer refusing the read, or a token without a
 * card's last four digits). Other failures of the read throw, as every read of a lookup does.
 */
async function cardOfToken(stripe: StripeReads, token: string): Promise<TokenCard | string> {
  if (Object.hasOwn(TEST_TOKENS, token)) return TEST_TOKENS[token]!;
  let read: Stripe.Token;
  try {
    read = await stripe.tokens.retrieve(token);
  } catch (error) {
    const e = error as { type?: unknown; message?: unknown };
    if (e?.type !== "StripeInvalidRequestError" && e?.type !== "StripePermissionError") throw error;
    return `Stripe did not give it: ${String(e.message)}`;
  }
  const last4 = read.card?.last4;
  if (typeof last4 !== "string" || last4 === "") return `it holds no card (${String(read.type)})`;
  return { brand: METHOD_BRANDS[read.card?.brand ?? ""], last4 };
}

/** The token an inline card is given by, if it is given by one. */
function tokenOf(data: unknown): string | undefined {
  const token = fields(fields(data)?.card)?.token;
  return typeof token === "string" ? token : undefined;
}

/** An id as Stripe renders a reference: the id, or the expanded object's. */
export const idOf = (ref: unknown): unknown =>
  ref !== null && typeof ref === "object" ? (ref as { id?: unknown }).id : ref;

type Fields = Record<string, unknown>;
const fields = (v: unknown): Fields | undefined =>
  v !== null && typeof v === "object" && !Array.isArray(v) ? (v as Fields) : undefined;

/** A whole number as Stripe reads a form-encoded one; undefined for anything else. */
function whole(v: unknown): number | undefined {
  const n = typeof v === "string" && /^\s*\d+\s*$/.test(v) ? Number(v) : v;
  return typeof n === "number" && Number.isInteger(n) ? n : undefined;
}

/** Billing details compared without case: an email's and a country code's. */
const CASELESS = new Set(["email", "country"]);

/**
 * What Stripe keeps of the inline `data` that differs in `pm`, the payment method it made (each a
 * phrase), none when all it keeps agrees. A field is compared only where `pm` renders it (Stripe
 * renders a billing detail as null when none was given) and the args give it; a card given by
 * token by `tokenCard`, the card the token names (none: not compared).
 */
export function inlineDifferences(data: unknown, pm: unknown, tokenCard?: TokenCard): string[] {
  const given = fields(data);
  const held = fields(pm);
  if (!given || !held) return [];
  const off: string[] = [];
  if (typeof given.type === "string" && typeof held.type === "string" && given.type !== held.type)
    off.push(`type (${held.type})`);
  const billing = (g: Fields | undefined, h: Fields | undefined, path: string) => {
    for (const [name, value] of Object.entries(g ?? {})) {
      if (name === "address" && h && name in h) {
        billing(fields(value), fields(h.address) ?? {}, "billing address");
        continue;
      }
      if (typeof value !== "string" || !h || !(name in h)) continue;
      const have = h[name];
      const same = (a: string, b: string) =>
        CASELESS.has(name) ? a.trim().toLowerCase() === b.trim().toLowerCase() : a.trim() === b.trim();
      if (typeof have !== "string" || !same(value, have)) off.push(`${path} ${name}`);
    }
  };
  billing(fields(given.billing_details), fields(held.billing_details), "billing");
  const card = fields(given.card);
  const kept = fields(held.card);
  if (tokenCard && kept) {
    const brand = tokenCard.brand;
    // A brand either does not tell ("unknown", a name with no payment method's) is not compared.
    if (brand !== undefined && typeof kept.brand === "string" && kept.brand !== "unknown" && kept.brand !== brand)
      off.push("card brand");
    if (typeof kept.last4 === "string" && kept.last4 !== tokenCard.last4) off.push("card number");
  }
  if (card && kept) {
    const digits = typeof card.number === "string" ? card.number.replace(/[\s-]/g, "") : undefined;
    if (digits && typeof kept.last4 === "string" && !digits.endsWith(kept.last4)) off.push("card number");
    const year = whole(card.exp_year);
    const expiry = [whole(card.exp_month), year !== undefined && year < 100 ? 2000 + year : year];
    const keptExpiry = [kept.exp_month, kept.exp_year];
    if (expiry.some((v, i) => v !== undefined && typeof keptExpiry[i] === "number" && v !== keptExpiry[i]))
      off.push("expiry");
  }
  return off;
}

/**
 * Why an intent with our key was not made with the card the args give inline, if it was not: the
 * payment method it was made with (expanded on a declined confirmation's `last_payment_error`,
 * else read by id) compared with `data` (inlineDifferences).
 */
export async function otherInlineMethod(
  stripe: StripeReads,
  intentId: string,
  madeWith: unknown,
  data: unknown,
): Promise<string | undefined> {
  const id = idOf(madeWith);
  if (!fields(data) || typeof id !== "string") return undefined;
  const pm: unknown =
    fields(madeWith)?.object === "payment_method" ? madeWith : await stripe.paymentMethods.retrieve(id);
  const token = tokenOf(data);
  const card = token === undefined ? undefined : await cardOfToken(stripe, token);
  const off = inlineDifferences(data, pm, typeof card === "string" ? undefined : card);
  if (off.length === 0 && typeof card !== "string") return undefined;
  const last4 = fields(fields(pm)?.card)?.last4;
  const what = typeof last4 === "string" ? `the card ending ${last4}` : "its details";
  const found = `found the payment intent ${intentId} with our key, made with the payment method ${id} (${what})`;
  const whether =
    "an earlier operation with this key (pruned from the ledger since) made it, or its payment method was changed since, and whether ours ran cannot be told from it; look at it in the dashboard";
  if (off.length === 0)
    return `${found}, where this operation gives the card inline by the token ${token}, whose card cannot be compared with it (a payment method keeps no token, and reading the token's card, ${String(card)}): an earlier operation with this key (pruned from the ledger since) may have made it with another card, and whether ours ran cannot be told from it; look at it in the dashboard`;
  return `${found}, not the card this operation gives inline (another ${off.join(", ")}): ${whether}`;
}
