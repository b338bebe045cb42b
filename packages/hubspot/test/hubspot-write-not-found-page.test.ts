/**
 * A write (the create or batch upsert that makes the record) answered 404 by something other than
 * HubSpot: a proxy's or gateway's page, not HubSpot's JSON error. It does not say whether HubSpot
 * got the request: a gateway answers its own page for a route it did not forward, or for an answer
 * it did not take. Before: permanent, so the operation failed ("no effect"), replayed to every
 * caller, while HubSpot may hold its contact (a caller told "failed" makes it again under another
 * key). Now ambiguous: unknown, and the read by the key settles it, either way.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { openLedger, type LedgerOptions } from "@idem/core";
import type { HubSpotSandbox } from "@idem/sandbox";
import { DIALECTS, ledgersFor } from "@idem/testkit";
import { hubspotTools, type HubSpotConfig } from "@idem/hubspot";
import { actionsOn, type SandboxServer, startSandbox, tenants } from "./support/sandbox.js";

let sandbox: HubSpotSandbox;
let server: SandboxServer;
beforeAll(async () => {
  ({ sandbox, server } = await startSandbox(["contacts"]));
});
afterAll(() => sandbox.close());

const tenant = tenants("wnf");
const WRITE = {
  upsert: { method: "POST", path: "/crm/v3/objects/contacts/batch/upsert" },
  create: { method: "POST", path: "/crm/v3/objects/contacts" },
} as const;
const PAGE =
  /404 \(an answer without HubSpot's JSON error body\).*not HubSpot's answer.*whether HubSpot took the write/;

for (const dialect of DIALECTS) {
  describe(`a write answered a 404 page that is not HubSpot's, on ${dialect}`, () => {
    const db = ledgersFor(dialect, openLedger, { defaults: { poolSize: 2 } as LedgerOptions });

    async function setup(config: Partial<HubSpotConfig>, attempts: number) {
      const tool = hubspotTools(actionsOn(server, { settleMs: 0, ...config })).createContact;
      const ledger = await db.open({ budget: { attempts, baseDelayMs: 10 }, actions: [tool.action] });
      const t = tenant();
      const input = { email: `page-${t}@example.test`, firstname: "Ada" };
      const run = () => ledger.run(tool.action, { tenant: t, key: tool.key(input), args: tool.args(input) });
      const mine = () => sandbox.crm.all("contacts").filter((r) => r.properties.email === input.email);
      const writes = (from: number) =>
        sandbox.requests
          .slice(from)
          .filter((r) => r.method === "POST" && r.path === WRITE[config.mode ?? "upsert"].path);
      return { ledger, t, run, mine, writes };
    }

    for (const mode of ["upsert", "create"] as const) {
      it(`${mode}: the page came after HubSpot wrote: not failed; the read by the key finds the contact, one`, async () => {
        const { ledger, t, run, mine, writes } = await setup({ mode }, 3);
        const from = sandbox.requests.length;
        sandbox.faults.add({ kind: "page_after_commit", match: WRITE[mode] });
        const out = await run().finally(() => sandbox.faults.clear());
        expect(mine()).toHaveLength(1);
        expect(out).toMatchObject({ status: "succeeded", receipt: { id: mine()[0]!.id, new: false } });
        // Settled by the read, not by a second write.
        expect(writes(from).map((r) => r.status)).toEqual([404]);
        const { events } = await ledger.get({ tenant: t, id: out.operationId });
        const unknown = events.find((e) => e.to === "unknown");
        expect(unknown?.reason).toMatch(PAGE);
        expect(unknown?.reason).not.toMatch(/<|Not Found/);
      });

      it(`${mode}: the page came before HubSpot had it: not failed; the read proves no contact, pending; then made once`, async () => {
        const { ledger, t, run, mine, writes } = await setup({ mode }, 1);
        const from = sandbox.requests.length;
        sandbox.faults.add({ kind: "page", match: WRITE[mode] });
        const out = await run().finally(() => sandbox.faults.clear());
        expect(out).toMatchObject({
          status: "pending_verification",
          state: "unknown",
          reason: expect.stringMatching(PAGE),
        });
        expect(mine()).toHaveLength(0);
        // The daemon's read proves no contact (HubSpot's own 404s), so the write runs again, once.
        const settled = await ledger.daemon.settle({ tenant: t, id: out.operationId });
        expect(mine()).toHaveLength(1);
        expect(settled).toMatchObject({ status: "succeeded", receipt: { id: mine()[0]!.id, new: true } });
        expect(writes(from).map((r) => r.status)).toEqual([404, mode === "upsert" ? 200 : 201]);
        const { events } = await ledger.get({ tenant: t, id: out.operationId });
        expect(events.map((e) => e.to)).toEqual(["running", "unknown", "running", "pending", "running", "succeeded"]);
        expect(events[3]?.reason).toMatch(/no contacts with idem_external_id = the key, live or archived/);
      });
    }
  });
}

/**
 * The reads by the key that follow a write (the read back of a refusal, the daemon's lookup)
 * answered that page: no read of it says "no such contact". Read as absent, the refusal of our
 * own record (an earlier request of this operation wrote it) was taken as the caller's data, and
 * the operation failed while its contact exists.
 */
for (const dialect of DIALECTS) {
  describe(`a write refused for the key, its read back answered a 404 page, on ${dialect}`, () => {
    const db = ledgersFor(dialect, openLedger, { defaults: { poolSize: 2 } as LedgerOptions });

    for (const mode of ["upsert", "create"] as const)
      it(`${mode}: unknown, not failed nor proven absent; then found, one contact`, async () => {
        const tool = hubspotTools(actionsOn(server, { mode, settleMs: 0 })).createContact;
        const ledger = await db.open({ budget: { attempts: 3, baseDelayMs: 10 }, actions: [tool.action] });
        const t = tenant();
        const input = { email: `back-${t}@example.test`, firstname: "Ada" };
        const mine = () => sandbox.crm.all("contacts").filter((r) => r.properties.email === input.email);
        const from = sandbox.requests.length;
        // Written, then refused for the key (as a racing request of the same operation is), and
        // every read by the key (before the upsert, the read back, the lookup) meets the page.
        sandbox.faults.add({ kind: "conflict_after_commit", match: WRITE[mode] });
        sandbox.faults.add({
          kind: "page",
          match: { method: "GET", path: "/crm/v3/objects/contacts/" },
          times: 100,
        });
        const out = await ledger
          .run(tool.action, { tenant: t, key: tool.key(input), args: tool.args(input) })
          .finally(() => sandbox.faults.clear());
        expect(out).toMatchObject({ status: "pending_verification", state: "unknown" });
        expect(mine()).toHaveLength(1);
        const { events } = await ledger.get({ tenant: t, id: out.operationId });
        expect(events.find((e) => e.to === "unknown")?.reason).toMatch(
          /read back by idem_external_id failed \(404 \(an answer without HubSpot's JSON error body\)/,
        );
        const reads = sandbox.requests
          .slice(from)
          .filter((r) => r.method === "GET" && r.path.startsWith("/crm/v3/objects/contacts/"));
        expect(reads.length).toBeGreaterThan(0);
        expect(reads.every((r) => r.status === 404)).toBe(true);
        const settled = await ledger.daemon.settle({ tenant: t, id: out.operationId });
        expect(settled).toMatchObject({ status: "succeeded", receipt: { id: mine()[0]!.id, new: false } });
        expect(mine()).toHaveLength(1);
        const writes = sandbox.requests.slice(from).filter((r) => r.method === "POST" && r.path === WRITE[mode].path);
        expect(writes).toHaveLength(1);
      });
  });
}
