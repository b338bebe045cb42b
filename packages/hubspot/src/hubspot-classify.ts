/**
 * Maps @hubspot/api-client errors to the failure classes of @idem/core. HTTP errors arrive as
 * ApiException (`code` = status, `body` = HubSpot's JSON, `headers`); network errors as fetch
 * errors with a system `code`.
 */
import { NOT_SENT_CODES, type Classification } from "@idem/core";

interface HubSpotError {
  code?: number | string;
  body?: { message?: string; category?: string; policyName?: string; correlationId?: string };
  headers?: Record<string, string>;
  message?: string;
}

export function classifyHubSpotError(error: unknown): Classification {
  const e = (error ?? {}) as HubSpotError;
  const status = typeof e.code === "number" ? e.code : undefined;
  const ids = e.body?.correlationId ? { providerRequestId: e.body.correlationId } : {};
  const what = status
    ? `${status} ${e.body?.category ?? ""}: ${e.body?.message ?? ""}`.trim()
    : `${e.code ?? "error"}: ${e.message ?? String(error)}`;
  if (status === undefined) {
    // Refused or unresolvable: the request never left.
    if (typeof e.code === "string" && NOT_SENT_CODES.has(e.code))
      return { kind: "transient", reason: `not sent: ${what}` };
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
  // Bad token or missing scope: permanent, and a person must know.
  if (status === 401 || status === 403) return { kind: "permanent", reason: what, alert: true, ...ids };
  // Validation (unknown property, bad value) and missing objects: HubSpot's final answer.
  if (status >= 400 && status < 500) return { kind: "permanent", reason: what, ...ids };
  // 5xx: the gateway or HubSpot failed, possibly after writing. The consistent read settles it.
  return { kind: "ambiguous", reason: what, ...ids };
}

/**
 * How long HubSpot asks us to wait: a daily limit lasts until the next day (the ledger's budget
 * ends the call and the daemon retries later); the secondly and ten-secondly policies announce
 * their window in X-HubSpot-RateLimit-Interval-Milliseconds.
 */
function rateLimitWaitMs(e: HubSpotError): number {
  if (e.body?.policyName === "DAILY") return 3_600_000;
  const retryAfter = retryAfterMs(e);
  if (retryAfter !== undefined) return retryAfter;
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
