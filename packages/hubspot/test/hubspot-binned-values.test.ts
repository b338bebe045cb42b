/**
 * A record with our key in HubSpot's recycling bin, made while our requests could have run, is
 * ours only if it holds the args' values as HubSpot keeps them (hubspot-values.ts): compared by
 * the property's type, read from HubSpot (text exactly, numbers as numbers, datetimes in UTC), and
 * over what HubSpot's read returns (the properties asked for, an empty one as null). Settled to
 * it, the receipt says the record is deleted (`archived: true`), and so does the agent tool.
 * Through the real @hubspot/api-client to the sandbox, on SQLite and Postgres.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { openLedger, operationKey, type LedgerOptions } from "@idem/core";
import type { HubSpotSandbox } from "@idem/sandbox";
import { DIALECTS, ledgersFor } from "@idem/testkit";
import {
  HUBSPOT_CALL_OPTIONS,
  createHubSpotClient,
  hubspotReceiptSchema,
  hubspotTools,
  type HubSpotConfig,
  type HubSpotReceipt,
} from "@idem/hubspot";
import { actionsOn, type SandboxServer, startSandbox, tenants } from "./support/sandbox.js";

let sandbox: HubSpotSandbox;
let server: SandboxServer;
beforeAll(async () => {
  ({ sandbox, server } = await startSandbox(["contacts", "deals"]));
  // A text property whose values look like numbers (an account code keeps its leading zero).
  sandbox.crm.createProperty("deals", {
    name: "account_code",
    label: "Account code",
    type: "string",
    fieldType: "text",
    groupName: "dealinformation",
  });
});
afterAll(() => sandbox.close());

const crm = (extra: Partial<HubSpotConfig> = {}) => actionsOn(server, extra);
const tenant = tenants("bv");

describe("the sandbox's read by id, as HubSpot's", () => {
  it("returns the properties asked for (an empty one as null, one the type does not have left out), else the type's defaults", async () => {
    const api = createHubSpotClient(server);
    const made = await api.objects.basicApi.create(
      "deals",
      { properties: { dealname: "Read me", pipeline: "default", account_code: "0123" }, associations: [] },
      HUBSPOT_CALL_OPTIONS,
    );
    const read = (properties?: string[]) =>
      api.objects.basicApi.getById(
        "deals",
        made.id,
        properties,
        undefined,
        undefined,
        false,
        undefined,
        HUBSPOT_CALL_OPTIONS,
      );
    // Before: every property the record holds, whatever was asked (pipeline too), and none it lacks.
    const asked = await read(["dealname", "amount", "no_such_property"]);
    expect(asked.properties).toMatchObject({ dealname: "Read me", amount: null, hs_object_id: made.id });
    for (const left of ["pipeline", "account_code", "no_such_property"])
      expect(asked.properties).not.toHaveProperty(left);
    // None asked: the type's default properties (HubSpot's CRM objects API lists them per type).
    const defaults = await read();
    expect(defaults.properties).toMatchObject({ dealname: "Read me", amount: null, pipeline: "default" });
    expect(defaults.properties).not.toHaveProperty("account_code");
  });
});

for (const dialect of DIALECTS) {
  describe(`a deleted record with our key, made in our window, on ${dialect}`, () => {
    const db = ledgersFor(dialect, openLedger, { defaults: { poolSize: 2 } as LedgerOptions });
    const ledger = (o: LedgerOptions = {}) => db.open({ budget: { attempts: 3, baseDelayMs: 10 }, ...o });

    /**
     * An earlier operation with the key (pruned from the ledger since) made a deal holding
     * `held` minutes ago, and a person deleted it; this operation's create is answered 502
     * (nothing written, the answer cannot say so): unknown, settled by the read.
     */
    async function runOver(mode: "upsert" | "create", held: Record<string, string>, given: Record<string, string>) {
      const l = await ledger();
      const t = tenant();
      const key = operationKey({ tenant: t, action: "hubspot.deals.create", parts: ["binned"] }).hash;
      const old = sandbox.crm.create("deals", { ...held, idem_external_id: key });
      sandbox.crm.archive("deals", old.id);
      sandbox.faults.add({ kind: "bad_gateway", match: { method: "POST", path: "/crm/v3/objects/deals" } });
      const out = await l
        .run(crm({ mode }).create("deals"), { tenant: t, key: ["binned"], args: { properties: given } })
        .finally(() => sandbox.faults.clear());
      const { operation } = await l.get({ tenant: t, id: out.operationId });
      return { out, old, reason: operation.reason };
    }

    for (const mode of ["upsert", "create"] as const) {
      it(`${mode}: a text property holding "123" where the args give "0123" is another value: a person decides`, async () => {
        const { out, old, reason } = await runOver(
          mode,
          { dealname: "Q1", account_code: "123" },
          { dealname: "Q1", account_code: "0123" },
        );
        // Before: read as the number 123 both, the deal taken as this operation's (succeeded).
        expect(out).toMatchObject({ status: "pending_verification", state: "needs_review" });
        expect(reason).toMatch(new RegExp(`^deal ${old.id} in the recycling bin .* its values of account_code differ`));
      });

      it(`${mode}: a number property in HubSpot's form ("1200" for "1200.00") is the same value: settled to it, flagged archived`, async () => {
        const { out, old } = await runOver(
          mode,
          { dealname: "Q1", amount: "1200" },
          { dealname: "Q1", amount: "1200.00" },
        );
        expect(out).toMatchObject({ status: "succeeded", receipt: { id: old.id, new: false, archived: true } });
        // A person may record such a receipt too.
        const receipt = out.status === "succeeded" ? out.receipt : undefined;
        expect(hubspotReceiptSchema("deals").parse(receipt)).toEqual(receipt);
      });

      it(`${mode}: a property the args give that the deleted record has no value in reads back null: another value, a person decides`, async () => {
        const { out, old, reason } = await runOver(mode, { dealname: "Q1" }, { dealname: "Q1", amount: "1200" });
        // Before: the sandbox returned only the values the record holds, whatever was asked:
        // amount not returned, not compared, and the deal taken as this operation's.
        expect(out).toMatchObject({ status: "pending_verification", state: "needs_review" });
        expect(reason).toMatch(new RegExp(`^deal ${old.id} in the recycling bin .* its values of amount differ`));
      });
    }

    it("a property's definition that cannot be read proves nothing: the outcome stays unknown, not settled either way", async () => {
      const l = await ledger({ budget: { attempts: 1 } });
      const t = tenant();
      const key = operationKey({ tenant: t, action: "hubspot.deals.create", parts: ["binned"] }).hash;
      const old = sandbox.crm.create("deals", { dealname: "Q1", amount: "1200", idem_external_id: key });
      sandbox.crm.archive("deals", old.id);
      sandbox.faults.add({ kind: "bad_gateway", match: { method: "POST", path: "/crm/v3/objects/deals" } });
      sandbox.faults.add({
        kind: "bad_gateway",
        match: { method: "GET", path: "/crm/v3/properties/deals/amount" },
        times: 100,
      });
      const action = crm().create("deals");
      try {
        const out = await l.run(action, { tenant: t, key: ["binned"], args: { properties: { amount: "1200.00" } } });
        expect(out).toMatchObject({ status: "pending_verification", state: "unknown" });
        const daemon = await ledger({ actions: [action] });
        expect(await daemon.daemon.settle({ tenant: t, id: out.operationId })).toMatchObject({
          status: "pending_verification",
          state: "unknown",
        });
        const { operation } = await l.get({ tenant: t, id: out.operationId });
        expect(operation.reason).toMatch(/definition/);
      } finally {
        sandbox.faults.clear();
      }
    });

    it("the agent tool: a contact settled to our record deleted since reads deleted, not a live contact", async () => {
      const l = await ledger({ budget: { attempts: 1 } });
      const t = tenant();
      const tool = hubspotTools(crm()).createContact;
      const input = { email: `binned-${t}@example.test`, firstname: "Ada" };
      // The answer is lost after the contact was written, and the read back fails: unknown.
      sandbox.faults.add({ kind: "drop_after_commit", match: { method: "POST", path: "/crm/v3/objects/contacts" } });
      sandbox.faults.add({
        kind: "bad_gateway",
        match: { method: "GET", path: "/crm/v3/objects/contacts" },
        times: 100,
      });
      const out = await l
        .run(tool.action, { tenant: t, key: tool.key(input), args: tool.args(input) })
        .finally(() => sandbox.faults.clear());
      expect(out).toMatchObject({ status: "pending_verification", state: "unknown" });
      const [row] = await l.admin.list({ tenant: t });
      const [record] = sandbox.crm.all("contacts").filter((r) => r.properties.idem_external_id === row!.key);
      sandbox.crm.archive("contacts", record!.id); // a person deletes it before the daemon settles it
      const daemon = await ledger({ actions: [tool.action] });
      const settled = await daemon.daemon.settle({ tenant: t, id: row!.id });
      // Before: { id, new: false } as for a live contact; the caller and the model read it there.
      expect(settled).toMatchObject({ status: "succeeded", receipt: { id: record!.id, archived: true } });
      const receipt = settled.status === "succeeded" ? (settled.receipt as HubSpotReceipt) : undefined;
      expect(tool.summarize(receipt!)).toMatchObject({
        id: record!.id,
        archived: true,
        note: expect.stringMatching(/deleted/),
      });
    });
  });
}
