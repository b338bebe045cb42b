/**
 * CRM records and properties as HubSpot's v3 API documents them, for the subset idem uses:
 * records per object type with string properties; properties per type, of which at most 10 may
 * be unique-value; a contact's `email` is unique too, as on HubSpot, whatever its case (a second
 * contact with it: 409 OBJECT_ALREADY_EXISTS "Contact already exists. Existing ID: …"); a create, or an upsert (creating or updating),
 * that repeats a unique value another record holds is refused (409, "Existing ID: …"); batch
 * upsert by a unique `idProperty`; reads by id or by a unique idProperty (consistent; any other
 * idProperty is refused 400); search sees a record only `indexLagMs` after it was written. Property values are checked as HubSpot does
 * for the ones idem's tests use: unknown properties, a contact email that is no address, and an
 * enumeration value not among the property's options. Values are kept as sent: HubSpot's own forms
 * of numbers, booleans and dates on a read are not documented (its date properties refuse a time
 * that is not midnight UTC, which is not checked here). A write moves the record's last-modified
 * property (`modifiedProperty`) and `updatedAt`.
 * Archiving (HubSpot's DELETE, the recycling bin) keeps the record, readable only with
 * `archived=true`; it leaves search, and its unique values are free again (HubSpot's knowledge
 * base: a deleted contact cannot be restored while an active one has its email). Records are
 * never purged (HubSpot does after 90 days, or at once for GDPR).
 */
export interface CrmRecord {
  id: string;
  properties: Record<string, string>;
  createdAt: string;
  updatedAt: string;
  archived: boolean;
  /** When it was archived; absent while live. */
  archivedAt?: string;
  writtenAtMs: number;
}

export interface PropertyDef {
  name: string;
  label: string;
  type: string;
  fieldType: string;
  groupName: string;
  hasUniqueValue: boolean;
  /**
   * An enumeration's options: a value not among them is refused (INVALID_OPTION). Absent or
   * empty, nothing is checked, as for properties whose options live outside the definition
   * (pipelines' stages, owners: `externalOptions`), which the built-in ones here stand for.
   */
  options?: PropertyOption[];
}

export interface PropertyOption {
  label: string;
  value: string;
  displayOrder?: number;
  hidden?: boolean;
}

export class HubSpotFailure {
  constructor(
    readonly status: number,
    readonly body: Record<string, unknown>,
    readonly beforeCommit = true,
  ) {}
}

/**
 * Property values HubSpot refused (400 VALIDATION_ERROR on a create). A batch answers it per
 * input instead: 207 Multi-Status with the error in `errors` and no result, even for one input.
 */
export class InputRefusal extends HubSpotFailure {}

/**
 * Built-in properties per object type, with HubSpot's types where a value is not plain text (what
 * the adapter compares a read by: hubspot-values.ts); a name alone is a text property.
 */
const BUILT_IN: Record<string, (string | [name: string, type: string, fieldType: string])[]> = {
  contacts: ["email", "firstname", "lastname", "phone", "company", ["lifecyclestage", "enumeration", "select"]],
  companies: ["name", "domain", "industry"],
  deals: [
    "dealname",
    ["amount", "number", "number"],
    ["dealstage", "enumeration", "select"],
    ["pipeline", "enumeration", "select"],
    ["closedate", "datetime", "date"],
  ],
  tickets: [
    "subject",
    "content",
    ["hs_pipeline", "enumeration", "select"],
    ["hs_pipeline_stage", "enumeration", "select"],
    ["hs_ticket_priority", "enumeration", "select"],
  ],
  notes: ["hs_note_body", ["hs_timestamp", "datetime", "date"]],
};
/**
 * What a read returns when it names no properties: the type's defaults, as HubSpot's CRM objects
 * API lists them ("Properties returned by default"), with the ones every read returns (`readAlways`).
 */
const READ_BY_DEFAULT: Record<string, string[]> = {
  companies: ["name", "domain"],
  contacts: ["firstname", "lastname", "email"],
  deals: ["dealname", "amount", "closedate", "pipeline", "dealstage"],
  tickets: ["content", "hs_pipeline", "hs_pipeline_stage", "hs_ticket_category", "hs_ticket_priority", "subject"],
};
/**
 * The property that holds when a record was last written: `lastmodifieddate` on contacts,
 * `hs_lastmodifieddate` on the other types, as HubSpot's CRM search guide lists their default
 * properties (developers.hubspot.com/docs/api/crm/search, "Default returned properties").
 */
function modifiedProperty(objectType: string): string {
  return objectType === "contacts" ? "lastmodifieddate" : "hs_lastmodifieddate";
}
const readAlways = (objectType: string) => ["hs_object_id", "createdate", modifiedProperty(objectType)];
const UNIQUE_LIMIT = 10;
/**
 * Built-in properties whose values HubSpot keeps unique without calling them unique-value
 * properties (the properties API reports `hasUniqueValue: false` for them).
 */
const UNIQUE_BUILT_IN: Record<string, string[]> = { contacts: ["email"] };

export class CrmStore {
  private readonly records = new Map<string, CrmRecord[]>();
  private readonly properties = new Map<string, Map<string, PropertyDef>>();
  private nextId = 1001;
  /**
   * How a create that repeats a unique value is refused: 409 CONFLICT, as HubSpot answers for a
   * contact's email; public integrations report a 400 validation error for custom unique
   * properties. Tests set 400 to hold the adapter to both.
   */
  duplicateValueStatus: 400 | 409 = 409;

  constructor(
    private readonly now: () => number,
    private readonly indexLagMs: () => number,
  ) {}

  /** Every record ever created, archived ones too: an archived record is an effect that happened. */
  count(objectType: string): number {
    return this.records.get(objectType)?.length ?? 0;
  }

  /** Every record ever created, archived ones too. */
  all(objectType: string): readonly CrmRecord[] {
    return this.records.get(objectType) ?? [];
  }

  /** The records not archived: what HubSpot's reads, search and unique values see by default. */
  live(objectType: string): readonly CrmRecord[] {
    return this.all(objectType).filter((r) => !r.archived);
  }

  getProperty(objectType: string, name: string): PropertyDef | undefined {
    return this.props(objectType).get(name);
  }

  listProperties(objectType: string): PropertyDef[] {
    return [...this.props(objectType).values()];
  }

  createProperty(objectType: string, p: Partial<PropertyDef>): PropertyDef {
    if (!p.name || !p.label || !p.type || !p.fieldType || !p.groupName)
      throw validation("name, label, type, fieldType and groupName are required");
    const props = this.props(objectType);
    if (props.has(p.name))
      throw new HubSpotFailure(
        409,
        error(`Property named '${p.name}' already exists.`, "OBJECT_ALREADY_EXISTS", "CONFLICT"),
      );
    if (p.hasUniqueValue && [...props.values()].filter((x) => x.hasUniqueValue).length >= UNIQUE_LIMIT) {
      throw validation(`An object type may have at most ${UNIQUE_LIMIT} unique value properties.`);
    }
    const def: PropertyDef = {
      name: p.name,
      label: p.label,
      type: p.type,
      fieldType: p.fieldType,
      groupName: p.groupName,
      hasUniqueValue: p.hasUniqueValue === true,
      ...(p.options && { options: p.options.map((o) => ({ ...o })) }),
    };
    props.set(def.name, def);
    return def;
  }

  /**
   * Deletes a property definition (HubSpot's DELETE /crm/v3/properties/{objectType}/{name}), and
   * its values with it: writes naming it are refused (PROPERTY_DOESNT_EXIST), reads by it too (400).
   * False when there was none.
   */
  deleteProperty(objectType: string, name: string): boolean {
    if (!this.props(objectType).delete(name)) return false;
    for (const r of this.all(objectType)) delete r.properties[name];
    return true;
  }

  create(objectType: string, properties: Record<string, unknown>): CrmRecord {
    const values = this.checkProperties(objectType, properties);
    this.refuseUniqueClash(objectType, values);
    return this.insert(objectType, values);
  }

  upsert(
    objectType: string,
    idProperty: string,
    id: string,
    properties: Record<string, unknown>,
  ): { record: CrmRecord; isNew: boolean } {
    this.requireUniqueId(objectType, idProperty, true);
    const values = this.checkProperties(objectType, properties);
    const existing = this.findBy(objectType, idProperty, id);
    // The other unique values are checked as a create checks them, updates included: a record
    // keeps its own values, but may not take one another record holds.
    this.refuseUniqueClash(objectType, existing ? values : { ...values, [idProperty]: id }, existing);
    if (existing) {
      const at = new Date(this.now()).toISOString();
      Object.assign(existing.properties, values, { [modifiedProperty(objectType)]: at });
      existing.updatedAt = at;
      existing.writtenAtMs = this.now();
      return { record: existing, isNew: false };
    }
    return { record: this.insert(objectType, { ...values, [idProperty]: id }), isNew: true };
  }

  /**
   * A consistent read, by record id or by a unique property (any other idProperty is refused
   * 400, as HubSpot's upsert refuses it: its docs name `idProperty` "any unique property"). HubSpot's
   * `archived` means "only archived": the default reads live records only, `archived: true`
   * archived ones only.
   */
  get(objectType: string, id: string, idProperty?: string, archived = false): CrmRecord | undefined {
    if (idProperty) this.requireUniqueId(objectType, idProperty);
    return this.all(objectType).find(
      (r) =>
        r.archived === archived &&
        (idProperty ? same(objectType, idProperty, r.properties[idProperty], id) : r.id === id),
    );
  }

  /**
   * A record's properties as a read returns them (GET /crm/v3/objects/{objectType}/{id}): those
   * `asked` (HubSpot's `properties` parameter), else the type's defaults, and the ones every read
   * returns. HubSpot's reference for the parameter: "A comma separated list of the properties to be
   * returned in the response. If any of the specified properties are not present on the requested
   * object(s), they will be ignored." A property the type has but the record holds no value in
   * comes back all the same, empty (null; singer-io/tap-hubspot#300 reports the v3 API answering
   * it rather than leaving the key out): the adapter compares such a value with the args' as empty
   * (hubspot-values.ts), where one left out is not compared.
   */
  readProperties(objectType: string, record: CrmRecord, asked: readonly string[]): Record<string, string | null> {
    const names = asked.length > 0 ? asked : (READ_BY_DEFAULT[objectType] ?? []);
    const known = this.props(objectType);
    const always = readAlways(objectType);
    const out: Record<string, string | null> = {};
    for (const name of [...names, ...always]) {
      if (!known.has(name) && !always.includes(name)) continue; // not a property of the type: ignored
      out[name] = record.properties[name] ?? null;
    }
    return out;
  }

  /**
   * Moves a record to the recycling bin (one already there stays as it was). The record, or
   * undefined when no record ever had that id.
   */
  archive(objectType: string, id: string): CrmRecord | undefined {
    const record = this.all(objectType).find((r) => r.id === id);
    if (record && !record.archived) {
      record.archived = true;
      record.archivedAt = new Date(this.now()).toISOString();
    }
    return record;
  }

  /** Search as HubSpot's index sees it: recent writes are not there yet. */
  search(objectType: string, filters: { propertyName: string; operator: string; value?: string }[]): CrmRecord[] {
    const indexedBefore = this.now() - this.indexLagMs();
    return this.live(objectType).filter(
      (r) =>
        r.writtenAtMs <= indexedBefore &&
        filters.every((f) => f.operator === "EQ" && r.properties[f.propertyName] === f.value),
    );
  }

  private insert(objectType: string, values: Record<string, string>): CrmRecord {
    const at = new Date(this.now()).toISOString();
    const id = String(this.nextId++);
    const record: CrmRecord = {
      id,
      properties: { ...values, hs_object_id: id, createdate: at, [modifiedProperty(objectType)]: at },
      createdAt: at,
      updatedAt: at,
      archived: false,
      writtenAtMs: this.now(),
    };
    const list = this.records.get(objectType) ?? [];
    list.push(record);
    this.records.set(objectType, list);
    return record;
  }

  /**
   * HubSpot's rule for an idProperty: a unique-value property, or a contact's email. An upsert by
   * any other (missing too) is refused in HubSpot's words, which name the object type by its id
   * (0-1 contacts, 0-2 companies) and the portal (as quoted in HubSpot/hubspot-api-nodejs#548).
   */
  private requireUniqueId(objectType: string, idProperty: string, upsert = false): void {
    if (this.props(objectType).get(idProperty)?.hasUniqueValue) return;
    if ((UNIQUE_BUILT_IN[objectType] ?? []).includes(idProperty)) return;
    throw validation(
      upsert
        ? `Unable to perform update/upsert by non-unique ${OBJECT_TYPE_IDS[objectType] ?? objectType} property ${idProperty} in portal ID ${PORTAL_ID}`
        : `idProperty '${idProperty}' must be a unique value property`,
    );
  }

  /** Live records only: an archived record's unique values are free again. */
  private findBy(objectType: string, property: string, value: string): CrmRecord | undefined {
    return this.live(objectType).find((r) => same(objectType, property, r.properties[property], value));
  }

  /**
   * Refuses values that another live record (not `self`) holds in a unique property: 409, as
   * HubSpot answers ("Contact already exists" for a contact's email), or the 400 some report for
   * custom unique properties (`duplicateValueStatus`).
   */
  private refuseUniqueClash(objectType: string, values: Record<string, string>, self?: CrmRecord): void {
    const unique = [
      ...(UNIQUE_BUILT_IN[objectType] ?? []),
      ...[...this.props(objectType).values()].filter((d) => d.hasUniqueValue).map((d) => d.name),
    ];
    for (const name of unique) {
      const v = values[name];
      if (v === undefined || v === "") continue;
      const clash = this.live(objectType).find((r) => r !== self && same(objectType, name, r.properties[name], v));
      if (!clash) continue;
      if ((UNIQUE_BUILT_IN[objectType] ?? []).includes(name))
        throw new HubSpotFailure(409, exists(objectType, name, v, clash.id));
      if (this.duplicateValueStatus === 400) throw new HubSpotFailure(400, uniqueValueRefusal(objectType, name));
      throw new HubSpotFailure(
        409,
        error(
          `A ${singular(objectType)} with this unique value already exists. Existing ID: ${clash.id}`,
          "CONFLICT",
          "CONFLICT",
        ),
      );
    }
  }

  /** The values as strings, or HubSpot's VALIDATION_ERROR naming each value it refuses. */
  private checkProperties(objectType: string, properties: Record<string, unknown>): Record<string, string> {
    const known = this.props(objectType);
    // HubSpot's values are strings (numbers and booleans sent as JSON are taken as their text); a
    // JSON null is no value, as the empty string HubSpot documents for clearing one: never the
    // text "null".
    const values = Object.fromEntries(
      Object.entries(properties ?? {}).map(([k, v]) => [k, v === null || v === undefined ? "" : String(v)]),
    );
    const invalid = Object.keys(values)
      .filter((k) => !known.has(k))
      .map((name) => ({
        isValid: false,
        message: `Property "${name}" does not exist`,
        error: "PROPERTY_DOESNT_EXIST",
        name,
      }));
    for (const [name, value] of Object.entries(values)) {
      const refused = refusedOption(known.get(name), value);
      if (refused) invalid.push({ isValid: false, message: refused, error: "INVALID_OPTION", name });
    }
    const email = values.email;
    if (objectType === "contacts" && email && !/^[^@\s]+@[^@\s]+\.[^@\s.]+$/.test(email))
      invalid.push({
        isValid: false,
        message: `Email address ${email} is invalid`,
        error: "INVALID_EMAIL",
        name: "email",
      });
    if (invalid.length)
      throw new InputRefusal(
        400,
        error(`Property values were not valid: ${JSON.stringify(invalid)}`, invalid[0]!.error),
      );
    return values;
  }

  private props(objectType: string): Map<string, PropertyDef> {
    let p = this.properties.get(objectType);
    if (!p) {
      p = new Map(
        (BUILT_IN[objectType] ?? ["name"]).map((entry) => {
          const [name, type, fieldType] = typeof entry === "string" ? [entry, "string", "text"] : entry;
          return [
            name,
            { name, label: name, type, fieldType, groupName: `${objectType}information`, hasUniqueValue: false },
          ];
        }),
      );
      this.properties.set(objectType, p);
    }
    return p;
  }
}

/**
 * HubSpot's words for a value not among an enumeration's options, as it answered in
 * gregorspan/csc-frodx#21 ("reports was not one of the allowed options: [PRODUCT_ISSUE,
 * BILLING_ISSUE, …]"); undefined when the value is taken. Multiple checkboxes (`fieldType:
 * checkbox`) take several values joined by ";", each checked; an empty value clears.
 */
function refusedOption(def: PropertyDef | undefined, value: string): string | undefined {
  if (def?.type !== "enumeration" || !def.options?.length || value === "") return undefined;
  const allowed = def.options.map((o) => o.value);
  const given = def.fieldType === "checkbox" ? value.split(";") : [value];
  const wrong = given.find((v) => !allowed.includes(v));
  return wrong === undefined ? undefined : `${wrong} was not one of the allowed options: [${allowed.join(", ")}]`;
}

/**
 * HubSpot's 409 for a contact whose email another contact has, as HubSpot answers it since 2024
 * (a real answer quoted in community.hubspot.com/t5/APIs-Integrations/Updated-409-Conflict-responses/m-p/951534):
 * category OBJECT_ALREADY_EXISTS (CONFLICT before), `error` CONTACT_EXISTS, the existing id in the
 * message, and per property in `errors` with the value itself (the email). Its `identityProfile`
 * (the contact's identities) is left out.
 */
function exists(objectType: string, property: string, value: string, existingId: string): Record<string, unknown> {
  const what = singular(objectType);
  return {
    status: "error",
    message: `${capitalized(what)} already exists. Existing ID: ${existingId}`,
    errors: [
      { message: `A ${what} with ${property} ${value} already exists. Existing ID: ${existingId}`, in: property },
    ],
    correlationId: crypto.randomUUID(),
    category: "OBJECT_ALREADY_EXISTS",
    error: `${what.toUpperCase()}_EXISTS`,
  };
}

/**
 * The 400 some report for a value another record holds in a custom unique property, in HubSpot's
 * format for refused property values: a list naming each property.
 */
export function uniqueValueRefusal(objectType: string, name: string): Record<string, unknown> {
  const refused = [
    {
      isValid: false,
      message: `A ${singular(objectType)} with this ${name} already exists`,
      error: "INVALID_PROPERTY_VALUE",
      name,
    },
  ];
  return error(`Property values were not valid: ${JSON.stringify(refused)}`, "INVALID_PROPERTY_VALUE");
}

export function error(message: string, subCategory: string, category = "VALIDATION_ERROR"): Record<string, unknown> {
  return { status: "error", message, category, subCategory, correlationId: crypto.randomUUID() };
}

/**
 * Whether two values of a property are one for HubSpot: a contact's email whatever its case
 * (HubSpot keeps contacts' emails lowercased, so "Ada@X.org" is the contact of "ada@x.org": a
 * second one is refused 409, and a read by either finds it); any other value exactly.
 */
function same(objectType: string, property: string, a: string | undefined, b: string): boolean {
  if (a === undefined) return false;
  return objectType === "contacts" && property === "email" ? a.toLowerCase() === b.toLowerCase() : a === b;
}

/** contacts -> contact, companies -> company, as HubSpot's messages name a record. */
function singular(objectType: string): string {
  return objectType.replace(/ies$/, "y").replace(/s$/, "");
}

function capitalized(word: string): string {
  return word.charAt(0).toUpperCase() + word.slice(1);
}

/** The sandbox's portal (HubSpot account) id, as HubSpot's messages name it. */
const PORTAL_ID = 10000001;

/** HubSpot's object type ids of the standard objects; another type is named by its name. */
const OBJECT_TYPE_IDS: Readonly<Record<string, string>> = {
  contacts: "0-1",
  companies: "0-2",
  deals: "0-3",
  tickets: "0-5",
  products: "0-7",
  line_items: "0-8",
  quotes: "0-14",
  tasks: "0-27",
  notes: "0-46",
  meetings: "0-47",
  calls: "0-48",
  emails: "0-49",
};

function validation(message: string, subCategory = "INVALID_INPUT"): HubSpotFailure {
  return new HubSpotFailure(400, error(message, subCategory));
}
