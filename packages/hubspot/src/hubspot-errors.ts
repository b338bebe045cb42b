/**
 * The errors the adapter raises itself, each carrying HubSpot's evidence; `classifyHubSpotError`
 * reads them. An action's HTTP and network errors stay the client's own (ApiException, fetch
 * errors), which the ledger classifies; the schema's requests are wrapped (HubSpotSchemaReadError,
 * HubSpotSchemaCreateError), as their callers (ensureSchema, a setup script) read them directly.
 */
import { answeredInFront, describeEvidence, evidenceOf } from "./hubspot-evidence.js";

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

/**
 * A write the client sent again (its retry decorator, `clientRetries`) after an earlier request of
 * it was answered 5xx, which a gateway may answer after HubSpot wrote: the last answer (`cause`: a
 * 429, a 403, a timeout) speaks of the last request only, so whether the write happened is not known.
 */
export class HubSpotResentError extends Error {
  override readonly name = "HubSpotResentError";
  constructor(
    /** What HubSpot answered the requests before the last, in order (HTTP statuses). */
    readonly answers: readonly number[],
    options: { cause: unknown },
  ) {
    super(`the client sent the write again after HubSpot answered ${answers.join(", ")}`, options);
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
      problem === "missing" ? missing(objectType, property) : notUnique(objectType, property, d),
      options?.cause === undefined ? undefined : { cause: options.cause },
    );
    this.definition = d;
  }
}

const WHY = "HubSpot would not refuse a second record with the same key, and a read by it cannot prove a record absent";

function missing(objectType: string, property: string): string {
  return (
    `${objectType}.${property} does not exist: ${WHY}. Create it with ensureSchema(["${objectType}"]) ` +
    `(a unique-value ${property}), or set uniqueProperty to a unique-value property`
  );
}

/**
 * Not "create it with ensureSchema": HubSpot sets hasUniqueValue only when a property is created
 * (its property update, PATCH /crm/v3/properties/{objectType}/{name}, takes no hasUniqueValue), so
 * no call can make this one unique-value. Archiving it loses the keys its records hold: only safe
 * when no record, archived ones included, has a value in it.
 */
function notUnique(objectType: string, property: string, d: HubSpotPropertyDefinition | undefined): string {
  const seen = d
    ? ` (HubSpot's definition of it: type ${d.type}, fieldType ${d.fieldType}, hasUniqueValue: ${d.hasUniqueValue ?? "absent"})`
    : "";
  return (
    `${objectType}.${property} exists but is not a unique-value property${seen}: ${WHY}. ` +
    "HubSpot makes a property unique-value only when it creates it, so ensureSchema cannot make an existing property unique-value. " +
    `Set uniqueProperty to a new name and run ensureSchema(["${objectType}"]), which creates it unique-value; ` +
    `or, only if no ${objectType} record (archived ones included) has a value in ${property}, ` +
    "archive the property in HubSpot and run ensureSchema again"
  );
}

/** The evidence of a schema request that failed, as the errors below carry it. */
abstract class HubSpotSchemaRequestError extends Error {
  /** The HTTP status, when an answer came. */
  readonly status: number | undefined;
  /** HubSpot's correlationId of the failed request, to quote to its support. */
  readonly requestId: string | undefined;
  /** The API host (never the path: a read's path holds the operation key). */
  readonly host: string | undefined;
  constructor(
    readonly objectType: string,
    readonly property: string,
    doing: string,
    hint: (status: number | undefined) => string | undefined,
    options: { cause: unknown; host?: string | undefined },
  ) {
    const ev = evidenceOf(options.cause, options.host);
    // A page in front of HubSpot says nothing of the token or its scopes (a 401, 403) either: a
    // refusal of that server's, which a person fixes there.
    const advice = answeredInFront(options.cause)
      ? notHubSpots(ev.status, ev.status === 401 || ev.status === 403 ? REFUSED_IN_FRONT : PROPERTY_UNKNOWN)
      : hint(ev.status);
    super(`${doing} ${objectType}.${property} failed: ${describeEvidence(ev)}${advice ? `: ${advice}` : ""}`, {
      cause: options.cause,
    });
    this.status = ev.status;
    this.requestId = ev.requestId;
    this.host = ev.host;
  }
}

/**
 * Why an answer without HubSpot's JSON error (see answeredInFront) tells nothing of HubSpot's
 * own: who answered it, and what stays `unknown`.
 */
export function notHubSpots(status: number | undefined, unknown: string): string {
  return `not HubSpot's answer (a proxy, gateway or firewall in front of HubSpot answered ${status}): ${unknown}`;
}

/** What a page in front of HubSpot leaves unknown of a property (see notHubSpots). */
export const PROPERTY_UNKNOWN = "HubSpot's answer was not received, so whether the property exists is not known";

/** What a 401 or 403 page in front of HubSpot says (see notHubSpots): that server refused us, HubSpot said nothing. */
const REFUSED_IN_FRONT =
  "that server refused the request, not HubSpot (this says nothing of the token or its scopes), so whether the property exists is not known; check the proxy or firewall between this process and HubSpot";

const TOKEN_REFUSED = "HubSpot does not accept the access token (revoked, expired or mistyped)";

/**
 * Reading the definition of the key's property failed (429, a token without the schema read
 * scope, unreachable, a 404 answered in front of HubSpot): no write was sent. `cause` is the
 * read's error; `status`, `requestId` and `host` its evidence.
 */
export class HubSpotSchemaReadError extends HubSpotSchemaRequestError {
  override readonly name = "HubSpotSchemaReadError";
  constructor(objectType: string, property: string, options: { cause: unknown; host?: string | undefined }) {
    super(
      objectType,
      property,
      "reading the definition of",
      (status) =>
        status === 401
          ? TOKEN_REFUSED
          : status === 403
            ? `the token lacks the scope to read ${objectType} properties (HubSpot's crm.schemas scopes)`
            : undefined,
      options,
    );
  }
}

/**
 * `ensureSchema`'s create of the key's property failed (a token without the schema write scope,
 * the object type's limit of unique-value properties, 429, 5xx, unreachable). After a 5xx or no
 * answer the property may exist: ensureSchema run again finds it. `cause` is the create's error.
 */
export class HubSpotSchemaCreateError extends HubSpotSchemaRequestError {
  override readonly name = "HubSpotSchemaCreateError";
  constructor(objectType: string, property: string, options: { cause: unknown; host?: string | undefined }) {
    super(
      objectType,
      property,
      "creating",
      (status) =>
        status === 401
          ? TOKEN_REFUSED
          : status === 403
            ? `the token lacks the scope to create ${objectType} properties (HubSpot's crm.schemas write scopes)`
            : status === 409
              ? "HubSpot holds the name, though no live property has it (an archived property?): restore it in HubSpot, or set uniqueProperty to another name"
              : undefined,
      options,
    );
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
