/**
 * A person resolved an operation as failed, and an earlier attempt's late receipt then proves the
 * effect: the row succeeds with it, and the person, who may have acted on "failed" (told the
 * customer, done the work by hand), hears that their verdict was contradicted. The daemon says so
 * (`verdict_overruled`), once, not as `two_effects` (the ledger saw one effect). Through the log
 * sink, on SQLite and Postgres. Failed first: not alerted at all.
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
  describe(`a person's verdict "failed" contradicted by a late receipt, alerted by the daemon on ${dialect}`, () => {
    it(
      "is said as verdict_overruled, once",
      async () => {
        const url = await freshDatabase(dialect);
        const { log, lines } = capturedLog<{ msg: string; alert?: { kind: string; operationId: string } }>();
        const config = parseConfig({ ledger: url, alerts: { log: true }, daemon: { intervalMs: 50 } });
        let calls = 0;
        let open: () => void = () => {};
        const out = new Promise<void>((r) => (open = r));
        // Nothing can check it: an expired lease goes to a person.
        const send = defineAction<{ to: string }, { id: string }>({
          type: "sms.late",
          capabilities: { lookup: false },
          execute: async () => {
            calls += 1;
            await out; // attempt 1's request is out until released, then lands
            return { id: "s-1" };
          },
          classify: () => ({ kind: "ambiguous", reason: "the answer was lost" }),
        });
        let now = Date.now();
        const ledger = await openTestLedger(url, {
          poolSize: 2,
          clock: () => now,
          leaseMs: 30_000,
          actions: [...alertActions(config, log), send],
        });
        cleanups.push(() => ledger.close());
        const tenant = `vo-${Math.random().toString(36).slice(2, 8)}`;
        const first = ledger.run(send, { tenant, key: ["k"], args: { to: "+15550100" } });
        await vi.waitFor(() => expect(calls).toBe(1));
        now += 31_000; // attempt 1's lease ran out; its request is still out
        const [op] = await ledger.admin.list({ tenant });
        const id = op!.id;
        expect(await ledger.daemon.settle({ tenant, id, actor: "daemon-a" })).toMatchObject({ state: "needs_review" });
        await ledger.admin.resolve({ tenant, id, outcome: "failed", reason: "not in the SMS log", actor: "ann" });
        open(); // attempt 1's request lands, and its receipt arrives
        expect(await first).toMatchObject({ status: "succeeded", receipt: { id: "s-1" } });
        const daemon = new Daemon(ledger, config, log, new DaemonMetrics(ledger, 1_000), "d-overruled");
        await daemon.tick();
        await daemon.tick();
        const said = lines.filter((l) => l.alert?.operationId === id);
        expect(said.map((l) => l.alert!.kind)).toEqual(["verdict_overruled"]);
        expect(said[0]!.msg).toMatch(
          /a person's verdict "failed" was contradicted: it took effect after all \(check whether anything was done on that verdict, such as the work redone by hand\): a person's verdict "failed" is overruled: attempt 1's receipt proves the effect happened/,
        );
        expect(calls).toBe(1);
      },
      scaled(60_000),
    );

    it(
      "a late receipt that names two effects, too large to store: said as two_effects, not only 'needs a person's review'",
      async () => {
        const url = await freshDatabase(dialect);
        const { log, lines } = capturedLog<{ msg: string; alert?: { kind: string; operationId: string } }>();
        const config = parseConfig({ ledger: url, alerts: { log: true }, daemon: { intervalMs: 50 } });
        let calls = 0;
        let open: () => void = () => {};
        const out = new Promise<void>((r) => (open = r));
        // As above, but attempt 1's request is answered with two effects (its ids name s-1 and s-2),
        // in a receipt too large to store: the row goes back to a person, its reason saying their
        // verdict is overruled first, then "attempt 1: two effects: …".
        const send = defineAction<{ to: string }, { ids: string[]; pad: string }>({
          type: "sms.late.two",
          capabilities: { lookup: false },
          execute: async () => {
            calls += 1;
            await out;
            return { ids: ["s-1", "s-2"], pad: "x".repeat(200) };
          },
          classify: () => ({ kind: "ambiguous", reason: "the answer was lost" }),
          effectId: (r) => r.ids,
        });
        let now = Date.now();
        const ledger = await openTestLedger(url, {
          poolSize: 2,
          clock: () => now,
          leaseMs: 30_000,
          maxResultBytes: 100,
          actions: [...alertActions(config, log), send],
        });
        cleanups.push(() => ledger.close());
        const tenant = `vo-${Math.random().toString(36).slice(2, 8)}`;
        const first = ledger.run(send, { tenant, key: ["k"], args: { to: "+15550100" } });
        await vi.waitFor(() => expect(calls).toBe(1));
        now += 31_000;
        const [op] = await ledger.admin.list({ tenant });
        const id = op!.id;
        expect(await ledger.daemon.settle({ tenant, id, actor: "daemon-a" })).toMatchObject({ state: "needs_review" });
        await ledger.admin.resolve({ tenant, id, outcome: "failed", reason: "not in the SMS log", actor: "ann" });
        open();
        await expect(first).rejects.toMatchObject({ name: "PayloadTooLargeError" });
        const [parked] = await ledger.admin.list({ tenant });
        expect(parked).toMatchObject({ status: "needs_review" });
        expect(parked!.reason).toMatch(
          /^a person's verdict "failed" is overruled: attempt 1: two effects: the receipt names 2 effects \(s-1, s-2\)/,
        );
        const daemon = new Daemon(ledger, config, log, new DaemonMetrics(ledger, 1_000), "d-overruled-two");
        await daemon.tick();
        await daemon.tick();
        const said = lines.filter((l) => l.alert?.operationId === id);
        // Before: ["needs_review"], "needs a person's review: …": two effects told, not said as such.
        expect(said.map((l) => l.alert!.kind)).toEqual(["two_effects"]);
        expect(said[0]!.msg).toMatch(
          /took effect twice .*: a person's verdict "failed" is overruled: attempt 1: two effects/,
        );
        expect(calls).toBe(1);
      },
      scaled(60_000),
    );
  });
}
