/**
 * How many property definitions the adapter reads (GET /crm/v3/properties/{type}/{name}), counted
 * at the sandbox. The key property's is read once per process (its unique-value verdict is kept).
 * The definitions of the args' properties, which say how a deleted record's values compare (a
 * number as a number), were read again by every lookup that met such a record: one request per
 * property per operation, into the same rate limit as the reads that settle it. Kept per process
 * now, except that a property HubSpot no longer has drops its kept definition (one made again
 * since under the name may be of another type).
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { openLedger, operationKey, type Action, type Ledger, type LedgerOptions } from "@idem/core";
import type { HubSpotSandbox } from "@idem/sandbox";
import { DIALECTS, ledgersFor } from "@idem/testkit";
import type { HubSpotCreateArgs, HubSpotReceipt } from "@idem/hubspot";
import { actionsOn, property, type SandboxServer, startSandbox, tenants } from "./support/sandbox.js";

let sandbox: HubSpotSandbox;
let server: SandboxServer;
beforeAll(async () => {
  ({ sandbox, server } = await startSandbox(["deals"]));
});
afterAll(() => sandbox.close());

const tenant = tenants("dr");
const UPSERT = { method: "POST", path: "/crm/v3/objects/deals/batch/upsert" } as const;
/** The definition reads since `from`, by property name. */
const definitionReads = (from: number) => {
  const reads: Record<string, number> = {};
  for (const r of sandbox.requests.slice(from)) {
    const name = /^\/crm\/v3\/properties\/deals\/([^/]+)$/.exec(r.path)?.[1];
    if (r.method === "GET" && name) reads[name] = (reads[name] ?? 0) + 1;
  }
  return reads;
};

for (const dialect of DIALECTS) {
  describe(`property definitions read per process, on ${dialect}`, () => {
    const db = ledgersFor(dialect, openLedger, { defaults: { poolSize: 2 } as LedgerOptions });

    /**
     * One operation whose upsert a gateway refused (502, nothing written) and whose record, made
     * by it earlier and deleted since, is in the recycling bin with `held`: the lookup compares
     * the args' values with it by the properties' types. How it settled.
     */
    async function deletedRecordOf(
      ledger: Ledger,
      action: Action<HubSpotCreateArgs, HubSpotReceipt>,
      held: Record<string, string>,
      given: Record<string, string>,
    ) {
      const t = tenant();
      const key = operationKey({ tenant: t, action: "hubspot.deals.create", parts: ["deleted"] }).hash;
      const old = sandbox.crm.create("deals", { ...held, idem_external_id: key });
      sandbox.crm.archive("deals", old.id);
      sandbox.faults.add({ kind: "bad_gateway", match: UPSERT });
      const out = await ledger
        .run(action, { tenant: t, key: ["deleted"], args: { properties: given } })
        .finally(() => sandbox.faults.clear());
      return { out, id: old.id, t };
    }

    it("three lookups meeting a deleted record: each definition read once, and the values compared by it", async () => {
      const action = actionsOn(server, { settleMs: 0 }).create("deals");
      const ledger = await db.open({ budget: { attempts: 3, baseDelayMs: 10 }, actions: [action] });
      const from = sandbox.requests.length;
      for (let i = 0; i < 3; i++) {
        // HubSpot keeps a number in its own form: "1200" read back for "1200.00" is the same value.
        const { out, id } = await deletedRecordOf(
          ledger,
          action,
          { dealname: `Q${i}`, amount: "1200" },
          { dealname: `Q${i}`, amount: "1200.00" },
        );
        expect(out).toMatchObject({ status: "succeeded", receipt: { id, archived: true } });
      }
      expect(definitionReads(from)).toEqual({ idem_external_id: 1, dealname: 1, amount: 1 });
    });

    it("a property HubSpot no longer has drops its kept definition: made again as text, its values compare as text", async () => {
      const action = actionsOn(server, { settleMs: 0 }).create("deals");
      const ledger = await db.open({ budget: { attempts: 3, baseDelayMs: 10 }, actions: [action] });
      const score = `score_${dialect}`;
      property(sandbox, "deals", score, { type: "number", fieldType: "number" });
      const from = sandbox.requests.length;
      const first = await deletedRecordOf(ledger, action, { [score]: "7" }, { [score]: "7.0" });
      expect(first.out).toMatchObject({ status: "succeeded", receipt: { id: first.id, archived: true } });
      // Deleted: a lookup's read of a record does not return it, HubSpot's word that it has none.
      sandbox.crm.deleteProperty("deals", score);
      const between = await deletedRecordOf(ledger, action, { dealname: "Between" }, { [score]: "7.0" });
      expect(between.out).toMatchObject({ status: "succeeded", receipt: { id: between.id, archived: true } });
      // Made again as text: "7" is not "7.0" now, so the deleted record is not taken as ours.
      property(sandbox, "deals", score);
      const last = await deletedRecordOf(ledger, action, { [score]: "7" }, { [score]: "7.0" });
      expect(last.out).toMatchObject({ status: "pending_verification", state: "needs_review" });
      const { operation } = await ledger.get({ tenant: last.t, id: last.out.operationId });
      expect(operation.reason).toMatch(new RegExp(`its values of ${score} differ`));
      expect(definitionReads(from)[score]).toBe(2);
    });

    /**
     * The key property's verdict (unique-value, kept for the process) was dropped on any 400 to a
     * read by the key, a proxy's 400 page too, which says nothing of the property: the next check
     * read the definition again. Behind a firewall that lets the objects API through but refuses
     * the properties API (its verdict kept from before), that read is refused: the lookup could not
     * settle an operation whose deal is there, and every create after it was refused its check.
     */
    for (const [read, fault, checkedAgain] of [
      // Read back in the call, whose next try looks the deal up.
      ["the read back of a create refused for the key (409)", "conflict_after_commit", false],
      // The call's one lookup meets the page, and ends unknown: the daemon's check settles it.
      ["the lookup's read of a create whose answer was lost", "drop_after_commit", true],
    ] as const)
      it(`a 400 page to ${read} keeps the verdict: settled by the read, no definition read again`, async () => {
        const action = actionsOn(server, { mode: "create", settleMs: 0 }).create("deals");
        const ledger = await db.open({ budget: { attempts: 3, baseDelayMs: 10 }, actions: [action] });
        const t = tenant();
        const run = (k: string) => ledger.run(action, { tenant: t, key: [k], args: { properties: { dealname: k } } });
        expect(await run("checked")).toMatchObject({ status: "succeeded", receipt: { new: true } });
        const from = sandbox.requests.length;
        sandbox.faults.add({
          kind: "page",
          status: 403,
          match: { method: "GET", path: "/crm/v3/properties/" },
          times: 100,
        });
        sandbox.faults.add({ kind: fault, match: { method: "POST", path: "/crm/v3/objects/deals" } });
        sandbox.faults.add({ kind: "page", status: 400, match: { method: "GET", path: "/crm/v3/objects/deals/" } });
        try {
          const ran = await run("paged");
          const out = checkedAgain ? await ledger.daemon.settle({ tenant: t, id: ran.operationId }) : ran;
          const key = (await ledger.get({ tenant: t, id: out.operationId })).operation.key;
          const deals = sandbox.crm.all("deals").filter((r) => r.properties.idem_external_id === key);
          expect(deals).toHaveLength(1);
          expect(out).toMatchObject({ status: "succeeded", receipt: { id: deals[0]!.id, new: false } });
          expect(await run("after")).toMatchObject({ status: "succeeded", receipt: { new: true } });
          expect(definitionReads(from)).toEqual({});
        } finally {
          sandbox.faults.clear();
        }
      });

    it("HubSpot's own 400 to the read back (the key property made plain since) drops the verdict: to a person, as the definition read again says", async () => {
      const name = `kb_${dialect}`;
      property(sandbox, "deals", name, { hasUniqueValue: true });
      const action = actionsOn(server, { mode: "create", settleMs: 0, uniqueProperty: name }).create("deals");
      // Two tries: the create and its read back, then one lookup, which must not trust the verdict.
      const ledger = await db.open({ budget: { attempts: 2, baseDelayMs: 10 }, actions: [action] });
      const t = tenant();
      const run = (k: string) => ledger.run(action, { tenant: t, key: [k], args: { properties: { dealname: k } } });
      expect(await run("checked")).toMatchObject({ status: "succeeded", receipt: { new: true } });
      sandbox.crm.getProperty("deals", name)!.hasUniqueValue = false;
      sandbox.faults.add({ kind: "conflict_after_commit", match: { method: "POST", path: "/crm/v3/objects/deals" } });
      const out = await run("made-plain").finally(() => sandbox.faults.clear());
      expect(out).toMatchObject({ status: "pending_verification", state: "needs_review" });
      const { operation } = await ledger.get({ tenant: t, id: out.operationId });
      expect(operation.reason).toMatch(new RegExp(`deals\\.${name} exists but is not a unique-value property`));
    });
  });
}
