/**
 * An earlier attempt's late receipt proves the effect after a later attempt ran the operation
 * again (a lookup proved absence before the earlier request landed) and lost its answer: one
 * effect proven, a second one possible. The daemon says so (`maybe_two_effects`), once, not as
 * `two_effects` ("took effect twice ... undo the extra effect": none may exist). Through the log
 * sink, on SQLite and Postgres. Failed first: said as two_effects.
 */
import { afterEach, describe, expect, it, vi } from "vitest";
import { defineAction } from "@idem/core";
import { openTestLedger } from "@idem/core/testing";
import { Daemon, DaemonMetrics, alertActions, parseConfig } from "@idem/cli";
import { DIALECTS, freshDatabase, scaled } from "@idem/testkit";
import { capturedLog } from "./support.js";

const cleanups: (() => Promise<unknown>)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c().catch(() => {});
});

for (const dialect of DIALECTS) {
  describe(`an effect proven after the operation was run again, alerted by the daemon on ${dialect}`, () => {
    it(
      "is said as maybe_two_effects, once",
      async () => {
        const url = await freshDatabase(dialect);
        const { log, lines } = capturedLog<{ msg: string; alert?: { kind: string; operationId: string } }>();
        const config = parseConfig({ ledger: url, alerts: { log: true }, daemon: { intervalMs: 50 } });
        let calls = 0;
        let open: () => void = () => {};
        const out = new Promise<void>((r) => (open = r));
        let landed = false;
        const send = defineAction<{ to: string }, { id: string }>({
          type: "mail.rerun",
          capabilities: { lookup: true },
          execute: async () => {
            calls += 1;
            if (calls > 1) throw new Error("the answer was lost"); // the rerun's request: its answer lost
            await out; // attempt 1's request is out until released, then lands
            landed = true;
            return { id: "m-1" };
          },
          classify: () => ({ kind: "ambiguous", reason: "the answer was lost" }),
          reconcile: async () =>
            landed
              ? { found: true, receipt: { id: "m-1" } }
              : { found: false, proof: "absent", reason: "not in the mailbox" },
        });
        let now = Date.now();
        const ledger = await openTestLedger(url, {
          poolSize: 2,
          clock: () => now,
          leaseMs: 30_000,
          budget: { attempts: 1 },
          actions: [...alertActions(config, log), send],
        });
        cleanups.push(() => ledger.close());
        const tenant = `mt-${Math.random().toString(36).slice(2, 8)}`;
        const first = ledger.run(send, { tenant, key: ["k"], args: { to: "a@example.com" } });
        await vi.waitFor(() => expect(calls).toBe(1));
        now += 31_000; // attempt 1's lease ran out; its request is still out
        const [op] = await ledger.admin.list({ tenant });
        const id = op!.id;
        // A lookup proves absence (the request has not landed) and the operation runs again: answer lost.
        expect(await ledger.daemon.settle({ tenant, id, actor: "daemon-a" })).toMatchObject({ state: "unknown" });
        expect(calls).toBe(2);
        open(); // attempt 1's request lands, and its receipt arrives
        expect(await first).toMatchObject({ status: "succeeded", receipt: { id: "m-1" } });
        const daemon = new Daemon(ledger, config, log, new DaemonMetrics(ledger, 1_000), "d-maybe-two");
        await daemon.tick();
        await daemon.tick();
        const said = lines.filter((l) => l.alert?.operationId === id);
        expect(said.map((l) => l.alert!.kind)).toEqual(["maybe_two_effects"]);
        expect(said[0]!.msg).toMatch(
          /may have taken effect twice: .*\(check the provider for a second effect, and undo it if there is one\): possibly two effects: attempt 1's receipt proves the effect happened/,
        );
      },
      scaled(60_000),
    );
  });
}
