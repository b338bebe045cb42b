/** What the ledger keeps of a Stripe write: ids and flags only, never card or customer data. */

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
