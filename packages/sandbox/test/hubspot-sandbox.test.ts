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
