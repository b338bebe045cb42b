/**
 * The errors the adapter raises itself, each carrying HubSpot's evidence; `classifyHubSpotError`
 * reads them. HTTP and network errors stay the client's own (ApiException, fetch errors).
 */

/** One entry of a batch answer's `errors`, as HubSpot sends it (every field optional in practice). */
export interface HubSpotBatchError {
  readonly status?: string;
  readonly category?: string;
  readonly subCategory?: unknown;
  readonly message?: string;
  readonly context?: unknown;
}

/**
 * A batch upsert answered with no result for our input: HubSpot's errors for it, as it answers
 * a refused input even when it is the only one (207 Multi-Status, `results: []`), or none at all.
 */
export class HubSpotBatchInputError extends Error {
  override readonly name = "HubSpotBatchInputError";
  constructor(readonly errors: readonly HubSpotBatchError[]) {
    super(
      errors.length
        ? `HubSpot answered the upsert with errors: ${errors.map((e) => `${e.category}: ${e.message}`).join("; ")}`
        : "HubSpot answered the upsert with no result and no error",
    );
  }
}

/**
 * HubSpot refused a second record with a unique value (a 409, a 400, or a batch refusal), and
 * the read by `idProperty` that would tell whether the record is ours failed: the refusal may
 * mean our record exists (an earlier attempt committed), so this outcome is ambiguous. `refusal`
 * is the write's error; `cause` the read's.
 */
export class HubSpotReadBackError extends Error {
  override readonly name = "HubSpotReadBackError";
  constructor(
    readonly refusal: unknown,
    readonly idProperty: string,
    options: { cause: unknown },
  ) {
    super(`HubSpot refused a second record and the read back by ${idProperty} failed`, options);
  }
}

/** HubSpot's definition of a property, as its properties API answered: the fields the check reads. */
export interface HubSpotPropertyDefinition {
  readonly name: string;
  readonly type: string;
  readonly fieldType: string;
  /** HubSpot leaves it out for a property that is not unique-value. */
  readonly hasUniqueValue: boolean | undefined;
}

/**
 * The property meant to carry operation keys is missing or not a unique-value property: HubSpot
 * would not refuse a second record with the same key (a create sent again after a lost answer
 * makes two), and a read by it cannot prove a record absent. Raised before anything is sent (by
 * the adapter's check, or `ensureSchema` finding a property of the name that is not unique-value),
 * or when HubSpot refused a write for naming it as a property that does not exist (deleted since
 * its check; `cause`: that refusal), which wrote nothing.
 */
export class HubSpotSchemaError extends Error {
  override readonly name = "HubSpotSchemaError";
  /** HubSpot's definition of the property, when it answered one (`not_unique`). */
  readonly definition: HubSpotPropertyDefinition | undefined;
  constructor(
    readonly objectType: string,
    readonly property: string,
    readonly problem: "missing" | "not_unique",
    options?: { cause?: unknown; definition?: HubSpotPropertyDefinition },
  ) {
    const d = options?.definition;
    super(
      `${objectType}.${property} ${problem === "missing" ? "does not exist" : "is not a unique-value property"}: ` +
        `HubSpot would not refuse a second record with the same key. Create it with ensureSchema(["${objectType}"]) ` +
        `(a unique-value idem_external_id), or set uniqueProperty to a unique-value property` +
        (d
          ? ` (HubSpot's definition of it: type ${d.type}, fieldType ${d.fieldType}, hasUniqueValue: ${d.hasUniqueValue ?? "absent"})`
          : ""),
      options?.cause === undefined ? undefined : { cause: options.cause },
    );
    this.definition = d;
  }
}

/**
 * Reading the definition of the key's property failed (429, a token without the schema read
 * scope, unreachable): no write was sent. `cause` is the read's error.
 */
export class HubSpotSchemaReadError extends Error {
  override readonly name = "HubSpotSchemaReadError";
  constructor(
    readonly objectType: string,
    readonly property: string,
    options: { cause: unknown },
  ) {
    super(`reading the definition of ${objectType}.${property} failed`, options);
  }
}

/**
 * A lookup's read failed: the read by the key, or of the key property's definition. It proves
 * nothing of the record, so the operation stays unknown; `cause` is the read's error, whose class
 * classifyHubSpotError keeps (a 401 or 403, an untrusted certificate: alerted, as every later
 * check fails alike). `read` names which read failed.
 */
export class HubSpotLookupError extends Error {
  override readonly name = "HubSpotLookupError";
  constructor(
    readonly objectType: string,
    readonly property: string,
    readonly read: "record" | "definition",
    /** What the read's error says, as classified (the status and HubSpot's words, not the whole answer). */
    said: string,
    options: { cause: unknown },
  ) {
    const what = read === "definition" ? `of the definition of ${objectType}.${property}` : `by ${property}`;
    super(`HubSpot read ${what} failed: ${said}`, options);
  }
}
