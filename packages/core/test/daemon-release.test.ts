/**
 * `ledger.daemon.release` on SQLite and Postgres: a daemon that stops before settling what it
 * claimed gives the rows back at once (another daemon claims them now, not `claimMs` later), and
 * only the rows that still carry its claim. And the bounds a daemon puts on a settlement within
 * its claim (`settle`'s `timeoutMs` and `budget`), so that the rest can be settled or given back.
 */
import { describe, expect, it } from "vitest";
import { InvalidValueError, defineAction, type Ledger } from "@idem/core";
import { openTestLedger } from "@idem/core/testing";
import { DIALECTS, freshDatabase } from "@idem/testkit";
import { uniqueTenant } from "./support/ledgers.js";
import { TestProvider } from "./support/provider.js";

const HOUR = 3_600_000;

/** An action whose execute waits for `open(key)`: its worker holds the row running until then. */
function held() {
  const gates = new Map<string, () => void>();
  const entered = new Map<string, () => void>();
  const waits = new Map<string, Promise<void>>();
  const ids = new Map<string, string>();
  const action = defineAction<{ name: string }, { ok: true }>({
    type: "held",
    capabilities: {},
    execute: async (args, op) => {
      ids.set(args.name, op.id);
      await new Promise<void>((resolve) => {
        gates.set(args.name, resolve);
        entered.get(args.name)?.();
      });
      return { ok: true };
    },
  });
  return {
    action,
    /** Resolves with its operation's id once the worker of `name` is inside execute (its row is running). */
    running: async (name: string) => {
      if (!waits.has(name))
        waits.set(name, gates.has(name) ? Promise.resolve() : new Promise((r) => entered.set(name, r)));
      await waits.get(name);
      return ids.get(name)!;
    },
    open: (name: string) => gates.get(name)?.(),
  };
}

for (const dialect of DIALECTS) {
  describe(`releasing a daemon's claim on ${dialect}`, () => {
    it("gives back the rows still under the claim (running with a dead lease, unknown): another daemon claims them at once; rows changed since keep what was set", async () => {
      // A database of its own: claimDue works across tenants.
      const url = await freshDatabase(dialect);
      const tenant = uniqueTenant();
      const p = new TestProvider();
      p.lookupAnswer = "inconclusive";
      const mail = p.action("mail", { lookup: true });
      const h = held();
      const opened: Ledger[] = [];
      const open = async (offsetMs: number) => {
        const l = await openTestLedger(url, { actions: [mail], clock: () => Date.now() + offsetMs, poolSize: 2 });
        opened.push(l);
        return l;
      };
      const worker = await openTestLedger(url, { budget: { attempts: 1, baseDelayMs: 20 }, poolSize: 2 });
      opened.push(worker);
      const runs: Promise<unknown>[] = [];
      try {
        // Two unknown outcomes, and two workers holding their rows running.
        const unknown: string[] = [];
        for (const k of ["u1", "u2"]) {
          p.faults.push({ when: "after", cls: { kind: "ambiguous", reason: "timeout" } });
          unknown.push((await worker.run(mail, { tenant, key: [k], args: { to: "x" } })).operationId);
        }
        const [r1, r2] = (await Promise.all(
          ["r1", "r2"].map((name) => {
            runs.push(worker.run(h.action, { tenant, key: [name], args: { name } }));
            return h.running(name);
          }),
        )) as [string, string];
        expect((await worker.admin.list({ tenant, status: "running" })).map((o) => o.id).sort()).toEqual(
          [r1, r2].sort(),
        );

        // A daemon an hour later: every lease has ended, every check is due. It claims all four.
        const a = await open(HOUR);
        const mine = await a.daemon.claimDue({ limit: 10, claimMs: 60_000 });
        expect(mine.map((r) => r.id).sort()).toEqual([...unknown, r1, r2].sort());
        for (const r of mine) expect((await a.get({ tenant, id: r.id })).operation.nextCheckAt).toBe(r.claimedUntil);
        const b = await open(HOUR);
        expect(await b.daemon.claimDue({ limit: 10, claimMs: 60_000 })).toEqual([]); // hidden by the claim

        // Meanwhile others change two of them: r2's worker finishes (no longer running), and
        // someone checks u2 again (still unknown, its next check theirs, set by a clock further on).
        h.open("r2");
        await runs[1];
        const someone = await open(2 * HOUR);
        await someone.daemon.settle({ tenant, id: unknown[1]! });
        const changed = await Promise.all([r2, unknown[1]!].map(async (id) => (await a.get({ tenant, id })).operation));
        expect(changed.map((o) => o.status)).toEqual(["succeeded", "unknown"]);
        expect(changed[1]!.nextCheckAt).not.toBe(mine.find((r) => r.id === unknown[1])!.claimedUntil);

        // The daemon stops without settling any: it gives back the two still under its claim.
        expect(await a.daemon.release(mine)).toBe(2);
        const theirs = await b.daemon.claimDue({ limit: 10, claimMs: 60_000 });
        expect(theirs.map((r) => r.id).sort()).toEqual([r1, unknown[0]!].sort());
        expect(theirs.find((r) => r.id === r1)?.status).toBe("running");
        for (const before of changed) {
          const after = (await a.get({ tenant, id: before.id })).operation;
          expect({ status: after.status, nextCheckAt: after.nextCheckAt }).toEqual({
            status: before.status,
            nextCheckAt: before.nextCheckAt,
          });
        }
        // Released again, nothing happens: the rows carry b's claim now, not a's.
        expect(await a.daemon.release(mine)).toBe(0);
        expect(await b.daemon.release(theirs)).toBe(2);
      } finally {
        h.open("r1");
        h.open("r2");
        await Promise.allSettled(runs);
        await Promise.all(opened.map((l) => l.close()));
      }
    });
  });

  describe(`a settlement's bounds on ${dialect}`, () => {
    it("a lookup given up at its bound is told so: its signal aborts, so its request does not run on unseen", async () => {
      const tenant = uniqueTenant();
      const signals: AbortSignal[] = [];
      const lookup = defineAction<{ to: string }, { id: string }>({
        type: "mail.hung-lookup",
        capabilities: { lookup: true },
        execute: async () => {
          throw new Error("timeout after DATA");
        },
        reconcile: (_args, op) => {
          signals.push(op.signal);
          return new Promise(() => {}); // never answers, whatever its signal says
        },
      });
      const url = await freshDatabase(dialect);
      const ledger = await openTestLedger(url, { actions: [lookup], poolSize: 2, budget: { attempts: 1 } });
      try {
        const { operationId: id } = await ledger.run(lookup, { tenant, key: ["k"], args: { to: "x" } });
        expect(await ledger.daemon.settle({ tenant, id, timeoutMs: 200 })).toMatchObject({ state: "unknown" });
        // Before: never aborted; the request ran on in the background, for as long as it hung.
        expect(signals.map((s) => s.aborted)).toEqual([true]);
      } finally {
        // The lookup never answers: closed without waiting a lease (30 s) for it.
        await ledger.close({ waitMs: 0 });
      }
    });

    it("timeoutMs: a lookup that hangs is given up by then, unknown with one check more", async () => {
      const tenant = uniqueTenant();
      const p = new TestProvider();
      const mail = p.action("mail", { lookup: true });
      const url = await freshDatabase(dialect);
      const ledger = await openTestLedger(url, { actions: [mail], poolSize: 2, budget: { attempts: 1 } });
      try {
        p.faults.push({ when: "after", cls: { kind: "ambiguous", reason: "timeout" } });
        const { operationId: id } = await ledger.run(mail, { tenant, key: ["k"], args: { to: "x" } });
        p.lookupAnswer = "hang"; // and ignores its signal: a client with no timeout
        const started = performance.now();
        const out = await ledger.daemon.settle({ tenant, id, timeoutMs: 300 });
        // The ledger's budget gives a lookup 30 s: a daemon's claim may end well before.
        expect(performance.now() - started).toBeLessThan(10_000);
        expect(out).toMatchObject({ status: "pending_verification", state: "unknown" });
        const { operation } = await ledger.get({ tenant, id });
        expect(operation).toMatchObject({ status: "unknown", checks: 1 });
        expect(operation.reason).toMatch(/^inconclusive: lookup failed: .*no answer within 300 ms/);
        // Bounds that are not whole numbers of ms (or executions) are refused, the row untouched.
        await expect(ledger.daemon.settle({ tenant, id, timeoutMs: 0 })).rejects.toThrow(InvalidValueError);
        await expect(ledger.daemon.settle({ tenant, id, budget: { attempts: 0 } })).rejects.toThrow(InvalidValueError);
        expect((await ledger.get({ tenant, id })).operation).toMatchObject({ status: "unknown", checks: 1 });
      } finally {
        // The lookup never answers: closed without waiting a lease (30 s) for it.
        await ledger.close({ waitMs: 0 });
      }
    });

    it("a settlement that waited out its own backoff executes again, though the database's clock says it is a little early", async () => {
      // The process's timers can end a wait before the database's clock has moved as far (under
      // load, a timer counts from the loop's cached time): here the database's clock runs at half
      // the speed of the timers, so every wait ends early by its database time.
      const start = Date.now();
      const tenant = uniqueTenant();
      const p = new TestProvider();
      const mail = p.action("mail", {});
      const url = await freshDatabase(dialect);
      const ledger = await openTestLedger(url, {
        actions: [mail],
        poolSize: 2,
        budget: { baseDelayMs: 20 },
        clock: () => start + Math.floor((Date.now() - start) / 2),
      });
      try {
        const transient = { when: "before", cls: { kind: "transient", reason: "503" } } as const;
        p.faults.push(transient);
        const first = await ledger.run(mail, { tenant, key: ["k"], args: { to: "x" }, budget: { attempts: 1 } });
        expect(first).toMatchObject({ state: "pending" });
        p.faults.push(transient, transient);
        const out = await ledger.daemon.settle({ tenant, id: first.operationId });
        // Its budget's three executions: two transient answers, then the effect.
        expect({ executions: p.calls - 1, status: out.status }).toEqual({ executions: 3, status: "succeeded" });
        expect(p.effects).toHaveLength(1);
      } finally {
        await ledger.close();
      }
    });

    it("budget: { attempts: 1 } executes once, whatever it answers; the next settlement tries again", async () => {
      const tenant = uniqueTenant();
      const p = new TestProvider();
      const mail = p.action("mail", {});
      const url = await freshDatabase(dialect);
      const ledger = await openTestLedger(url, { actions: [mail], poolSize: 2, budget: { baseDelayMs: 1 } });
      try {
        const transient = { when: "before", cls: { kind: "transient", reason: "503" } } as const;
        p.faults.push(transient);
        const first = await ledger.run(mail, { tenant, key: ["k"], args: { to: "x" }, budget: { attempts: 1 } });
        expect(first).toMatchObject({ state: "pending" });
        p.faults.push(transient, transient, transient);
        const calls = p.calls;
        const out = await ledger.daemon.settle({ tenant, id: first.operationId, budget: { attempts: 1 } });
        expect({ executions: p.calls - calls, out: out.status === "pending_verification" && out.state }).toEqual({
          executions: 1,
          out: "pending",
        });
        // Without it, the ledger's budget: three executions.
        await ledger.daemon.settle({ tenant, id: first.operationId });
        expect(p.calls - calls).toBe(4);
      } finally {
        await ledger.close();
      }
    });
  });
}
