/** classifyHubSpotError over the shapes @hubspot/api-client gives its errors. */
import { describe, expect, it } from "vitest";
import {
  HubSpotBatchInputError,
  HubSpotLookupError,
  HubSpotReadBackError,
  HubSpotSchemaError,
  HubSpotSchemaReadError,
  classifyHubSpotError,
} from "@idem/hubspot";

const api = (code: number, body: Record<string, unknown> = {}, headers: Record<string, string> = {}) =>
  Object.assign(new Error("HTTP-Code"), { code, body, headers });
/** A page in front of HubSpot: the client hands its body over as text. */
const page = (code: number) =>
  Object.assign(new Error("HTTP-Code"), { code, body: `<html><h1>${code}</h1></html>`, headers: {} });
const net = (code: string) => Object.assign(new Error(code), { code, type: "system" });

describe("classifyHubSpotError", () => {
  it.each([
    // HubSpot's headers on a burst-limit 429: Max requests per Interval-Milliseconds, the window.
    [
      "ten-secondly 429 with HubSpot's headers: its window",
      api(
        429,
        { policyName: "TEN_SECONDLY_ROLLING" },
        {
          "x-hubspot-ratelimit-interval-milliseconds": "10000",
          "x-hubspot-ratelimit-max": "190",
          "x-hubspot-ratelimit-remaining": "0",
        },
      ),
      { kind: "rate_limited", retryAfterMs: 10_000 },
    ],
    [
      "secondly 429: a second, not the burst window the interval header describes",
      api(429, { policyName: "SECONDLY" }, { "x-hubspot-ratelimit-interval-milliseconds": "10000" }),
      { kind: "rate_limited", retryAfterMs: 1_000 },
    ],
    [
      "429 with a Retry-After",
      api(429, { policyName: "TEN_SECONDLY_ROLLING" }, { "Retry-After": "3" }),
      { kind: "rate_limited", retryAfterMs: 3_000 },
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
    // HubSpot's own 404 (its JSON): the object type or record is not there, HubSpot's final word.
    ["404 with HubSpot's JSON", api(404, { category: "OBJECT_NOT_FOUND" }), { kind: "permanent" }],
    // A 404 page in front of HubSpot (the client hands it over as text): whether HubSpot took the
    // write is not known, and the read by the key settles it.
    [
      "404 page in front of HubSpot",
      Object.assign(new Error("HTTP-Code"), { code: 404, body: "<html><h1>Not Found</h1></html>", headers: {} }),
      {
        kind: "ambiguous",
        reason: expect.stringMatching(/^404 \(an answer without HubSpot's JSON error body\): not HubSpot's answer/),
      },
    ],
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
    // node-fetch keeps the socket's code, not whether it came at connect: an unreachable host or
    // network is also what an ICMP error on an open connection reports, after the request left.
    ["host unreachable", net("EHOSTUNREACH"), { kind: "ambiguous" }],
    ["network unreachable", net("ENETUNREACH"), { kind: "ambiguous" }],
  ])("%s", (_what, error, expected) => {
    expect(classifyHubSpotError(error)).toMatchObject(expected);
  });

  // Other 4xx pages in front of HubSpot (a proxy's, a load balancer's, a firewall's): believed
  // only where the status says the request was not taken in whole; else the read settles it.
  type Case = [string, unknown, Record<string, unknown>];
  const unknownWrite = (code: number): Case => [
    `${code} page in front of HubSpot`,
    page(code),
    {
      kind: "ambiguous",
      reason: expect.stringMatching(
        new RegExp(
          `^${code} \\(an answer without HubSpot's JSON error body\\): not HubSpot's answer.*whether HubSpot took the write is not known`,
        ),
      ),
    },
  ];
  const tooLarge = (code: number): Case => [
    `${code} page: refused for its size`,
    page(code),
    { kind: "permanent", alert: true, reason: expect.stringMatching(/^not sent: .*refused the request for its size/) },
  ];
  it.each<Case>([
    ...[400, 401, 403, 405, 409, 410, 422].map(unknownWrite),
    [
      "408 page: that server did not receive the whole request",
      page(408),
      { kind: "transient", reason: expect.stringMatching(/^not sent: 408 .*did not receive the whole request/) },
    ],
    ...[413, 414, 431].map(tooLarge),
    // A limit's refusal, whoever answered it: nothing taken, wait.
    ["429 page", page(429), { kind: "rate_limited", retryAfterMs: 1_000 }],
  ])("%s", (_what, error, expected) => {
    expect(classifyHubSpotError(error)).toMatchObject(expected);
  });

  const conflict = api(409, {
    category: "CONFLICT",
    message: "Contact already exists. Existing ID: 7",
    correlationId: "c-409",
  });
  it.each([
    ["429", api(429, { category: "RATE_LIMITS", policyName: "TEN_SECONDLY_ROLLING" }), /\(429 RATE_LIMITS/],
    ["403 missing read scope", api(403, { category: "MISSING_SCOPES", message: "no scope" }), /\(403 MISSING_SCOPES/],
    ["connection refused", net("ECONNREFUSED"), /\(not sent: ECONNREFUSED/],
    ["500", api(500, { category: "INTERNAL_ERROR" }), /\(500 INTERNAL_ERROR/],
  ])("a refusal of a second record whose read-back answered %s: ambiguous, saying both", (_what, read, readReason) => {
    const c = classifyHubSpotError(new HubSpotReadBackError(conflict, "idem_external_id", { cause: read }));
    expect(c).toMatchObject({ kind: "ambiguous", providerRequestId: "c-409" });
    expect(c.reason).toMatch(
      /^HubSpot refused a second record \(409 CONFLICT: Contact already exists\. Existing ID: 7\)/,
    );
    expect(c.reason).toMatch(/the read back by idem_external_id failed /);
    expect(c.reason).toMatch(readReason);
  });

  it("takes the read's correlation id when the refusal has none", () => {
    const refusal = new HubSpotBatchInputError([{ status: "error", category: "CONFLICT", message: "exists" }]);
    const read = api(429, { correlationId: "c-read" });
    expect(classifyHubSpotError(new HubSpotReadBackError(refusal, "idem_external_id", { cause: read }))).toMatchObject({
      kind: "ambiguous",
      providerRequestId: "c-read",
    });
  });

  it.each([
    [
      "a validation error: HubSpot's final answer, its message the reason",
      [{ status: "error", category: "VALIDATION_ERROR", message: "Email address x is invalid", context: {} }],
      { kind: "permanent", reason: "207 VALIDATION_ERROR: Email address x is invalid" },
    ],
    [
      "an error of another category: may have been written",
      [{ status: "error", category: "INTERNAL_ERROR", message: "try again" }],
      { kind: "ambiguous", reason: "207 INTERNAL_ERROR: try again" },
    ],
    ["no error at all", [], { kind: "ambiguous" }],
  ])("a batch upsert answered with no result, %s", (_what, errors, expected) => {
    expect(classifyHubSpotError(new HubSpotBatchInputError(errors))).toMatchObject(expected);
  });

  it("keeps HubSpot's correlation id as the provider request id", () => {
    expect(classifyHubSpotError(api(400, { category: "VALIDATION_ERROR", correlationId: "c-1" }))).toMatchObject({
      providerRequestId: "c-1",
    });
  });

  it("a key property that is not unique-value: permanent, alerted, naming it and what a person can do", () => {
    expect(classifyHubSpotError(new HubSpotSchemaError("deals", "erp_ref", "not_unique"))).toEqual({
      kind: "permanent",
      alert: true,
      reason: expect.stringMatching(
        /^deals\.erp_ref exists but is not a unique-value property: .*cannot make an existing property unique-value/,
      ),
    });
  });

  it.each([
    // A GET sent before any write: unanswered, it still wrote nothing.
    [
      "502",
      api(502, { category: "SERVICE_UNAVAILABLE" }),
      {
        kind: "transient",
        reason: expect.stringMatching(/^not sent: reading the definition of deals\.erp_ref failed: 502/),
      },
    ],
    ["a reset", net("ECONNRESET"), { kind: "transient", reason: expect.stringMatching(/^not sent: /) }],
    [
      "429",
      api(429, { policyName: "TEN_SECONDLY_ROLLING" }, { "x-hubspot-ratelimit-interval-milliseconds": "10000" }),
      {
        kind: "rate_limited",
        retryAfterMs: 10_000,
        reason: expect.stringMatching(/^reading the definition of deals\.erp_ref failed: 429/),
      },
    ],
    ["403 without the schema scope", api(403, { category: "MISSING_SCOPES" }), { kind: "permanent", alert: true }],
  ])(
    "the key property's definition unreadable (%s): nothing was written, the read's own wait or alert",
    (_what, read, expected) => {
      expect(classifyHubSpotError(new HubSpotSchemaReadError("deals", "erp_ref", { cause: read }))).toMatchObject(
        expected,
      );
    },
  );

  it.each([
    ["a self-signed certificate", "DEPTH_ZERO_SELF_SIGNED_CERT", /certificate is not trusted/],
    ["a certificate no trusted CA signed", "UNABLE_TO_GET_ISSUER_CERT_LOCALLY", /certificate is not trusted/],
    ["an expired certificate", "CERT_HAS_EXPIRED", /certificate is not trusted/],
    ["a name the certificate does not carry", "ERR_TLS_CERT_ALTNAME_INVALID", /certificate is not trusted/],
    ["no TLS version in common", "ERR_SSL_UNSUPPORTED_PROTOCOL", /no TLS version/],
  ])(
    "%s refused the handshake: nothing sent, permanent, alerted (not 'no answer from HubSpot')",
    (_what, code, said) => {
      // node-fetch's FetchError for a failed handshake: the system error's code, no HTTP status.
      const c = classifyHubSpotError(net(code));
      expect(c).toMatchObject({ kind: "permanent", alert: true, reason: expect.stringMatching(/^not sent: /) });
      expect(c.reason).toMatch(said);
      expect(c.reason).toContain(code);
      // Through the key property's check too: its read, the first request of a create, never left.
      expect(classifyHubSpotError(new HubSpotSchemaReadError("deals", "erp_ref", { cause: net(code) }))).toMatchObject({
        kind: "permanent",
        alert: true,
      });
    },
  );

  it.each([401, 403])(
    "the key property's definition read answered a %i page: not sent, alerted as refused in front of HubSpot, claiming nothing of the token or its scopes",
    (code) => {
      const error = new HubSpotSchemaReadError("deals", "erp_ref", { cause: page(code) });
      expect(error.message).toMatch(
        new RegExp(
          `^reading the definition of deals\\.erp_ref failed: ${code} \\(an answer without HubSpot's JSON error body\\): not HubSpot's answer .*: that server refused the request, not HubSpot .*check the proxy or firewall`,
        ),
      );
      expect(error.message).not.toMatch(/lacks the scope|does not accept the access token/);
      const c = classifyHubSpotError(error);
      expect(c).toMatchObject({ kind: "permanent", alert: true, reason: `not sent: ${error.message}` });
    },
  );

  it("a handshake cut off (ECONNRESET) is not a refusal of the certificate: it may pass", () => {
    expect(classifyHubSpotError(net("ECONNRESET"))).toMatchObject({ kind: "ambiguous" });
  });

  it.each([
    ["403 (no read scope)", "record", api(403, { category: "MISSING_SCOPES" }), { kind: "permanent", alert: true }],
    [
      "401 (a token revoked)",
      "record",
      api(401, { category: "INVALID_AUTHENTICATION" }),
      { kind: "permanent", alert: true },
    ],
    ["an untrusted certificate", "definition", net("SELF_SIGNED_CERT_IN_CHAIN"), { kind: "permanent", alert: true }],
    ["502", "record", api(502, { category: "SERVICE_UNAVAILABLE" }), { kind: "ambiguous" }],
    // Refused by something in front of HubSpot: alerted as HubSpot's refusal is, claiming no scope.
    ["a 403 page", "record", page(403), { kind: "ambiguous", alert: true }],
    ["a 401 page", "definition", page(401), { kind: "ambiguous", alert: true }],
  ] as const)(
    "a lookup's read refused, %s: the read's own class, named as the lookup's read",
    (_what, read, cause, expected) => {
      const said = classifyHubSpotError(cause).reason;
      const c = classifyHubSpotError(new HubSpotLookupError("deals", "idem_external_id", read, said, { cause }));
      expect(c).toMatchObject(expected);
      expect(c.reason).toBe(
        `HubSpot read ${read === "record" ? "by idem_external_id" : "of the definition of deals.idem_external_id"} failed: ${said}`,
      );
    },
  );
});
