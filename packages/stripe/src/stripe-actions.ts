/**
 * Stripe writes as idem actions, through the real stripe SDK. Every request carries OUR
 * `Idempotency-Key` (the operation key, never stripe-node's automatic one); the typed creates also
 * carry `metadata.idem_operation` = the key, so the object can be found again (a generic POST
 * does not: it has no lookup, and one that updates an object would overwrite its creator's marker).
 *
 * Capabilities: Stripe dedupes on the key for 24 h (replayed with a 1 h margin), and customers,
 * payment intents and refunds can be looked up after that. A generic POST (`stripePost`) has no
 * lookup: past the key window an unknown outcome goes to review.
 *
 * Connected accounts: an operation acts on the account its args name (`stripeAccount: "acct_…"`),
 * else the config's; its write, replay and lookups all go there, and its receipt names it
 * (stripe-account.ts).
 *
 * Not supported: API v2 paths (`post("/v2/…")` is refused: its idempotency differs from v1's);
 * `stripeContext` (in the config or in args, refused naming it); stripe-node's other request
 * options in args (`idempotencyKey`, `apiKey`, `timeout` …: refused naming the field, since
 * stripe-node would send them as parameters);
 * cancelling a request on `op.signal`. stripe-node 23's request options take no
 * AbortSignal (stripe/stripe-node#2240 was declined), so a request runs until `timeoutMs` (no
 * byte) or `deadlineMs` (no end); a lost lease is harmless here because every attempt carries the
 * same key.
 */
import type Stripe from "stripe";
import { defineAction, InvalidValueError, type Action, type OperationContext } from "@idem/core";
import { accountIn, accountOfReference, readsOn, referenceOf } from "./stripe-account.js";
import { createStripeClient, refuseRequestOptions, type StripeConfig } from "./stripe-client.js";
import { classifyStripeError } from "./stripe-classify.js";
import {
  listRefunds,
  reconcileByLookup,
  searchCustomers,
  searchPaymentIntents,
  type Lookup,
} from "./stripe-reconcile.js";
import { METADATA_KEY, onAccount, stripeReceiptSchema, toReceipt, type StripeReceipt } from "./stripe-receipt.js";

/** Stripe keeps idempotency keys for at least 24 hours. */
export const STRIPE_KEY_RETENTION_MS = 24 * 3_600_000;

/** Any other POST resource's parameters, as Stripe's API takes them. */
export type StripeParams = Record<string, unknown>;

/**
 * What every action's args may add to Stripe's parameters: the connected account (`acct_…`) the
 * operation acts on, sent as the `Stripe-Account` header, never as a parameter. Part of the args'
 * hash: the same key with another account is an `ArgsMismatchError`. Default: the config's.
 */
export interface StripeAccountArgs {
  readonly stripeAccount?: string | undefined;
}

export interface StripeActions {
  /** The platform's client (no account of its own: each action's request names its account). */
  readonly client: Stripe;
  readonly customersCreate: Action<Stripe.CustomerCreateParams & StripeAccountArgs, StripeReceipt>;
  readonly paymentIntentsCreate: Action<Stripe.PaymentIntentCreateParams & StripeAccountArgs, StripeReceipt>;
  readonly refundsCreate: Action<Stripe.RefundCreateParams & StripeAccountArgs, StripeReceipt>;
  /**
   * Any other POST resource, e.g. `post("/v1/products")`; type `stripe.post:/v1/products`. A path
   * that does not begin with a single "/" is refused here (`InvalidValueError`): stripe-node would
   * refuse it before sending, with an error no run could tell from a lost request. So is an API
   * v2 path ("/v2/…"): Stripe's v2 idempotency is not the v1 behaviour this adapter relies on.
   */
  post(path: string): Action<StripeParams & StripeAccountArgs, StripeReceipt>;
}

export function stripeActions(config: StripeConfig): StripeActions {
  // A window that is not a whole number of ms ends at once (NaN and negative comparisons): Search's
  // "not found" would be read before the index could show the write. At most 2^31-1, as the
  // daemon's config has it: the wait before a lookup's next try is taken from it.
  const lagMs = config.searchLagMs ?? 90_000;
  if (!(Number.isInteger(lagMs) && lagMs >= 0 && lagMs <= 2 ** 31 - 1))
    throw new RangeError(`searchLagMs must be a whole number of ms >= 0 and at most 2^31-1 (got ${lagMs})`);
  const stripe = createStripeClient(config);
  const configAccount = accountIn(config);
  /**
   * The account of an operation's requests: the one its provider reference names once it has one,
   * else the args', else the config's. The account is the operation's from its first reference on:
   * a config changed since (another process's, the daemon's, which names none) does not move its
   * replay, its lookups or, once proven not done, its next send. The runner hands the reference
   * it holds to `providerReference` too, though that hook's type does not promise it.
   */
  const accountFor = (args: StripeAccountArgs, op: { providerReference?: string | null }) =>
    op.providerReference ? accountOfReference(op.providerReference) : (args.stripeAccount ?? configAccount);
  /**
   * Requests sent so far by each execute in flight, by our key (an attempt that lost its lease may
   * still run beside the next), counted by one listener on the client (one each would pass Node's
   * 10-listener warning at 11 calls in flight); and the errors that answered a request stripe-node
   * had sent more than once (see execute).
   */
  const sends = new Map<string, { sent: number }[]>();
  stripe.on("request", (request: { idempotency_key?: string }) => {
    for (const c of sends.get(request.idempotency_key ?? "") ?? []) c.sent += 1;
  });
  const resent = new WeakSet<object>();
  const windows = { lagMs, keyRetentionMs: STRIPE_KEY_RETENTION_MS };

  /** `object`: the Stripe object type the action makes (its receipt's `object`), undefined for a generic POST. */
  function action<A extends StripeAccountArgs>(
    type: string,
    object: string | undefined,
    send: (
      params: A,
      options: Stripe.RequestOptions,
    ) => Promise<Stripe.Response<{ id: string; object: string; status?: string | null }>>,
    lookup?: Lookup<A>,
  ): Action<A, StripeReceipt> {
    const base = {
      type,
      // What a person may record as the receipt when resolving an operation as succeeded.
      receipt: stripeReceiptSchema(object),
      // stripe-node's per-request options where a caller might put them: stripe-node would send
      // them as parameters (Stripe: 400 parameter_unknown; a lenient server charges the platform
      // account, or an SDK reading them as options sends the caller's idempotency key, not ours).
      validate: (args: A) => refuseRequestOptions(args, "args."),
      async execute(args: A, op: OperationContext) {
        const account = accountFor(args, op);
        // The account is the request's header, not a parameter.
        const { stripeAccount: _, ...rest } = args;
        // The marker a lookup finds the object by. Only where there is a lookup: a generic POST
        // may update an object, and would overwrite the marker of the operation that created it.
        const own = (args as { metadata?: Record<string, unknown> }).metadata;
        const params = (lookup ? { ...rest, metadata: { ...own, [METADATA_KEY]: op.key } } : rest) as A;
        // stripe-node sends a request again by itself after a closed connection, even with
        // retries off, though the first may have committed: its last answer alone would hide that.
        const mine = { sent: 0 };
        sends.set(op.key, [...(sends.get(op.key) ?? []), mine]);
        try {
          const obj = await send(params, {
            idempotencyKey: op.key,
            ...(account !== undefined && { stripeAccount: account }),
          });
          const replayed = obj.lastResponse?.headers?.["idempotent-replayed"] === "true";
          return onAccount(toReceipt(obj, obj.lastResponse?.requestId ?? null, replayed), account);
        } catch (error) {
          if (mine.sent > 1 && typeof error === "object" && error !== null) resent.add(error);
          throw error;
        } finally {
          const left = (sends.get(op.key) ?? []).filter((c) => c !== mine);
          if (left.length > 0) sends.set(op.key, left);
          else sends.delete(op.key);
        }
      },
      classify: (error: unknown) => classifyStripeError(error, resent.has(error as object)),
      // The account with the key: the object and the key live on that account, and every later
      // request of the operation reads its account from here (accountFor).
      providerReference: (args: A, op: { key: string; providerReference?: string | null }) =>
        referenceOf(op.key, accountFor(args, op)),
      // A create's object id: a request deduped on our key answers the first one's object, a second
      // effect is another object. A lookup's receipt (no request id) and the request's own late
      // answer naming one object are one effect, not alerted as two; a lookup that found several
      // names each (`others`, alerted once as two effects), and a late answer naming one of them
      // is that incident again. Not a generic POST's: one that updates an object (adds lines to
      // an invoice) names the same object every time it takes effect, and two such effects must
      // stay alerted.
      ...(object !== undefined && {
        effectId: (receipt: StripeReceipt) => (receipt.others?.length ? [receipt.id, ...receipt.others] : receipt.id),
      }),
    };
    const dedupe = { retentionMs: STRIPE_KEY_RETENTION_MS };
    return lookup
      ? defineAction<A, StripeReceipt>({
          ...base,
          capabilities: { dedupe, lookup: true },
          reconcile: async (args, op) => {
            const account = accountFor(args, op);
            const found = await reconcileByLookup(readsOn(stripe, account), lookup, args, op, windows);
            return found.found ? { ...found, receipt: onAccount(found.receipt, account) } : found;
          },
        })
      : defineAction<A, StripeReceipt>({ ...base, capabilities: { dedupe } });
  }

  return {
    client: stripe,
    customersCreate: action<Stripe.CustomerCreateParams & StripeAccountArgs>(
      "stripe.customers.create",
      "customer",
      (p, o) => stripe.customers.create(p, o),
      searchCustomers,
    ),
    paymentIntentsCreate: action<Stripe.PaymentIntentCreateParams & StripeAccountArgs>(
      "stripe.paymentIntents.create",
      "payment_intent",
      (p, o) => stripe.paymentIntents.create(p, o),
      searchPaymentIntents,
    ),
    refundsCreate: action<Stripe.RefundCreateParams & StripeAccountArgs>(
      "stripe.refunds.create",
      "refund",
      (p, o) => stripe.refunds.create(p, o),
      listRefunds,
    ),
    post: (path) => {
      // stripe-node's own check (utils.validatePath), which it makes before sending, throwing a
      // plain Error: classified as a lost request, every run of it would read "outcome unknown".
      if (typeof path !== "string" || !path.startsWith("/") || path.startsWith("//"))
        throw new InvalidValueError(
          "path",
          `a Stripe path begins with a single "/", as "/v1/products" does; got ${JSON.stringify(path)}`,
        );
      // API v2 (stripe-node's test: the path begins with "/v2") keeps a key differently: a retry
      // finishes failed work rather than replaying a saved answer (docs.stripe.com/api/
      // idempotent_requests), so "a 500 saved under the key" and Idempotent-Replayed would be
      // misread, and its errors and key window were never checked here. Any case: unverified too.
      if (/^\/v2/i.test(path))
        throw new InvalidValueError(
          "path",
          `Stripe API v2 paths are not supported (${JSON.stringify(path)}): v2 idempotency (a retry completes failed work, it does not replay a saved answer) differs from v1's, on which this adapter's classification and replay rely`,
        );
      return action<StripeParams & StripeAccountArgs>(`stripe.post:${path}`, undefined, (p, o) =>
        stripe.rawRequest("POST", path, p, o),
      );
    },
  };
}
