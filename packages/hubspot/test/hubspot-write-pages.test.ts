/**
 * A write (the create or batch upsert) answered a 4xx page by something in front of HubSpot (a
 * proxy, load balancer, gateway or firewall: HTML, not HubSpot's JSON error). Its status is that
 * server's, not HubSpot's word on the write, and such a server may answer its own page in place of
 * HubSpot's answer. Before: every such page but a 404 was permanent (failed, "no effect"), a 400
 * or 409 page taken as HubSpot's refusal of the values, a 403 page alerted as the token's missing
 * scope; the operation failed while its contact existed. Now the page is believed only where its
 * status says the request was not taken in (408: not received whole; 413: refused for its size);
 * any other is ambiguous, and the read by the key settles it. (The 404 page:
 * hubspot-write-not-found-page.test.ts.)
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

const tenant = tenants("wpg");
const WRITE = {
  upsert: { method: "POST", path: "/crm/v3/objects/contacts/batch/upsert" },
  create: { method: "POST", path: "/crm/v3/objects/contacts" },
} as const;
const page = (status: number) =>
  new RegExp(
    `${status} \\(an answer without HubSpot's JSON error body\\).*not HubSpot's answer.*whether HubSpot took the write is not known`,
  );

for (const dialect of DIALECTS) {
  describe(`a write answered a 4xx page that is not HubSpot's, on ${dialect}`, () => {
    const db = ledgersFor(dialect, openLedger, { defaults: { poolSize: 2 } as LedgerOptions });

    async function setup(mode: "upsert" | "create", attempts: number, config: Partial<HubSpotConfig> = {}) {
      const tool = hubspotTools(actionsOn(server, { settleMs: 0, mode, ...config })).createContact;
      const ledger = await db.open({ budget: { attempts, baseDelayMs: 10 }, actions: [tool.action] });
      const t = tenant();
      const input = { email: `page-${t}@example.test`, firstname: "Ada" };
      const from = sandbox.requests.length;
      const run = () => ledger.run(tool.action, { tenant: t, key: tool.key(input), args: tool.args(input) });
      const mine = () => sandbox.crm.all("contacts").filter((r) => r.properties.email === input.email);
      const writes = () =>
        sandbox.requests
          .slice(from)
          .filter((r) => r.method === "POST" && r.path === WRITE[mode].path)
          .map((r) => r.status);
      const events = async (id: string) => (await ledger.get({ tenant: t, id })).events;
      const alerted = async (id: string) => (await ledger.daemon.alertsDue({ limit: 1_000 })).some((a) => a.id === id);
      return { ledger, t, run, mine, writes, events, alerted };
    }

    for (const mode of ["upsert", "create"] as const) {
      for (const status of [400, 403, 405, 409]) {
        it(`${mode}: a ${status} page after HubSpot wrote: not failed; the read by the key finds the contact, one`, async () => {
          const { run, mine, writes, events } = await setup(mode, 3);
          sandbox.faults.add({ kind: "page_after_commit", status, match: WRITE[mode] });
          const out = await run().finally(() => sandbox.faults.clear());
          expect(mine()).toHaveLength(1);
          expect(out).toMatchObject({ status: "succeeded", receipt: { id: mine()[0]!.id, new: false } });
          // Settled by the read, not by a second write.
          expect(writes()).toEqual([status]);
          const unknown = (await events(out.operationId)).find((e) => e.to === "unknown");
          expect(unknown?.reason).toMatch(page(status));
          // A page carries no word of HubSpot's on the token or its scopes, and is not quoted.
          expect(unknown?.reason).not.toMatch(/lacks the scope|<|Forbidden|Bad Request/);
        });
      }

      for (const status of [400, 403]) {
        it(`${mode}: a ${status} page before HubSpot had it: unknown, not failed; the read proves no contact; then made once`, async () => {
          const { ledger, t, run, mine, writes, events, alerted } = await setup(mode, 1);
          sandbox.faults.add({ kind: "page", status, match: WRITE[mode] });
          const out = await run().finally(() => sandbox.faults.clear());
          expect(out).toMatchObject({
            status: "pending_verification",
            state: "unknown",
            reason: expect.stringMatching(page(status)),
          });
          expect(mine()).toHaveLength(0);
          // Not "a person must fix the token's scopes": the read that settles it passed.
          expect(await alerted(out.operationId)).toBe(false);
          const settled = await ledger.daemon.settle({ tenant: t, id: out.operationId });
          expect(mine()).toHaveLength(1);
          expect(settled).toMatchObject({ status: "succeeded", receipt: { id: mine()[0]!.id, new: true } });
          expect(writes()).toEqual([status, mode === "upsert" ? 200 : 201]);
          expect((await events(out.operationId)).map((e) => e.to)).toEqual([
            "running",
            "unknown",
            "running",
            "pending",
            "running",
            "succeeded",
          ]);
        });
      }

      it(`${mode}: the lookup's reads answered a 403 page too: unknown, alerted, no scope claimed; then found, one`, async () => {
        const { ledger, t, run, mine, writes, alerted } = await setup(mode, 1);
        const reads = { method: "GET", path: "/crm/v3/objects/contacts/" };
        sandbox.faults.add({ kind: "page_after_commit", status: 403, match: WRITE[mode] });
        sandbox.faults.add({ kind: "page", status: 403, match: reads, times: 100 });
        const out = await run();
        expect(out).toMatchObject({ status: "pending_verification", state: "unknown" });
        const checked = await ledger.daemon
          .settle({ tenant: t, id: out.operationId })
          .finally(() => sandbox.faults.clear());
        expect(checked).toMatchObject({ status: "pending_verification", state: "unknown" });
        expect(mine()).toHaveLength(1);
        // The check that would settle it is refused, as every later one may be: a person hears of it.
        expect(await alerted(out.operationId)).toBe(true);
        const { operation } = await ledger.get({ tenant: t, id: out.operationId });
        expect(operation.reason).toMatch(/403 \(an answer without HubSpot's JSON error body\).*not HubSpot's answer/);
        expect(operation.reason).not.toMatch(/lacks the scope|<|Forbidden/);
        const settled = await ledger.daemon.settle({ tenant: t, id: out.operationId });
        expect(settled).toMatchObject({ status: "succeeded", receipt: { id: mine()[0]!.id, new: false } });
        expect(mine()).toHaveLength(1);
        expect(writes()).toEqual([403]);
      });

      it(`${mode}: a 408 page (the request not received whole): not sent, run again at once; made once`, async () => {
        const { run, mine, writes, events } = await setup(mode, 3);
        sandbox.faults.add({ kind: "page", status: 408, match: WRITE[mode] });
        const out = await run().finally(() => sandbox.faults.clear());
        expect(mine()).toHaveLength(1);
        expect(out).toMatchObject({ status: "succeeded", receipt: { id: mine()[0]!.id, new: true } });
        expect(writes()).toEqual([408, mode === "upsert" ? 200 : 201]);
        const pending = (await events(out.operationId)).find((e) => e.to === "pending");
        expect(pending?.reason).toMatch(/^transient: not sent: 408 .*did not receive the whole request/);
      });

      it(`${mode}: a 413 page (the request refused for its size): failed, nothing made, a person alerted`, async () => {
        const { run, mine, writes, alerted } = await setup(mode, 3);
        sandbox.faults.add({ kind: "page", status: 413, match: WRITE[mode], times: 3 });
        const out = await run().finally(() => sandbox.faults.clear());
        expect(out).toMatchObject({ status: "failed" });
        expect(mine()).toHaveLength(0);
        expect(writes()).toEqual([413]);
        expect(await alerted(out.operationId)).toBe(true);
      });
    }
  });
}
