/**
 * A live record with our key that HubSpot created long before the operation began (an earlier
 * operation with the key made it, pruned from the ledger since), found by the lookup after this
 * operation's write went unanswered. In create mode, every create with the key is refused while
 * that record lives, so the operation wrote nothing to it: the receipt says so (`existedBefore`),
 * as it does when the refusal's answer comes. Before: "most likely this operation's own", and the
 * model read "done", as if this call had written its names, when the record was as a person left it.
 * In upsert mode the lost upsert may have written over the record: nothing more is claimed.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { setTimeout as sleep } from "node:timers/promises";
import { openLedger, type LedgerOptions } from "@idem/core";
import type { HubSpotSandbox } from "@idem/sandbox";
import { DIALECTS, ledgersFor } from "@idem/testkit";
import { hubspotTools, type HubSpotConfig, type HubSpotReceipt } from "@idem/hubspot";
import { actionsOn, type SandboxServer, startSandbox, tenants } from "./support/sandbox.js";

let sandbox: HubSpotSandbox;
let server: SandboxServer;
beforeAll(async () => {
  ({ sandbox, server } = await startSandbox(["contacts"]));
});
afterAll(() => sandbox.close());

const crm = (extra: Partial<HubSpotConfig> = {}) => actionsOn(server, extra);
const tenant = tenants("fb");

for (const dialect of DIALECTS) {
  describe(`a live record with our key made long before the operation, found after a lost answer, on ${dialect}`, () => {
    const db = ledgersFor(dialect, openLedger, { defaults: { poolSize: 2 } as LedgerOptions });
    const ledger = (o: LedgerOptions = {}) => db.open({ ...o });

    /**
     * An earlier operation with the key made the contact 40 days ago, a person renamed it, and the
     * operation was pruned; the key comes again, and its writes and reads are answered 502 by a
     * gateway (HubSpot wrote nothing): unknown. A daemon whose actions are in `daemonMode` settles it.
     */
    async function comesAgain(mode: "upsert" | "create", daemonMode = mode) {
      const l = await ledger({ retentionMs: 1, budget: { attempts: 1 } });
      const t = tenant();
      const tool = hubspotTools(crm({ mode })).createContact;
      const input = { email: `before-${t}@example.test`, firstname: "Ada" };
      const first = await l.run(tool.action, { tenant: t, key: tool.key(input), args: tool.args(input) });
      const id = first.status === "succeeded" ? first.receipt!.id : "";
      const record = sandbox.crm.get("contacts", id)!;
      record.createdAt = new Date(Date.now() - 40 * 86_400_000).toISOString();
      record.properties.firstname = "Adaline";
      await sleep(20); // the retention of 1 ms passes (not a synchronisation)
      expect(await l.admin.prune({ tenant: t })).toBe(1);
      sandbox.faults.add({ kind: "bad_gateway", match: { method: "POST", path: "/crm/v3/objects/contacts" } });
      sandbox.faults.add({
        kind: "bad_gateway",
        match: { method: "GET", path: "/crm/v3/objects/contacts/" },
        times: 100,
      });
      const again = await l
        .run(tool.action, { tenant: t, key: tool.key(input), args: tool.args(input) })
        .finally(() => sandbox.faults.clear());
      expect(again).toMatchObject({ status: "pending_verification", state: "unknown" });
      const daemon = await ledger({ actions: [crm({ mode: daemonMode }).create("contacts")] });
      const settled = await daemon.daemon.settle({ tenant: t, id: again.operationId });
      expect(settled).toMatchObject({ status: "succeeded", receipt: { id, new: false } });
      expect(sandbox.crm.get("contacts", id)!.properties.firstname).toBe("Adaline"); // nothing written
      expect(sandbox.crm.all("contacts").filter((r) => r.properties.email === input.email)).toHaveLength(1);
      return { receipt: settled.status === "succeeded" ? (settled.receipt as HubSpotReceipt) : undefined, id, tool };
    }

    it("create: the receipt says the contact was there before and this operation wrote nothing to it", async () => {
      const { receipt, id, tool } = await comesAgain("create");
      expect(receipt).toMatchObject({ existedBefore: true });
      // What the model is told: already there, the names given not written.
      expect(tool.summarize(receipt!)).toMatchObject({ id, new: false, note: expect.stringMatching(/not written/) });
    });

    it("upsert: the lost upsert may have written over the record: found, nothing more claimed", async () => {
      const { receipt } = await comesAgain("upsert");
      expect(receipt).not.toHaveProperty("existedBefore");
    });

    it("upsert, settled by a daemon configured in create mode: what the operation sent decides, not today's config", async () => {
      const { receipt } = await comesAgain("upsert", "create");
      expect(receipt).not.toHaveProperty("existedBefore");
    });
  });
}
