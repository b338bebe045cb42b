/** What the ledger keeps of a CRM write: ids only, never the record's properties. */
import { z } from "zod";

export interface HubSpotReceipt {
  readonly objectType: string;
  readonly id: string;
  /** True when this operation created the record; false when it found it (upsert, conflict, lookup). */
  readonly new: boolean;
  /** The operation key, stored in the unique-value property. */
  readonly externalId: string;
  /**
   * True when HubSpot showed the record already there before anything of this operation could
   * have written (its first attempt, or one after earlier ones HubSpot refused before any write:
   * `op.mayHaveCommitted` false), and this operation wrote nothing to it: the upsert's
   * read by the key found it (no upsert was sent), or a create was refused for the key (its first
   * request; the client sends each once). So it was made before the operation began (an operation
   * with the same key pruned from the ledger since, an import), and the work is not repeated.
   * Absent otherwise: on a create; on an upsert that wrote (HubSpot's `_new: false` is an update
   * of a record our read did not see: a racing write, or a read that failed); on a record found
   * after a lost answer (a replay, a lookup), most likely made by this operation's own earlier
   * request, unless (mode "create") HubSpot created that live record before the operation began,
   * so refused every create of it: then set. Receipts stored by earlier versions lack it, except
   * that those set it on an upsert's `_new: false` at the first request, which had written.
   */
  readonly existedBefore?: true;
  /**
   * True when the record was in HubSpot's recycling bin (deleted since this operation made it)
   * when the lookup settled the operation to it: the effect happened, but no live record holds
   * it (a person may restore it within 90 days). Absent for a live record, and on receipts stored
   * by earlier versions.
   */
  readonly archived?: true;
}

/**
 * The receipt's schema: what a person may record as the receipt when they resolve an operation
 * as succeeded (`admin.resolve`), the record they found in the CRM. `objectType` is the action's
 * (`deals`), any for none given; `id` HubSpot's record id (`hs_object_id`, digits); `externalId`
 * the operation key the record carries (64 hex, as `idem show` gives it). Fields besides these are
 * dropped (never the record's properties); `new` defaults to false (found, not known to be made
 * by this operation), and `existedBefore` and `archived` (the record is in the recycling bin) are
 * kept only when given as true.
 */
export function hubspotReceiptSchema(objectType?: string) {
  return z.object({
    objectType: objectType === undefined ? z.string().min(1) : z.literal(objectType),
    id: z.string().regex(/^[1-9][0-9]*$/, "must be HubSpot's record id (hs_object_id: digits)"),
    new: z.boolean().default(false),
    externalId: z.string().regex(/^[0-9a-f]{64}$/, "must be the operation key (64 hex) the record carries"),
    existedBefore: z.literal(true).exactOptional(),
    archived: z.literal(true).exactOptional(),
  });
}
