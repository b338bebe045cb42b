/**
 * The HubSpot sandbox answers as HubSpot does where its words reach a person (an operation's
 * reason), checked over HTTP as @hubspot/api-client would send (no ledger involved). Its CRM
 * semantics are checked through the real client in packages/hubspot/test/hubspot.test.ts.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { HubSpotSandbox } from "@idem/sandbox";

let sandbox: HubSpotSandbox;
let server: { basePath: string; accessToken: string };
beforeAll(async () => {
  sandbox = new HubSpotSandbox();
  server = await sandbox.start();
  sandbox.crm.createProperty("companies", {
    name: "plain_ref",
    label: "plain_ref",
    type: "string",
    fieldType: "text",
    groupName: "companyinformation",
    hasUniqueValue: false,
  });
});
afterAll(() => sandbox.close());

const upsert = (objectType: string, input: Record<string, unknown>) =>
  fetch(`${server.basePath}/crm/v3/objects/${objectType}/batch/upsert`, {
    method: "POST",
    headers: { authorization: `Bearer ${server.accessToken}`, "content-type": "application/json" },
    body: JSON.stringify({ inputs: [input] }),
  });

describe("HubSpot sandbox refusals, in HubSpot's words", () => {
  // HubSpot's answer as quoted in HubSpot/hubspot-api-nodejs#548 and segmentio/action-destinations#3957:
  // the object type by its id (0-1 contacts, 0-2 companies) and the portal. Before: "idProperty
  // 'plain_ref' must be a unique value property", the sandbox's own words.
  it.each([
    ["not unique-value", "plain_ref"],
    // HubSpot's answer for a property that does not exist is not quoted anywhere we found; the
    // sandbox answers alike (it refused both alike before too).
    ["missing", "no_such_ref"],
  ])("an upsert by an idProperty %s: 400 VALIDATION_ERROR, HubSpot's message", async (_what, idProperty) => {
    const res = await upsert("companies", { idProperty, id: "P-1", properties: { name: "P" } });
    expect(res.status).toBe(400);
    const body = (await res.json()) as { category?: string; message?: string };
    expect(body.category).toBe("VALIDATION_ERROR");
    expect(body.message).toMatch(
      new RegExp(`^Unable to perform update/upsert by non-unique 0-2 property ${idProperty} in portal ID \\d+$`),
    );
    expect(sandbox.crm.all("companies")).toHaveLength(0);
  });
});

const api = (method: string, path: string, body?: unknown) =>
  fetch(`${server.basePath}${path}`, {
    method,
    headers: { authorization: `Bearer ${server.accessToken}`, "content-type": "application/json" },
    ...(body !== undefined && { body: JSON.stringify(body) }),
  });

describe("HubSpot sandbox records, as HubSpot keeps them", () => {
  // HubSpot's CRM search guide lists each object's default properties: contacts carry
  // `lastmodifieddate`, companies, deals, tickets and the others `hs_lastmodifieddate`
  // (developers.hubspot.com/docs/api/crm/search, "Default returned properties"). A write moves it,
  // with the record's `updatedAt`. Before: `lastmodifieddate` on every type, never moved by an update.
  it.each([
    ["contacts", "lastmodifieddate", { email: "modified@example.test" }, { firstname: "Ada" }],
    ["deals", "hs_lastmodifieddate", { dealname: "Before" }, { dealname: "After" }],
  ])("an upsert that updates a %s record moves its %s with updatedAt", async (objectType, modified, first, then) => {
    ensureKeyProperty(objectType);
    const input = (properties: Record<string, string>) => ({
      idProperty: "sandbox_ref",
      id: `M-${objectType}`,
      properties,
    });
    const made = (await (await upsert(objectType, input(first))).json()) as UpsertAnswer;
    const created = made.results[0]!;
    expect(created.properties[modified]).toBe(created.createdAt);
    sandbox.advance(60_000);
    const updated = (await (await upsert(objectType, input(then))).json()) as UpsertAnswer;
    const record = updated.results[0]!;
    expect(record.new).toBe(false);
    expect(Date.parse(record.updatedAt) - Date.parse(created.updatedAt)).toBeGreaterThanOrEqual(60_000);
    expect(record.properties[modified]).toBe(record.updatedAt);
    expect(record.properties.createdate).toBe(created.createdAt);
    // A read returns it by default, and only the type's own name of it.
    const read = (await (await api("GET", `/crm/v3/objects/${objectType}/${record.id}`)).json()) as Answered;
    expect(read.properties[modified]).toBe(record.updatedAt);
    const other = modified === "lastmodifieddate" ? "hs_lastmodifieddate" : "lastmodifieddate";
    expect(read.properties).not.toHaveProperty(other);
  });

  // HubSpot refuses a value not among an enumeration property's options: 400 VALIDATION_ERROR,
  // each refused value listed with error INVALID_OPTION, as HubSpot answered in
  // gregorspan/csc-frodx#21 ("reports was not one of the allowed options: [PRODUCT_ISSUE, …]") and
  // gitcoinco/code_fund_ads#479. Before: any value was stored as sent.
  describe("an enumeration property's options", () => {
    beforeAll(() => {
      for (const [name, fieldType] of [
        ["deal_tier", "select"],
        ["deal_regions", "checkbox"],
      ] as const)
        sandbox.crm.createProperty("deals", {
          name,
          label: name,
          type: "enumeration",
          fieldType,
          groupName: "dealinformation",
          options: ["gold", "silver", "emea", "apac"].map((value, displayOrder) => ({
            label: value,
            value,
            displayOrder,
            hidden: false,
          })),
        });
    });

    it("a create with a value not among them: 400 VALIDATION_ERROR, INVALID_OPTION naming it, nothing written", async () => {
      const before = sandbox.crm.all("deals").length;
      const res = await api("POST", "/crm/v3/objects/deals", { properties: { dealname: "Tin", deal_tier: "tin" } });
      expect(res.status).toBe(400);
      const body = (await res.json()) as { category?: string; message?: string };
      expect(body.category).toBe("VALIDATION_ERROR");
      const [refused] = JSON.parse(/^Property values were not valid: (\[.*\])$/s.exec(body.message ?? "")![1]!) as {
        error: string;
        name: string;
        message: string;
      }[];
      expect(refused).toMatchObject({ error: "INVALID_OPTION", name: "deal_tier" });
      expect(refused!.message).toMatch(/^tin was not one of the allowed options: \[gold, silver, emea, apac\]$/);
      expect(sandbox.crm.all("deals")).toHaveLength(before);
    });

    it("a batch upsert with one: its input refused (207), as HubSpot answers a batch", async () => {
      ensureKeyProperty("deals");
      const res = await upsert("deals", {
        idProperty: "sandbox_ref",
        id: "E-1",
        properties: { deal_regions: "emea;mars" },
      });
      expect(res.status).toBe(207);
      const body = (await res.json()) as { results: unknown[]; errors: { category: string; message: string }[] };
      expect(body.results).toEqual([]);
      expect(body.errors[0]).toMatchObject({
        category: "VALIDATION_ERROR",
        message: expect.stringMatching(/mars was not one of the allowed options/),
      });
    });

    it("values among them, several checkboxes joined by ';', or none (cleared): taken", async () => {
      const res = await api("POST", "/crm/v3/objects/deals", {
        properties: { dealname: "Gold", deal_tier: "gold", deal_regions: "emea;apac" },
      });
      expect(res.status).toBe(201);
      const cleared = await api("POST", "/crm/v3/objects/deals", { properties: { dealname: "None", deal_tier: "" } });
      expect(cleared.status).toBe(201);
    });
  });

  // HubSpot sends its rate-limit headers on its answers, not only on a 429 (developer changelog
  // 2018-11-06, "Rate limit information headers will be included in HTTP responses"; for OAuth
  // tokens since "Rate limit headers will now appear for OAuth authenticated calls").
  it("every answer carries the X-HubSpot-RateLimit headers, Remaining counting the window's requests", async () => {
    const first = await api("GET", "/crm/v3/properties/deals");
    const second = await api("GET", "/crm/v3/objects/deals/999999");
    expect(second.status).toBe(404);
    for (const res of [first, second]) {
      expect(res.headers.get("x-hubspot-ratelimit-interval-milliseconds")).toBe("10000");
      expect(Number(res.headers.get("x-hubspot-ratelimit-max"))).toBeGreaterThan(0);
      expect(Number(res.headers.get("x-hubspot-ratelimit-daily"))).toBeGreaterThan(0);
    }
    const remaining = (res: Response) => Number(res.headers.get("x-hubspot-ratelimit-remaining"));
    const daily = (res: Response) => Number(res.headers.get("x-hubspot-ratelimit-daily-remaining"));
    expect(remaining(second)).toBe(remaining(first) - 1);
    expect(daily(second)).toBe(daily(first) - 1);
  });
});

describe("HubSpot sandbox pages in front of HubSpot", () => {
  // A proxy's, load balancer's or firewall's page: HTML, no HubSpot JSON, no rate-limit headers,
  // of the fault's status (404 unless given). Before the write (`page`) nothing is kept; after it
  // (`page_after_commit`) the record is.
  it.each([
    ["page", undefined, 404, "Not Found", 0],
    ["page_after_commit", undefined, 404, "Not Found", 1],
    ["page", 403, 403, "Forbidden", 0],
    ["page_after_commit", 400, 400, "Bad Request", 1],
  ] as const)(
    "%s (status %s) on a create: an HTML %i, %s, %i record kept",
    async (kind, status, answered, phrase, kept) => {
      const before = sandbox.count("tickets");
      sandbox.faults.add({
        kind,
        match: { method: "POST", path: "/crm/v3/objects/tickets" },
        ...(status && { status }),
      });
      const res = await api("POST", "/crm/v3/objects/tickets", { properties: { subject: kind } });
      expect(res.status).toBe(answered);
      expect(res.headers.get("content-type")).toMatch(/^text\/html/);
      expect(res.headers.get("x-hubspot-ratelimit-remaining")).toBeNull();
      expect(await res.text()).toContain(`<h1>${phrase}</h1>`);
      expect(sandbox.count("tickets") - before).toBe(kept);
      expect(sandbox.requests.at(-1)).toEqual({ method: "POST", path: "/crm/v3/objects/tickets", status: answered });
    },
  );
});

type Answered = { id: string; createdAt: string; updatedAt: string; properties: Record<string, string | null> };
type UpsertAnswer = { results: (Answered & { new: boolean })[] };

function ensureKeyProperty(objectType: string): void {
  if (!sandbox.crm.getProperty(objectType, "sandbox_ref"))
    sandbox.crm.createProperty(objectType, {
      name: "sandbox_ref",
      label: "sandbox_ref",
      type: "string",
      fieldType: "text",
      groupName: `${objectType}information`,
      hasUniqueValue: true,
    });
}
