/**
 * Maps @hubspot/api-client errors to the failure classes of @idem/core. HTTP errors arrive as
 * ApiException (`code` = status, `body` = HubSpot's JSON, `headers`); network errors as fetch
 * errors with a system `code`; a batch answer without our result, and a refusal whose read-back
 * failed, as the adapter's own errors (hubspot-errors.ts).
 */
import { neverSent, tlsRefused, type Classification } from "@idem/core";
import {
  HubSpotBatchInputError,
  HubSpotLookupError,
  HubSpotReadBackError,
  HubSpotResentError,
  HubSpotSchemaCreateError,
  HubSpotSchemaError,
  HubSpotSchemaReadError,
  notHubSpots,
} from "./hubspot-errors.js";
import { answeredInFront, evidenceOf, hostsOnly, type HubSpotError } from "./hubspot-evidence.js";

/**
 * Categories of a batch error that refuse the input itself: HubSpot's final answer about these
 * values (a validation error), or a unique value another record holds. Any other category of a
 * batch error says nothing about whether the record was written.
 */
const REFUSAL_CATEGORIES: ReadonlySet<string> = new Set(["VALIDATION_ERROR", "CONFLICT", "OBJECT_ALREADY_EXISTS"]);

/**
 * HubSpot refused the values of our write: a 409 CONFLICT (a unique value exists), a 400 (a
 * validation error, which some report for a custom unique property too), or a batch answer whose
 * every error is a refusal. Either may be the CRM refusing a second record with our key. HubSpot's
 * own answer only (its JSON error): a 400 or 409 page in front of it is no refusal of HubSpot's.
 */
export function isRefusal(error: unknown): boolean {
  if (error instanceof HubSpotBatchInputError)
    return error.errors.length > 0 && error.errors.every((e) => REFUSAL_CATEGORIES.has(e.category ?? ""));
  const code = (error as { code?: unknown } | null)?.code;
  return (code === 409 || code === 400) && !answeredInFront(error);
}

/**
 * HubSpot refused the values themselves (a 400, or a batch answer whose every error is a
 * VALIDATION_ERROR): an upsert by our key updates the record with it rather than repeat it, so
 * such a refusal is the caller's data and says nothing of our record, unless it refuses the key's
 * own value (`propertyRefusal`): the clash of a racing write of the key.
 */
export function isValidationRefusal(error: unknown): boolean {
  if (error instanceof HubSpotBatchInputError)
    return error.errors.length > 0 && error.errors.every((e) => e.category === "VALIDATION_ERROR");
  return (error as { code?: unknown } | null)?.code === 400 && !answeredInFront(error);
}

/**
 * The record a conflict names ("Contact already exists. Existing ID: 1006"): the one holding the
 * unique value our write repeated. Undefined when the answer names none.
 */
export function existingIdOf(error: unknown): string | undefined {
  for (const m of messagesOf(error)) {
    const id = /Existing ID: (\d+)/.exec(m)?.[1];
    if (id) return id;
  }
  return undefined;
}

/**
 * What a refusal says of one property: "missing" when HubSpot answers that it does not exist
 * (PROPERTY_DOESNT_EXIST: nothing was written), "value" when it refuses the value (a validation
 * entry naming the property, or a message quoting `value`), undefined when it names neither.
 * HubSpot lists refused values in its message: `Property values were not valid: [{"isValid":
 * false, "message", "error", "name"}]`. For the key's property "value" is a unique-value clash:
 * the key is a plain string, which HubSpot refuses only when another record holds it.
 */
export function propertyRefusal(error: unknown, property: string, value: string): "missing" | "value" | undefined {
  for (const v of refusedValues(error))
    if (v.name === property) return v.error === "PROPERTY_DOESNT_EXIST" ? "missing" : "value";
  return messagesOf(error).some((m) => m.includes(value)) ? "value" : undefined;
}

/**
 * Whether HubSpot's answer names `property` (as a whole word): for the key's property, which the
 * caller cannot set, a refusal naming it is about it, such as HubSpot's 400 for an upsert by a
 * property that is not unique-value ("Unable to perform update/upsert by non-unique 0-1 property
 * <name> in portal ID <portal>").
 */
export function namesProperty(error: unknown, property: string): boolean {
  const word = new RegExp(`(^|[^A-Za-z0-9_])${property.replace(/[.*+?^${}()|[\]\\]/g, "\\$&")}($|[^A-Za-z0-9_])`);
  return messagesOf(error).some((m) => word.test(m));
}

/** HubSpot's per-property entries of a validation message; none when it has no such list. */
function refusedValues(error: unknown): { name?: unknown; error?: unknown }[] {
  return messagesOf(error).flatMap((m) => {
    const list = /^Property values were not valid: (\[.*\])$/s.exec(m)?.[1];
    if (!list) return [];
    try {
      const entries: unknown = JSON.parse(list);
      return Array.isArray(entries) ? entries.filter((e): e is object => typeof e === "object" && e !== null) : [];
    } catch {
      return [];
    }
  });
}

/** HubSpot's messages in an answer: a batch's, per error, or an HTTP error's body. */
function messagesOf(error: unknown): string[] {
  const messages =
    error instanceof HubSpotBatchInputError
      ? error.errors.map((e) => e.message)
      : [(error as HubSpotError | null)?.body?.message];
  return messages.filter((m): m is string => typeof m === "string");
}

export function classifyHubSpotError(error: unknown): Classification {
  if (error instanceof HubSpotReadBackError) {
    // The refusal may be our own record (an earlier attempt committed), and the read that would
    // tell failed: whatever it failed with (429, a 403 for a missing read scope, refused, 5xx),
    // that says nothing about the write. Unknown, settled later by the consistent read.
    const refusal = classifyHubSpotError(error.refusal);
    const read = classifyHubSpotError(error.cause);
    const id = requestIdOf(refusal) ?? requestIdOf(read);
    return {
      kind: "ambiguous",
      reason: `HubSpot refused a second record (${refusal.reason}) and the read back by ${error.idProperty} failed (${read.reason}): the record may be ours`,
      ...(id && { providerRequestId: id }),
      // The read's own wait (429) binds the first check; a refused credential (401, 403: a
      // missing read scope) fails every check until a person fixes it: alerted now.
      ...(read.kind === "rate_limited" && { retryAfterMs: read.retryAfterMs }),
      ...("alert" in read && read.alert && { alert: true }),
    };
  }
  if (error instanceof HubSpotResentError) {
    // The last request's answer says nothing of the earlier one's write: unknown, settled by the
    // consistent read, whatever the last was (a 429's wait kept, a refused credential alerted).
    const last = classifyHubSpotError(error.cause);
    const id = requestIdOf(last);
    return {
      kind: "ambiguous",
      reason: `${last.reason}; but the client had sent this write before (HubSpot answered ${error.answers.join(", ")}), and a request answered 5xx may have been written: the record may be ours`,
      ...(id && { providerRequestId: id }),
      ...(last.kind === "rate_limited" && { retryAfterMs: last.retryAfterMs }),
      ...("alert" in last && last.alert && { alert: true }),
    };
  }
  // A lookup's read failed: the record stays unknown, whatever the read's class. Kept otherwise
  // (a 401, a 403 or an untrusted certificate alerted; a 429's wait), named as the lookup's read.
  if (error instanceof HubSpotLookupError) {
    const read = classifyHubSpotError(error.cause);
    // Refused by something in front of HubSpot (a 401 or 403 page), as HubSpot's own refusal of a
    // check would be: the next checks most likely meet it too, so a person hears of it now.
    const refused = answeredInFront(error.cause) && refusedInFront(evidenceOf(error.cause).status);
    if (refused && read.kind === "ambiguous") return { ...read, reason: error.message, alert: true };
    return { ...read, reason: error.message };
  }
  // A misconfigured key property: nothing was sent, and nothing will be until a person fixes it.
  if (error instanceof HubSpotSchemaError) return { kind: "permanent", reason: error.message, alert: true };
  if (error instanceof HubSpotSchemaReadError) {
    // A GET, sent before any write: whatever became of it, no record was written, so a read that
    // may pass later (unanswered, or a page answered in front of HubSpot, not its word on the
    // property) leaves the work to run again. Its own class otherwise (a 429's wait, a 401 or 403
    // alerted), named as the definition's read; a page's in the error's words (of the property).
    const read = classifyHubSpotError(error.cause);
    // Refused by a server in front of HubSpot (a 401 or 403 page: a firewall, a proxy): every
    // later check meets it too until a person changes it there. Left to run again, the work waited
    // unseen until the daemon escalated it; failed as not sent and alerted now, as HubSpot's own
    // refusal of this read is (a pending operation carries no alert), and run again by a person's
    // retry once fixed.
    if (answeredInFront(error.cause) && refusedInFront(error.status))
      return { kind: "permanent", reason: `not sent: ${error.message}`, alert: true };
    const reason = answeredInFront(error.cause)
      ? error.message
      : `reading the definition of ${error.objectType}.${error.property} failed: ${read.reason}`;
    return read.kind === "ambiguous" ? { kind: "transient", reason: `not sent: ${reason}` } : { ...read, reason };
  }
  // ensureSchema's create of the property: its request's own class (a 5xx ambiguous: the property
  // may exist, and ensureSchema run again finds it), named as that create.
  if (error instanceof HubSpotSchemaCreateError) {
    const create = classifyHubSpotError(error.cause);
    return { ...create, reason: `creating ${error.objectType}.${error.property} failed: ${create.reason}` };
  }
  if (error instanceof HubSpotBatchInputError) {
    const what = error.errors.map((b) => `${b.category ?? "error"}: ${b.message ?? ""}`.trim()).join("; ");
    // A refused input (validation): HubSpot's final answer, replayed to every caller.
    if (isRefusal(error)) return { kind: "permanent", reason: `207 ${what}` };
    // No result and no refusal: we cannot tell whether the record was written.
    return { kind: "ambiguous", reason: what ? `207 ${what}` : error.message };
  }
  const e = (error ?? {}) as HubSpotError;
  const { status, requestId, said: what } = evidenceOf(error);
  const ids = requestId ? { providerRequestId: requestId } : {};
  if (status === undefined) {
    // We refused the server's TLS before the request was written: nothing sent, and every retry
    // meets the same certificate. A configuration (a CA bundle, a proxy) a person must fix.
    const tls = tlsRefusal(e);
    if (tls) return { kind: "permanent", reason: `not sent: ${tls}`, alert: true };
    // Refused or unresolvable: the request never left (node-fetch keeps no syscall, so an
    // unreachable host may have come after the request: read back, not sent again blindly).
    if (neverSent(e)) return { kind: "transient", reason: `not sent: ${what}` };
    // Reset or timed out after sending: HubSpot may have written the record.
    return { kind: "ambiguous", reason: `no answer from HubSpot: ${what}` };
  }
  if (status === 429)
    return {
      kind: "rate_limited",
      reason: `${what} (policy ${e.body?.policyName ?? "unknown"})`,
      retryAfterMs: rateLimitWaitMs(e),
      ...ids,
    };
  // Documented refusals before any write: a 423 while a lock from a burst of writes lasts (2 s),
  // a 477 while the account migrates between data centres (Retry-After, up to a day).
  if (status === 423) return { kind: "rate_limited", reason: what, retryAfterMs: 2_000, ...ids };
  if (status === 477) return { kind: "rate_limited", reason: what, retryAfterMs: retryAfterMs(e) ?? 3_600_000, ...ids };
  // A 4xx page in front of HubSpot (not its JSON error): that server's word, not HubSpot's. (The
  // reads an action makes before its write are wrapped above or never thrown; a lookup's read
  // proves nothing whatever its class.)
  if (status < 500 && answeredInFront(e)) return pageInFront(status, what);
  // Bad token or missing scope (HubSpot's JSON says which): permanent, and a person must know.
  if (status === 401 || status === 403) return { kind: "permanent", reason: what, alert: true, ...ids };
  // Validation (unknown property, bad value) and missing objects: HubSpot's final answer.
  if (status >= 400 && status < 500) return { kind: "permanent", reason: what, ...ids };
  // 5xx: the gateway or HubSpot failed, possibly after writing. The consistent read settles it.
  return { kind: "ambiguous", reason: what, ...ids };
}

/** Statuses that refuse a request for its size, on receipt: 413 (its body), 414 (its URI), 431 (its headers). */
const TOO_LARGE: ReadonlySet<number> = new Set([413, 414, 431]);

/**
 * A write answered a 4xx page by a server in front of HubSpot (a proxy, load balancer, gateway or
 * firewall; HTML, not HubSpot's JSON error). Its status is that server's, and such a server may
 * answer its own page in place of an answer it did not take, HubSpot's among them (a write it
 * committed): the page does not say HubSpot refused the write. Taken as HubSpot's refusal
 * (permanent), the operation failed while its record may exist. Believed only where the status
 * says the request was not taken in whole, so could not have gone on to HubSpot whole: 408 and
 * the size refusals. Any other may have reached HubSpot: ambiguous, and the read by the key
 * settles it. (A 429, 423 or 477 is classified before: a limit's refusal, whoever answered.)
 */
function pageInFront(status: number, what: string): Classification {
  // That server did not receive the whole request in time (RFC 9110 15.5.9): nothing to pass on.
  if (status === 408)
    return {
      kind: "transient",
      reason: `not sent: ${what}: ${notHubSpots(status, "that server did not receive the whole request, so HubSpot did not get it")}`,
    };
  // Refused for its size on receipt: every attempt meets the same limit until a person changes it.
  if (TOO_LARGE.has(status))
    return {
      kind: "permanent",
      reason: `not sent: ${what}: ${notHubSpots(status, "that server refused the request for its size, so HubSpot did not get it; its limit, or the size of the values, is a person's to change")}`,
      alert: true,
    };
  // A 401 or 403 page is no word of HubSpot's on the token or its scopes either: not alerted here
  // (the read that settles it may pass); a lookup's read refused so is (HubSpotLookupError), and
  // create mode's check of the key property (HubSpotSchemaReadError).
  const unknown = refusedInFront(status)
    ? "whether HubSpot took the write is not known, nor whether HubSpot accepts the token and its scopes"
    : "whether HubSpot took the write is not known";
  return { kind: "ambiguous", reason: `${what}: ${notHubSpots(status, unknown)}` };
}

/** A 401 or 403 page in front of HubSpot: something there (a firewall, a proxy) refuses our requests. */
const refusedInFront = (status: number | undefined) => status === 401 || status === 403;

/**
 * What in `error` (a fetch error, no HTTP status) says we refused HubSpot's TLS: its certificate
 * not trusted, or no TLS version in common; undefined otherwise. The handshake failed before any
 * byte of the request was written. Not a handshake cut off (ECONNRESET): that may pass.
 */
export function tlsRefusal(error: unknown): string | undefined {
  const refused = tlsRefused(error);
  if (refused === undefined) return undefined;
  const message = (error as { message?: unknown }).message;
  const said = `${refused.code}: ${typeof message === "string" ? hostsOnly(message) : "no message"}`;
  return refused.refused === "certificate"
    ? `HubSpot's certificate is not trusted (${said}): a TLS-inspecting proxy or a private endpoint needs its CA trusted (NODE_EXTRA_CA_CERTS)`
    : `no TLS version both HubSpot and this process accept (${said})`;
}

function requestIdOf(c: Classification): string | undefined {
  return "providerRequestId" in c ? c.providerRequestId : undefined;
}

/**
 * How long HubSpot asks us to wait. A daily limit lasts until the next day (the ledger's budget
 * ends the call and the daemon retries later). A Retry-After, where one comes, is HubSpot's own
 * word. The burst limit (TEN_SECONDLY_ROLLING) counts requests over a rolling window whose length
 * X-HubSpot-RateLimit-Interval-Milliseconds gives (10 000 ms; X-HubSpot-RateLimit-Max requests in
 * it): the requests that filled it have all left it one window later, and not surely sooner. A
 * secondly limit (SECONDLY, as the search API's) is over after a second: the interval header
 * describes the burst window, not this one.
 */
function rateLimitWaitMs(e: HubSpotError): number {
  if (e.body?.policyName === "DAILY") return 3_600_000;
  const retryAfter = retryAfterMs(e);
  if (retryAfter !== undefined) return retryAfter;
  if (e.body?.policyName === "SECONDLY") return 1_000;
  const interval = Number(header(e, "x-hubspot-ratelimit-interval-milliseconds"));
  if (Number.isFinite(interval) && interval > 0) return interval;
  return e.body?.policyName === "TEN_SECONDLY_ROLLING" ? 10_000 : 1_000;
}

/** Retry-After in seconds, as ms; undefined when absent or not a positive number. */
function retryAfterMs(e: HubSpotError): number | undefined {
  const sec = Number(header(e, "retry-after"));
  return Number.isFinite(sec) && sec > 0 ? sec * 1000 : undefined;
}

function header(e: HubSpotError, name: string): string | undefined {
  return Object.entries(e.headers ?? {}).find(([k]) => k.toLowerCase() === name)?.[1];
}
