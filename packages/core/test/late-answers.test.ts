/**
 * An attempt whose request is still out when its lease runs out, answering late: while or after
 * another attempt looks the effect up. Its answer must keep the operation from running again
 * (found by helper-56's review; each test failed first: two effects).
 */
import { describe, expect, it } from "vitest";
import { setTimeout as sleep } from "node:timers/promises";
import { defineAction, type Ledger } from "@idem/core";
import { ProviderError } from "./support/provider.js";
import { DIALECTS } from "@idem/testkit";
import { ledgers, uniqueTenant } from "./support/ledgers.js";

/** A provider without dedupe, with a consistent lookup: every execute that gets past `gate` is an effect. */
function slowProvider(type: string) {
  const effects: { key: string; id: string }[] = [];
  let calls = 0;
  let gate: Promise<void> | undefined;
  let open: () => void = () => {};
  let lookupGate: Promise<void> | undefined;
  let openLookup: () => void = () => {};
  let lookups = 0;
  let lateTimeout = false;
  const hold = () => {
    gate = new Promise<void>((r) => (open = r));
  };
  const action = defineAction<{ to: string }, { id: string; pad?: string }>({
    type,
    capabilities: { lookup: true },
    execute: async (_args, op) => {
      calls += 1;
      const g = gate;
      gate = undefined; // only the first call waits
      if (g) await g;
      const id = `obj_${effects.length + 1}`;
      effects.push({ key: op.key, id });
      if (g && lateTimeout) throw new Error("timeout after the request was sent");
      return { id, pad: "x".repeat(200) };
    },
    reconcile: async (_args, op) => {
      lookups += 1;
      // The provider reads its records now; the answer may reach us later (a slow read).
      const hit = effects.find((e) => e.key === op.key);
      const g = lookupGate;
      lookupGate = undefined;
      if (g) await g;
      return hit
        ? { found: true as const, receipt: { id: hit.id } }
        : { found: false as const, proof: "absent" as const, reason: "not at the provider" };
    },
  });
  return {
    action,
    effects,
    hold,
    release: () => open(),
    calls: () => calls,
    holdLookup: () => {
      lookupGate = new Promise<void>((r) => (openLookup = r));
    },
    releaseLookup: () => openLookup(),
    lookups: () => lookups,
    answerLateWithTimeout: () => {
      lateTimeout = true;
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
  describe(`late answers on ${dialect}`, () => {
    const db = ledgers(dialect);

    for (const size of ["small", "too large"] as const) {
      it(`a late attempt's ${size} receipt after a lookup proved absence keeps the operation from running again`, async () => {
        let now = Date.now();
        const clock = () => now;
        const p = slowProvider(`late.${size === "small" ? "s" : "l"}`);
        const ledger: Ledger = await db.open({
          clock,
          leaseMs: 30_000,
          maxResultBytes: size === "small" ? 10_000 : 50,
          actions: [p.action],
          budget: { attempts: 1 },
        });
        const tenant = uniqueTenant();
        p.hold();
        // Attempt 1 sends; its answer is slow and its lease runs out by the database clock.
        const first = ledger.run(p.action, { tenant, key: ["late"], args: { to: "x" } }).catch((e: unknown) => e);
        await until(() => p.calls() === 1);
        now += 31_000;
        const [op] = await ledger.admin.list({ tenant });
        // The daemon (stopping, so it does not execute at once) looks the effect up: not there yet.
        const stop = new AbortController();
        stop.abort();
        const settled = await ledger.daemon.settle({ tenant, id: op!.id, actor: "daemon", stop: stop.signal });
        expect(settled).toMatchObject({ status: "pending_verification", state: "pending" });
        // Attempt 1's request committed after all; its answer arrives late.
        p.release();
        const out = await first;
        const after = await ledger.get({ tenant, id: op!.id });
        // The next caller (or the daemon) must not run it again: the effect exists.
        const again = await ledger.run(p.action, { tenant, key: ["late"], args: { to: "x" } }).catch((e: unknown) => e);
        expect(
          { effects: p.effects.length, statusAfterLateAnswer: after.operation.status },
          `first: ${String((out as Error)?.name ?? JSON.stringify(out))}; again: ${JSON.stringify(again)}`,
        ).toEqual({ effects: 1, statusAfterLateAnswer: size === "small" ? "succeeded" : "needs_review" });
      });
    }

    for (const late of ["receipt", "timeout"] as const)
      it(`a late attempt's ${late} that arrives while the daemon's lookup holds the row is not lost: no second effect`, async () => {
        let now = Date.now();
        const p = slowProvider(`late.reconciling.${late}`);
        if (late === "timeout") p.answerLateWithTimeout();
        const ledger: Ledger = await db.open({
          clock: () => now,
          leaseMs: 30_000,
          actions: [p.action],
          budget: { attempts: 1 },
        });
        const tenant = uniqueTenant();
        p.hold();
        const first = ledger.run(p.action, { tenant, key: ["late2"], args: { to: "x" } }).catch((e: unknown) => e);
        await until(() => p.calls() === 1);
        now += 31_000; // attempt 1's lease ran out by the database clock; its request is still in flight
        const [op] = await ledger.admin.list({ tenant });
        // The daemon takes the row over and looks the effect up: the provider reads before attempt 1 commits.
        p.holdLookup();
        const stop = new AbortController();
        stop.abort(); // a stopping daemon: it looks up but sends nothing
        const settling = ledger.daemon.settle({ tenant, id: op!.id, actor: "daemon", stop: stop.signal });
        await until(() => p.lookups() === 1);
        // Attempt 1 commits and its receipt arrives while attempt 2 (the lookup) holds the row.
        p.release();
        const out = await first;
        // Then the lookup's answer (read before the commit) arrives: absent.
        p.releaseLookup();
        const settled = await settling;
        const after = await ledger.get({ tenant, id: op!.id });
        if (late === "receipt") {
          // The receipt proves the effect: it settles the row though the lookup held it (helper-71's
          // explorer: only noted, it could be lost to what the holder wrote next).
          expect(out).toMatchObject({ status: "succeeded", receipt: { id: "obj_1" }, replayed: false });
          expect(settled).toMatchObject({ status: "succeeded", receipt: { id: "obj_1" } });
          expect({ effects: p.effects.length, status: after.operation.status }).toEqual({
            effects: 1,
            status: "succeeded",
          });
          return;
        }
        // The lookup read the provider before the commit: its "absent" proves nothing now (before:
        // pending, "known not done", and the next caller did it again).
        expect(settled).toMatchObject({ state: "unknown" });
        // The daemon's next check finds the effect: attempt 1's.
        const again = await ledger.daemon.settle({ tenant, id: op!.id, actor: "daemon" });
        expect(
          { effects: p.effects.length, status: after.operation.status, again: again.status },
          `first: ${JSON.stringify(out)}; settled: ${JSON.stringify(settled)}; again: ${JSON.stringify(again)}; events: ${after.events.map((e) => `${e.from}>${e.to}@${e.attempt} ${e.reason}`).join(" | ")}`,
        ).toEqual({ effects: 1, status: "unknown", again: "succeeded" });
        expect(again).toMatchObject({ receipt: { id: "obj_1" } });
      });

    for (const size of ["small", "too large"] as const)
      it(`a late attempt's ${size} receipt after a later attempt failed: the effect happened, so the operation is not 'failed'`, async () => {
        // helper-63's review: attempt 3 is refused (an "already exists", say, as attempt 1 committed
        // meanwhile); attempt 1's receipt then arrives. Before: every caller read failed, the caller
        // that performed the effect too (replayed), with the effect at the provider.
        let now = Date.now();
        const p = slowProvider(`late.failed.${size === "small" ? "s" : "l"}`);
        const refusing = defineAction<{ to: string }, { id: string }>({
          type: p.action.type,
          capabilities: { lookup: true },
          execute: async () => {
            throw new ProviderError({ kind: "permanent", reason: "validation: refused" });
          },
          classify: (e) => (e instanceof ProviderError ? e.cls : { kind: "ambiguous", reason: String(e) }),
          reconcile: p.action.reconcile!,
        });
        const ledger: Ledger = await db.open({
          clock: () => now,
          leaseMs: 30_000,
          maxResultBytes: size === "small" ? 10_000 : 50,
          actions: [p.action],
          budget: { attempts: 1 },
        });
        const tenant = uniqueTenant();
        p.hold();
        const first = ledger.run(p.action, { tenant, key: ["k"], args: { to: "x" } }).catch((e: unknown) => e);
        await until(() => p.calls() === 1);
        now += 31_000;
        const [op] = await ledger.admin.list({ tenant });
        const stop = new AbortController();
        stop.abort();
        expect(await ledger.daemon.settle({ tenant, id: op!.id, actor: "daemon", stop: stop.signal })).toMatchObject({
          state: "pending",
        });
        expect(await ledger.run(refusing, { tenant, key: ["k"], args: { to: "x" } })).toMatchObject({
          status: "failed",
        });
        p.release();
        const out = await first;
        const after = await ledger.get({ tenant, id: op!.id });
        const again = await ledger.run(p.action, { tenant, key: ["k"], args: { to: "x" } });
        const story = `first: ${JSON.stringify(out)}; events: ${after.events.map((e) => `${e.from}>${e.to}@${e.attempt} ${e.reason}`).join(" | ")}`;
        expect(p.effects, story).toHaveLength(1);
        if (size === "small") {
          expect(out, story).toMatchObject({ status: "succeeded", receipt: { id: "obj_1" }, replayed: false });
          expect(again, story).toMatchObject({ status: "succeeded", receipt: { id: "obj_1" } });
        } else {
          // A receipt that cannot be stored: a person decides, alerted.
          expect(after.operation.status, story).toBe("needs_review");
          expect(
            (await ledger.daemon.alertsDue({ limit: 10 })).map((a) => a.id),
            story,
          ).toContain(op!.id);
          // The effect happened: "run it again" is refused (helper-63: it was accepted, and sent again).
          await expect(
            ledger.admin.retry({ tenant, id: op!.id, actor: "alice", reason: "looks stuck" }),
          ).rejects.toMatchObject({
            name: "InvalidTransitionError",
            message: expect.stringMatching(/effect happened/),
          });
          expect(again.status, story).toBe("pending_verification");
        }
      });

    for (const verdict of ["retry", "resolve failed"] as const)
      it(`a person's ${verdict} decided on a view from before a late 'may have committed' end is refused`, async () => {
        // helper-63's review: attempt 1's request, out past its lease, commits after the daemon
        // parked the row for a person and the person loaded it; its answer is a timeout. Before:
        // the decision with that view was accepted (retry: sent again, two effects; resolve
        // failed: every caller read failed, with the effect at the provider).
        let now = Date.now();
        const p = slowProvider(`late.seen.${verdict === "retry" ? "r" : "f"}`);
        const plain = defineAction<{ to: string }, { id: string }>({
          type: p.action.type,
          capabilities: {},
          execute: p.action.execute,
        });
        const ledger: Ledger = await db.open({
          clock: () => now,
          leaseMs: 30_000,
          actions: [plain],
          budget: { attempts: 1 },
        });
        const tenant = uniqueTenant();
        p.hold();
        p.answerLateWithTimeout();
        const first = ledger.run(plain, { tenant, key: ["k"], args: { to: "x" } }).catch((e: unknown) => e);
        await until(() => p.calls() === 1);
        now += 31_000;
        const [op] = await ledger.admin.list({ tenant });
        expect(await ledger.daemon.settle({ tenant, id: op!.id, actor: "daemon" })).toMatchObject({
          state: "needs_review",
        });
        const seen = (await ledger.get({ tenant, id: op!.id })).operation; // nothing at the provider yet
        p.release();
        await first;
        const reason = "nothing at the provider";
        const decision =
          verdict === "retry"
            ? ledger.admin.retry({ tenant, id: op!.id, actor: "alice", reason, seen })
            : ledger.admin.resolve({ tenant, id: op!.id, actor: "alice", reason, outcome: "failed", seen });
        await expect(decision).rejects.toThrow();
        expect((await ledger.get({ tenant, id: op!.id })).operation.status).toBe("needs_review");
        expect(p.effects).toHaveLength(1);
      });

    for (const late of ["receipt", "timeout"] as const)
      it(`a late ${late} while a later attempt holds the row, which then fails before sending: not run a third time`, async () => {
        // helper-71's explorer (seeds 9115, 8961, ...): attempt 1's answer came while attempt 3
        // held the row; it was only noted, and attempt 3's "503 before execution" then made the
        // row pending, known not done: the next caller sent again (two effects).
        let now = Date.now();
        const p = slowProvider(`late.held.${late === "receipt" ? "r" : "t"}`);
        let open3: () => void = () => {};
        const gate3 = new Promise<void>((r) => (open3 = r));
        let entered3 = false;
        const unavailable = defineAction<{ to: string }, { id: string }>({
          type: p.action.type,
          capabilities: { lookup: true },
          execute: async () => {
            entered3 = true;
            await gate3;
            throw new ProviderError({ kind: "transient", reason: "503 before execution" });
          },
          classify: (e) => (e instanceof ProviderError ? e.cls : { kind: "ambiguous", reason: String(e) }),
          reconcile: p.action.reconcile!,
        });
        const ledger: Ledger = await db.open({
          clock: () => now,
          leaseMs: 30_000,
          actions: [p.action],
          budget: { attempts: 1 },
        });
        const tenant = uniqueTenant();
        p.hold();
        if (late === "timeout") p.answerLateWithTimeout();
        const first = ledger.run(p.action, { tenant, key: ["k"], args: { to: "x" } }).catch((e: unknown) => e);
        await until(() => p.calls() === 1);
        now += 31_000;
        const [op] = await ledger.admin.list({ tenant });
        const stop = new AbortController();
        stop.abort();
        expect(await ledger.daemon.settle({ tenant, id: op!.id, actor: "daemon", stop: stop.signal })).toMatchObject({
          state: "pending",
        });
        const third = ledger.run(unavailable, { tenant, key: ["k"], args: { to: "x" } });
        await until(() => entered3);
        p.release(); // attempt 1 commits and answers while attempt 3 holds the row
        const out = await first;
        open3();
        const thirdOut = await third;
        const again = await ledger.run(p.action, { tenant, key: ["k"], args: { to: "x" }, waitMs: 0 });
        const settled = await ledger.daemon.settle({ tenant, id: op!.id, actor: "daemon" });
        const after = await ledger.get({ tenant, id: op!.id });
        const story = `first: ${JSON.stringify(out)}; third: ${JSON.stringify(thirdOut)}; again: ${JSON.stringify(again)}; settled: ${JSON.stringify(settled)}; events: ${after.events.map((e) => `${e.from}>${e.to}@${e.attempt} ${e.reason}`).join(" | ")}`;
        expect(p.effects, story).toHaveLength(1);
        expect(after.operation.status, story).toBe("succeeded");
      });

    for (const verdict of ["a later attempt's refusal", "a person's failed"] as const)
      it(`a late 'may have committed' end after ${verdict}: a person decides, not 'failed' with the effect there`, async () => {
        // helper-71's explorer (seed 4393): the failure was replayed to every caller, attempt 1's too.
        let now = Date.now();
        const p = slowProvider(`late.afterfail.${verdict.startsWith("a person") ? "p" : "r"}`);
        const refusing = defineAction<{ to: string }, { id: string }>({
          type: p.action.type,
          capabilities: { lookup: true },
          execute: async () => {
            throw new ProviderError({ kind: "permanent", reason: "refused: already exists" });
          },
          classify: (e) => (e instanceof ProviderError ? e.cls : { kind: "ambiguous", reason: String(e) }),
          reconcile: p.action.reconcile!,
        });
        const plain = defineAction<{ to: string }, { id: string }>({
          type: p.action.type,
          capabilities: {},
          execute: p.action.execute,
        });
        const person = verdict.startsWith("a person");
        const ledger: Ledger = await db.open({
          clock: () => now,
          leaseMs: 30_000,
          actions: [person ? plain : p.action],
          budget: { attempts: 1 },
        });
        const tenant = uniqueTenant();
        p.hold();
        p.answerLateWithTimeout();
        const first = ledger
          .run(person ? plain : p.action, { tenant, key: ["k"], args: { to: "x" } })
          .catch((e: unknown) => e);
        await until(() => p.calls() === 1);
        now += 31_000;
        const [op] = await ledger.admin.list({ tenant });
        if (person) {
          // Parked for a person, who finds nothing at the provider and resolves it failed.
          expect(await ledger.daemon.settle({ tenant, id: op!.id, actor: "daemon" })).toMatchObject({
            state: "needs_review",
          });
          const seen = (await ledger.get({ tenant, id: op!.id })).operation;
          await ledger.admin.resolve({
            tenant,
            id: op!.id,
            actor: "alice",
            reason: "nothing there",
            outcome: "failed",
            seen,
          });
        } else {
          const stop = new AbortController();
          stop.abort();
          await ledger.daemon.settle({ tenant, id: op!.id, actor: "daemon", stop: stop.signal });
          expect(await ledger.run(refusing, { tenant, key: ["k"], args: { to: "x" } })).toMatchObject({
            status: "failed",
          });
        }
        p.release(); // attempt 1 commits; its answer is a timeout
        const out = await first;
        const after = await ledger.get({ tenant, id: op!.id });
        const story = `first: ${JSON.stringify(out)}; events: ${after.events.map((e) => `${e.from}>${e.to}@${e.attempt} ${e.reason}`).join(" | ")}`;
        expect(p.effects, story).toHaveLength(1);
        expect(after.operation.status, story).toBe("needs_review");
        expect(after.operation.expiresAt, story).toBeNull(); // not pruned as a settled operation
        expect(
          (await ledger.daemon.alertsDue({ limit: 10 })).map((a) => a.id),
          story,
        ).toContain(op!.id);
        expect(out, story).toMatchObject({ status: "pending_verification", state: "needs_review" });
      });
  });
}
