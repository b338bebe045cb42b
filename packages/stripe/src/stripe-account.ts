/**
 * Connect's connected accounts (docs.stripe.com/connect/authentication): a request with the
 * `Stripe-Account` header acts on that account, where the objects it makes live and where its
 * idempotency key is kept. An operation names its account (`stripeAccount` in its args, else the
 * adapter's config) and every request of it, the write, its replay with our key and each lookup
 * (Search, lists, retrieves), goes there: a lookup on the platform would find nothing of an
 * intent made on a connected account and prove it absent, and the card would be charged again.
 *
 * The account an operation first sent to is kept in its provider reference (which the ledger
 * keeps once an attempt may have sent): its replays and lookups stay there, whatever the
 * adapter's config says since. The args' account is in the args' hash too: the same key with
 * another account fails closed (ArgsMismatchError). The config's is not, and is recorded only with
 * the reference, written just before the first request: an attempt that stops before that write
 * (the ledger failed, given back as not sent) leaves no account recorded, and the next sender's
 * config decides (the daemon's names none: the platform). No action hook runs earlier; the README
 * tells callers whose first send the daemon may make to name the account in the args.
 *
 * Not supported: `stripeContext` (the `Stripe-Context` header, docs.stripe.com/context): its value
 * depends on the target's relation to the key's account (a path through an organisation), and how
 * Stripe keeps idempotency keys and Search across such contexts is not documented; refused.
 */
import type Stripe from "stripe";
import { InvalidValueError } from "@idem/core";

/** A Stripe account id, as Stripe writes one (`acct_` and letters and digits). */
const ACCOUNT_ID = /^acct_[A-Za-z0-9]{1,250}$/;

/** An account given as a caller's option: absent when undefined, as stripe-node reads it. */
const given = (o: object, name: string): unknown =>
  Object.hasOwn(o, name) ? (o as Record<string, unknown>)[name] : undefined;

/**
 * The connected account `o` names (`stripeAccount`), undefined for none; an `InvalidValueError`
 * (path: `prefix` + the option) for one that is not an account id, or for a `stripeContext`.
 */
export function accountIn(o: object, prefix = ""): string | undefined {
  if (given(o, "stripeContext") !== undefined)
    throw new InvalidValueError(
      `${prefix}stripeContext`,
      "Stripe-Context is not supported (how Stripe keeps idempotency keys and Search across its contexts is not documented); name a connected account with stripeAccount (acct_…); nothing was sent",
    );
  const account = given(o, "stripeAccount");
  if (account === undefined) return undefined;
  if (typeof account !== "string" || !ACCOUNT_ID.test(account))
    throw new InvalidValueError(
      `${prefix}stripeAccount`,
      `a connected account is named by its Stripe id, acct_ followed by letters and digits; got ${JSON.stringify(account) ?? String(account)}; nothing was sent`,
    );
  return account;
}

const ON = " on ";

/** The provider reference of an operation: our idempotency key, and the account it is kept on. */
export function referenceOf(key: string, account: string | undefined): string {
  return `idempotency-key:${key}${account === undefined ? "" : `${ON}${account}`}`;
}

/** The account a provider reference names (undefined: the platform's, as every reference before accounts were). */
export function accountOfReference(reference: string): string | undefined {
  const at = reference.lastIndexOf(ON);
  const account = at < 0 ? undefined : reference.slice(at + ON.length);
  return account !== undefined && ACCOUNT_ID.test(account) ? account : undefined;
}

/**
 * The subset of stripe-node the lookups read, every request bound to one account: a lookup cannot
 * read elsewhere than the operation's account. (stripe-node reads a retrieve's second argument
 * as its params: the options go third.)
 */
export interface StripeReads {
  readonly customers: {
    search(p: Stripe.CustomerSearchParams): Stripe.ApiSearchResultPromise<Stripe.Customer>;
    list(p: Stripe.CustomerListParams): Stripe.ApiListPromise<Stripe.Customer>;
  };
  readonly paymentIntents: {
    search(p: Stripe.PaymentIntentSearchParams): Stripe.ApiSearchResultPromise<Stripe.PaymentIntent>;
    list(p: Stripe.PaymentIntentListParams): Stripe.ApiListPromise<Stripe.PaymentIntent>;
    retrieve(id: string): Promise<Stripe.Response<Stripe.PaymentIntent>>;
  };
  readonly refunds: { list(p: Stripe.RefundListParams): Stripe.ApiListPromise<Stripe.Refund> };
  readonly paymentMethods: { retrieve(id: string): Promise<Stripe.Response<Stripe.PaymentMethod>> };
  readonly tokens: { retrieve(id: string): Promise<Stripe.Response<Stripe.Token>> };
}

/** The lookups' reads of `stripe` on `account` (the platform's when undefined). */
export function readsOn(stripe: Stripe, account: string | undefined): StripeReads {
  const on: Stripe.RequestOptions = account === undefined ? {} : { stripeAccount: account };
  return {
    customers: { search: (p) => stripe.customers.search(p, on), list: (p) => stripe.customers.list(p, on) },
    paymentIntents: {
      search: (p) => stripe.paymentIntents.search(p, on),
      list: (p) => stripe.paymentIntents.list(p, on),
      retrieve: (id) => stripe.paymentIntents.retrieve(id, {}, on),
    },
    refunds: { list: (p) => stripe.refunds.list(p, on) },
    paymentMethods: { retrieve: (id) => stripe.paymentMethods.retrieve(id, {}, on) },
    tokens: { retrieve: (id) => stripe.tokens.retrieve(id, {}, on) },
  };
}
