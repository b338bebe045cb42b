/**
 * A write of this operation that HubSpot applies after the answer the adapter read (helper-113's
 * findings), and what the model is then told:
 * - the client gave up on the write (its timeout) and HubSpot applied it while the lookup read:
 *   found absent at once, the operation ran again as "known not done", and its own record read as
 *   one there before it began: "the names given were not written". Absence now counts only after
 *   the settle window (`settleMs`);
 * - with `clientRetries`, the client sent the write again after a 502 that came after HubSpot
 *   wrote, and the last answer (a 429, a 403) was read as the write's: "known not done" again
 *   (pending), or "failed" replayed to every caller though the record exists. Ambiguous now.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { LedgerOptions } from "@idem/core";
import { openTestLedger, type TestLedgerOptions } from "@idem/core/testing";
import type { HubSpotSandbox } from "@idem/sandbox";
import { DIALECTS, ledgersFor, scaled } from "@idem/testkit";
import { HUBSPOT_SETTLE_MS, hubspotTools, type HubSpotConfig, type HubSpotReceipt } from "@idem/hubspot";
import { holdingProxy } from "./support/holding-proxy.js";
import { actionsOn, type SandboxServer, startSandbox, tenants } from "./support/sandbox.js";

let sandbox: HubSpotSandbox;
let server: SandboxServer;
beforeAll(async () => {
  ({ sandbox, server } = await startSandbox(["contacts"]));
});
afterAll(() => sandbox.close());

const tenant = tenants("lw");
const WRITE = {
  upsert: { method: "POST", path: "/crm/v3/objects/contacts/batch/upsert" },
  create: { method: "POST", path: "/crm/v3/objects/contacts" },
} as const;

for (const dialect of DIALECTS) {
  describe(`a write HubSpot applied after the answer the adapter read, on ${dialect}`, () => {
    const db = ledgersFor(dialect, openTestLedger, { defaults: { poolSize: 2 } as LedgerOptions });

    /** The contact tool over `basePath`, and a ledger on a test clock that knows its action. */
    async function setup(basePath: string, config: Partial<HubSpotConfig>) {
      const clock = { now: Date.now() };
      const tool = hubspotTools(actionsOn(server, { basePath, ...config })).createContact;
      const options: TestLedgerOptions = {
        clock: () => clock.now,
        actions: [tool.action],
        // The test clock stands still, so a check the call would wait for never comes due: the
        // call ends at its time budget (pending_verification) and the test settles it.
        budget: { attempts: 4, baseDelayMs: 10, elapsedMs: scaled(3_000) },
      };
      const ledger = await db.open(options);
      const t = tenant();
      const input = { email: `late-${t}@example.test`, firstname: "Ada" };
      const mine = () => sandbox.crm.all("contacts").filter((r) => r.properties.email === input.email);
      return { clock, tool, ledger, t, input, mine };
    }

    for (const mode of ["upsert", "create"] as const) {
      it(`${mode}: applied while the lookup read, after the client gave up: not proven absent within the settle window, then found as this operation's (no 'names not written')`, async () => {
        const proxy = await holdingProxy(server.basePath, {
          ...WRITE[mode],
          // Applied at HubSpot as the lookup's second read (the recycling bin's) is answered.
          releaseAfter: (req) => req.method === "GET" && (req.url ?? "").includes("archived=true"),
        });
        try {
          const { clock, tool, ledger, t, input, mine } = await setup(proxy.basePath, {
            mode,
            timeoutMs: scaled(1_500),
          });
          const first = await ledger.run(tool.action, { tenant: t, key: tool.key(input), args: tool.args(input) });
          expect(first).toMatchObject({ status: "pending_verification", state: "unknown" });
          const id = first.operationId;
          // Before: proven absent, run again, and "there before the operation, nothing written".
          const early = await ledger.daemon.settle({ tenant: t, id, actor: "daemon" });
          await proxy.drained();
          expect(early).toMatchObject({
            status: "pending_verification",
            state: "unknown",
            reason: expect.stringMatching(/settle window/),
          });
          expect(mine()).toHaveLength(1);
          clock.now += HUBSPOT_SETTLE_MS + 1_000;
          const out = await ledger.daemon.settle({ tenant: t, id, actor: "daemon" });
          expect(out).toMatchObject({ status: "succeeded", receipt: { new: false } });
          if (out.status !== "succeeded") throw new Error(`not settled: ${JSON.stringify(out)}`);
          const receipt = out.receipt as HubSpotReceipt;
          expect(receipt.existedBefore).toBeUndefined();
          expect(tool.summarize(receipt)).not.toHaveProperty("note");
          expect(mine()).toHaveLength(1);
          expect(mine()[0]!.properties.firstname).toBe("Ada"); // this operation's first request wrote it
          const { events } = await ledger.get({ tenant: t, id });
          expect(events.map((e) => e.to)).not.toContain("pending");
        } finally {
          await proxy.close();
        }
      });

      for (const last of [
        { kind: "rate_limit", said: "429", was: "pending: known not done" },
        { kind: "missing_scopes", said: "403", was: "failed, replayed to every caller" },
      ] as const)
        it(`${mode}, clientRetries 2: a 502 after HubSpot wrote, the client's retry answered ${last.said}: unknown (before: ${last.was}), then found`, async () => {
          const { clock, tool, ledger, t, input, mine } = await setup(server.basePath, { mode, clientRetries: 2 });
          // The first request is written and answered 502; the client's retry meets the refusal.
          sandbox.faults.add({ kind: "bad_gateway_after_commit", match: WRITE[mode] });
          sandbox.faults.add({ kind: last.kind, match: WRITE[mode], skip: 1 });
          try {
            const first = await ledger.run(tool.action, { tenant: t, key: tool.key(input), args: tool.args(input) });
            expect(mine()).toHaveLength(1);
            expect(first).toMatchObject({ status: "pending_verification", state: "unknown" });
            const { events } = await ledger.get({ tenant: t, id: first.operationId });
            expect(events[1]).toMatchObject({
              to: "unknown",
              reason: expect.stringMatching(
                new RegExp(
                  `^ambiguous: ${last.said} .*but the client had sent this write before \\(HubSpot answered 502\\)`,
                ),
              ),
            });
          } finally {
            sandbox.faults.clear();
          }
          const [op] = await ledger.admin.list({ tenant: t });
          clock.now += HUBSPOT_SETTLE_MS + 1_000;
          const out = await ledger.daemon.settle({ tenant: t, id: op!.id, actor: "daemon" });
          expect(out).toMatchObject({ status: "succeeded", receipt: { new: false } });
          if (out.status !== "succeeded") throw new Error(`not settled: ${JSON.stringify(out)}`);
          expect((out.receipt as HubSpotReceipt).existedBefore).toBeUndefined();
          expect(mine()).toHaveLength(1);
        });
    }
  });
}
