/** classifyHubSpotError over the shapes @hubspot/api-client gives its errors. */
import { describe, expect, it } from "vitest";
import { classifyHubSpotError } from "@idem/hubspot";

const api = (code: number, body: Record<string, unknown> = {}, headers: Record<string, string> = {}) =>
  Object.assign(new Error("HTTP-Code"), { code, body, headers });
const net = (code: string) => Object.assign(new Error(code), { code, type: "system" });

describe("classifyHubSpotError", () => {
  it.each([
    [
      "secondly 429 with its interval header",
      api(429, { policyName: "SECONDLY" }, { "x-hubspot-ratelimit-interval-milliseconds": "2000" }),
      { kind: "rate_limited", retryAfterMs: 2000 },
    ],
    [
      "ten-secondly 429 without headers",
      api(429, { policyName: "TEN_SECONDLY_ROLLING" }),
      { kind: "rate_limited", retryAfterMs: 10_000 },
    ],
    ["daily 429", api(429, { policyName: "DAILY" }), { kind: "rate_limited", retryAfterMs: 3_600_000 }],
    ["401", api(401, { category: "INVALID_AUTHENTICATION" }), { kind: "permanent", alert: true }],
    ["403 missing scope", api(403, { category: "MISSING_SCOPES" }), { kind: "permanent", alert: true }],
    ["400 validation", api(400, { category: "VALIDATION_ERROR" }), { kind: "permanent" }],
    // Documented: a 423 while a lock from many writes lasts (2 s), and nothing was written.
    ["423 locked", api(423, { category: "LOCKED" }), { kind: "rate_limited", retryAfterMs: 2000 }],
    [
      "477 migration in progress, with Retry-After",
      api(477, {}, { "Retry-After": "30" }),
      { kind: "rate_limited", retryAfterMs: 30_000 },
    ],
    ["477 without Retry-After", api(477), { kind: "rate_limited", retryAfterMs: 3_600_000 }],
    ["502 from the gateway", api(502), { kind: "ambiguous" }],
    ["500", api(500), { kind: "ambiguous" }],
    ["connection refused", net("ECONNREFUSED"), { kind: "transient" }],
    ["reset after sending", net("ECONNRESET"), { kind: "ambiguous" }],
  ])("%s", (_what, error, expected) => {
    expect(classifyHubSpotError(error)).toMatchObject(expected);
  });

  it("keeps HubSpot's correlation id as the provider request id", () => {
    expect(classifyHubSpotError(api(400, { correlationId: "c-1" }))).toMatchObject({ providerRequestId: "c-1" });
  });
});
