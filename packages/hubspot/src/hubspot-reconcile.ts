/**
 * Settling an unknown create by a consistent read of the unique-value property (GET by
 * idProperty), not through Search, whose index lags writes. HubSpot's `archived` on that read means
 * "only archived", so a live record and one deleted since (in the recycling bin) take two reads; a
 * 404 from both, once the settle window after the last attempt passed (a write HubSpot took may be
 * applied after our client stopped waiting), is proof of absence, and the create can run again with the same external id, but
 * only for a unique-value property (read from HubSpot first, once per process): HubSpot answers a
 * read by any other property 400, and more than one record could carry the key in it. A 429 is
 * waited out as HubSpot's headers say.
 *
 * A deleted record does not hold its unique values, so the recycling bin may hold several with the
 * key: an earlier operation's, pruned from the ledger since, and ours. The read shows one. It is
 * ours only if HubSpot created it while our requests could have run (the operation's claim to its
 * last attempt, with some slack for clocks): one made outside that window is another operation's,
 * and ours, deleted since, could be behind it, so a person decides. Inside the window too, when its
 * values differ from the args (hubspot-values.ts): the slack lets in a record an earlier operation
 * with the key made minutes before this one began, with other args, and deleted since. A live
 * record is the only one with the key: whenever it was made, and whatever its values, it is the
 * record a create with the key meets.
 * Not covered: a record purged since (90 days after its deletion, or at once by a GDPR delete)
 * reads as absent, and is created again.
 */
import type { OperationContext, ReconcileResult } from "@idem/core";
import { HUBSPOT_CALL_OPTIONS, type createHubSpotClient } from "./hubspot-client.js";
import { classifyHubSpotError } from "./hubspot-classify.js";
import { HubSpotLookupError, HubSpotSchemaError, HubSpotSchemaReadError } from "./hubspot-errors.js";
import { notFoundByHubSpot, readByPropertyRefused } from "./hubspot-evidence.js";
import type { HubSpotReceipt } from "./hubspot-receipt.js";
import type { PropertyShapeCache, UniquePropertyCheck } from "./hubspot-schema.js";
import { differingProperties, type PropertyShape } from "./hubspot-values.js";

type Api = ReturnType<typeof createHubSpotClient>;

/**
 * A record read by the key: its id, when HubSpot created it (ms, HubSpot's clock) if it said, and
 * the values it returned of the properties asked for (a property it does not have is left out).
 */
export interface FoundRecord {
  readonly id: string;
  readonly createdAt?: number;
  readonly properties: Readonly<Record<string, string | null>>;
}

/**
 * The slack of our attempts' window, as the Stripe adapter's: before the claim, for HubSpot's clock
 * being behind the ledger's; after the last attempt, for that and for a request still running at
 * HubSpot after our attempt gave up on it. Kept tight: a record outside goes to a person, while one
 * inside is taken as ours, so a wider window only risks taking an earlier operation's.
 */
const BEFORE_MS = 5 * 60_000;
const AFTER_MS = 10 * 60_000;

/** Whether HubSpot created the record while the operation's requests could have run. */
function madeWithin(record: FoundRecord, op: OperationContext): boolean {
  if (record.createdAt === undefined) return true; // nothing to judge by, as before windows were
  return record.createdAt >= op.createdAt - BEFORE_MS && record.createdAt <= op.lastAttemptAt + AFTER_MS;
}

/** Whether HubSpot created the record before the operation began (its creation, less the clocks' slack). */
function madeBefore(record: FoundRecord, op: OperationContext): boolean {
  return record.createdAt !== undefined && record.createdAt < op.createdAt - BEFORE_MS;
}

/**
 * The record carrying `externalId` in `uniqueProperty`: live ones only, or (`archived: true`)
 * archived ones only, as HubSpot's `archived` parameter reads, with its values of `properties`
 * too. Undefined on HubSpot's 404 (see `notFoundByHubSpot`); throws when the read proves nothing
 * (unreachable, refused, a 404 that is not HubSpot's).
 */
export async function readByExternalId(
  api: Api,
  objectType: string,
  uniqueProperty: string,
  externalId: string,
  archived = false,
  properties: readonly string[] = [],
): Promise<FoundRecord | undefined> {
  try {
    const r = await api.objects.basicApi.getById(
      objectType,
      externalId,
      [uniqueProperty, ...properties],
      undefined,
      undefined,
      archived,
      uniqueProperty,
      HUBSPOT_CALL_OPTIONS,
    );
    const createdAt = r.createdAt instanceof Date ? r.createdAt.getTime() : Number.NaN;
    return { id: r.id, ...(Number.isFinite(createdAt) && { createdAt }), properties: r.properties ?? {} };
  } catch (e) {
    if (notFoundByHubSpot(e)) return undefined;
    throw e; // unreachable or refused: the lookup proves nothing
  }
}

export async function reconcileByRead(
  api: Api,
  schema: UniquePropertyCheck,
  /** The definitions of the args' properties, kept for the process (see propertyShapeCache). */
  definitions: PropertyShapeCache,
  objectType: string,
  uniqueProperty: string,
  op: OperationContext,
  /** The args' properties: what a record this operation made holds (compared on a deleted record). */
  given: Readonly<Record<string, string>>,
  /** See `HubSpotConfig.settleMs`. */
  settleMs: number,
  /**
   * Whether every write of the operation that may have reached HubSpot was a create (mode
   * "create", as its provider reference records): a create never writes to a record with the key.
   */
  createsOnly: boolean,
): Promise<ReconcileResult<HubSpotReceipt>> {
  const externalId = op.key;
  let live: FoundRecord | undefined;
  let archived: FoundRecord | undefined;
  let shapes: Record<string, PropertyShape> = {};
  try {
    await schema.require(objectType, uniqueProperty);
    live = await readByExternalId(api, objectType, uniqueProperty, externalId);
    // A record deleted since our attempt made it is still the effect that happened: without the
    // second read it was "proven absent" and created again. Its values are read to tell it from an
    // earlier operation's with the key (see above).
    if (!live) archived = await readByExternalId(api, objectType, uniqueProperty, externalId, true, Object.keys(given));
    // How HubSpot keeps the values it returned (text exactly, numbers as numbers, times in UTC):
    // read only for a record whose values decide.
    if (archived && madeWithin(archived, op)) {
      const held = archived.properties;
      // Not returned: HubSpot has no such property now, so a definition kept of it is stale.
      definitions.forget(
        objectType,
        Object.keys(given).filter((name) => held[name] === undefined),
      );
      shapes = await definitions.of(
        objectType,
        Object.keys(given).filter((name) => held[name] !== undefined),
      );
    }
  } catch (e) {
    // Waiting does not make a property unique-value: no later check can prove absence. A person
    // decides (needs_review), rather than checks repeated with backoff for ever (inconclusive).
    // (Its message says so: a read by it cannot prove a record absent.)
    if (e instanceof HubSpotSchemaError) return { found: false, proof: "never", reason: e.message };
    // Kept in the ledger as the check's reason: the status and HubSpot's words, not the client's
    // whole dump of the answer (its body and headers).
    const ofSchema = e instanceof HubSpotSchemaReadError;
    const cause = ofSchema ? e.cause : e;
    const read = classifyHubSpotError(cause);
    // The definition read may be of a value's property (definitions.of), not the key's: named as read.
    const property = ofSchema ? e.property : uniqueProperty;
    const failed = new HubSpotLookupError(objectType, property, ofSchema ? "definition" : "record", read.reason, {
      cause,
    });
    // Refused 400 by HubSpot, the property is no longer unique-value or is gone since its kept
    // verdict: the next check reads its definition again, which says so (and a person decides).
    if (!ofSchema && readByPropertyRefused(e)) schema.forget(objectType, uniqueProperty);
    // Thrown, the check would be due again at the ledger's backoff (milliseconds), into the same limit.
    if (read.kind === "rate_limited")
      return { found: false, proof: "inconclusive", reason: failed.message, retryAfterMs: read.retryAfterMs };
    // Typed, so that the runner's classify keeps the read's class: a refused credential or an
    // untrusted certificate fails every later check alike, and is alerted now.
    throw failed;
  }
  // A live record HubSpot made before the operation began refused every create of it (the key is
  // unique-value): this operation wrote nothing to it, as a create refused for the key tells when
  // its answer comes (HubSpotReceipt.existedBefore), not "most likely ours". An upsert that went
  // unanswered may have written over it: nothing more is claimed.
  if (live) {
    const before = createsOnly && madeBefore(live, op);
    return {
      found: true,
      receipt: { objectType, id: live.id, new: false, externalId, ...(before && { existedBefore: true }) },
    };
  }
  if (archived && !madeWithin(archived, op)) return outsideWindow(objectType, archived, op);
  const differ = archived ? differingProperties(given, archived.properties, shapes) : [];
  if (archived && differ.length > 0) return otherValues(objectType, archived, differ);
  // Ours, deleted since: the effect that happened, and the receipt says it is not a live record.
  if (archived)
    return { found: true, receipt: { objectType, id: archived.id, new: false, externalId, archived: true } };
  const none = `no ${objectType} with ${uniqueProperty} = the key, live or archived (consistent reads)`;
  // A write our attempt stopped waiting for may still be applied: found absent then, it ran again
  // as "known not done", and its record, written after, read as one there before the operation.
  // Both times are the database's (the clock windows are measured by).
  const waited = op.now - op.lastAttemptAt;
  // Without the database's time (a hand-made context, an older runner) no window can be judged.
  if (!Number.isFinite(waited))
    return {
      found: false,
      proof: "inconclusive",
      reason: `${none}; no database time (op.now) to judge the settle window`,
    };
  if (waited < settleMs)
    return {
      found: false,
      proof: "inconclusive",
      reason: `${none} yet; a write HubSpot took before the attempt gave up may still be applied (${settleMs} ms settle window)`,
      retryAfterMs: settleMs - waited,
    };
  return { found: false, proof: "absent", reason: none };
}

/**
 * A record in the recycling bin with our key, created outside our attempts' window: an earlier
 * operation's (pruned from the ledger since), or ours seen through a clock far off HubSpot's. Not
 * absent either: HubSpot shows one archived record per read, and ours, deleted since, may be
 * behind it. Waiting changes nothing, so a person decides.
 */
function outsideWindow(objectType: string, r: FoundRecord, op: OperationContext): ReconcileResult<HubSpotReceipt> {
  const iso = (ms: number) => (Number.isFinite(ms) ? new Date(ms).toISOString() : "an unknown time");
  const what = objectType.replace(/ies$/, "y").replace(/s$/, "");
  return {
    found: false,
    proof: "never",
    reason:
      `${what} ${r.id} in the recycling bin carries the key but was created ${iso(r.createdAt ?? Number.NaN)}, ` +
      `outside the window our requests could have run (${iso(op.createdAt - BEFORE_MS)} to ${iso(op.lastAttemptAt + AFTER_MS)} ` +
      "by the ledger's clock): an earlier operation with this key, pruned from the ledger since, made it, " +
      "or the ledger's clock is off HubSpot's; a read shows one deleted record per key, so one of ours deleted since may be " +
      "behind it: look in HubSpot's recycling bin",
  };
}

/**
 * A record in the recycling bin with our key, made inside our attempts' window, whose values of
 * `differ` are not the args': an earlier operation's with other args (pruned from the ledger
 * since, its record made minutes before this operation began, inside the clocks' slack), or ours
 * edited before it was deleted. Settled to it, the caller would be told done for a record that is
 * not there, holding other values. The reason names the properties, never their values (reasons
 * are stored).
 */
function otherValues(objectType: string, r: FoundRecord, differ: readonly string[]): ReconcileResult<HubSpotReceipt> {
  const what = objectType.replace(/ies$/, "y").replace(/s$/, "");
  const shown = differ.slice(0, 5).join(", ") + (differ.length > 5 ? ` and ${differ.length - 5} more` : "");
  const when =
    r.createdAt === undefined
      ? "at a time HubSpot did not say"
      : `${new Date(r.createdAt).toISOString()}, while our requests could have run`;
  return {
    found: false,
    proof: "never",
    reason:
      `${what} ${r.id} in the recycling bin carries the key and was created ${when}, ` +
      `but its values of ${shown} differ from this operation's args: an earlier operation with this key, pruned ` +
      "from the ledger since, made it with other args, or ours was edited before it was deleted; a read shows one " +
      "deleted record per key, so one of ours deleted since may be behind it: look in HubSpot's recycling bin",
  };
}
