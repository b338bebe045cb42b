/**
 * A read by the key answered 404 by something other than HubSpot (a proxy's or gateway's page in
 * front of it): HubSpot's own "no such record" is its JSON with category OBJECT_NOT_FOUND, and
 * only that proves a record absent. Before: any 404 did. An operation whose create HubSpot wrote
 * (its answer lost) was "proven absent", sent again, refused for its key, its read back met the
 * page too, and it failed, replayed to every caller, while its deal exists (create mode); in
 * upsert mode the upsert was sent again over the record.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { openLedger, operationKey, type LedgerOptions } from "@idem/core";
import type { HubSpotSandbox } from "@idem/sandbox";
import { DIALECTS, ledgersFor } from "@idem/testkit";
import { HubSpotSchemaReadError, classifyHubSpotError, type HubSpotConfig } from "@idem/hubspot";
import { actionsOn, type SandboxServer, startSandbox, tenants } from "./support/sandbox.js";

let sandbox: HubSpotSandbox;
let server: SandboxServer;
beforeAll(async () => {
  ({ sandbox, server } = await startSandbox(["deals"]));
});
afterAll(() => sandbox.close());

const crm = (extra: Partial<HubSpotConfig> = {}) => actionsOn(server, extra);
const tenant = tenants("nf");
const WRITE = {
  upsert: { method: "POST", path: "/crm/v3/objects/deals/batch/upsert" },
  create: { method: "POST", path: "/crm/v3/objects/deals" },
} as const;

for (const dialect of DIALECTS) {
  describe(`a read by the key answered a 404 page that is not HubSpot's, on ${dialect}`, () => {
    const db = ledgersFor(dialect, openLedger, { defaults: { poolSize: 2 } as LedgerOptions });

    for (const mode of ["upsert", "create"] as const)
      it(`${mode}: the write's answer lost after HubSpot wrote: unknown, not proven absent; then found, one deal`, async () => {
        const action = crm({ mode, settleMs: 0 }).create("deals");
        const l = await db.open({ budget: { attempts: 3, baseDelayMs: 10 }, actions: [action] });
        const t = tenant();
        const before = sandbox.requests.length;
        sandbox.faults.add({ kind: "drop_after_commit", match: WRITE[mode] });
        sandbox.faults.add({
          kind: "page",
          match: { method: "GET", path: "/crm/v3/objects/deals/" },
          times: 100,
        });
        const out = await l
          .run(action, { tenant: t, key: ["behind-a-proxy"], args: { properties: { dealname: "Behind a proxy" } } })
          .finally(() => sandbox.faults.clear());
        const { operation } = await l.get({ tenant: t, id: out.operationId });
        const deals = () => sandbox.crm.all("deals").filter((r) => r.properties.idem_external_id === operation.key);
        expect(deals()).toHaveLength(1);
        expect(out).toMatchObject({ status: "pending_verification", state: "unknown" });
        // The operator reads which read failed and its status, never the page itself.
        expect(operation.reason).toMatch(
          /HubSpot read by idem_external_id failed: 404 \(an answer without HubSpot's JSON error body\)/,
        );
        expect(operation.reason).not.toMatch(/<|Not Found/);
        // The write HubSpot took, and no other: nothing was proven absent.
        const writes = sandbox.requests.slice(before).filter((r) => r.method === "POST" && r.path === WRITE[mode].path);
        expect(writes.map((r) => r.status)).toEqual(["dropped"]);
        const settled = await l.daemon.settle({ tenant: t, id: out.operationId });
        expect(settled).toMatchObject({ status: "succeeded", receipt: { id: deals()[0]!.id, new: false } });
        expect(deals()).toHaveLength(1);
      });
  });
}

/**
 * The key property's definition read (GET /crm/v3/properties/deals/idem_external_id) answered a
 * 404 page that is not HubSpot's: HubSpot's answer was not received, so nothing is known of the
 * property. Before: read as "the property does not exist", so create mode failed with an alert
 * telling an operator to create a property that exists, and a lookup sent the operation to a
 * person for the same wrong reason.
 */
const DEFINITION = { method: "GET", path: "/crm/v3/properties/deals/" } as const;

for (const dialect of DIALECTS) {
  describe(`a property definition read answered a page that is not HubSpot's, on ${dialect}`, () => {
    const db = ledgersFor(dialect, openLedger, { defaults: { poolSize: 2 } as LedgerOptions });

    it("create mode's check before the first write: nothing sent, pending (not failed 'does not exist'); then created once", async () => {
      const action = crm({ mode: "create" }).create("deals");
      const l = await db.open({ budget: { attempts: 2, baseDelayMs: 10 }, actions: [action] });
      const t = tenant();
      const before = sandbox.requests.length;
      sandbox.faults.add({ kind: "page", match: DEFINITION, times: 100 });
      const run = () =>
        l.run(action, { tenant: t, key: ["definition-page"], args: { properties: { dealname: "Definition page" } } });
      const out = await run().finally(() => sandbox.faults.clear());
      expect(out).toMatchObject({ status: "pending_verification", state: "pending" });
      const { operation } = await l.get({ tenant: t, id: out.operationId });
      expect(operation.reason).toMatch(
        /^transient: not sent: reading the definition of deals\.idem_external_id failed: 404 \(an answer without HubSpot's JSON error body\).*not HubSpot's answer/,
      );
      expect(operation.reason).not.toMatch(/does not exist|<|Not Found/);
      const writes = sandbox.requests.slice(before).filter((r) => r.method === "POST");
      expect(writes).toEqual([]);
      expect(await run()).toMatchObject({ status: "succeeded", receipt: { new: true } });
      expect(sandbox.crm.all("deals").filter((r) => r.properties.idem_external_id === operation.key)).toHaveLength(1);
    });

    // A firewall or proxy refusing the check refuses every later one alike: before, each call was
    // left pending ("transient"), run again and again unseen until the daemon's escalation.
    for (const status of [401, 403])
      it(`create mode's check refused by a ${status} page: nothing sent, failed and alerted at once, naming the server in front (no token or scope claimed); retried once fixed, created once`, async () => {
        const action = crm({ mode: "create" }).create("deals");
        const l = await db.open({ budget: { attempts: 3, baseDelayMs: 10 }, actions: [action] });
        const t = tenant();
        const before = sandbox.requests.length;
        sandbox.faults.add({ kind: "page", status, match: DEFINITION, times: 100 });
        const run = () =>
          l.run(action, { tenant: t, key: [`refused-${status}`], args: { properties: { dealname: "Refused check" } } });
        const out = await run().finally(() => sandbox.faults.clear());
        expect(out).toMatchObject({ status: "failed", error: { kind: "permanent", alert: true } });
        const reason = out.status === "failed" ? out.error.reason : "";
        expect(reason).toMatch(
          new RegExp(
            `^not sent: reading the definition of deals\\.idem_external_id failed: ${status} \\(an answer without HubSpot's JSON error body\\).*: not HubSpot's answer .*: that server refused the request, not HubSpot.*proxy or firewall`,
          ),
        );
        expect(reason).not.toMatch(/lacks the scope|does not accept the access token|<|Forbidden|Unauthorized/);
        expect(sandbox.requests.slice(before).filter((r) => r.method === "POST")).toEqual([]);
        // Refused once, not tried until the budget ran out: every try meets the same server.
        expect(sandbox.requests.slice(before).map((r) => `${r.method} ${r.status}`)).toEqual([`GET ${status}`]);
        const alerts = await l.daemon.alertsDue({ limit: 1_000 });
        expect(alerts.some((a) => a.id === out.operationId)).toBe(true);
        // The proxy fixed, a person retries it: made once.
        await l.admin.retry({ tenant: t, id: out.operationId, actor: "ops", reason: "the proxy lets HubSpot through" });
        expect(await run()).toMatchObject({ status: "succeeded", receipt: { new: true } });
        const { operation } = await l.get({ tenant: t, id: out.operationId });
        expect(sandbox.crm.all("deals").filter((r) => r.properties.idem_external_id === operation.key)).toHaveLength(1);
      });

    it("a lookup's check of the key property: unknown, not sent to a person as 'does not exist'; then found", async () => {
      const action = crm({ settleMs: 0 }).create("deals");
      const l = await db.open({ budget: { attempts: 2, baseDelayMs: 10 }, actions: [action] });
      const t = tenant();
      sandbox.faults.add({ kind: "drop_after_commit", match: WRITE.upsert });
      sandbox.faults.add({ kind: "page", match: DEFINITION, times: 100 });
      const out = await l
        .run(action, { tenant: t, key: ["lookup-page"], args: { properties: { dealname: "Lookup page" } } })
        .finally(() => sandbox.faults.clear());
      expect(out).toMatchObject({ status: "pending_verification", state: "unknown" });
      const { operation } = await l.get({ tenant: t, id: out.operationId });
      expect(operation.reason).toMatch(
        /HubSpot read of the definition of deals\.idem_external_id failed: 404 \(an answer without HubSpot's JSON error body\)/,
      );
      expect(operation.reason).not.toMatch(/does not exist|<|Not Found/);
      const deals = sandbox.crm.all("deals").filter((r) => r.properties.idem_external_id === operation.key);
      expect(await l.daemon.settle({ tenant: t, id: out.operationId })).toMatchObject({
        status: "succeeded",
        receipt: { id: deals[0]!.id, new: false },
      });
      expect(deals).toHaveLength(1);
    });

    it("a deleted record's value shapes: unknown, naming the property read, not 'its values differ'", async () => {
      const action = crm().create("deals");
      const l = await db.open({ budget: { attempts: 2, baseDelayMs: 10 }, actions: [action] });
      const t = tenant();
      const key = operationKey({ tenant: t, action: "hubspot.deals.create", parts: ["shape-page"] }).hash;
      // Ours, deleted since; HubSpot keeps a number in its own form ("1200" for "1200.00").
      const old = sandbox.crm.create("deals", { dealname: "Q1", amount: "1200", idem_external_id: key });
      sandbox.crm.archive("deals", old.id);
      sandbox.faults.add({ kind: "bad_gateway", match: WRITE.upsert });
      sandbox.faults.add({ kind: "page", match: { ...DEFINITION, path: "/crm/v3/properties/deals/amount" } });
      const out = await l
        .run(action, { tenant: t, key: ["shape-page"], args: { properties: { dealname: "Q1", amount: "1200.00" } } })
        .finally(() => sandbox.faults.clear());
      expect(out).toMatchObject({ status: "pending_verification", state: "unknown" });
      const { operation } = await l.get({ tenant: t, id: out.operationId });
      expect(operation.reason).toMatch(
        /HubSpot read of the definition of deals\.amount failed: 404 \(an answer without HubSpot's JSON error body\)/,
      );
      expect(await l.daemon.settle({ tenant: t, id: out.operationId })).toMatchObject({
        status: "succeeded",
        receipt: { id: old.id, archived: true },
      });
    });
  });
}

describe("ensureSchema, its definition read answered a 404 page that is not HubSpot's", () => {
  it("a read error saying HubSpot's answer was not received, not a create refused for an archived property", async () => {
    sandbox.faults.add({ kind: "page", match: DEFINITION, times: 100 });
    const error = await crm()
      .ensureSchema(["deals"])
      .then(
        () => undefined,
        (e: unknown) => e,
      )
      .finally(() => sandbox.faults.clear());
    expect(error).toBeInstanceOf(HubSpotSchemaReadError);
    expect(error).toMatchObject({ status: 404, objectType: "deals", property: "idem_external_id" });
    expect((error as Error).message).toMatch(
      /^reading the definition of deals\.idem_external_id failed: 404 \(an answer without HubSpot's JSON error body\).*not HubSpot's answer/,
    );
    expect((error as Error).message).not.toMatch(/archived|<|Not Found/);
    expect(classifyHubSpotError(error)).toMatchObject({ kind: "transient" });
  });
});
