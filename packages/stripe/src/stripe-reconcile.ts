/**
 * Looking a Stripe effect up by our key, for the cases a replay cannot settle: after Stripe's
 * 24 h key retention, or when Stripe saved a 500 under the key. Customers and payment intents
 * are found through Search on `metadata['idem_operation']`, which lags writes by about a minute:
 * "not found" is inconclusive until the lag has passed, and absence is then proven by a consistent
 * list of the objects created around our attempts. Refunds have no Search: the refunds of the
 * payment intent or charge the args name are read (a consistent list, newest first, up to the
 * same bound as those lists) and matched on the same metadata. Every window is measured on the
 * database clock (`op.now`), never ours. Every read goes to the operation's account (`StripeReads`,
 * bound to it by stripe-account.ts): an object made on a connected account is not on the platform.
 *
 * An object with our key is ours when Stripe created it while our requests could have run, by the
 * ledger's clock. Stripe's `created` is Stripe's clock, and the ledger's may be off it: one created
 * within a day of that window (SKEW_BAND_S) is either ours, seen through a wrong clock, or an
 * earlier operation's with the same key pruned from the ledger within a day; a person decides. One
 * further off is an earlier operation's (a month-old charge of the same invoice), not this one's.
 * Two or more in the window are two effects: settled as found, and alerted (`twice`, answerOf).
 */
import type Stripe from "stripe";
import type { StripeReads } from "./stripe-account.js";
import type { OperationContext, ReconcileResult } from "@idem/core";
import { evidenceOf } from "./stripe-classify.js";
import { deadlineWorded } from "./stripe-http-client.js";
import { idOf, namedCard, otherInlineMethod } from "./stripe-payment-methods.js";
import { METADATA_KEY, toReceipt, type StripeReceipt } from "./stripe-receipt.js";

type Found = { id: string; object: string; status?: string | null; created?: number };

/** When the operation's requests could have created an object: from its claim to its last attempt (ms, database clock). */
interface AttemptWindow {
  readonly from: number;
  readonly to: number;
}

/** A filter on Stripe's `created` (seconds, Stripe's clock), both ends included. */
export interface CreatedRange {
  readonly gte: number;
  readonly lte: number;
}

/** How an effect is looked up. */
export interface Lookup<A> {
  /**
   * The objects that carry our key (Search: its first SEARCH_HITS; a consistent list: those among
   * its first MAX_LISTED, or TOO_MANY when it holds more and none of those read has our key).
   */
  find(stripe: StripeReads, args: A, key: string): Promise<Found[] | typeof TOO_MANY>;
  /** For a consistent `find`: what it lists, named in the reason when ours is not in it or it holds too many to read. */
  listOf?(args: A): string;
  /** Whether `find` reads an index that lags (Search) or a consistent list. */
  readonly lags: boolean;
  /**
   * For a lagging `find`: the consistent read that proves absence, of the objects with our key
   * created in `created` (none: absent; TOO_MANY: none among the first MAX_LISTED of more).
   * Search is usually a minute behind but, by Stripe's word, up to an hour during an incident;
   * "not in Search" after the lag window would then charge again. A list of the objects created
   * around our attempts is not behind.
   */
  confirm?(stripe: StripeReads, args: A, key: string, created: CreatedRange): Promise<Found[] | typeof TOO_MANY>;
  /** Why `find` cannot see every object these args could have made, if it cannot: absence is then never proven. */
  blindSpot?(args: A): string | undefined;
  /**
   * The verdict on an object found, when the object alone is not the effect's proof (undefined:
   * it is): read again by id, consistently, since Search may show an older state.
   */
  judge?(stripe: StripeReads, found: Found, args: A): Promise<ReconcileResult<StripeReceipt> | undefined>;
}

/**
 * Stripe's `created` (seconds) while our requests could have run, with slack for the clocks'
 * usual skew and a request still running at Stripe after our last attempt timed out.
 */
function attemptRange(w: AttemptWindow): CreatedRange {
  return { gte: Math.floor(w.from / 1000) - 300, lte: Math.ceil(w.to / 1000) + 600 };
}

/**
 * How far either side of the attempt window an object with our key may be ours, seen through a
 * ledger's clock that is wrong: no clock is a day off, and only an earlier operation with the same
 * key, pruned from the ledger within that day, explains one otherwise. A person tells them apart.
 */
const SKEW_BAND_S = 24 * 3_600;

function bandRange(w: AttemptWindow): CreatedRange {
  const r = attemptRange(w);
  return { gte: r.gte - SKEW_BAND_S, lte: r.lte + SKEW_BAND_S };
}

const within = (created: number, r: CreatedRange) => created >= r.gte && created <= r.lte;

/**
 * Of the objects with our key: those made in our attempt window (ours; one without `created`
 * too, as before windows were judged), oldest first, else one made within a day of it (a
 * person's question). More than one in the window is more than one effect (see answerOf).
 */
function sortHits(hits: readonly Found[], w: AttemptWindow): { ours?: Found[]; skewed?: Found } {
  const [r, band] = [attemptRange(w), bandRange(w)];
  const ours = oldestFirst(hits.filter((o) => typeof o.created !== "number" || within(o.created, r)));
  const skewed = hits.find((o) => typeof o.created === "number" && within(o.created, band));
  return ours.length > 0 ? { ours } : skewed ? { skewed } : {};
}

/** By Stripe's `created`, oldest first (one without it first, as the receipt a lookup always gave). */
function oldestFirst(found: readonly Found[]): Found[] {
  return [...found].sort((a, b) => (a.created ?? Number.NEGATIVE_INFINITY) - (b.created ?? Number.NEGATIVE_INFINITY));
}

/** The objects of `a` and `b`, each once (by id): Search's hits and the list's name the same objects. */
function union(a: readonly Found[], b: readonly Found[]): Found[] {
  const ids = new Set(a.map((o) => o.id));
  return [...a, ...b.filter((o) => !ids.has(o.id))];
}

/**
 * Ours is not among the first MAX_LISTED objects of a list that holds more: neither found nor
 * proven absent this way (a person decides). A list of at most MAX_LISTED is read to its end.
 */
export const TOO_MANY = Symbol("too many objects to read");
const MAX_LISTED = 2_000;
/** How many of Search's hits on our key are read: more than one when an earlier operation's object has it too. */
const SEARCH_HITS = 10;

/**
 * Reads the pages (auto-pagination: the match may be past the first 100) for our key, up to
 * MAX_LISTED objects, and answers those with our key (sortHits tells ours from an earlier
 * operation's). Only an object past the bound, none with our key read before it, makes the list
 * too long to prove absence; a list of exactly MAX_LISTED is read to its end.
 */
async function withKey<T extends { metadata?: Stripe.Metadata | null }>(
  pages: AsyncIterable<T>,
  key: string,
): Promise<T[] | typeof TOO_MANY> {
  const hits: T[] = [];
  let read = 0;
  for await (const o of pages) {
    if (++read > MAX_LISTED) return hits.length > 0 ? hits : TOO_MANY;
    if (o.metadata?.[METADATA_KEY] === key) hits.push(o);
  }
  return hits;
}

/**
 * The consistent list around our attempts: the attempt window first (where ours is), then the day
 * either side of it (where ours is if the ledger's clock is off Stripe's).
 */
async function listAround<A>(
  stripe: StripeReads,
  lookup: Lookup<A>,
  args: A,
  key: string,
  w: AttemptWindow,
): Promise<{ ours?: Found[]; skewed?: Found } | typeof TOO_MANY> {
  const [r, band] = [attemptRange(w), bandRange(w)];
  const inWindow = await lookup.confirm!(stripe, args, key, r);
  if (inWindow === TOO_MANY) return TOO_MANY;
  if (inWindow.length > 0) return { ours: oldestFirst(inWindow) };
  for (const side of [
    { gte: band.gte, lte: r.gte - 1 },
    { gte: r.lte + 1, lte: band.lte },
  ]) {
    const hits = await lookup.confirm!(stripe, args, key, side);
    if (hits === TOO_MANY) return TOO_MANY;
    if (hits[0]) return { skewed: hits[0] };
  }
  return {};
}

/** What a payment intent's lookup reads of the args: the list's filter, and what the confirmation asked. */
type IntentArgs = Pick<
  Stripe.PaymentIntentCreateParams,
  | "customer"
  | "confirm"
  | "payment_method"
  | "payment_method_data"
  | "error_on_requires_action"
  | "off_session"
  | "amount"
  | "currency"
>;

/**
 * Why an intent carrying our key is not this operation's, if it asks for another amount or
 * currency than the args, belongs to another customer or was made with another payment method:
 * an earlier operation's with the same key, pruned from the ledger since, inside our attempts'
 * window (Stripe then answers our request `idempotency_error`). Taken as ours, the caller read
 * "charged" for a charge of another amount, or of another customer's card or another card while
 * the one asked for was never charged. A person decides.
 */
function otherCharge(found: Found, args: IntentArgs | undefined): string | undefined {
  const pi = found as Found & {
    amount?: unknown;
    currency?: unknown;
    customer?: unknown;
    payment_method?: unknown;
    last_payment_error?: { payment_method?: unknown } | null;
  };
  // A customer's id is Stripe's, kept as given (an intent's customer may be expanded to the object).
  // None is a holder too: an intent of no customer (a guest's card) is not this customer's charge,
  // nor one of a customer the charge of an operation that names none ("" unsets it, as Stripe reads it).
  const held: unknown = typeof pi.customer === "object" ? (pi.customer as { id?: unknown } | null)?.id : pi.customer;
  const holder = held === undefined || held === null || held === "" ? null : held;
  const given: unknown = args?.customer;
  const asks = given === undefined || given === null || given === "" ? null : given;
  const named = (c: unknown) => (c === null ? "no customer" : `the customer ${String(c)}`);
  // Only an intent as Stripe renders it, which always has the field (null when none), is compared.
  const comparable = (c: unknown) => c === null || typeof c === "string";
  if (args !== undefined && "customer" in pi && comparable(asks) && comparable(holder) && holder !== asks)
    return `found the payment intent ${found.id} with our key, for ${named(holder)} where this operation asks ${asks === null ? "no customer" : String(asks)}: an earlier operation with this key (pruned from the ledger since) made it, and whether ours ran cannot be told from it; look at it in the dashboard`;
  // The card, as the customer: only when the args name one (an intent made without one is paid
  // with the customer's own, whichever). A declined confirmation leaves the intent without one,
  // the card it was made with named on its `last_payment_error` (as an authentication that failed
  // does). A test payment method's name is never the intent's (namedCard): not compared. A card
  // given inline is compared by what Stripe keeps of it (the judge: it takes a read).
  const card = namedCard(args?.payment_method);
  const madeWith = idOf(pi.payment_method) ?? idOf(pi.last_payment_error?.payment_method);
  if (card !== undefined && typeof madeWith === "string" && madeWith !== card)
    return `found the payment intent ${found.id} with our key, made with the payment method ${madeWith} where this operation names ${card}: an earlier operation with this key (pruned from the ledger since) made it, or its payment method was changed since, and whether ours ran cannot be told from it; look at it in the dashboard`;
  // stripe-node form-encodes its params, so a caller's "2000" is the amount 2000 too.
  const asked: unknown = args?.amount;
  const amount = typeof asked === "string" && /^\d+$/.test(asked) ? Number(asked) : asked;
  const amountOff = typeof amount === "number" && typeof pi.amount === "number" && pi.amount !== amount;
  const currencyOff =
    typeof args?.currency === "string" &&
    typeof pi.currency === "string" &&
    pi.currency.toLowerCase() !== args.currency.toLowerCase();
  if (!amountOff && !currencyOff) return undefined;
  return `found the payment intent ${found.id} with our key, for ${String(pi.amount)} ${String(pi.currency)} where this operation asks ${String(args?.amount)} ${String(args?.currency)}: an earlier operation with this key (pruned from the ledger since) made it, or its amount was changed since (an update, an incremental authorization), and whether ours ran cannot be told from it; look at it in the dashboard`;
}

/**
 * A boolean parameter as Stripe reads it: stripe-node form-encodes its params, so "true" is the
 * confirmation Stripe runs too (as otherCharge reads an amount "2000").
 */
const stripeTrue = (v: unknown) => v === true || v === "true";

/**
 * A payment intent's status by the names API versions since 2019-02-11 give it: before, Stripe
 * named an intent waiting for another payment method `requires_source` and one waiting for the
 * customer `requires_source_action` (docs.stripe.com/changelog/2019-02-11/renames-several-statuses-payment-intents),
 * and a client pinned to such a version reads those. Read as they were, a declined confirmation
 * found by a lookup was no unpaid status at all: "succeeded", charged, for a card declined.
 */
export function intentStatus(status: string | null | undefined): string {
  return status === "requires_source"
    ? "requires_payment_method"
    : status === "requires_source_action"
      ? "requires_action"
      : (status ?? "");
}

export const searchPaymentIntents: Lookup<IntentArgs> = {
  find: async (stripe, _args, key) =>
    (await stripe.paymentIntents.search({ query: `metadata['${METADATA_KEY}']:'${key}'`, limit: SEARCH_HITS })).data,
  lags: true,
  confirm: (stripe, args, key, created) =>
    withKey(
      stripe.paymentIntents.list({
        created,
        ...(typeof args?.customer === "string" && { customer: args.customer }),
        limit: 100,
      }),
      key,
    ),
  // Created with confirm, the request's answer was a charge, its decline (a 402 saved under the
  // key, the intent left waiting for another payment method), or the intent waiting for the
  // customer to authenticate the card (200 requires_action). Found waiting with the decline on it,
  // it is that decline. Found waiting for authentication, it is that 200, read as the answer itself
  // is (succeeded: the intent we created, its status saying nothing is charged yet, as the charge
  // tool's note does). So is one whose customer failed that authentication since: Stripe returns
  // it to requires_payment_method with `payment_intent_authentication_failure`, an error only the
  // customer's authentication leaves (docs.stripe.com/error-codes), never a confirmation's answer.
  // Either way, unless our request could not have left it waiting (it asked Stripe to fail rather
  // than wait, or named another card): confirmed again since. Waiting without the decline (an
  // update clears it), for confirmation (another card attached since) or canceled: whether our
  // confirmation was declined cannot be told, and a person decides. Without confirm, whatever
  // became of the intent since is its customer's doing.
  judge: async (stripe, found, args) => {
    const asFound = found as Found & {
      payment_method?: unknown;
      last_payment_error?: { payment_method?: unknown } | null;
    };
    const other =
      otherCharge(found, args) ??
      (namedCard(args?.payment_method) === undefined
        ? await otherInlineMethod(
            stripe,
            found.id,
            asFound.payment_method ?? asFound.last_payment_error?.payment_method,
            args?.payment_method_data,
          )
        : undefined);
    if (other) return { found: false, proof: "never", reason: other };
    if (!stripeTrue(args?.confirm)) return undefined;
    const unpaid = ["requires_payment_method", "requires_confirmation", "requires_action", "canceled"];
    if (!unpaid.includes(intentStatus(found.status))) return undefined;
    const pi = await stripe.paymentIntents.retrieve(found.id); // Search may lag the intent's updates
    // The receipt keeps Stripe's word for the status; the verdict reads it by today's names.
    const status = intentStatus(pi.status);
    if (!unpaid.includes(status)) return { found: true, receipt: toReceipt(pi, null, false) };
    const e = pi.last_payment_error;
    const authFailed = status === "requires_payment_method" && e?.code === "payment_intent_authentication_failure";
    if (status === "requires_action" || authFailed) {
      // The card asked to authenticate: the one on the intent, or the one whose authentication failed.
      // A test card's name is never the intent's (namedCard): not compared, as in otherCharge.
      const card = idOf(authFailed ? e?.payment_method : pi.payment_method);
      const named = namedCard(args.payment_method);
      const off: unknown = args.off_session;
      const failFast =
        stripeTrue(args.error_on_requires_action) || (off !== undefined && off !== false && off !== "false");
      if (!failFast && (named === undefined || card === named))
        return { found: true, receipt: toReceipt(pi, null, false) };
      const seen = authFailed
        ? `whose customer failed to authenticate the payment since (${e?.code})`
        : "waiting for the customer to authenticate the payment (requires_action)";
      return {
        found: false,
        proof: "never",
        reason: `found the payment intent ${pi.id}, created with confirm, ${seen}, where our request could not have left it waiting for that (${failFast ? "it asked Stripe to fail such a confirmation instead" : "it named another payment method"}): it was confirmed again since, and whether ours was declined cannot be told; look at it in the dashboard`,
      };
    }
    if (status === "requires_payment_method" && e) {
      const code = [e.code, e.decline_code].filter(Boolean).join(" ");
      return {
        found: false,
        proof: "refused",
        reason: `Stripe declined the payment intent ${pi.id} at its confirmation (${code || "no code"}): ${e.message ?? "no message"}`,
        // As the request's own answer would have named them (classifyStripeError).
        ...evidenceOf({ payment_intent: pi.id, code: e.code, decline_code: e.decline_code }),
      };
    }
    return {
      found: false,
      proof: "never",
      reason: `found the payment intent ${pi.id}, created with confirm, now ${pi.status}${e ? "" : " with no payment error on it"}: whether Stripe declined our confirmation or it changed since cannot be told from it; look at it in the dashboard`,
    };
  },
};

/** What a customer's lookup reads of the args: what the found customer is compared on. */
type CustomerArgs = Pick<Stripe.CustomerCreateParams, "email" | "name">;

export const searchCustomers: Lookup<CustomerArgs> = {
  find: async (stripe, _args, key) =>
    (await stripe.customers.search({ query: `metadata['${METADATA_KEY}']:'${key}'`, limit: SEARCH_HITS })).data,
  lags: true,
  confirm: (stripe, _args, key, created) => withKey(stripe.customers.list({ created, limit: 100 }), key),
  // As a payment intent's (otherCharge): a customer with our key and another email or name than
  // the args give is an earlier operation's with the same key, pruned from the ledger since
  // (Stripe then answers our request `idempotency_error`), or one changed since. Taken as ours,
  // the caller read "created" for a customer that is not the one asked for. A person decides.
  judge: async (_stripe, found, args) => {
    const c = found as Found & { email?: unknown; name?: unknown };
    const off = (["email", "name"] as const).filter(
      (f) =>
        typeof args?.[f] === "string" &&
        typeof c[f] === "string" &&
        (c[f] as string).toLowerCase() !== (args[f] as string).toLowerCase(),
    );
    if (off.length === 0) return undefined;
    return {
      found: false,
      proof: "never",
      reason: `found the customer ${found.id} with our key, with another ${off.join(" and ")} than this operation gives: an earlier operation with this key (pruned from the ledger since) made it, or it was changed since, and whether ours ran cannot be told from it; look at it in the dashboard`,
    };
  },
};

type RefundTarget = {
  payment_intent?: string | undefined;
  charge?: string | undefined;
  amount?: number | string | undefined;
};

export const listRefunds: Lookup<RefundTarget> = {
  // Bounded as the other lists are: a payment intent may be refunded in thousands of parts, and a
  // read without end would hold the daemon's tick. Newest first, so a refund with our key read
  // before the bound (an earlier operation's is older than ours) means ours, if made, was read too.
  find: (stripe, args, key) =>
    withKey(
      stripe.refunds.list({
        ...(args.charge ? { charge: args.charge } : { payment_intent: args.payment_intent! }),
        limit: 100,
      }),
      key,
    ),
  listOf: (args) =>
    args.charge ? `refunds of the charge ${args.charge}` : `refunds of the payment intent ${args.payment_intent}`,
  lags: false,
  // As a payment intent's (otherCharge): a refund with our key for another amount than the args
  // ask is an earlier operation's with the same key, pruned from the ledger since (Stripe then
  // answers our request `idempotency_error`). Taken as ours, the caller read "refunded" for a
  // refund of another amount. A person decides.
  judge: async (_stripe, found, args) => {
    const re = found as Found & { amount?: unknown; currency?: unknown };
    const asked: unknown = args?.amount;
    const amount = typeof asked === "string" && /^\d+$/.test(asked) ? Number(asked) : asked;
    if (typeof amount !== "number" || typeof re.amount !== "number" || re.amount === amount) return undefined;
    return {
      found: false,
      proof: "never",
      reason: `found the refund ${found.id} with our key, for ${re.amount} ${String(re.currency)} where this operation asks ${amount}: an earlier operation with this key (pruned from the ledger since) made it, and whether ours ran cannot be told from it; look at it in the dashboard`,
    };
  },
  blindSpot: (args) =>
    args.charge || args.payment_intent
      ? undefined
      : "the refund names neither a charge nor a payment_intent, so there is no list to look in: absence cannot be proven",
};

export interface ReconcileWindows {
  /** Search lag: "not found" proves nothing before this much time passed since the attempt. */
  readonly lagMs: number;
  /** Inside this window from our key's first request (`op.firstSentAt`) Stripe still holds the key, with whatever it saved under it. */
  readonly keyRetentionMs: number;
}

/**
 * Looks the effect of `op` up. A request that fails throws its error, which the runner stores as
 * the check's reason ("lookup failed: …"): one cut at our deadline is worded as that, not as
 * stripe-node's inactivity timeout (deadlineWorded).
 */
export function reconcileByLookup<A>(
  stripe: StripeReads,
  lookup: Lookup<A>,
  args: A,
  op: OperationContext,
  w: ReconcileWindows,
): Promise<ReconcileResult<StripeReceipt>> {
  return lookUp(stripe, lookup, args, op, w).catch((error: unknown) => {
    throw deadlineWorded(error);
  });
}

async function lookUp<A>(
  stripe: StripeReads,
  lookup: Lookup<A>,
  args: A,
  op: OperationContext,
  w: ReconcileWindows,
): Promise<ReconcileResult<StripeReceipt>> {
  const blind = lookup.blindSpot?.(args);
  if (blind) return { found: false, proof: "never", reason: blind };
  const window = { from: op.createdAt, to: op.lastAttemptAt };
  let listed: string | undefined; // why only the consistent list was read: Search failed
  let skewed: Found | undefined; // an object with our key within a day of our window, not in it
  let searched: Found[] | undefined; // the hits in our window of `find` (Search, or a consistent list)
  try {
    // Search's hits that are not ours (an earlier operation's) may hide ours behind them, and
    // one near our window may be ours through a wrong clock: the list around the window decides.
    const seen = await lookup.find(stripe, args, op.key);
    if (seen === TOO_MANY)
      return {
        found: false,
        proof: "never",
        reason: `more than ${MAX_LISTED} ${lookup.listOf?.(args) ?? "objects in the list"}, none with our key among the newest ${MAX_LISTED} read: absence cannot be proven by reading them; look in the dashboard`,
      };
    const hits = sortHits(seen, window);
    searched = hits.ours;
    skewed = hits.skewed;
  } catch (error) {
    // Search refused or down (Stripe does not offer it everywhere; an incident): the consistent
    // list answers on its own, and does not lag.
    if (!lookup.confirm) throw error;
    const inList = await listAround(stripe, lookup, args, op.key, window);
    if (inList === TOO_MANY) return tooMany("Stripe Search failed");
    if (inList.ours) return answerOf(stripe, lookup, inList.ours, args);
    skewed = inList.skewed;
    const why = deadlineWorded(error);
    listed = `Stripe Search failed (${(why as Error)?.message ?? String(why)})`;
  }
  if (searched) return answerOf(stripe, lookup, await withListed(stripe, lookup, args, op.key, window, searched), args);
  // Without the database's time no window can be judged (a runner that does not fill `now`):
  // not found proves nothing yet, rather than everything (NaN comparisons are all false).
  if (!Number.isFinite(op.now))
    return {
      found: false,
      proof: "inconclusive",
      reason: "no database time (op.now) to judge the search-lag and key windows",
    };
  const sinceAttempt = op.now - op.lastAttemptAt;
  if (lookup.lags && listed === undefined && !skewed && sinceAttempt < w.lagMs) {
    // Look again before the window ends: the index usually catches up sooner.
    const retryAfterMs = Math.min(w.lagMs - sinceAttempt, Math.max(1_000, Math.round(w.lagMs / 6)));
    return {
      found: false,
      proof: "inconclusive",
      reason: `not in Stripe Search yet; it may lag ${w.lagMs} ms`,
      retryAfterMs,
    };
  }
  // Search may be far behind during an incident: its "not found" is checked against the
  // consistent list of the objects created around our attempts, in any window.
  if (lookup.confirm && listed === undefined) {
    const inList = await listAround(stripe, lookup, args, op.key, window);
    if (inList === TOO_MANY && !skewed) return tooMany("not in Stripe Search");
    if (inList !== TOO_MANY && inList.ours) return answerOf(stripe, lookup, inList.ours, args);
    if (inList !== TOO_MANY) skewed ??= inList.skewed;
  }
  if (skewed) return outsideWindow(skewed, window);
  // Stripe keeps a key for its retention from the first request that carried it, not from the
  // operation's creation (one rate limited, then left pending for a day, sent it a day later).
  const keptMs = (op.firstSentAt ?? op.createdAt) + w.keyRetentionMs - op.now;
  if (keptMs > 0) {
    // Absent, but Stripe still holds our key (with an error it saved under it, or past the
    // replay's margin): a retry with it now could only replay that. A person decides at once
    // (waiting for Stripe to forget the key would outlast the daemon's maxAgeMs anyway).
    const where = !lookup.confirm
      ? `in no page of the ${lookup.listOf?.(args) ?? "list"}, read to its end`
      : listed
        ? `${listed}; not in the list of the objects created around our attempts`
        : "neither in Search nor in the list of the objects created around our attempts";
    return {
      found: false,
      proof: "never",
      reason: `absent at Stripe (${where}), but Stripe holds our key ${Math.ceil(keptMs / 60_000)} min more: a retry with it now could only replay what Stripe saved; retry once it is forgotten, or with a new revision`,
    };
  }
  if (lookup.confirm)
    return {
      found: false,
      proof: "absent",
      reason: `${listed ? `${listed}; not` : "not in Stripe Search, nor"} in the list of the objects created around our attempts`,
    };
  return {
    found: false,
    proof: "absent",
    // What was read, as a charge's reason names the objects created around our attempts.
    reason: lookup.lags
      ? "not in Stripe Search after the lag window"
      : `not in any page of the ${lookup.listOf?.(args) ?? "list"} (read to its end)`,
  };
}

/** An object with our key near our attempts but not during them: ours through a wrong clock, or an earlier operation's. */
function outsideWindow(o: Found, w: AttemptWindow): ReconcileResult<StripeReceipt> {
  const iso = (ms: number) => new Date(ms).toISOString();
  const made = typeof o.created === "number" ? iso(o.created * 1000) : "at an unknown time";
  return {
    found: false,
    proof: "never",
    reason: `the ${o.object} ${o.id} carries our key but was created ${made} by Stripe's clock, outside our attempts' window by the ledger's clock (${iso(w.from)} to ${iso(w.to)}): the ledger's clock may be off Stripe's (clock skew), or an earlier operation with this key, pruned from the ledger since, made it; look at it in the dashboard`,
  };
}

/**
 * Search's hits in our window, with those of the consistent list of the window that Search does
 * not show yet: a second object with our key made minutes ago (a later attempt's, once Stripe
 * forgot the key) is not in Search for as long as it lags, and "found" would settle on the first
 * alone. A list of more than MAX_LISTED adds nothing (Search's hits are all that can be told).
 */
async function withListed<A>(
  stripe: StripeReads,
  lookup: Lookup<A>,
  args: A,
  key: string,
  w: AttemptWindow,
  hits: Found[],
): Promise<Found[]> {
  if (!lookup.lags || !lookup.confirm) return hits;
  const listed = await lookup.confirm(stripe, args, key, attemptRange(w));
  return listed === TOO_MANY ? hits : oldestFirst(union(hits, listed));
}

/** How many of the objects in our window are judged (each may cost a read): the rest are named only. */
const JUDGED = 5;
/**
 * How many of the other objects a receipt names (`others`): a late answer naming one past them is
 * alerted again (a person told twice, never not at all), and the receipt stays small.
 */
const NAMED_OTHERS = 20;

/**
 * The objects found with our key in our window: the effect, or what its lookup's judge makes of it
 * (a refusal, a person's question). More than one is more than one effect (Stripe dedupes a key it
 * still holds, so a second object with it came from a request made after it forgot the key, or not
 * by us): settled as found with the oldest taken as ours (nothing runs again), its receipt naming
 * the others (`others`), and `twice` naming each so that a person is alerted; or, when none is
 * judged this operation's effect, a person's question naming each. Never one of them in silence.
 */
async function answerOf<A>(
  stripe: StripeReads,
  lookup: Lookup<A>,
  found: readonly Found[],
  args: A,
): Promise<ReconcileResult<StripeReceipt>> {
  const judge = async (o: Found): Promise<ReconcileResult<StripeReceipt>> =>
    (await lookup.judge?.(stripe, o, args)) ?? { found: true, receipt: toReceipt(o, null, false) };
  if (found.length === 1) return judge(found[0]!);
  const verdicts: ReconcileResult<StripeReceipt>[] = [];
  for (const o of found.slice(0, JUDGED)) verdicts.push(await judge(o));
  // The ids first: an alert keeps the first 300 characters of this.
  const named = found
    .slice(0, JUDGED)
    .map((o, i) => {
      const v = verdicts[i]!;
      return `${o.id} ${v.found ? (v.receipt.status ?? "found") : v.proof === "refused" ? "declined" : "not judged ours"}`;
    })
    .join(", ");
  const more = found.length > JUDGED ? `, and ${found.length - JUDGED} more` : "";
  const what = `${found.length} ${found[0]!.object} objects carry our key, created while our requests could run (${named}${more})`;
  const ours = verdicts.find((v) => v.found);
  if (ours?.found) {
    // The receipt names the others too: a late answer naming one is this incident, alerted once.
    const others = found
      .map((o) => o.id)
      .filter((id) => id !== ours.receipt.id)
      .slice(0, NAMED_OTHERS);
    return { found: true, receipt: { ...ours.receipt, others }, twice: what };
  }
  const why = verdicts.map((v) => (v.found ? "" : v.reason)).join("; ");
  return { found: false, proof: "never", reason: `${what}: ${why}; look at them in the dashboard` };
}

function tooMany(search: string): ReconcileResult<StripeReceipt> {
  return {
    found: false,
    proof: "never",
    reason: `${search}, and more than ${MAX_LISTED} objects were created around our attempts (within a day of them, where a clock off Stripe's would put ours) and ours is not among the ${MAX_LISTED} read: absence cannot be proven by reading them`,
  };
}
