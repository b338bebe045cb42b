/**
 * A read by the key answered 404 by something other than HubSpot (a proxy's or gateway's page in
 * front of it): HubSpot's own "no such record" is its JSON with category OBJECT_NOT_FOUND, and
 * only that proves a record absent. Before: any 404 did. An operation whose create HubSpot wrote
 * (its answer lost) was "proven absent", sent again, refused for its key, its read back met the
 * page too, and it failed, replayed to every caller, while its deal exists (create mode); in
 * upsert mode the upsert was sent again over the record.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { openLedger, type LedgerOptions } from "@idem/core";
import { HubSpotSandbox } from "@idem/sandbox";
import { DIALECTS, ledgersFor } from "@idem/testkit";
import { hubspotActions, type HubSpotConfig } from "@idem/hubspot";

let sandbox: HubSpotSandbox;
let server: { basePath: string; accessToken: string };
beforeAll(async () => {
  sandbox = new HubSpotSandbox();
  server = await sandbox.start();
  await crm().ensureSchema(["deals"]);
});
afterAll(() => sandbox.close());

const crm = (extra: Partial<HubSpotConfig> = {}) =>
  hubspotActions({ accessToken: server.accessToken, basePath: server.basePath, ...extra });
let n = 0;
const tenant = () => `nf${++n}-${Math.random().toString(36).slice(2, 7)}`;
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
          kind: "not_found_page",
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
