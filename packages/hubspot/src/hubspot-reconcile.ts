/**
 * Settling an unknown create by a consistent read of the unique-value property (GET by
 * idProperty), not through Search, whose index lags writes. HubSpot's `archived` on that read means
 * "only archived", so a live record and one deleted since (in the recycling bin) take two reads; a
 * 404 from both is proof of absence, and the create can run again with the same external id.
 * Not covered: a record purged since (90 days after its deletion, or at once by a GDPR delete)
 * reads as absent, and is created again.
 */
import type { ReconcileResult } from "@idem/core";
import { HUBSPOT_CALL_OPTIONS, type createHubSpotClient } from "./hubspot-client.js";
import { classifyHubSpotError } from "./hubspot-classify.js";
import type { HubSpotReceipt } from "./hubspot-receipt.js";

type Api = ReturnType<typeof createHubSpotClient>;

/**
 * The record carrying `externalId` in `uniqueProperty`: live ones only, or (`archived: true`)
 * archived ones only, as HubSpot's `archived` parameter reads. Undefined on a 404; throws when the
 * read proves nothing (unreachable, refused).
 */
export async function readByExternalId(
  api: Api,
  objectType: string,
  uniqueProperty: string,
  externalId: string,
  archived = false,
): Promise<{ id: string } | undefined> {
  try {
    const r = await api.objects.basicApi.getById(
      objectType,
      externalId,
      [uniqueProperty],
      undefined,
      undefined,
      archived,
      uniqueProperty,
      HUBSPOT_CALL_OPTIONS,
    );
    return { id: r.id };
  } catch (e) {
    if ((e as { code?: unknown }).code === 404) return undefined;
    throw e; // unreachable or refused: the lookup proves nothing
  }
}

export async function reconcileByRead(
  api: Api,
  objectType: string,
  uniqueProperty: string,
  externalId: string,
): Promise<ReconcileResult<HubSpotReceipt>> {
  let found: { id: string } | undefined;
  try {
    // A record deleted since our attempt made it is still the effect that happened: without the
    // second read it was "proven absent" and created again.
    found =
      (await readByExternalId(api, objectType, uniqueProperty, externalId)) ??
      (await readByExternalId(api, objectType, uniqueProperty, externalId, true));
  } catch (e) {
    // Kept in the ledger as the check's reason: the status and HubSpot's words, not the client's
    // whole dump of the answer (its body and headers).
    throw new Error(`HubSpot read by ${uniqueProperty} failed: ${classifyHubSpotError(e).reason}`, { cause: e });
  }
  if (found) return { found: true, receipt: { objectType, id: found.id, new: false, externalId } };
  return {
    found: false,
    proof: "absent",
    reason: `no ${objectType} with ${uniqueProperty} = the key, live or archived (consistent reads)`,
  };
}
