/**
 * A ready tool definition for agents (see @idem/agents), shaped as its `ToolDefinition`.
 *
 * The identity of a contact is its email address, trimmed and lowercased (hashed in the key): one
 * record per address, whatever the model retries or however it spells the case; the names the
 * model fills in are not part of the identity. Other names for a known address are refused while
 * the ledger keeps the first call's operation (its `retentionMs`, 30 days by default). After that,
 * the contact is found by its key and returned as already done, its names left as they are in the
 * CRM (in upsert mode, unless that read fails: the upsert then writes them, and the model reads done).
 *
 * The model reads `new: true` for a record this call created, and "already done earlier" with
 * `new: false` for one HubSpot showed was there before the operation began (made by an operation
 * pruned from the ledger since) and this call did not write (`existedBefore`), with a `note` that
 * the names given were not written (else the model tells the user the CRM holds them). A record
 * found after a lost answer is most likely this call's own, and one an upsert updated was written
 * by it: each reads done, without `new`. One deleted since (settled to our record in HubSpot's
 * recycling bin, `archived`) reads `archived: true` with a `note` that it is not a live contact.
 */
import { z } from "zod";
import { sensitive } from "@idem/core";
import type { HubSpotActions, HubSpotCreateArgs } from "./hubspot-actions.js";
import type { HubSpotReceipt } from "./hubspot-receipt.js";

const contactInput = z.object({
  email: z.string().email(),
  firstname: z.string().min(1).nullish(),
  lastname: z.string().min(1).nullish(),
});
export type HubSpotContactInput = z.output<typeof contactInput>;

/** What a model reads of a contact found already there: its names (maybe other ones) left as they were. */
const NOT_WRITTEN = "the contact was already there: the names given were not written, it is as it was";
/** What a model reads of a contact this call made that someone deleted since (HubSpot's recycling bin). */
const DELETED =
  "the contact was created, then deleted in HubSpot since: it is in the recycling bin, not a live contact";

export function hubspotTools(actions: HubSpotActions) {
  return {
    createContact: {
      name: "create_contact",
      description: "Create a CRM contact for an email address. Safe to call again: one contact per address.",
      action: actions.create("contacts"),
      input: contactInput,
      args: (i: HubSpotContactInput): HubSpotCreateArgs => ({
        properties: {
          email: i.email.trim().toLowerCase(),
          ...(i.firstname && { firstname: i.firstname }),
          ...(i.lastname && { lastname: i.lastname }),
        },
      }),
      key: (i: HubSpotContactInput) => ["contact", sensitive(i.email.trim().toLowerCase())],
      summarize: (r: HubSpotReceipt) => ({
        id: r.id,
        ...(r.new ? { new: true } : r.existedBefore && { new: false, note: NOT_WRITTEN }),
        ...(r.archived && { archived: true, note: DELETED }),
      }),
      // Only a receipt of a record this call did not write: "not repeated" must be true.
      foundEarlier: (r: HubSpotReceipt) => r.existedBefore === true,
    },
  } as const;
}
