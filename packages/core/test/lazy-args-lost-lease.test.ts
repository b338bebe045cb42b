/**
 * Lazy args whose generation outlasted the caller's lease (its heartbeats failed, the process
 * stalled): the daemon found the row running with no args stored, so known not done, and gave it
 * back as `pending`. The caller then holds the generated args but cannot store them. A row
 * pending without args is run by no daemon (it has no args to send) and is never due nor alerted:
 * only a caller with the args runs it. The caller that has them must not be told "pending
 * verification" (which a model reads as "it will be run again, do not retry").
 */
import { describe, expect, it } from "vitest";
import { setTimeout as sleep } from "node:timers/promises";
import { defineAction, type Ledger, type Operation } from "@idem/core";
import { DIALECTS } from "@idem/testkit";
import { ledgers, uniqueTenant } from "./support/ledgers.js";

/** A mail action that records what it sent; `found` says whether its lookup finds the first send. */
function mailAction(found: (sent: readonly { to: string }[]) => boolean) {
  const sent: { to: string }[] = [];
  const action = defineAction<{ to: string }, { id: string }>({
    type: "mail",
    capabilities: { lookup: true },
    execute: async (args) => {
      sent.push(args);
      return { id: `m${sent.length}` };
    },
    reconcile: async () =>
      found(sent) ? { found: true, receipt: { id: "m1" } } : { found: false, proof: "absent", reason: "none" },
  });
  return { action, sent };
}

/** The tenant's one operation, once the call in flight has claimed it (polled: the claim is the call's own step). */
async function claimed(ledger: Ledger, tenant: string): Promise<Operation> {
  const deadline = Date.now() + 20_000;
  while (Date.now() < deadline) {
    const [op] = await ledger.admin.list({ tenant });
    if (op) return op;
    await sleep(5);
  }
  throw new Error("the call never claimed its operation");
}

for (const dialect of DIALECTS) {
  describe(`lazy args that outlast their lease, ${dialect}`, () => {
    const db = ledgers(dialect);

    it("a caller whose row was released while it generated its args runs it with them, not 'pending' for ever", async () => {
      const { action: mail, sent } = mailAction((sent) => sent.length > 0);
      let at = 1_900_000_000_000;
      const clock = () => at;
      // A long lease: no heartbeat fires during the test; the clock's jump is the time they failed.
      const leaseMs = 60_000;
      const caller = await db.open({ clock, leaseMs });
      const daemon = await db.open({ clock, leaseMs, actions: [mail] });
      const tenant = uniqueTenant();
      let generate!: () => void;
      const model = new Promise<void>((r) => (generate = r));
      const run = caller.run(mail, {
        tenant,
        key: ["lazy"],
        args: async () => {
          await model;
          return { to: "x" };
        },
      });
      const op = await claimed(daemon, tenant);
      at += 2 * leaseMs; // the caller's lease ran out while its model was generating
      const released = await daemon.daemon.settle({ tenant, id: op.id, actor: "daemon" });
      expect(released).toMatchObject({ status: "pending_verification", state: "pending" });
      generate();
      const out = await run;
      // Before: pending_verification (state pending), "attempt 1 was moved meanwhile", nothing sent.
      expect(out).toMatchObject({ status: "succeeded", replayed: false });
      expect(sent).toEqual([{ to: "x" }]);
      const after = await daemon.status({ tenant, id: op.id });
      expect(after).toMatchObject({ status: "succeeded" });
    });
  });
}

for (const dialect of DIALECTS) {
  describe(`lazy args given up by their caller, ${dialect}`, () => {
    const db = ledgers(dialect);

    it("a caller that gives up while its args are generated leaves the operation known not done, not failed for good", async () => {
      const { action: mail, sent } = mailAction(() => false);
      const ledger = await db.open({ actions: [mail] });
      const tenant = uniqueTenant();
      const controller = new AbortController();
      // The generator is a model call the application aborts with the same signal (its own timeout).
      const model = (signal: AbortSignal) =>
        new Promise<{ to: string }>((_resolve, reject) =>
          signal.addEventListener("abort", () => reject(signal.reason), { once: true }),
        );
      const run = ledger
        .run(mail, { tenant, key: ["lazy"], args: () => model(controller.signal), signal: controller.signal })
        .catch((e: unknown) => e);
      await claimed(ledger, tenant);
      controller.abort(new Error("the user closed the chat"));
      const out = await run;
      const [op] = await ledger.admin.list({ tenant });
      // Before: the operation failed for good ("rejected before send: the user closed the chat"),
      // and every later call of this work was answered "failed, retrying will not change it".
      expect(op).toMatchObject({ status: "pending" });
      expect(out).not.toMatchObject({ status: "failed" });
      const again = await ledger.run(mail, { tenant, key: ["lazy"], args: () => ({ to: "x" }) });
      expect(again).toMatchObject({ status: "succeeded", replayed: false });
      expect(sent).toEqual([{ to: "x" }]);
    });
  });
}
