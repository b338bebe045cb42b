/**
 * An answer that keeps coming and never ends: HubSpot (or a proxy in front of it) commits the
 * write, sends the answer's head and then one byte of its body every 200 ms, never the last.
 * Each byte resets the socket's inactivity timeout (`timeoutMs`), so the write never ends: the
 * operation stays `running` under a lease its heartbeat keeps renewing, and `run` never returns,
 * though the record exists and a read by the key would say so. Now each request has a deadline
 * (`deadlineMs`) from its start: past it the request is cut, ambiguous as a timeout is, and the
 * read by the key finds the record. Through the real @hubspot/api-client to the HubSpot sandbox
 * (its `trickle_after_commit` fault), on SQLite and Postgres.
 */
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import { setTimeout as sleep } from "node:timers/promises";
import type { LedgerOptions } from "@idem/core";
import { openTestLedger, type TestLedgerOptions } from "@idem/core/testing";
import type { HubSpotSandbox } from "@idem/sandbox";
import { DIALECTS, ledgersFor, scaled } from "@idem/testkit";
import { actionsOn, type SandboxServer, startSandbox, tenants } from "./support/sandbox.js";

let sandbox: HubSpotSandbox;
let server: SandboxServer;
beforeAll(async () => {
  ({ sandbox, server } = await startSandbox(["companies"]));
});
// A test that failed must not leave a trickle armed, nor its call waiting on one.
afterEach(() => {
  sandbox.faults.clear();
  sandbox.trickling.cut();
});
afterAll(() => sandbox?.close());

for (const dialect of DIALECTS) {
  describe(`HubSpot answering a write that never ends, on ${dialect}`, () => {
    const db = ledgersFor(dialect, openTestLedger, { defaults: { poolSize: 2 } as TestLedgerOptions });
    const tenant = tenants("trickle");

    for (const mode of ["upsert", "create"] as const) {
      it(
        `${mode}: a body trickled for ever after HubSpot wrote: the call ends (unknown, then found), not running for ever`,
        async () => {
          const action = actionsOn(server, {
            mode,
            timeoutMs: 1_000,
            deadlineMs: 2_000,
            settleMs: 0,
          }).create("companies");
          const ledger = await db.open({ budget: { attempts: 2, baseDelayMs: 10 } } as LedgerOptions);
          const t = tenant();
          // Every POST's answer: the write's, and any other the call makes.
          sandbox.faults.add({
            kind: "trickle_after_commit",
            match: { method: "POST" },
            times: Number.POSITIVE_INFINITY,
          });
          const started = Date.now();
          const run = ledger.run(action, {
            tenant: t,
            key: ["trickle"],
            args: { properties: { name: "Trickle Ltd" } },
          });
          const bound = scaled(15_000);
          const out = await Promise.race([run, sleep(bound).then(() => "still running" as const)]);
          const [row] = await ledger.admin.list({ tenant: t });
          sandbox.trickling.cut(); // lets a call that never ended go
          await run;
          const records = sandbox.crm.all("companies").filter((r) => r.properties.idem_external_id === row?.key);
          expect(records).toHaveLength(1); // HubSpot wrote it at once
          // Before: "still running" after 15 s (and for ever), the row running under a renewed lease.
          // Cut at the deadline, unknown, then found by the read (settleMs 0).
          expect({ out: out === "still running" ? out : out.status, row: row?.status }).toEqual({
            out: "succeeded",
            row: "succeeded",
          });
          expect(Date.now() - started).toBeLessThan(bound);
          // The cut is said as the deadline it was, naming the setting to raise.
          const { events } = await ledger.get({ tenant: t, id: row!.id });
          expect(events.map((e) => e.reason)).toContainEqual(
            expect.stringMatching(/no complete answer from HubSpot within 2000 ms \(deadlineMs\)/),
          );
        },
        scaled(60_000),
      );
    }
  });
}
