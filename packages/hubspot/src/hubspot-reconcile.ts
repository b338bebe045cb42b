/**
 * Settling an unknown create by a consistent read of the unique-value property (GET by
 * idProperty), not through Search, whose index lags writes: a 404 from the read is proof of
 * absence, so the create can run again with the same external id.
 */
import type { ReconcileResult } from "@idem/core";
import { HUBSPOT_CALL_OPTIONS, type createHubSpotClient } from "./hubspot-client.js";
import { classifyHubSpotError } from "./hubspot-classify.js";
import type { HubSpotReceipt } from "./hubspot-receipt.js";

type Api = ReturnType<typeof createHubSpotClient>;

export async function readByExternalId(
  api: Api,
  objectType: string,
  uniqueProperty: string,
  externalId: string,
): Promise<{ id: string } | undefined> {
  try {
    const r = await api.objects.basicApi.getById(
      objectType,
      externalId,
      [uniqueProperty],
      undefined,
      undefined,
      false,
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
    found = await readByExternalId(api, objectType, uniqueProperty, externalId);
  } catch (e) {
    // Kept in the ledger as the check's reason: the status and HubSpot's words, not the client's
    // whole dump of the answer (its body and headers).
    throw new Error(`HubSpot read by ${uniqueProperty} failed: ${classifyHubSpotError(e).reason}`, { cause: e });
  }
  if (found) return { found: true, receipt: { objectType, id: found.id, new: false, externalId } };
  return {
    found: false,
    proof: "absent",
    reason: `no ${objectType} with ${uniqueProperty} = the key (consistent read)`,
  };
}
