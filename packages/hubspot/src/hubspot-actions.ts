/**
 * HubSpot CRM creates as idem actions, through the real @hubspot/api-client, for any object type
 * by name (contacts, companies, deals, tickets, notes, custom). The operation key goes into a
 * unique-value property (default `idem_external_id`), so the CRM itself refuses a second record:
 * creates are upserts by that idProperty, or (mode "create") a create whose unique-value conflict
 * is read back as the existing record, once the property is known to be unique-value (read from
 * HubSpot once per process). Either way a record that already has the key is not written again:
 * an upsert is preceded by a read by the key (it would write its values over the record), a create
 * is refused for it. Unknown outcomes are settled by a consistent read.
 */
import { defineAction, type Action } from "@idem/core";
import {
  type HUBSPOT_CALL_OPTIONS,
  HUBSPOT_SETTLE_MS,
  answersKept,
  createHubSpotClient,
  type HubSpotConfig,
} from "./hubspot-client.js";
import {
  classifyHubSpotError,
  existingIdOf,
  isRefusal,
  isValidationRefusal,
  namesProperty,
  propertyRefusal,
  tlsRefusal,
} from "./hubspot-classify.js";
import {
  HubSpotBatchInputError,
  HubSpotReadBackError,
  HubSpotResentError,
  HubSpotSchemaError,
} from "./hubspot-errors.js";
import { readByPropertyRefused } from "./hubspot-evidence.js";
import { hubspotReceiptSchema, type HubSpotReceipt } from "./hubspot-receipt.js";
import { readByExternalId, reconcileByRead } from "./hubspot-reconcile.js";
import { ensureUniqueProperty, propertyShapeCache, uniquePropertyCheck } from "./hubspot-schema.js";

/** What ends the provider reference of an operation whose writes are creates (mode "create"). */
const CREATE_MODE = " (create mode)";

export interface HubSpotCreateArgs {
  readonly properties: Readonly<Record<string, string>>;
}

export interface HubSpotActions {
  /** The create action for an object type; type `hubspot.<objectType>.create`. */
  create(objectType: string): Action<HubSpotCreateArgs, HubSpotReceipt>;
  /** Creates the unique-value property on these object types where missing. */
  ensureSchema(objectTypes: readonly string[]): Promise<Record<string, "created" | "present">>;
}

export function hubspotActions(config: HubSpotConfig): HubSpotActions {
  const api = createHubSpotClient(config);
  const unique = config.uniqueProperty ?? "idem_external_id";
  const mode = config.mode ?? "upsert";
  const cache = new Map<string, Action<HubSpotCreateArgs, HubSpotReceipt>>();
  const schema = uniquePropertyCheck(api);
  const definitions = propertyShapeCache(api);
  // With client retries, one execution may send a request again after the first committed: what
  // its answer finds may be this operation's own record.
  const oneRequest = (config.clientRetries ?? 0) <= 1;
  const settleMs = config.settleMs ?? HUBSPOT_SETTLE_MS;
  if (!(Number.isInteger(settleMs) && settleMs >= 0))
    throw new Error(`settleMs must be a whole number of ms >= 0 (got ${settleMs})`);

  function create(objectType: string): Action<HubSpotCreateArgs, HubSpotReceipt> {
    const known = cache.get(objectType);
    if (known) return known;
    const action = defineAction<HubSpotCreateArgs, HubSpotReceipt>({
      type: `hubspot.${objectType}.create`,
      capabilities: { lookup: true },
      receipt: hubspotReceiptSchema(objectType),
      // `property:key`, marked when every write is a create (what a lookup may conclude: see createsOnly).
      providerReference: (_args, op) => `${unique}:${op.key}${mode === "create" ? CREATE_MODE : ""}`,
      // The record's id: the unique property allows one record per key, so a lookup's receipt
      // (new: false) and the request's own late answer (new: true) naming it are one effect.
      effectId: (receipt) => `${receipt.objectType}/${receipt.id}`,
      validate(args) {
        if (args.properties?.[unique] !== undefined)
          throw new Error(`${unique} is set by idem from the operation key; do not pass it`);
      },
      async execute(args, op) {
        const idProperty = idPropertyOf(op);
        // Create mode rests on HubSpot refusing a second record with the key: checked before the
        // first create. An upsert by a property that is not unique-value HubSpot refuses itself
        // (400), and that refusal is read as the same misconfiguration (refuseKeyProperty).
        if (mode === "create") await schema.require(objectType, idProperty);
        // No earlier request of this operation can have made a record: the first attempt, or one
        // run from known not done (its earlier ones refused before any write: 423, 429, 477).
        const unwritten = op.mayHaveCommitted === undefined ? op.attempt === 1 : !op.mayHaveCommitted;
        if (mode === "upsert") {
          // Found, the record is the effect, and is not written again. While nothing of this
          // operation has reached HubSpot, it was made before the operation began (see
          // HubSpotReceipt.existedBefore).
          const there = await readBeforeUpsert(op.key, idProperty);
          if (there)
            return {
              objectType,
              id: there.id,
              new: false,
              externalId: op.key,
              ...(unwritten && { existedBefore: true }),
            };
        }
        // The operation's first request that could write: a create refused for the key met a
        // record that was there before the operation began (see HubSpotReceipt.existedBefore).
        const first = unwritten && oneRequest;
        const sent = answersKept();
        try {
          return mode === "upsert"
            ? await upsert(args, op.key, idProperty, sent.options)
            : await createOne(args, op.key, idProperty, sent.options);
        } catch (e) {
          // Sent again by the client after a 5xx (which may follow a write): the last answer, a
          // 429 or a 403 say, would be read as nothing written. A refusal of our key is read back.
          const earlier = sent.earlier();
          if (earlier.some((status) => status >= 500) && !isRefusal(e))
            throw new HubSpotResentError(earlier, { cause: e });
          if (!isRefusal(e)) throw e;
          const ofKey = propertyRefusal(e, idProperty, op.key);
          // The key's property deleted since its check (kept for the process): HubSpot wrote nothing,
          // and a read by it would be refused too. A person fixes the schema, as at the first check.
          if (ofKey === "missing") {
            schema.forget(objectType, idProperty);
            throw new HubSpotSchemaError(objectType, idProperty, "missing", { cause: e });
          }
          // An upsert refused for naming its key property: HubSpot's 400 for an idProperty that is
          // not unique-value (or missing). A configuration to fix, as create mode's check finds it
          // before its first write; the definition, read again, says which (and nothing else).
          if (mode === "upsert" && ofKey === undefined && namesProperty(e, idProperty))
            await refuseKeyProperty(e, idProperty);
          // An upsert updates the record with our key rather than repeat it: a validation error is
          // about the values, the caller's data, whatever records exist (read back, ours was taken
          // as this write's success though HubSpot wrote nothing). Unless it refuses our key's
          // value: a unique-value clash, which only a racing write of the key causes (some accounts
          // answer it 400, or 207 in a batch), read back as a create's conflict is.
          if (mode === "upsert" && isValidationRefusal(e) && ofKey !== "value") throw e;
          return readBack(e, op.key, idProperty, first);
        }
      },
      classify: (error) => classifyHubSpotError(error),
      reconcile: (args, op) =>
        reconcileByRead(
          api,
          schema,
          definitions,
          objectType,
          idPropertyOf(op),
          op,
          args.properties ?? {},
          settleMs,
          createsOnly(op),
        ),
    });
    cache.set(objectType, action);
    return action;

    /**
     * The record with our key, read before an upsert: the upsert would write this call's values
     * over it (a person's edits since reverted) though the work was done, by an earlier attempt or
     * an operation with the key pruned from the ledger since. A read that fails proves nothing, and
     * the upsert goes as it did without it (its receipt then claims nothing of before), except when
     * HubSpot asks us to wait (429, 423, 477), or its certificate is not trusted: a write now would
     * be refused alike.
     */
    async function readBeforeUpsert(key: string, idProperty: string): Promise<{ id: string } | undefined> {
      try {
        return await readByExternalId(api, objectType, idProperty, key);
      } catch (e) {
        // An untrusted certificate refused the read before it was sent: the upsert would meet it too.
        if (classifyHubSpotError(e).kind === "rate_limited" || tlsRefusal(e)) throw e;
        return undefined;
      }
    }

    /**
     * Throws HubSpotSchemaError (caused by `refusal`) when the key property's definition, read
     * again, is missing or not unique-value; returns when it is unique-value or cannot be read, and
     * the refusal is then taken as it stands. Read on such a refusal only: upsert mode sends no
     * request before its first write for a check that a correct schema never needs.
     */
    async function refuseKeyProperty(refusal: unknown, idProperty: string): Promise<void> {
      schema.forget(objectType, idProperty);
      try {
        await schema.require(objectType, idProperty);
      } catch (e) {
        if (e instanceof HubSpotSchemaError)
          throw new HubSpotSchemaError(objectType, idProperty, e.problem, {
            cause: refusal,
            ...(e.definition && { definition: e.definition }),
          });
      }
    }

    /**
     * HubSpot's `_new: false` here is a record written between our read and this upsert (a racing
     * write of the key), or one our read could not see (it failed): updated with this call's
     * values, so not "there before, nothing written" (no existedBefore).
     */
    async function upsert(
      args: HubSpotCreateArgs,
      key: string,
      idProperty: string,
      options: typeof HUBSPOT_CALL_OPTIONS,
    ): Promise<HubSpotReceipt> {
      const out = await api.objects.batchApi.upsert(
        objectType,
        { inputs: [{ idProperty, id: key, properties: { ...args.properties } }] },
        options,
      );
      const r = out.results[0];
      // HubSpot answers a refused input with 207 Multi-Status and no result, even for one
      // input: the client returns that answer, it does not throw.
      if (!r) throw new HubSpotBatchInputError("errors" in out ? (out.errors ?? []) : []);
      return { objectType, id: r.id, new: r._new, externalId: key };
    }

    async function createOne(
      args: HubSpotCreateArgs,
      key: string,
      idProperty: string,
      options: typeof HUBSPOT_CALL_OPTIONS,
    ): Promise<HubSpotReceipt> {
      const r = await api.objects.basicApi.create(
        objectType,
        { properties: { ...args.properties, [idProperty]: key }, associations: [] },
        options,
      );
      return { objectType, id: r.id, new: true, externalId: key };
    }

    /**
     * The CRM refused a second record with our key (a create after one that went through; an
     * upsert that lost a race with another attempt's): the first one is the effect. HubSpot
     * answers 409 for a contact's email, but a 400 validation error has been reported for a
     * custom unique property, and a batch answers per input (207): each is read back before it
     * is taken as the caller's data.
     * Live records only: a deleted record does not hold its unique values (HubSpot restores a
     * deleted contact only while no active one has its email), so it cannot be why this write
     * was refused. An earlier attempt's record deleted since is the lookup's to find (reconcile
     * reads archived records too), before any create is sent again.
     */
    async function readBack(
      refusal: unknown,
      key: string,
      idProperty: string,
      first: boolean,
    ): Promise<HubSpotReceipt> {
      let existing: { id: string } | undefined;
      try {
        existing = await readByExternalId(api, objectType, idProperty, key);
      } catch (readError) {
        // A read by the key refused 400 by HubSpot: the property is no longer unique-value, or is
        // gone. Its kept verdict is dropped, so the lookup reads the definition again (and a person
        // decides). A proxy's 400 page says nothing of it: the verdict stands.
        if (readByPropertyRefused(readError)) schema.forget(objectType, idProperty);
        // The read proves nothing (429, a missing read scope, unreachable): the refusal may
        // still be our record's. Ambiguous, never the read's own class (hubspot-classify.ts).
        throw new HubSpotReadBackError(refusal, idProperty, { cause: readError });
      }
      if (!existing) throw refusal; // a conflict on another unique property, or invalid values: the caller's data
      // An upsert refused for a value another record holds (the conflict names it) wrote nothing:
      // our record, made earlier, is not this write's effect. A create's effect is our record,
      // whichever record HubSpot names: an earlier attempt made it.
      const named = existingIdOf(refusal);
      if (mode === "upsert" && named !== undefined && named !== existing.id) throw refusal;
      // A create refused on the operation's first request met a record made before the operation
      // began. An upsert refused raced another write of the key after our read found none, most
      // likely this operation's own (a lost lease's attempt): not known.
      const before = mode === "create" && first;
      return { objectType, id: existing.id, new: false, externalId: key, ...(before && { existedBefore: true }) };
    }
  }

  /**
   * The unique property recorded for the operation before its first request (its provider
   * reference, `property:key`), not the one configured today: with another `uniqueProperty` since,
   * the record would be read by a property it never had, "proven absent", and created again.
   */
  function idPropertyOf(op: { readonly providerReference: string | null }): string {
    const ref = op.providerReference;
    const colon = ref?.lastIndexOf(":") ?? -1;
    return ref && colon > 0 ? ref.slice(0, colon) : unique;
  }

  /**
   * Whether the operation's writes that may have reached HubSpot were all creates: its reference,
   * made again before any attempt run from known not done, says so, whatever mode is configured
   * today (a daemon's config may differ from the workers'). References made by earlier versions
   * do not: not known, so false.
   */
  function createsOnly(op: { readonly providerReference: string | null }): boolean {
    return op.providerReference?.endsWith(CREATE_MODE) === true;
  }

  async function ensureSchema(objectTypes: readonly string[]) {
    const out: Record<string, "created" | "present"> = {};
    for (const t of objectTypes) {
      out[t] = await ensureUniqueProperty(
        api,
        t,
        unique,
        config.groupNames?.[t] ?? `${t.replace(/ies$/, "y").replace(/s$/, "")}information`,
      );
      schema.known(t, unique);
    }
    return out;
  }

  return { create, ensureSchema };
}
