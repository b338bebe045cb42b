/**
 * A create's answer arrives late: its lease ran out meanwhile, and the daemon's lookup (a read by
 * the key's unique property) recorded the record it found. The lookup's receipt (`new: false`) and
 * the late answer's (`new: true`) are built by different code (hubspot-reconcile.ts,
 * hubspot-actions.ts); the action's `effectId` must call them one effect when they name one record
 * (no "two effects" alert), and two when the lookup found another record with our key (one deleted
 * since, which frees the key for ours: alerted, never a silent duplicate). A deleted one whose
 * values are not the args' the lookup does not take: a person is asked, and our late answer settles it. Through the real
 * @hubspot/api-client to the HubSpot sandbox, in both modes, counted at the target: the sandbox's
 * records with our key, deleted ones too.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { openTestLedger, type TestLedgerOptions } from "@idem/core/testing";
import type { HubSpotSandbox } from "@idem/sandbox";
import { DIALECTS, gatedProxy, ledgersFor, scaled } from "@idem/testkit";
import { HUBSPOT_CALL_OPTIONS, createHubSpotClient, type HubSpotConfig } from "@idem/hubspot";
import { actionsOn, type SandboxServer, startSandbox } from "./support/sandbox.js";

let sandbox: HubSpotSandbox;
let server: SandboxServer;
beforeAll(async () => {
  ({ sandbox, server } = await startSandbox(["deals"]));
});
afterAll(() => sandbox.close());

// The client waits longer than any hold: the answer is late, not lost.
const crm = (extra: Partial<HubSpotConfig> = {}) => actionsOn(server, { timeoutMs: scaled(60_000), ...extra });
const dealsWith = (key: string) => sandbox.crm.all("deals").filter((r) => r.properties.idem_external_id === key);

for (const dialect of DIALECTS) {
  describe(`a late answer after a lookup, HubSpot on ${dialect}`, () => {
    const db = ledgersFor(dialect, openTestLedger, { defaults: { poolSize: 2 } as TestLedgerOptions, prepare: true });

    /**
     * Holds the create's answer (`hold: "answer"`: the record is made now) or the create itself
     * (`"request"`: made on release); meanwhile, past its lease, the daemon settles the operation
     * by lookup; then lets the create go on. `meanwhile` runs before the lookup, with our key.
     */
    async function lateCreate(
      mode: "upsert" | "create",
      hold: "answer" | "request",
      meanwhile?: (key: string) => Promise<void>,
    ) {
      const proxy = await gatedProxy(server.basePath, { method: "POST", path: "/crm/v3/objects/deals", hold });
      try {
        const action = crm({ basePath: proxy.url, mode }).create("deals");
        let skew = 0;
        const l = await db.open({ clock: () => Date.now() + skew, actions: [action] });
        const tenant = `late-${Math.random().toString(36).slice(2, 8)}`;
        const run = l.run(action, { tenant, key: ["deal", "late"], args: { properties: { dealname: "Late" } } });
        await proxy.held;
        const [op] = await l.admin.list({ tenant });
        await meanwhile?.(op!.key);
        skew += 31_000; // its lease (30 s) ran out while the answer was out
        const found = await l.daemon.settle({ tenant, id: op!.id, actor: "daemon" });
        proxy.release();
        const caller = await run;
        const { operation, events } = await l.get({ tenant, id: op!.id });
        const alerted = (await l.daemon.alertsDue({ limit: 1_000 })).some((a) => a.id === op!.id);
        const twoEffects = [operation.reason, ...events.map((e) => e.reason)].some((r) => /two effects/.test(r ?? ""));
        return { key: op!.key, found, caller, operation, alerted, twoEffects };
      } finally {
        await proxy.close();
      }
    }

    for (const mode of ["upsert", "create"] as const) {
      it(`${mode}: the lookup's receipt and the late answer name one record: one effect, succeeded, not alerted`, async () => {
        const out = await lateCreate(mode, "answer");
        const deals = dealsWith(out.key);
        expect(deals).toHaveLength(1);
        const id = deals[0]!.id;
        expect(out.found).toMatchObject({ status: "succeeded", receipt: { id, new: false } });
        expect(out.caller).toMatchObject({ status: "succeeded", receipt: { id, new: true } });
        expect({
          status: out.operation.status,
          id: (out.operation.result as { id: string }).id,
          alerted: out.alerted,
          twoEffects: out.twoEffects,
        }).toEqual({ status: "succeeded", id, alerted: false, twoEffects: false });
      });

      /** Made out of band with our key and `dealname`, and deleted since (the recycling bin): the lookup finds it. */
      const binnedWith = (dealname: string) => async (key: string) => {
        const api = createHubSpotClient(server);
        const other = await api.objects.basicApi.create(
          "deals",
          { properties: { dealname, idem_external_id: key }, associations: [] },
          HUBSPOT_CALL_OPTIONS,
        );
        await api.objects.basicApi.archive("deals", other.id, HUBSPOT_CALL_OPTIONS);
      };

      it(`${mode}: the lookup found a deleted record with our key and our values, and ours commits late: two effects, alerted`, async () => {
        // Its values are the args': the lookup cannot tell it from ours, and takes it.
        const out = await lateCreate(mode, "request", binnedWith("Late"));
        const deals = dealsWith(out.key);
        expect(deals.map((d) => d.archived)).toEqual([true, false]);
        const [first, second] = deals.map((d) => d.id);
        expect(out.found).toMatchObject({ status: "succeeded", receipt: { id: first } });
        // The caller is told its own request took effect; the row keeps the receipt it replays.
        expect(out.caller).toMatchObject({ status: "succeeded", receipt: { id: second, new: true } });
        expect({
          status: out.operation.status,
          id: (out.operation.result as { id: string }).id,
          alerted: out.alerted,
          twoEffects: out.twoEffects,
        }).toEqual({ status: "succeeded", id: first, alerted: true, twoEffects: true });
      });

      it(`${mode}: the lookup found a deleted record with our key and other values: a person is asked, and ours, committed late, settles it`, async () => {
        const out = await lateCreate(mode, "request", binnedWith("Out of band"));
        const deals = dealsWith(out.key);
        expect(deals.map((d) => d.archived)).toEqual([true, false]);
        const [first, second] = deals.map((d) => d.id);
        expect(out.found).toMatchObject({
          status: "pending_verification",
          state: "needs_review",
          reason: expect.stringContaining(`deal ${first} in the recycling bin carries the key`),
        });
        expect(out.caller).toMatchObject({ status: "succeeded", receipt: { id: second, new: true } });
        expect({
          status: out.operation.status,
          id: (out.operation.result as { id: string }).id,
          twoEffects: out.twoEffects,
        }).toEqual({ status: "succeeded", id: second, twoEffects: false });
      });
    }
  });
}
