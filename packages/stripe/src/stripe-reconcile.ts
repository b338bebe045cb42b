/**
 * Looking a Stripe effect up by our key, for the cases a replay cannot settle: after Stripe's
 * 24 h key retention, or when Stripe saved a 500 under the key. Customers and payment intents
 * are found through Search on `metadata['idem_operation']`, which lags writes by about a minute:
 * "not found" is inconclusive until the lag has passed, and absence is then proven by a consistent
 * list of the objects created while our requests could have run. Refunds have no Search: every page of the
 * refunds of the payment intent or charge the args name is read (a consistent list) and matched
 * on the same metadata. Every window is measured on the database clock (`op.now`), never ours.
 */
import type Stripe from "stripe";
import type { OperationContext, ReconcileResult } from "@idem/core";
import { METADATA_KEY, toReceipt, type StripeReceipt } from "./stripe-receipt.js";

type Found = { id: string; object: string; status?: string | null; created?: number } | undefined;

/** When the operation's requests could have created an object: from its claim to its last attempt (ms, database clock). */
export interface AttemptWindow {
  readonly from: number;
  readonly to: number;
}

/** How an effect is looked up. */
export interface Lookup<A> {
  find(stripe: Stripe, args: A, key: string): Promise<Found>;
  /** Whether `find` reads an index that lags (Search) or a consistent list. */
  readonly lags: boolean;
  /**
   * For a lagging `find`: the consistent read that proves absence. Search is usually a minute
   * behind but, by Stripe's word, up to an hour during an incident; "not in Search" after the
   * lag window would then charge again. A list of the objects created while our requests could
   * have run is not behind.
   */
  confirm?(stripe: Stripe, args: A, key: string, window: AttemptWindow): Promise<Found | typeof TOO_MANY>;
  /** Why `find` cannot see every object these args could have made, if it cannot: absence is then never proven. */
  blindSpot?(args: A): string | undefined;
  /**
   * The verdict on an object found, when the object alone is not the effect's proof (undefined:
   * it is): read again by id, consistently, since Search may show an older state.
   */
  judge?(stripe: Stripe, found: NonNullable<Found>, args: A): Promise<ReconcileResult<StripeReceipt> | undefined>;
}

/**
 * Stripe's `created` filter (seconds) for an attempt window, with slack for the clocks' skew and
 * a request still running at Stripe after our last attempt timed out.
 */
function createdWithin(w: AttemptWindow): { gte: number; lte: number } {
  return { gte: Math.floor(w.from / 1000) - 300, lte: Math.ceil(w.to / 1000) + 600 };
}

/** Whether a Stripe object (its `created`, in seconds) was made while our requests could have run. */
function madeWithin(o: { created?: unknown }, w: AttemptWindow): boolean {
  if (typeof o.created !== "number") return true;
  const { gte, lte } = createdWithin(w);
  return o.created >= gte && o.created <= lte;
}

/** More objects in the window than one lookup reads: absence is not proven this way (a person decides). */
export const TOO_MANY = Symbol("too many objects to read");
const MAX_LISTED = 2_000;

/** Reads the pages (auto-pagination: the match may be past the first 100) for our key, up to MAX_LISTED objects. */
async function firstWithKey<T extends { metadata?: Stripe.Metadata | null }>(
  pages: AsyncIterable<T>,
  key: string,
): Promise<T | undefined | typeof TOO_MANY> {
  let read = 0;
  for await (const o of pages) {
    if (o.metadata?.[METADATA_KEY] === key) return o;
    if (++read >= MAX_LISTED) return TOO_MANY;
  }
  return undefined;
}

export const searchPaymentIntents: Lookup<{ customer?: string | undefined; confirm?: boolean | undefined }> = {
  find: async (stripe, _args, key) =>
    (await stripe.paymentIntents.search({ query: `metadata['${METADATA_KEY}']:'${key}'`, limit: 1 })).data[0],
  lags: true,
  confirm: (stripe, args, key, w) =>
    firstWithKey(
      stripe.paymentIntents.list({
        created: createdWithin(w),
        ...(typeof args?.customer === "string" && { customer: args.customer }),
        limit: 100,
      }),
      key,
    ),
  // Created with confirm, the request's answer was a charge or its decline (a 402 saved under the
  // key, the intent left waiting for another payment method). Found waiting so, with the decline
  // on it, it is that answer. Waiting without it (an update clears it), for confirmation (another
  // card attached since) or canceled: whether our confirmation was declined cannot be told, and a
  // person decides. Without confirm, whatever became of the intent since is its customer's doing.
  judge: async (stripe, found, args) => {
    if (args?.confirm !== true) return undefined;
    const unpaid = ["requires_payment_method", "requires_confirmation", "canceled"];
    if (!unpaid.includes(found.status ?? "")) return undefined;
    const pi = await stripe.paymentIntents.retrieve(found.id); // Search may lag the intent's updates
    if (!unpaid.includes(pi.status)) return { found: true, receipt: toReceipt(pi, null, false) };
    const e = pi.last_payment_error;
    if (pi.status === "requires_payment_method" && e) {
      const code = [e.code, e.decline_code].filter(Boolean).join(" ");
      return {
        found: false,
        proof: "refused",
        reason: `Stripe declined the payment intent ${pi.id} at its confirmation (${code || "no code"}): ${e.message ?? "no message"}`,
      };
    }
    return {
      found: false,
      proof: "never",
      reason: `found the payment intent ${pi.id}, created with confirm, now ${pi.status}${e ? "" : " with no payment error on it"}: whether Stripe declined our confirmation or it changed since cannot be told from it; look at it in the dashboard`,
    };
  },
};

export const searchCustomers: Lookup<unknown> = {
  find: async (stripe, _args, key) =>
    (await stripe.customers.search({ query: `metadata['${METADATA_KEY}']:'${key}'`, limit: 1 })).data[0],
  lags: true,
  confirm: (stripe, _args, key, w) =>
    firstWithKey(stripe.customers.list({ created: createdWithin(w), limit: 100 }), key),
};

type RefundTarget = { payment_intent?: string | undefined; charge?: string | undefined };

export const listRefunds: Lookup<RefundTarget> = {
  async find(stripe, args, key) {
    const by = args.charge ? { charge: args.charge } : { payment_intent: args.payment_intent! };
    // Auto-pagination reads every page (starting_after the last id): the match may be past the first 100.
    for await (const refund of stripe.refunds.list({ ...by, limit: 100 })) {
      if (refund.metadata?.[METADATA_KEY] === key) return refund;
    }
    return undefined;
  },
  lags: false,
  blindSpot: (args) =>
    args.charge || args.payment_intent
      ? undefined
      : "the refund names neither a charge nor a payment_intent, so there is no list to look in: absence cannot be proven",
};

export interface ReconcileWindows {
  /** Search lag: "not found" proves nothing before this much time passed since the attempt. */
  readonly lagMs: number;
  /** Inside this window Stripe still holds our key, with whatever it saved under it. */
  readonly keyRetentionMs: number;
}

export async function reconcileByLookup<A>(
  stripe: Stripe,
  lookup: Lookup<A>,
  args: A,
  op: OperationContext,
  w: ReconcileWindows,
): Promise<ReconcileResult<StripeReceipt>> {
  const blind = lookup.blindSpot?.(args);
  if (blind) return { found: false, proof: "never", reason: blind };
  const window = { from: op.createdAt, to: op.lastAttemptAt };
  let listed: string | undefined; // why only the consistent list was read: Search failed
  try {
    const found = await lookup.find(stripe, args, op.key);
    // Only an object created while our requests could have run is ours: one older (an earlier
    // operation with this key, pruned from the ledger since) is not this operation's effect, and
    // Search's one hit may hide ours, so the window's list decides.
    if (found && madeWithin(found, window)) return answerOf(stripe, lookup, found, args);
  } catch (error) {
    // Search refused or down (Stripe does not offer it everywhere; an incident): the consistent
    // list answers on its own, and does not lag.
    if (!lookup.confirm) throw error;
    const inList = await lookup.confirm(stripe, args, op.key, window);
    if (inList === TOO_MANY) return tooMany("Stripe Search failed");
    if (inList) return answerOf(stripe, lookup, inList, args);
    listed = `Stripe Search failed (${(error as Error)?.message ?? String(error)})`;
  }
  // Without the database's time no window can be judged (a runner that does not fill `now`):
  // not found proves nothing yet, rather than everything (NaN comparisons are all false).
  if (!Number.isFinite(op.now))
    return {
      found: false,
      proof: "inconclusive",
      reason: "no database time (op.now) to judge the search-lag and key windows",
    };
  const sinceAttempt = op.now - op.lastAttemptAt;
  if (lookup.lags && listed === undefined && sinceAttempt < w.lagMs) {
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
  // consistent list of the objects created while our requests could have run, in any window.
  if (lookup.confirm && listed === undefined) {
    const inList = await lookup.confirm(stripe, args, op.key, window);
    if (inList === TOO_MANY) return tooMany("not in Stripe Search");
    if (inList) return answerOf(stripe, lookup, inList, args);
  }
  const keptMs = op.createdAt + w.keyRetentionMs - op.now;
  if (keptMs > 0) {
    // Absent, but Stripe still holds our key (with an error it saved under it, or past the
    // replay's margin): a retry with it now could only replay that. A person decides at once
    // (waiting for Stripe to forget the key would outlast the daemon's maxAgeMs anyway).
    const where = !lookup.confirm
      ? "in no page of the list"
      : listed
        ? `${listed}; not in the list of the objects created while our requests could have run`
        : "neither in Search nor in the list of the objects created while our requests could have run";
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
      reason: `${listed ? `${listed}; not` : "not in Stripe Search, nor"} in the list of the objects created while our requests could have run`,
    };
  return {
    found: false,
    proof: "absent",
    reason: lookup.lags ? "not in Stripe Search after the lag window" : "not in any page of the list",
  };
}

/** An object found with our key: the effect, or what its lookup's judge makes of it (a refusal, a person's question). */
async function answerOf<A>(
  stripe: Stripe,
  lookup: Lookup<A>,
  found: NonNullable<Found>,
  args: A,
): Promise<ReconcileResult<StripeReceipt>> {
  return (await lookup.judge?.(stripe, found, args)) ?? { found: true, receipt: toReceipt(found, null, false) };
}

function tooMany(search: string): ReconcileResult<StripeReceipt> {
  return {
    found: false,
    proof: "never",
    reason: `${search}, and more than ${MAX_LISTED} objects were created while our requests could have run: absence cannot be proven by reading them`,
  };
}
