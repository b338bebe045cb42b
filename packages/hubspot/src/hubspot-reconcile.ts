/**
 * Settling an unknown create by a consistent read of the unique-value property (GET by
 * idProperty), not through Search, whose index lags writes. HubSpot's `archived` on that read means
 * "only archived", so a live record and one deleted since (in the recycling bin) take two reads; a
 * 404 from both is proof of absence, and the create can run again with the same external id, but
 * only for a unique-value property (read from HubSpot first, once per process): HubSpot answers a
 * read by any other property 400, and more than one record could carry the key in it. A 429 is
 * waited out as HubSpot's headers say. Not covered: a record purged since (90 days after its deletion, or at once by a GDPR delete)
 * reads as absent, and is created again.
 */
import type { ReconcileResult } from "@idem/core";
import { HUBSPOT_CALL_OPTIONS, type createHubSpotClient } from "./hubspot-client.js";
import { classifyHubSpotError } from "./hubspot-classify.js";
import { HubSpotSchemaError, HubSpotSchemaReadError } from "./hubspot-errors.js";
import type { HubSpotReceipt } from "./hubspot-receipt.js";
import type { UniquePropertyCheck } from "./hubspot-schema.js";

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
  schema: UniquePropertyCheck,
  objectType: string,
  uniqueProperty: string,
  externalId: string,
): Promise<ReconcileResult<HubSpotReceipt>> {
  let found: { id: string } | undefined;
  try {
    await schema.require(objectType, uniqueProperty);
    // A record deleted since our attempt made it is still the effect that happened: without the
    // second read it was "proven absent" and created again.
    found =
      (await readByExternalId(api, objectType, uniqueProperty, externalId)) ??
      (await readByExternalId(api, objectType, uniqueProperty, externalId, true));
  } catch (e) {
    // Waiting does not make a property unique-value: no later check can prove absence. A person
    // decides (needs_review), rather than checks repeated with backoff for ever (inconclusive).
    if (e instanceof HubSpotSchemaError)
      return { found: false, proof: "never", reason: `${e.message}; a read by it cannot prove the record absent` };
    // Kept in the ledger as the check's reason: the status and HubSpot's words, not the client's
    // whole dump of the answer (its body and headers).
    const ofSchema = e instanceof HubSpotSchemaReadError;
    const read = classifyHubSpotError(ofSchema ? e.cause : e);
    const what = ofSchema ? `of the definition of ${objectType}.${uniqueProperty}` : `by ${uniqueProperty}`;
    const reason = `HubSpot read ${what} failed: ${read.reason}`;
    // Thrown, the check would be due again at the ledger's backoff (milliseconds), into the same limit.
    if (read.kind === "rate_limited")
      return { found: false, proof: "inconclusive", reason, retryAfterMs: read.retryAfterMs };
    throw new Error(reason, { cause: e });
  }
  if (found) return { found: true, receipt: { objectType, id: found.id, new: false, externalId } };
  return {
    found: false,
    proof: "absent",
    reason: `no ${objectType} with ${uniqueProperty} = the key, live or archived (consistent reads)`,
  };
}
