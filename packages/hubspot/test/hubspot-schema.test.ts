/**
 * ensureSchema against what HubSpot answers: a property of the name that is not unique-value (which
 * HubSpot cannot make unique-value since), and the properties API refusing or failing (401, 403,
 * 429, 5xx). The real @hubspot/api-client over HTTP to the HubSpot sandbox.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { HubSpotSandbox } from "@idem/sandbox";
import {
  HubSpotSchemaCreateError,
  HubSpotSchemaError,
  HubSpotSchemaReadError,
  classifyHubSpotError,
  type HubSpotConfig,
} from "@idem/hubspot";
import { actionsOn, plainProperty, type SandboxServer, startSandbox } from "./support/sandbox.js";

let sandbox: HubSpotSandbox;
let server: SandboxServer;
beforeAll(async () => {
  ({ sandbox, server } = await startSandbox());
});
afterAll(() => sandbox.close());

const crm = (extra: Partial<HubSpotConfig> = {}) => actionsOn(server, extra);
const host = () => new URL(server.basePath).host;
const UUID = /[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}/;

/** A plain text property (not unique-value), as an operator or another tool might have made it. */
describe("ensureSchema: a property of the name that is not unique-value", () => {
  it("refuses with what is wrong and what a person can do, not 'create it with ensureSchema'", async () => {
    plainProperty(sandbox, "deals", "idem_external_id");
    const error = await crm()
      .ensureSchema(["deals"])
      .catch((e: unknown) => e);
    expect(error).toBeInstanceOf(HubSpotSchemaError);
    expect(error).toMatchObject({
      objectType: "deals",
      property: "idem_external_id",
      problem: "not_unique",
      definition: { name: "idem_external_id", type: "string", fieldType: "text", hasUniqueValue: false },
    });
    const message = (error as Error).message;
    expect(message).toMatch(
      /^deals\.idem_external_id exists but is not a unique-value property \(HubSpot's definition/,
    );
    expect(message).toMatch(/hasUniqueValue: false/);
    // ensureSchema cannot fix it: HubSpot makes a property unique-value only when creating it.
    expect(message).not.toMatch(/create it with ensureSchema/i);
    expect(message).toMatch(/cannot make an existing property unique-value/);
    expect(message).toMatch(/uniqueProperty/); // another name, made unique-value
    expect(message).toMatch(/archive/); // or remade, where no record holds a value in it
    expect(classifyHubSpotError(error)).toMatchObject({ kind: "permanent", alert: true });
  });

  it("made meanwhile by another process (the create answered 409): refused, not 'present'", async () => {
    // Another process creates it plain between ensureSchema's read (404) and its create.
    const create = sandbox.crm.createProperty.bind(sandbox.crm);
    sandbox.crm.createProperty = (objectType, p) => {
      sandbox.crm.createProperty = create;
      plainProperty(sandbox, objectType, p.name ?? "");
      return create(objectType, p);
    };
    try {
      const error = await crm()
        .ensureSchema(["tickets"])
        .catch((e: unknown) => e);
      // Before: { tickets: "present" }, and the property kept as known unique-value.
      expect(error).toBeInstanceOf(HubSpotSchemaError);
      expect(error).toMatchObject({ objectType: "tickets", problem: "not_unique" });
      expect(sandbox.requests.filter((r) => r.method === "POST" && r.path === "/crm/v3/properties/tickets")).toEqual([
        { method: "POST", path: "/crm/v3/properties/tickets", status: 409 },
      ]);
    } finally {
      sandbox.crm.createProperty = create;
    }
  });
});

describe("ensureSchema: the properties API refusing or failing", () => {
  /** What a person reads of the error: the evidence, and never the token or the request's path. */
  function expectEvidence(error: unknown, status: number, token = server.accessToken) {
    expect(error).toMatchObject({ status, host: host(), requestId: expect.stringMatching(UUID) });
    const message = (error as Error).message;
    expect(message).toContain(String(status));
    expect(message).toContain((error as { requestId: string }).requestId);
    expect(message).toContain(host());
    expect(message).not.toContain(token);
    expect(message).not.toContain("/crm/v3/");
    expect((error as Error).cause).toMatchObject({ code: status }); // the client's error, kept
  }

  it("the read refused 401 (a token revoked): HubSpotSchemaReadError with the evidence, alerted", async () => {
    const token = "pat-revoked-0123456789";
    const error = await crm({ accessToken: token })
      .ensureSchema(["companies"])
      .catch((e: unknown) => e);
    // Before: the client's ApiException as it came ("HTTP-Code: 401 … Body: … Headers: …").
    expect(error).toBeInstanceOf(HubSpotSchemaReadError);
    expectEvidence(error, 401, token);
    expect((error as Error).message).toMatch(/^reading the definition of companies\.idem_external_id failed: 401/);
    expect(classifyHubSpotError(error)).toMatchObject({ kind: "permanent", alert: true });
  });

  it("the create refused 403 (the token lacks the schema write scope): HubSpotSchemaCreateError, alerted", async () => {
    sandbox.faults.add({ kind: "missing_scopes", match: { method: "POST", path: "/crm/v3/properties/companies" } });
    const error = await crm()
      .ensureSchema(["companies"])
      .catch((e: unknown) => e)
      .finally(() => sandbox.faults.clear());
    expect(error).toBeInstanceOf(HubSpotSchemaCreateError);
    expectEvidence(error, 403);
    expect((error as Error).message).toMatch(/^creating companies\.idem_external_id failed: 403 MISSING_SCOPES/);
    expect(classifyHubSpotError(error)).toMatchObject({
      kind: "permanent",
      alert: true,
      providerRequestId: expect.stringMatching(UUID),
    });
    expect(sandbox.crm.getProperty("companies", "idem_external_id")).toBeUndefined();
  });

  it("the read rate limited (429): HubSpotSchemaReadError, waiting HubSpot's window", async () => {
    sandbox.faults.add({ kind: "rate_limit", match: { method: "GET", path: "/crm/v3/properties/companies" } });
    const error = await crm()
      .ensureSchema(["companies"])
      .catch((e: unknown) => e)
      .finally(() => sandbox.faults.clear());
    expect(error).toBeInstanceOf(HubSpotSchemaReadError);
    expectEvidence(error, 429);
    expect(classifyHubSpotError(error)).toMatchObject({ kind: "rate_limited", retryAfterMs: 10_000 });
  });

  it("the create failing 502: HubSpotSchemaCreateError; ensureSchema run again creates it once", async () => {
    sandbox.faults.add({ kind: "bad_gateway", match: { method: "POST", path: "/crm/v3/properties/companies" } });
    const error = await crm()
      .ensureSchema(["companies"])
      .catch((e: unknown) => e)
      .finally(() => sandbox.faults.clear());
    expect(error).toBeInstanceOf(HubSpotSchemaCreateError);
    expectEvidence(error, 502);
    expect(await crm().ensureSchema(["companies"])).toEqual({ companies: "created" });
  });

  // A page in front of HubSpot says nothing of whether HubSpot took the create. Before: permanent
  // ("no effect"), though the property exists.
  it("the create answered a 404 page after HubSpot made it: ambiguous; ensureSchema run again finds it", async () => {
    const uniqueProperty = "idem_page_ref";
    sandbox.faults.add({
      kind: "page_after_commit",
      match: { method: "POST", path: "/crm/v3/properties/contacts" },
    });
    const error = await crm({ uniqueProperty })
      .ensureSchema(["contacts"])
      .catch((e: unknown) => e)
      .finally(() => sandbox.faults.clear());
    expect(error).toBeInstanceOf(HubSpotSchemaCreateError);
    // A page carries no HubSpot request id, and is not quoted.
    expect(error).toMatchObject({ status: 404, host: host(), requestId: undefined });
    expect((error as Error).message).not.toMatch(/<|Not Found|\/crm\/v3\//);
    expect((error as Error).message).toMatch(
      /^creating contacts\.idem_page_ref failed: 404 \(an answer without HubSpot's JSON error body\).*not HubSpot's answer/,
    );
    expect(classifyHubSpotError(error)).toMatchObject({ kind: "ambiguous" });
    expect(await crm({ uniqueProperty }).ensureSchema(["contacts"])).toEqual({ contacts: "present" });
  });
});
