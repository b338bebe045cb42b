/**
 * Looking a Stripe effect up by our key, for the cases a replay cannot settle: after Stripe's
 * 24 h key retention, or when Stripe saved a 500 under the key. Customers and payment intents
 * are found through Search on `metadata['idem_operation']`, which lags writes by about a minute:
 * "not found" is inconclusive until the lag has passed. Refunds have no Search: they are listed
 * by payment intent (a consistent read) and matched on the same metadata.
 */
import type Stripe from "stripe";
import type { OperationContext, ReconcileResult } from "@idem/core";
import { METADATA_KEY, toReceipt, type StripeReceipt } from "./stripe-receipt.js";

type Found = { id: string; object: string; status?: string | null } | undefined;
export type Lookup<A> = (stripe: Stripe, args: A, key: string) => Promise<Found>;

export const searchPaymentIntents: Lookup<unknown> = async (stripe, _args, key) =>
  (await stripe.paymentIntents.search({ query: `metadata['${METADATA_KEY}']:'${key}'`, limit: 1 })).data[0];

export const searchCustomers: Lookup<unknown> = async (stripe, _args, key) =>
  (await stripe.customers.search({ query: `metadata['${METADATA_KEY}']:'${key}'`, limit: 1 })).data[0];

export const listRefunds: Lookup<{ payment_intent?: string | undefined }> = async (stripe, args, key) => {
  if (!args.payment_intent) return undefined;
  const page = await stripe.refunds.list({ payment_intent: args.payment_intent, limit: 100 });
  return page.data.find((r) => r.metadata?.[METADATA_KEY] === key);
};

export interface ReconcileWindows {
  readonly now: number;
  /** Search lag: "not found" proves nothing before this much time passed since the attempt. */
  readonly lagMs: number;
  /** Inside this window Stripe still holds our key, with whatever it saved under it. */
  readonly keyRetentionMs: number;
  /** Whether the lookup reads an index that lags (Search) or a consistent list. */
  readonly lags: boolean;
}

export async function reconcileByLookup<A>(stripe: Stripe, lookup: Lookup<A>, args: A, op: OperationContext, w: ReconcileWindows): Promise<ReconcileResult<StripeReceipt>> {
  const found = await lookup(stripe, args, op.key);
  if (found) return { found: true, receipt: toReceipt(found, null, false) };
  const sinceAttempt = w.now - op.lastAttemptAt;
  if (w.lags && sinceAttempt < w.lagMs) {
    // Look again before the window ends: the index usually catches up sooner.
    const retryAfterMs = Math.min(w.lagMs - sinceAttempt, Math.max(1_000, Math.round(w.lagMs / 6)));
    return { found: false, proof: "inconclusive", reason: `not in Stripe Search yet; it may lag ${w.lagMs} ms`, retryAfterMs };
  }
  if (w.now - op.createdAt < w.keyRetentionMs) {
    // We only look up inside the retention window when Stripe saved an error under our key: the
    // object is absent, but a retry with this key can only replay that error until Stripe forgets it.
    return { found: false, proof: "never", reason: "absent at Stripe, but Stripe saved an error under this key: retrying it repeats the error; a person must resolve it or retry with a new revision" };
  }
  return { found: false, proof: "absent", reason: w.lags ? "not in Stripe Search after the lag window" : "not in the list" };
}
