/**
 * A person retries an operation whose outcome was unknown (`idem retry`), and the lookup made
 * first finds the effect: the earlier attempt committed after all, and the retry did not run. The
 * daemon says so (`retry_not_run`), once, never as `two_effects` (whose text tells the operator to
 * undo an extra effect that does not exist); a lookup that finds it twice still reads two_effects.
 * Through the log sink, on SQLite and Postgres. Failed first: said as two_effects. So when the
 * finding is recorded through the fence (another look took the row over meanwhile): failed first,
 * not alerted at all.
 */
import { describe, expect, it, vi } from "vitest";
import { defineAction } from "@idem/core";
import { DIALECTS, scaled } from "@idem/testkit";
import { alertingDaemon, gate } from "./support.js";

/** Each request's answer is lost; its effect lands after the person looked (`landed`), found once or twice. */
const landed = new Map<string, number>();
const lateSend = defineAction<{ to: string }, { id: string }>({
  type: "mail.late",
  capabilities: { lookup: true },
  execute: async () => {
    throw new Error("the answer was lost");
  },
  classify: () => ({ kind: "ambiguous", reason: "the answer was lost" }),
  reconcile: async (args) => {
    const copies = landed.get(args.to) ?? 0;
    if (copies === 0) return { found: false, proof: "inconclusive", reason: "not there yet" };
    return { found: true, receipt: { id: `m-${args.to}` }, ...(copies > 1 && { twice: `${copies} copies` }) };
  },
});

/** Its first lookup is held until `open`, then finds the effect; every later one proves nothing. */
function slowLook() {
  let lookups = 0;
  const held = gate();
  const action = defineAction<{ to: string }, { id: string }>({
    type: "mail.slow-look",
    capabilities: { lookup: true },
    execute: lateSend.execute,
    classify: lateSend.classify,
    reconcile: async (args) => {
      lookups += 1;
      if (lookups > 1) return { found: false, proof: "inconclusive", reason: "the search is down" };
      await held.passed;
      return { found: true, receipt: { id: `m-${args.to}` } };
    },
  });
  return { action, open: held.open, lookups: () => lookups };
}

for (const dialect of DIALECTS) {
  describe(`a person's retry whose lookup finds the effect, alerted by the daemon on ${dialect}`, () => {
    it(
      "is said as retry_not_run, once, never two_effects; found twice is still two_effects",
      async () => {
        const { ledger, daemon, tenant, said } = await alertingDaemon(dialect, "d-retry-found", [lateSend]);
        const to = { once: `once-${tenant}`, twice: `twice-${tenant}` };
        const once = await ledger.run(lateSend, { tenant, key: ["once"], args: { to: to.once } });
        const twice = await ledger.run(lateSend, { tenant, key: ["twice"], args: { to: to.twice } });
        expect([once.status, twice.status]).toEqual(["pending_verification", "pending_verification"]);
        // A person looks, finds nothing, and retries each; the earlier request then lands.
        for (const op of [once, twice]) {
          const seen = (await ledger.get({ tenant, id: op.operationId })).operation;
          expect(seen.status).toBe("unknown");
          await ledger.admin.retry({ tenant, id: op.operationId, actor: "ops", reason: "not there", seen });
        }
        landed.set(to.once, 1);
        landed.set(to.twice, 2);
        await daemon.tick();
        for (const op of [once, twice])
          expect((await ledger.get({ tenant, id: op.operationId })).operation.status).toBe("succeeded");
        expect(said(once.operationId).map((l) => l.alert!.kind)).toEqual(["retry_not_run"]);
        expect(said(once.operationId)[0]!.msg).toMatch(
          /was done when a person retried it: the earlier attempt took effect after all, once, and the retry did not run \(nothing to undo\): reconciled after a person's retry: .*\. See: idem show/,
        );
        expect(said(once.operationId)[0]!.alert).toMatchObject({ status: "succeeded" });
        expect(said(twice.operationId).map((l) => l.alert!.kind)).toEqual(["two_effects"]);
        expect(said(twice.operationId)[0]!.msg).toMatch(
          /took effect twice .*: two effects: the lookup found the effect more than once \(2 copies\)/,
        );
        // Ticked again: nothing more is said.
        await daemon.tick();
        expect(said(once.operationId)).toHaveLength(1);
        expect(said(twice.operationId)).toHaveLength(1);
      },
      scaled(60_000),
    );

    it(
      "found while another look took the row over (recorded through the fence): retry_not_run, once",
      async () => {
        const slow = slowLook();
        const { ledger, daemon, tenant, said, advance } = await alertingDaemon(
          dialect,
          "d-retry-fenced",
          [slow.action],
          {
            heldClock: true,
            budget: { attempts: 1 }, // the call ends unknown, not looking the effect up itself
          },
        );
        const first = await ledger.run(slow.action, { tenant, key: ["k"], args: { to: tenant } });
        expect(first).toMatchObject({ state: "unknown" });
        const id = first.operationId;
        const seen = (await ledger.get({ tenant, id })).operation;
        await ledger.admin.retry({ tenant, id, actor: "ops", reason: "not there", seen });
        const looking = ledger.daemon.settle({ tenant, id, actor: "daemon-a" }).catch((e: unknown) => e);
        await vi.waitFor(() => expect(slow.lookups()).toBe(1));
        advance(31_000); // its lease ran out while it looked: another daemon takes the row over
        expect(await ledger.daemon.settle({ tenant, id, actor: "daemon-b" })).toMatchObject({ state: "pending" });
        slow.open();
        expect(await looking).toMatchObject({ status: "succeeded" });
        await daemon.tick();
        await daemon.tick();
        const alerts = said(id);
        expect(alerts.map((l) => l.alert!.kind)).toEqual(["retry_not_run"]);
        expect(alerts[0]!.msg).toMatch(
          /the retry did not run \(nothing to undo\): reconciled after a person's retry: .*found by attempt 2's lookup/,
        );
      },
      scaled(60_000),
    );

    it(
      "its look refused, then settled by the earlier attempt's late receipt: retry_not_run after check_refused",
      async () => {
        let sends = 0;
        const out = gate();
        class Revoked extends Error {}
        // Attempt 1's request is out until it lands; every lookup is refused (a revoked key).
        const send = defineAction<{ to: string }, { id: string }>({
          type: "mail.late-receipt",
          capabilities: { lookup: true },
          execute: async (args) => {
            sends += 1;
            await out.passed;
            return { id: `m-${args.to}` };
          },
          classify: (e) =>
            e instanceof Revoked
              ? { kind: "permanent", reason: e.message, alert: true }
              : { kind: "ambiguous", reason: String(e) },
          reconcile: async () => {
            throw new Revoked("the API key was revoked");
          },
        });
        const { ledger, daemon, tenant, said, advance } = await alertingDaemon(dialect, "d-retry-late", [send], {
          heldClock: true,
          budget: { attempts: 1 },
        });
        const first = ledger.run(send, { tenant, key: ["k"], args: { to: tenant } });
        await vi.waitFor(() => expect(sends).toBe(1), { timeout: scaled(10_000) });
        advance(31_000); // attempt 1's lease ran out; its request is still out
        const [op] = await ledger.admin.list({ tenant });
        const id = op!.id;
        expect(await ledger.daemon.settle({ tenant, id, actor: "daemon-a" })).toMatchObject({ state: "unknown" });
        const seen = (await ledger.get({ tenant, id })).operation;
        await ledger.admin.retry({ tenant, id, actor: "ops", reason: "not there", seen });
        await daemon.tick(); // the retry's look is refused: check_refused, the retry not run yet
        expect(said(id).map((l) => l.alert!.kind)).toEqual(["check_refused"]);
        out.open(); // attempt 1's request lands; its receipt settles the row
        expect(await first).toMatchObject({ status: "succeeded", receipt: { id: `m-${tenant}` } });
        await daemon.tick();
        await daemon.tick();
        // Before: ["check_refused"] only: the person who retried never heard the retry did not run.
        expect(said(id).map((l) => l.alert!.kind)).toEqual(["check_refused", "retry_not_run"]);
        expect(said(id)[1]!.msg).toMatch(
          /the retry did not run \(nothing to undo\): settled after a person's retry, before it ran .*attempt 1's receipt proves the effect happened/,
        );
        expect(sends).toBe(1);
      },
      scaled(60_000),
    );
  });
}
