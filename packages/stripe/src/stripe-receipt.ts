/** What the ledger keeps of a Stripe write: ids and flags only, never card or customer data. */
import { z } from "zod";

/** The metadata field that carries the operation key on every object we create. */
export const METADATA_KEY = "idem_operation";

export interface StripeReceipt {
  readonly id: string;
  readonly object: string;
  readonly status: string | null;
  /** Stripe's Request-Id of the answer, for support; null when the object was found by lookup. */
  readonly requestId: string | null;
  /** Stripe answered from its idempotency cache (`Idempotent-Replayed: true`). */
  readonly replayed: boolean;
  /**
   * The other objects with our key a lookup found made while our requests could run, when it
   * found more than one (settled with `twice`, a person alerted): each another effect. The
   * action's `effectId` names them with `id`, so that a request's late answer naming one of them
   * is that same incident, not alerted again. Absent otherwise.
   */
  readonly others?: readonly string[] | undefined;
  /** The connected account (`acct_…`) the object lives on; absent for the API key's own account. */
  readonly account?: string | undefined;
}

export function toReceipt(
  obj: { id: string; object: string; status?: string | null },
  requestId: string | null,
  replayed: boolean,
): StripeReceipt {
  return {
    id: obj.id,
    object: obj.object,
    status: typeof obj.status === "string" ? obj.status : null,
    requestId,
    replayed,
  };
}

/** `receipt`, naming the connected account its object lives on (none: the platform's, unchanged). */
export function onAccount(receipt: StripeReceipt, account: string | undefined): StripeReceipt {
  return account === undefined ? receipt : { ...receipt, account };
}

/**
 * The receipt's schema: what a person may record as the receipt when they resolve an operation
 * as succeeded (`admin.resolve`), the object they found at Stripe. `object` is the action's
 * Stripe object type (`payment_intent`), any for a generic POST; `others`, the other objects with
 * our key they found (up to 20, as a lookup names them); `account`, the connected account they
 * found it on (none: the API key's own). Fields besides these are dropped
 * (never card or customer data); `requestId` defaults to null and `replayed` to false (found by a
 * person, not answered), `status` to null (not recorded: a charge tool then reads it as not known
 * to be paid).
 */
export function stripeReceiptSchema(object?: string) {
  return z
    .object({
      id: z.string().min(1),
      object: object === undefined ? z.string().min(1) : z.literal(object),
      status: z.string().min(1).nullable().default(null),
      requestId: z.string().min(1).nullable().default(null),
      replayed: z.boolean().default(false),
      // The other objects with our key the person found (a second charge): named, a request's late
      // answer naming one is that incident, not alerted again (`StripeReceipt.others`).
      others: z
        .array(z.string().min(1))
        .min(1)
        .max(20)
        .refine((ids) => new Set(ids).size === ids.length, "the other objects are named once each")
        .optional(),
      account: z
        .string()
        .regex(/^acct_[A-Za-z0-9]+$/, "a connected account's id, acct_…")
        .optional(),
    })
    .refine((r) => !r.others?.includes(r.id), { path: ["others"], message: "names the receipt's own object" });
}
