/**
 * CRM records and properties as HubSpot's v3 API documents them, for the subset idem uses:
 * records per object type with string properties; properties per type, of which at most 10 may
 * be unique-value; a create that repeats a unique value is refused (409, "Existing ID: …");
 * batch upsert by a unique `idProperty`; reads by id or by idProperty (consistent); search sees
 * a record only `indexLagMs` after it was written. Archiving (HubSpot's DELETE, the recycling bin)
 * keeps the record, readable only with `archived=true`; it leaves search, and its unique values
 * are free again (HubSpot's knowledge base: a deleted contact cannot be restored while an active
 * one has its email). Records are never purged (HubSpot does after 90 days, or at once for GDPR).
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
}

export class HubSpotFailure {
  constructor(
    readonly status: number,
    readonly body: Record<string, unknown>,
    readonly beforeCommit = true,
  ) {}
}

const BUILT_IN: Record<string, string[]> = {
  contacts: ["email", "firstname", "lastname", "phone", "company", "lifecyclestage"],
  companies: ["name", "domain", "industry"],
  deals: ["dealname", "amount", "dealstage", "pipeline", "closedate"],
  tickets: ["subject", "content", "hs_pipeline", "hs_pipeline_stage", "hs_ticket_priority"],
  notes: ["hs_note_body", "hs_timestamp"],
};
const UNIQUE_LIMIT = 10;

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
    };
    props.set(def.name, def);
    return def;
  }

  create(objectType: string, properties: Record<string, unknown>): CrmRecord {
    const values = this.checkProperties(objectType, properties);
    const clash = this.uniqueClash(objectType, values);
    if (clash && this.duplicateValueStatus === 400)
      throw new HubSpotFailure(
        400,
        error(
          `Property values were not valid: a ${objectType.replace(/s$/, "")} already has that value`,
          "INVALID_PROPERTY_VALUE",
        ),
      );
    if (clash)
      throw new HubSpotFailure(
        409,
        error(
          `A ${objectType.replace(/s$/, "")} with this unique value already exists. Existing ID: ${clash.id}`,
          "CONFLICT",
          "CONFLICT",
        ),
      );
    return this.insert(objectType, values);
  }

  upsert(
    objectType: string,
    idProperty: string,
    id: string,
    properties: Record<string, unknown>,
  ): { record: CrmRecord; isNew: boolean } {
    if (
      !this.props(objectType).get(idProperty)?.hasUniqueValue &&
      !(objectType === "contacts" && idProperty === "email")
    ) {
      throw validation(`idProperty '${idProperty}' must be a unique value property`);
    }
    const values = this.checkProperties(objectType, properties);
    const existing = this.findBy(objectType, idProperty, id);
    if (existing) {
      Object.assign(existing.properties, values);
      existing.updatedAt = new Date(this.now()).toISOString();
      existing.writtenAtMs = this.now();
      return { record: existing, isNew: false };
    }
    return { record: this.insert(objectType, { ...values, [idProperty]: id }), isNew: true };
  }

  /**
   * A consistent read, by record id or by a unique property. HubSpot's `archived` means "only
   * archived": the default reads live records only, `archived: true` archived ones only.
   */
  get(objectType: string, id: string, idProperty?: string, archived = false): CrmRecord | undefined {
    return this.all(objectType).find(
      (r) => r.archived === archived && (idProperty ? r.properties[idProperty] === id : r.id === id),
    );
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
      properties: { ...values, hs_object_id: id, createdate: at, lastmodifieddate: at },
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

  /** Live records only: an archived record's unique values are free again. */
  private findBy(objectType: string, property: string, value: string): CrmRecord | undefined {
    return this.live(objectType).find((r) => r.properties[property] === value);
  }

  private uniqueClash(objectType: string, values: Record<string, string>): CrmRecord | undefined {
    for (const def of this.props(objectType).values()) {
      const v = values[def.name];
      if (def.hasUniqueValue && v !== undefined && v !== "") {
        const hit = this.findBy(objectType, def.name, v);
        if (hit) return hit;
      }
    }
    return undefined;
  }

  private checkProperties(objectType: string, properties: Record<string, unknown>): Record<string, string> {
    const known = this.props(objectType);
    const unknown = Object.keys(properties ?? {}).filter((k) => !known.has(k));
    if (unknown.length)
      throw validation(
        `Property values were not valid: properties ${unknown.map((u) => `'${u}'`).join(", ")} do not exist`,
        "PROPERTY_DOESNT_EXIST",
      );
    return Object.fromEntries(Object.entries(properties ?? {}).map(([k, v]) => [k, String(v)]));
  }

  private props(objectType: string): Map<string, PropertyDef> {
    let p = this.properties.get(objectType);
    if (!p) {
      p = new Map(
        (BUILT_IN[objectType] ?? ["name"]).map((name) => [
          name,
          {
            name,
            label: name,
            type: "string",
            fieldType: "text",
            groupName: `${objectType}information`,
            hasUniqueValue: false,
          },
        ]),
      );
      this.properties.set(objectType, p);
    }
    return p;
  }
}

export function error(message: string, subCategory: string, category = "VALIDATION_ERROR"): Record<string, unknown> {
  return { status: "error", message, category, subCategory, correlationId: crypto.randomUUID() };
}

function validation(message: string, subCategory = "INVALID_INPUT"): HubSpotFailure {
  return new HubSpotFailure(400, error(message, subCategory));
}
