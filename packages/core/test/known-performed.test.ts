/**
 * An operation whose effect is known performed: a receipt came back but could not be stored (too
 * large), so the row waits for a person with the proof on it (error kind `invalid_result`). What
 * a person may decide, what another caller is told, and what a second such receipt means.
 */
import { describe, expect, it } from "vitest";
import { setTimeout as sleep } from "node:timers/promises";
import { ArgsMismatchError, defineAction, InvalidTransitionError, performedProof, type Ledger } from "@idem/core";
import { openTestLedger } from "@idem/core/testing";
import { DIALECTS } from "@idem/testkit";
import { dialectFor, hooked } from "./support/dialects.js";
import { ledgers, uniqueTenant } from "./support/ledgers.js";

/**
 * Every receipt is over `maxResultBytes: 50`: the effect happens, its receipt cannot be stored.
 * After `fit()`, the requests' receipts answered from then on fit (until `bloat()`); the lookup's
 * never do. `dedupe`: the provider dedupes on our key (a request with a key it has seen is
 * answered with that key's first effect, none made), for a day.
 */
function bloatedProvider(type: string, capabilities: { lookup?: true; dedupe?: true } = {}) {
  const effects: { key: string; id: string }[] = [];
  let calls = 0;
  let pad = 200;
  let gate: { until: Promise<void>; commit: "before" | "after" } | undefined;
  let open: () => void = () => {};
  type Receipt = { id: string; pad: string };
  const execute = async (_args: { to: string }, op: { key: string }): Promise<Receipt> => {
    calls += 1;
    const g = gate;
    gate = undefined; // only the next call waits
    if (g?.commit === "after") await g.until; // the request is out, the provider commits when released
    const first = capabilities.dedupe ? effects.find((e) => e.key === op.key) : undefined;
    const id = first?.id ?? `obj_${effects.length + 1}`;
    if (!first) effects.push({ key: op.key, id });
    if (g?.commit === "before") await g.until; // committed; the answer comes when released
    return { id, pad: "x".repeat(pad) };
  };
  const action = capabilities.dedupe
    ? defineAction<{ to: string }, Receipt>({ type, capabilities: { dedupe: { retentionMs: 86_400_000 } }, execute })
    : capabilities.lookup
      ? defineAction<{ to: string }, Receipt>({
          type,
          capabilities: { lookup: true },
          execute,
          reconcile: async (_args, op) =>
            effects.some((e) => e.key === op.key)
              ? { found: true as const, receipt: { id: "found", pad: "x".repeat(200) } }
              : { found: false as const, proof: "absent" as const, reason: "not at the provider" },
        })
      : defineAction<{ to: string }, Receipt>({ type, capabilities: {}, execute });
  return {
    action,
    effects,
    calls: () => calls,
    /** The next execute waits for `release` (or the function returned), before the provider commits it or after. */
    hold: (commit: "before" | "after") => {
      gate = { until: new Promise<void>((r) => (open = r)), commit };
      return open;
    },
    release: () => open(),
    fit: () => {
      pad = 0;
    },
    bloat: () => {
      pad = 200;
    },
  };
}

async function until(cond: () => boolean, ms = 10_000): Promise<void> {
  const end = Date.now() + ms;
  while (!cond()) {
    if (Date.now() > end) throw new Error("condition not met in time");
    await sleep(5);
  }
}

for (const dialect of DIALECTS) {
  describe(`an effect known performed on ${dialect}`, () => {
    const db = ledgers(dialect);

    /** One call whose effect happened with a receipt too large to store: the row parked with the proof. */
    async function parked(type: string) {
      const p = bloatedProvider(type);
      const ledger: Ledger = await db.open({ maxResultBytes: 50, actions: [p.action], budget: { attempts: 1 } });
      const tenant = uniqueTenant();
      await expect(ledger.run(p.action, { tenant, key: ["k"], args: { to: "x" } })).rejects.toMatchObject({
        name: "PayloadTooLargeError",
      });
      const [op] = await ledger.admin.list({ tenant });
      expect(op).toMatchObject({ status: "needs_review", error: { kind: "invalid_result" } });
      return { p, ledger, tenant, op: op! };
    }

    it("a person's 'it did not happen' contradicts the proof: refused with the operation and why; 'it happened' is taken", async () => {
      const { p, ledger, tenant, op } = await parked("known.resolve");
      const reason = "nothing in the dashboard";
      const refused = await ledger.admin
        .resolve({ tenant, id: op.id, actor: "alice", reason, outcome: "failed", seen: op })
        .catch((e: unknown) => e);
      // Before: accepted, and every caller read "failed" for an effect that happened.
      expect(refused).toBeInstanceOf(InvalidTransitionError);
      expect(refused).toMatchObject({
        operationId: op.id,
        to: "failed",
        message: expect.stringMatching(/effect happened.*receipt could not be stored.*resolve it as succeeded/),
      });
      // The same refusal as a retry's, from the same predicate.
      await expect(ledger.admin.retry({ tenant, id: op.id, actor: "alice", reason, seen: op })).rejects.toMatchObject({
        name: "InvalidTransitionError",
        operationId: op.id,
        to: "pending",
      });
      const unchanged = (await ledger.get({ tenant, id: op.id })).operation;
      expect(unchanged).toMatchObject({ status: "needs_review", updatedAt: op.updatedAt });
      // What an operator's tool reads of it (the console offers only "succeeded"): core's own predicate.
      expect(performedProof(unchanged)).toMatchObject({ kind: "invalid_result" });
      const resolved = await ledger.admin.resolve({
        tenant,
        id: op.id,
        actor: "alice",
        reason: "found it",
        evidence: "obj_1 in the dashboard",
        outcome: "succeeded",
        seen: op,
      });
      expect(resolved).toMatchObject({ status: "succeeded", resolution: { outcome: "succeeded" } });
      expect(performedProof((await ledger.get({ tenant, id: op.id })).operation)).toBeUndefined();
      expect(p.effects).toHaveLength(1);
    });

    it("other args for it: the mismatch says the effect is known performed", async () => {
      const { p, ledger, tenant, op } = await parked("known.args");
      const err = await ledger.run(p.action, { tenant, key: ["k"], args: { to: "y" } }).catch((e: unknown) => e);
      expect(err).toBeInstanceOf(ArgsMismatchError);
      // Before: only the status, which a reader takes for "a person will decide whether it happened".
      expect(err).toMatchObject({ operationId: op.id, status: "needs_review", performed: true });
      expect(p.effects).toHaveLength(1);
    });

    it("other args for an operation a person decides without a proof: not known performed", async () => {
      const action = defineAction<{ to: string }, { id: string }>({
        type: "known.args.unknown",
        capabilities: {},
        execute: async () => {
          throw new Error("timeout after the request was sent");
        },
      });
      const ledger: Ledger = await db.open({ actions: [action], budget: { attempts: 1 } });
      const tenant = uniqueTenant();
      expect(await ledger.run(action, { tenant, key: ["k"], args: { to: "x" } })).toMatchObject({
        state: "needs_review",
      });
      const err = await ledger.run(action, { tenant, key: ["k"], args: { to: "y" } }).catch((e: unknown) => e);
      expect(err).toMatchObject({ name: "ArgsMismatchError", status: "needs_review", performed: false });
    });

    it("two receipts that could not be stored, from two attempts: a second effect, alerted as one", async () => {
      // Attempt 1's request is out past its lease; a lookup finds nothing yet (pending); attempt 3
      // sends and its receipt cannot be stored (parked, alerted, the alert delivered); then attempt
      // 1's answer comes, its receipt too large as well. Before: only noted in the history, no alert.
      let now = Date.now();
      const p = bloatedProvider("known.two", { lookup: true });
      const ledger: Ledger = await db.open({
        clock: () => now,
        leaseMs: 30_000,
        maxResultBytes: 50,
        actions: [p.action],
        budget: { attempts: 1 },
      });
      const tenant = uniqueTenant();
      p.hold("after");
      const first = ledger.run(p.action, { tenant, key: ["k"], args: { to: "x" } }).catch((e: unknown) => e);
      await until(() => p.calls() === 1);
      now += 31_000;
      const [op] = await ledger.admin.list({ tenant });
      const stop = new AbortController();
      stop.abort(); // a stopping daemon: it looks up but sends nothing
      expect(await ledger.daemon.settle({ tenant, id: op!.id, actor: "daemon", stop: stop.signal })).toMatchObject({
        state: "pending",
      });
      await expect(ledger.run(p.action, { tenant, key: ["k"], args: { to: "x" } })).rejects.toMatchObject({
        name: "PayloadTooLargeError",
      });
      const parkedOp = (await ledger.get({ tenant, id: op!.id })).operation;
      expect(parkedOp).toMatchObject({ status: "needs_review", attempt: 3, error: { kind: "invalid_result" } });
      await ledger.daemon.ackAlert(parkedOp); // the daemon delivered the parking's alert
      expect((await ledger.daemon.alertsDue({ limit: 10 })).map((a) => a.id)).not.toContain(op!.id);
      p.release(); // attempt 1's request took effect too; its receipt cannot be stored either
      expect(await first).toMatchObject({ name: "PayloadTooLargeError", operationId: op!.id });
      const after = await ledger.get({ tenant, id: op!.id });
      const story = `events: ${after.events.map((e) => `${e.from}>${e.to}@${e.attempt} ${e.reason}`).join(" | ")}`;
      expect(p.effects, story).toHaveLength(2);
      expect(after.operation, story).toMatchObject({ status: "needs_review", error: { kind: "invalid_result" } });
      expect(after.operation.reason, story).toMatch(/^two effects: attempt 1's request took effect/);
      expect(
        (await ledger.daemon.alertsDue({ limit: 10 })).map((a) => a.id),
        story,
      ).toContain(op!.id);
      // Still known performed: nobody may run it again or call it not done.
      await expect(
        ledger.admin.resolve({
          tenant,
          id: op!.id,
          actor: "alice",
          reason: "no",
          outcome: "failed",
          seen: after.operation,
        }),
      ).rejects.toMatchObject({ name: "InvalidTransitionError" });
      expect(await ledger.run(p.action, { tenant, key: ["k"], args: { to: "x" } })).toMatchObject({
        state: "needs_review",
        performed: true,
      });
    });

    it("a lookup's receipt that could not be stored, then the request's own: one effect, not alerted as two", async () => {
      // Attempt 1's request is out past its lease; the daemon's lookup (attempt 2) finds its effect,
      // whose receipt cannot be stored (parked). Attempt 1's own receipt is the same effect.
      let now = Date.now();
      const p = bloatedProvider("known.found", { lookup: true });
      const ledger: Ledger = await db.open({
        clock: () => now,
        leaseMs: 30_000,
        maxResultBytes: 50,
        actions: [p.action],
        budget: { attempts: 1 },
      });
      const tenant = uniqueTenant();
      p.hold("before");
      const first = ledger.run(p.action, { tenant, key: ["k"], args: { to: "x" } }).catch((e: unknown) => e);
      await until(() => p.effects.length === 1); // committed; the answer is held
      now += 31_000;
      const [op] = await ledger.admin.list({ tenant });
      await expect(ledger.daemon.settle({ tenant, id: op!.id, actor: "daemon" })).rejects.toMatchObject({
        name: "PayloadTooLargeError",
      });
      const parkedOp = (await ledger.get({ tenant, id: op!.id })).operation;
      expect(parkedOp).toMatchObject({ status: "needs_review", attempt: 2, error: { kind: "invalid_result" } });
      await ledger.daemon.ackAlert(parkedOp);
      p.release();
      expect(await first).toMatchObject({ name: "PayloadTooLargeError" });
      const after = await ledger.get({ tenant, id: op!.id });
      const story = `events: ${after.events.map((e) => `${e.from}>${e.to}@${e.attempt} ${e.reason}`).join(" | ")}`;
      expect(p.effects, story).toHaveLength(1);
      expect(after.operation.reason, story).not.toMatch(/two effects/);
      expect(
        (await ledger.daemon.alertsDue({ limit: 10 })).map((a) => a.id),
        story,
      ).not.toContain(op!.id);
    });

    it("a person's 'it happened' without a receipt, then two attempts' late receipts that differ: two effects, alerted", async () => {
      // Nothing can check the provider: attempt 1's request, out past its lease, is parked; a person
      // runs it again (attempt 3), parked the same way; then says it happened, with no receipt to
      // give. Both requests took effect. Attempt 1's receipt write is held until attempt 3's has
      // run: each read the row without a receipt, so each wrote its own.
      const clock = { now: Date.now() };
      const p = bloatedProvider("known.verdict.two");
      p.fit();
      await (await db.open()).close(); // migrated
      let thirdWrote: () => void = () => {};
      const third = new Promise<void>((r) => (thirdWrote = r));
      const receiptWrite = (sql: string, params: readonly unknown[], attempt: number) =>
        sql.startsWith('update "idem_operations" set "status"') &&
        params.some(
          (v) =>
            typeof v === "string" &&
            v.includes(`attempt ${attempt}'s receipt proves the effect happened, after a person`),
        );
      const holding = hooked(await dialectFor(dialect, db.url()), {
        async query(q, run) {
          if (receiptWrite(q.sql, q.parameters, 1)) await third;
          const out = await run();
          if (receiptWrite(q.sql, q.parameters, 3)) thirdWrote();
          return out;
        },
      });
      const ledger: Ledger = await openTestLedger(holding, {
        clock: () => clock.now,
        leaseMs: 30_000,
        maxResultBytes: 50,
        actions: [p.action],
        budget: { attempts: 1 },
      });
      try {
        const tenant = uniqueTenant();
        const run = () => ledger.run(p.action, { tenant, key: ["k"], args: { to: "x" } }).catch((e: unknown) => e);
        const release1 = p.hold("after");
        const first = run();
        await until(() => p.calls() === 1);
        clock.now += 31_000;
        const [op] = await ledger.admin.list({ tenant });
        const id = op!.id;
        expect(await ledger.daemon.settle({ tenant, id, actor: "daemon" })).toMatchObject({ state: "needs_review" });
        const parked2 = (await ledger.get({ tenant, id })).operation;
        await ledger.admin.retry({ tenant, id, actor: "alice", reason: "try it again", seen: parked2 });
        const release3 = p.hold("after");
        const again = run();
        await until(() => p.calls() === 2);
        clock.now += 31_000;
        expect(await ledger.daemon.settle({ tenant, id, actor: "daemon" })).toMatchObject({ state: "needs_review" });
        const parked4 = (await ledger.get({ tenant, id })).operation;
        expect(parked4).toMatchObject({ status: "needs_review", attempt: 4 });
        await ledger.admin.resolve({
          tenant,
          id,
          actor: "alice",
          reason: "the charge is in the dashboard",
          outcome: "succeeded",
          seen: parked4,
        });
        release1(); // attempt 1's receipt comes; its write held until attempt 3's has run
        await until(() => p.effects.length === 1);
        release3();
        const [out1, out3] = await Promise.all([first, again]);
        const { operation, events } = await ledger.get({ tenant, id });
        const story = `events: ${events.map((e) => `${e.from}>${e.to}@${e.attempt} ${e.reason}`).join(" | ")}`;
        const alerted = (await ledger.daemon.alertsDue({ limit: 10 })).some((a) => a.id === id);
        expect(p.effects, story).toHaveLength(2);
        expect(out1, story).toMatchObject({ status: "succeeded", receipt: { id: "obj_1" } });
        expect(out3, story).toMatchObject({ status: "succeeded", receipt: { id: "obj_2" } });
        // Before: attempt 1's receipt written over attempt 3's (told its own), unalerted: "attempt
        // 1's receipt proves the effect happened, after a person resolved it as succeeded without one".
        expect(operation.reason, story).toMatch(/two effects/);
        expect(alerted, story).toBe(true);
      } finally {
        thirdWrote(); // never left holding a statement
        await ledger.close();
      }
    });

    // A proof on the row tells whose effect it was (`performedBy`): a lookup's finding (no attempt
    // named) may be any request's effect, a request's own receipt is that request's.
    describe("the proof's attempts and a storable receipt that comes later", () => {
      async function opened(type: string) {
        const clock = { now: Date.now() };
        const p = bloatedProvider(type, { lookup: true });
        const ledger: Ledger = await db.open({
          clock: () => clock.now,
          leaseMs: 30_000,
          maxResultBytes: 50,
          actions: [p.action],
          budget: { attempts: 1 },
        });
        const tenant = uniqueTenant();
        const run = () => ledger.run(p.action, { tenant, key: ["k"], args: { to: "x" } }).catch((e: unknown) => e);
        /** The daemon's settlement; `stopping`: it looks up but sends nothing. */
        const settle = async (id: string, stopping = false) => {
          const stop = new AbortController();
          if (stopping) stop.abort();
          return ledger.daemon.settle({ tenant, id, actor: "daemon", stop: stop.signal }).catch((e: unknown) => e);
        };
        const after = async (id: string) => {
          const { operation, events } = await ledger.get({ tenant, id });
          const story = `events: ${events.map((e) => `${e.from}>${e.to}@${e.attempt} ${e.reason}`).join(" | ")}`;
          const alerted = (await ledger.daemon.alertsDue({ limit: 10 })).some((a) => a.id === id);
          return { operation, events, story, alerted };
        };
        /**
         * Attempt 1's request held out past its lease (its answer held after its effect, until
         * released), and the daemon's lookup finding nothing yet: pending, nothing sent.
         */
        const outPastLease = async () => {
          const release = p.hold("after");
          const first = run();
          await until(() => p.calls() === 1);
          clock.now += 31_000;
          const [op] = await ledger.admin.list({ tenant });
          expect(await settle(op!.id, true)).toMatchObject({ state: "pending" });
          return { first, id: op!.id, release };
        };
        return { p, ledger, tenant, clock, run, settle, after, outPastLease };
      }

      it("a lookup's finding parked, then the request's own storable receipt: recorded, noted, not alerted as two effects", async () => {
        // Attempt 1's request is out past its lease; the daemon's lookup (attempt 2) finds its effect,
        // whose receipt cannot be stored (parked). Attempt 1's own receipt, storable, is that effect.
        const { p, ledger, tenant, clock, run, settle, after } = await opened("known.found.fits");
        p.hold("before");
        const first = run();
        await until(() => p.effects.length === 1); // committed; the answer is held
        clock.now += 31_000;
        const [op] = await ledger.admin.list({ tenant });
        expect(await settle(op!.id)).toMatchObject({ name: "PayloadTooLargeError" });
        const parkedOp = (await ledger.get({ tenant, id: op!.id })).operation;
        expect(parkedOp).toMatchObject({ status: "needs_review", error: { kind: "invalid_result" } });
        expect(parkedOp.error).not.toHaveProperty("performedBy");
        await ledger.daemon.ackAlert(parkedOp);
        p.fit();
        p.release();
        const out = await first;
        const { operation, events, story, alerted } = await after(op!.id);
        expect(out, story).toMatchObject({ status: "succeeded", receipt: { id: "obj_1" }, replayed: false });
        expect(operation, story).toMatchObject({ status: "succeeded", result: { id: "obj_1" } });
        // Before: "two effects: attempt 1's request took effect, and an effect whose receipt could
        // not be stored was recorded before", alerted (the console's two_effects).
        expect(operation.reason, story).not.toMatch(/two effects/);
        expect(alerted, story).toBe(false);
        expect(events.at(-1)?.reason, story).toMatch(/a lookup's finding/);
        expect(p.effects, story).toHaveLength(1);
      });

      it("a request's own receipt parked, then another attempt's own storable receipt: two effects, alerted", async () => {
        // Attempt 1's request is out past its lease; a lookup finds nothing yet (pending); attempt 3
        // sends, its receipt too large (parked, its attempt named); then attempt 1's request takes
        // effect too, its receipt storable.
        const { p, ledger, tenant, run, after, outPastLease } = await opened("known.two.fits");
        const { first, id } = await outPastLease();
        expect(await run()).toMatchObject({ name: "PayloadTooLargeError" });
        const parkedOp = (await ledger.get({ tenant, id: id })).operation;
        expect(parkedOp).toMatchObject({ status: "needs_review", error: { performedBy: [3] } });
        await ledger.daemon.ackAlert(parkedOp);
        p.fit();
        p.release();
        const out = await first;
        const { operation, story, alerted } = await after(id);
        expect(p.effects, story).toHaveLength(2);
        expect(out, story).toMatchObject({ status: "succeeded", receipt: { id: "obj_2" } });
        expect(operation.reason, story).toMatch(/^two effects: attempt 1's request took effect/);
        expect(alerted, story).toBe(true);
      });

      it("another attempt's own receipt recorded, then a request's own receipt too large: two effects, alerted", async () => {
        // Attempt 1's request is out past its lease; a lookup finds nothing yet (pending); attempt 3
        // sends, its receipt storable (succeeded); then attempt 1's request takes effect too, its
        // receipt too large to store. A storable one that differs is alerted as a second effect.
        const { p, run, after, outPastLease } = await opened("known.settled.two");
        const { first, id } = await outPastLease();
        p.fit();
        expect(await run()).toMatchObject({ status: "succeeded", attempt: 3, receipt: { id: "obj_1" } });
        p.bloat();
        p.release();
        const out = await first;
        const { operation, events, story, alerted } = await after(id);
        expect(p.effects, story).toHaveLength(2);
        // Its caller is told its own effect happened, its receipt not recordable (named by the operation).
        expect(out, story).toMatchObject({ name: "PayloadTooLargeError", what: "result", operationId: id });
        // The row keeps the receipt it replays to every other caller.
        expect(operation, story).toMatchObject({ status: "succeeded", result: { id: "obj_1" } });
        // Before: only noted in the history ("fenced: attempt 1's effect happened but its receipt
        // cannot be stored"), no alert: a second charge nobody heard of.
        expect(operation.reason, story).toMatch(/^two effects: attempt 1's request took effect too/);
        expect(alerted, story).toBe(true);
        expect(
          events.filter((e) => e.reason?.startsWith("two effects")),
          story,
        ).toHaveLength(1);
      });

      it("another attempt's own receipt recorded, then a receipt too large deduped onto it by the provider: noted, not alerted", async () => {
        // The provider dedupes on our key: attempt 2, a replay with the same key after attempt 1's
        // lease ran out, makes the effect; attempt 1's request, inside the key's window, is
        // answered with that effect (its receipt too large). One effect: noted in the history.
        const clock = { now: Date.now() };
        const p = bloatedProvider("known.settled.deduped", { dedupe: true });
        const ledger: Ledger = await db.open({
          clock: () => clock.now,
          leaseMs: 30_000,
          maxResultBytes: 50,
          actions: [p.action],
          budget: { attempts: 1 },
        });
        const tenant = uniqueTenant();
        const run = () => ledger.run(p.action, { tenant, key: ["k"], args: { to: "x" } }).catch((e: unknown) => e);
        p.hold("after");
        const first = run();
        await until(() => p.calls() === 1);
        clock.now += 31_000;
        p.fit();
        expect(await run()).toMatchObject({ status: "succeeded", attempt: 2, receipt: { id: "obj_1" } });
        p.bloat();
        p.release();
        const out = await first;
        const [op] = await ledger.admin.list({ tenant });
        const { operation, events } = await ledger.get({ tenant, id: op!.id });
        const story = `events: ${events.map((e) => `${e.from}>${e.to}@${e.attempt} ${e.reason}`).join(" | ")}`;
        expect(p.effects, story).toHaveLength(1);
        expect(out, story).toMatchObject({ name: "PayloadTooLargeError", operationId: op!.id });
        expect(operation, story).toMatchObject({ status: "succeeded", result: { id: "obj_1" } });
        expect(operation.reason, story).not.toMatch(/two effects/);
        expect(
          (await ledger.daemon.alertsDue({ limit: 10 })).map((a) => a.id),
          story,
        ).not.toContain(op!.id);
        expect(
          events.filter((e) =>
            e.reason?.startsWith("fenced: attempt 1's effect happened but its receipt cannot be stored"),
          ),
          story,
        ).toHaveLength(1);
      });

      it("a lookup's finding parked, a request's own receipt too large, then another's storable: two effects, alerted", async () => {
        // Attempts 1 and 3 are both out; the daemon's lookup (attempt 4) finds an effect, receipt
        // too large (parked, no attempt named). Attempt 1's own receipt, too large, was only noted,
        // so attempt 3's storable one read the proof as the lookup's alone: one effect, unalerted.
        const { p, ledger, tenant, clock, run, settle, after, outPastLease } = await opened("known.three");
        const { first, id, release: release1 } = await outPastLease();
        const release3 = p.hold("before");
        const third = run();
        try {
          await until(() => p.effects.length === 1); // attempt 3 committed; its answer is held
          clock.now += 31_000;
          expect(await settle(id)).toMatchObject({ name: "PayloadTooLargeError" });
          release1(); // attempt 1's request takes effect too; its receipt cannot be stored
          expect(await first).toMatchObject({ name: "PayloadTooLargeError" });
          const parkedOp = (await ledger.get({ tenant, id: id })).operation;
          // Before: no attempt named, attempt 1's effect only noted in the history.
          expect(parkedOp).toMatchObject({ status: "needs_review", error: { performedBy: [1] } });
          expect(parkedOp.reason).not.toMatch(/two effects/);
        } finally {
          p.fit();
          release3();
        }
        const out = await third;
        const { operation, story, alerted } = await after(id);
        expect(p.effects, story).toHaveLength(2);
        expect(out, story).toMatchObject({ status: "succeeded", receipt: { id: "obj_1" } });
        expect(operation.reason, story).toMatch(/^two effects: attempt 3's request took effect/);
        expect(alerted, story).toBe(true);
      });
    });
  });
}
