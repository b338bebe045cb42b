/**
 * The property that carries operation keys: created where missing (`ensureUniqueProperty`, safe to
 * run again and by several processes at once: a 409 means another created it, and what it created
 * is checked as a found one is), and checked to be unique-value before the adapter relies on it
 * (`uniquePropertyCheck`). Requests that fail are raised as HubSpotSchemaReadError or
 * HubSpotSchemaCreateError, with HubSpot's evidence and the client's error as `cause`.
 */
import { HUBSPOT_CALL_OPTIONS, type createHubSpotClient } from "./hubspot-client.js";
import {
  HubSpotSchemaCreateError,
  HubSpotSchemaError,
  HubSpotSchemaReadError,
  type HubSpotPropertyDefinition,
} from "./hubspot-errors.js";
import { propertyNotFoundByHubSpot } from "./hubspot-evidence.js";
import type { PropertyShape } from "./hubspot-values.js";

type Api = ReturnType<typeof createHubSpotClient>;

/**
 * "created" or "present" (unique-value); throws HubSpotSchemaError when a property of the name is
 * not unique-value, which no call can change (see HubSpotSchemaError).
 */
export async function ensureUniqueProperty(
  api: Api,
  objectType: string,
  name: string,
  groupName: string,
): Promise<"created" | "present"> {
  const existing = await readDefinition(api, objectType, name);
  if (existing) {
    // Not made again: HubSpot keeps one property per name, and a create would be refused (409).
    if (!isUniqueId(objectType, existing)) throw notUnique(objectType, existing);
    return "present";
  }
  try {
    await api.properties.coreApi.create(
      objectType,
      {
        name,
        label: "idem external id",
        description: "Operation key written by idem; makes creates idempotent",
        type: "string" as never,
        fieldType: "text" as never,
        groupName,
        hasUniqueValue: true,
      },
      HUBSPOT_CALL_OPTIONS,
    );
    return "created";
  } catch (e) {
    if ((e as { code?: unknown }).code !== 409)
      throw new HubSpotSchemaCreateError(objectType, name, { cause: e, host: api.host });
    // Made since our read, by another process or a person: "present" only if unique-value, as
    // one our read found. None live, an archived property holds the name.
    const made = await readDefinition(api, objectType, name);
    if (!made) throw new HubSpotSchemaCreateError(objectType, name, { cause: e, host: api.host });
    if (!isUniqueId(objectType, made)) throw notUnique(objectType, made);
    return "present";
  }
}

/**
 * HubSpot's definition of the property; undefined when HubSpot answers it has none (its 404 with
 * its JSON error). Any other failure throws HubSpotSchemaReadError, a 404 page from a proxy or
 * gateway in front of HubSpot too: read as "missing", it told an operator to create a property
 * that exists, and ensureSchema to create it again.
 */
async function readDefinition(api: Api, objectType: string, name: string) {
  try {
    return await api.properties.coreApi.getByName(objectType, name, undefined, undefined, HUBSPOT_CALL_OPTIONS);
  } catch (e) {
    if (propertyNotFoundByHubSpot(e)) return undefined;
    throw new HubSpotSchemaReadError(objectType, name, { cause: e, host: api.host });
  }
}

/**
 * How HubSpot keeps the values of properties (their definitions' type and fieldType), to compare a
 * record's values with the args' (hubspot-values.ts), read on the rare path that needs them (a
 * deleted record with our key), one request per property, and kept for the process: every lookup
 * that met such a record read them again before, into the rate limit its own reads share. Only a
 * definition HubSpot answered is kept. A property HubSpot has no definition of is left out (a
 * read does not return it either), asked again next time (one made since is seen), and its kept
 * definition dropped: one made again under the name may be of another type. A lookup whose read
 * of a record did not return a property asked for (HubSpot's word that it has none) drops it
 * likewise (`forget`). Not seen: a property's type changed in place, or deleted and made again
 * between two lookups; the next process reads it.
 * `of` throws HubSpotSchemaReadError when a definition cannot be read, which proves nothing (and
 * is not kept).
 */
export function propertyShapeCache(api: Api) {
  const kept = new Map<string, Promise<PropertyShape | undefined>>();
  const keyOf = (objectType: string, name: string) => `${objectType}\u0000${name}`;
  async function read(objectType: string, name: string): Promise<PropertyShape | undefined> {
    const p = await readDefinition(api, objectType, name);
    if (!p) return undefined;
    // HubSpot keeps a contact's email lowercased (a change of case alone is the same contact).
    const caseless = objectType === "contacts" && name === "email";
    return { type: p.type, fieldType: p.fieldType, ...(caseless && { caseless }) };
  }
  function shapeOf(objectType: string, name: string): Promise<PropertyShape | undefined> {
    const key = keyOf(objectType, name);
    const known = kept.get(key);
    if (known) return known;
    // Kept while in flight too: concurrent lookups share one read. Dropped unless answered.
    const shape = read(objectType, name);
    kept.set(key, shape);
    const drop = () => {
      if (kept.get(key) === shape) kept.delete(key);
    };
    shape.then((s) => s === undefined && drop(), drop);
    return shape;
  }
  return {
    async of(objectType: string, names: readonly string[]): Promise<Record<string, PropertyShape>> {
      const shapes: Record<string, PropertyShape> = {};
      for (const name of names) {
        const shape = await shapeOf(objectType, name);
        if (shape) shapes[name] = shape;
      }
      return shapes;
    },
    /** HubSpot answered as if it has no such properties now: their next use reads them again. */
    forget(objectType: string, names: readonly string[]): void {
      for (const name of names) kept.delete(keyOf(objectType, name));
    },
  };
}

export type PropertyShapeCache = ReturnType<typeof propertyShapeCache>;

/**
 * Built-in properties HubSpot keeps unique, and accepts as an idProperty, though its properties API
 * reports `hasUniqueValue: false` for them. (A key is no email address, so HubSpot refuses it as a
 * contact's email: the check passes, the write is refused as the caller's data.)
 */
const UNIQUE_BUILT_IN: Readonly<Record<string, readonly string[]>> = { contacts: ["email"] };

function isUniqueId(objectType: string, p: { name: string; hasUniqueValue?: boolean }): boolean {
  return p.hasUniqueValue === true || (UNIQUE_BUILT_IN[objectType] ?? []).includes(p.name);
}

/** A property HubSpot defines, not unique-value: the error carries what HubSpot answered of it. */
function notUnique(
  objectType: string,
  p: Omit<HubSpotPropertyDefinition, "hasUniqueValue"> & { hasUniqueValue?: boolean },
): HubSpotSchemaError {
  const definition = { name: p.name, type: p.type, fieldType: p.fieldType, hasUniqueValue: p.hasUniqueValue };
  return new HubSpotSchemaError(objectType, p.name, "not_unique", { definition });
}

/**
 * Whether a property can carry operation keys, read from HubSpot once per process and property
 * (GET /crm/v3/properties/{objectType}/{name}). `require` resolves when it is unique-value and
 * rejects with HubSpotSchemaError when it is missing or not, HubSpotSchemaReadError when the
 * definition could not be read. Only a unique verdict is kept: a refusal or a failed read is asked
 * again by the next call, so a schema fixed since is seen without a restart. A kept verdict is
 * dropped (`forget`) when HubSpot answers as if the property had changed since: a write refused
 * for naming a property that does not exist, a read by it refused (400). (A property made plain
 * since, with nothing refused meanwhile, is seen by the next process.)
 */
export function uniquePropertyCheck(api: Api) {
  const verdicts = new Map<string, Promise<void>>();
  const keyOf = (objectType: string, name: string) => `${objectType}\u0000${name}`;
  async function check(objectType: string, name: string): Promise<void> {
    const p = await readDefinition(api, objectType, name);
    if (!p) throw new HubSpotSchemaError(objectType, name, "missing");
    if (!isUniqueId(objectType, p)) throw notUnique(objectType, p);
  }
  return {
    require(objectType: string, name: string): Promise<void> {
      const key = keyOf(objectType, name);
      let verdict = verdicts.get(key);
      if (!verdict) {
        // Kept while in flight too: concurrent first calls share one read.
        verdict = check(objectType, name).catch((e: unknown) => {
          verdicts.delete(key);
          throw e;
        });
        verdicts.set(key, verdict);
      }
      return verdict;
    },
    /** A property known unique-value (ensureSchema found or made it): no read needed. */
    known(objectType: string, name: string): void {
      verdicts.set(keyOf(objectType, name), Promise.resolve());
    },
    /** HubSpot answered as if the property changed since its verdict: the next `require` reads it again. */
    forget(objectType: string, name: string): void {
      verdicts.delete(keyOf(objectType, name));
    },
  };
}

export type UniquePropertyCheck = ReturnType<typeof uniquePropertyCheck>;
