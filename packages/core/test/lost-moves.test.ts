/**
 * An attempt's end (failed, pending, unknown, parked for a person) that the database committed but
 * whose answer never reached us (a connection cut after the commit). The write is retried through
 * the outage (`durably`) and the retry matches nothing: the row is already where it put it. The
 * call must answer as if the first answer had arrived, not "moved meanwhile by a person or the
 * daemon", nor "failed earlier and not tried again", and the history must not record a fence.
 */
import { describe, expect, it } from "vitest";
import { setTimeout as sleep } from "node:timers/promises";
import type { CompiledQuery } from "kysely";
import { defineAction, type Classification, type Ledger, type Operation, type OperationEvent } from "@idem/core";
import { openTestLedger, type TestLedgerOptions } from "@idem/core/testing";
import { DIALECTS } from "@idem/testkit";
import { dialectFor, hooked } from "./support/dialects.js";
import { ledgers, uniqueTenant } from "./support/ledgers.js";
import { answering, TestProvider } from "./support/provider.js";

const isMove = (q: CompiledQuery, to: string, reason: string) =>
  q.sql.startsWith('update "idem_operations" set "status"') &&
  q.parameters.includes(to) &&
  q.parameters.some((p) => typeof p === "string" && p.includes(reason));

const story = (events: readonly OperationEvent[]) =>
  events.map((e) => `${e.from}>${e.to}@${e.attempt} ${e.reason}`).join(" | ");

/**
 * A move's answer lost after its commit, or the database unreachable for the move (nothing
 * committed); or, `read`, unreachable for the read of the row that comes before it.
 */
type Fault = "lost" | "outage" | "read";
const FAULTS: readonly Fault[] = ["lost", "outage"];

/** The store's read of one operation by its id (`findById`): what a late end decides its move on. */
const isReadById = (q: CompiledQuery) =>
  q.sql.startsWith("select") && /from "idem_operations" where "tenant_id" = (\?|\$1) and "id" = (\?|\$2)$/.test(q.sql);
// Matched no row: a takeover's UPDATE ... RETURNING answers its row (SQLite counts no affected rows for it).
const isRefusedMove = (q: CompiledQuery, out: { numAffectedRows?: bigint; rows: unknown[] }) =>
  q.sql.startsWith('update "idem_operations" set "status"') &&
  Number(out.numAffectedRows ?? 0) === 0 &&
  out.rows.length === 0;

/**
 * A late end: what attempt 3 (run from pending, after the daemon's lookup proved absence) is
 * answered, and whether attempt 1's timeout comes while attempt 3's request is out; the move whose
 * answer is lost; and what the caller that reads it (attempt 1's, or attempt 3's) gets.
 */
interface LateEnd {
  name: string;
  third?: { cls: Classification; during: boolean };
  move: [string, string];
  reader: "first" | "third";
  out: Record<string, unknown>;
}

for (const dialect of DIALECTS) {
  describe(`an attempt's end whose answer was lost after it committed (${dialect})`, () => {
    const db = ledgers(dialect);
    const opened: Ledger[] = [];

    /**
     * A ledger whose first move to `to` with `reason` in it commits, then fails as a connection
     * cut after the commit does (the answer is lost); or, `outage`, fails before it ran (the
     * database briefly unreachable: nothing committed); or, `read`, runs, but while it has not,
     * the read by id that follows a move refused (the row moved meanwhile) fails as unreachable:
     * the read a late end decides its move on. `lost()` counts the statements failed. `refusedMs`
     * (with `lost`): the same move is then refused as unreachable for that long (an outage after
     * the lost answer, through which the retries fail), not counted in `lost()`.
     */
    async function lossy(to: string, reason: string, options: TestLedgerOptions, fault: Fault = "lost", refusedMs = 0) {
      await (await db.open()).close(); // migrated
      let lost = 0;
      let lostAt = 0;
      let moved = false;
      let refused = false;
      const dialectWithLoss = hooked(await dialectFor(dialect, db.url()), {
        async query(q, run) {
          if (fault === "read") {
            if (refused && isReadById(q)) {
              refused = false;
              lost += 1;
              throw new Error("connection refused (test)");
            }
            const out = await run();
            if (isMove(q, to, reason)) moved = true;
            else if (!moved && isRefusedMove(q, out)) refused = true;
            return out;
          }
          if (fault === "outage" && lost === 0 && isMove(q, to, reason)) {
            lost += 1;
            throw new Error("connection refused (test)");
          }
          if (fault === "lost" && lost > 0 && Date.now() - lostAt < refusedMs && isMove(q, to, reason))
            throw new Error("connection refused (test)");
          const out = await run();
          if (fault === "outage" || lost > 0 || !isMove(q, to, reason)) return out;
          lost += 1;
          lostAt = Date.now();
          throw new Error("connection reset after commit (test)");
        },
      });
      const ledger = await openTestLedger(dialectWithLoss, options);
      opened.push(ledger);
      return { ledger, lost: () => lost };
    }

    const close = async () => {
      for (const l of opened.splice(0)) await l.close();
    };

    it("a refusal recorded as failed: the caller reads its own failure, not one replayed from earlier", async () => {
      try {
        const p = new TestProvider();
        const action = p.action("lost.failed", {});
        p.faults.push({ when: "before", cls: { kind: "permanent", reason: "validation: refused" } });
        const { ledger, lost } = await lossy("failed", "validation: refused", { actions: [action] });
        const tenant = uniqueTenant();
        const out = await ledger.run(action, { tenant, key: ["k"], args: { to: "a" } });
        const { operation, events } = await ledger.get({ tenant, id: out.operationId });
        expect(lost()).toBe(1);
        // Before: replayed true ("It failed earlier and was not tried again"), and a fence in the history.
        expect(out, story(events)).toMatchObject({
          status: "failed",
          replayed: false,
          attempt: 1,
          error: { reason: "validation: refused" },
        });
        expect(operation.status).toBe("failed");
        expect(
          events.filter((e) => e.reason?.startsWith("fenced")),
          story(events),
        ).toEqual([]);
        expect(p.calls).toBe(1);
      } finally {
        await close();
      }
    });

    it("a refusal whose reason holds a lone surrogate: its own failure, not a fence, recorded as failed: its own failure", async () => {
      try {
        const p = new TestProvider();
        const action = p.action("lost.failed.cut", {});
        p.faults.push({ when: "before", cls: { kind: "permanent", reason: "validation: refused \uD83D" } });
        const { ledger, lost } = await lossy("failed", "validation: refused", { actions: [action] });
        const tenant = uniqueTenant();
        const out = await ledger.run(action, { tenant, key: ["k"], args: { to: "a" } });
        const { events } = await ledger.get({ tenant, id: out.operationId });
        expect(lost()).toBe(1);
        expect(out, story(events)).toMatchObject({ status: "failed", replayed: false, attempt: 1 });
        expect(
          events.filter((e) => e.reason?.startsWith("fenced")),
          story(events),
        ).toEqual([]);
      } finally {
        await close();
      }
    });

    it("a 503 before execution recorded as pending: the call goes on to its next attempt, not 'moved meanwhile'", async () => {
      try {
        const p = new TestProvider();
        const action = p.action("lost.pending", {});
        p.faults.push({ when: "before", cls: { kind: "transient", reason: "503 before execution" } });
        const { ledger, lost } = await lossy("pending", "503 before execution", {
          actions: [action],
          budget: { attempts: 2, baseDelayMs: 1, maxDelayMs: 2 },
        });
        const tenant = uniqueTenant();
        const out = await ledger.run(action, { tenant, key: ["k"], args: { to: "a" } });
        const { events } = await ledger.get({ tenant, id: out.operationId });
        expect(lost()).toBe(1);
        // Before: pending_verification, "attempt 1 was moved meanwhile (by a person or the daemon)".
        expect(out, story(events)).toMatchObject({ status: "succeeded", replayed: false, attempt: 2 });
        expect(
          events.filter((e) => e.reason?.startsWith("fenced")),
          story(events),
        ).toEqual([]);
        expect(p.effects).toHaveLength(1);
      } finally {
        await close();
      }
    });

    it("a timeout after the body recorded as unknown: the call goes on to look it up, not 'moved meanwhile'", async () => {
      try {
        const p = new TestProvider();
        const action = p.action("lost.unknown", { lookup: true });
        p.faults.push({ when: "after", cls: { kind: "ambiguous", reason: "timeout after the body" } });
        const { ledger, lost } = await lossy("unknown", "timeout after the body", {
          actions: [action],
          budget: { attempts: 2, baseDelayMs: 1, maxDelayMs: 2 },
        });
        const tenant = uniqueTenant();
        const out = await ledger.run(action, { tenant, key: ["k"], args: { to: "a" } });
        const { events } = await ledger.get({ tenant, id: out.operationId });
        expect(lost()).toBe(1);
        expect(out, story(events)).toMatchObject({ status: "succeeded", receipt: { id: "obj_1" } });
        expect(
          events.filter((e) => e.reason?.startsWith("fenced")),
          story(events),
        ).toEqual([]);
        expect(p.effects).toHaveLength(1);
      } finally {
        await close();
      }
    });

    it("a receipt too large to store, parked for a person: one proof, one alert, no fence and no 'two effects'", async () => {
      try {
        const p = new TestProvider();
        const action = p.action("lost.unstorable", {});
        const { ledger, lost } = await lossy("needs_review", "receipt cannot be stored", {
          actions: [action],
          maxResultBytes: 5,
        });
        const tenant = uniqueTenant();
        const err = await ledger.run(action, { tenant, key: ["k"], args: { to: "a" } }).catch((e: unknown) => e);
        expect(err).toMatchObject({ name: "PayloadTooLargeError" });
        const [op] = await ledger.admin.list({ tenant });
        const { operation, events } = await ledger.get({ tenant, id: op!.id });
        expect(lost()).toBe(1);
        expect(operation, story(events)).toMatchObject({ status: "needs_review", error: { kind: "invalid_result" } });
        expect(operation.reason, story(events)).not.toMatch(/two effects/);
        // Before: a second event, "fenced: attempt 1's effect happened but …", for its own write.
        expect(
          events.filter((e) => e.to === "needs_review"),
          story(events),
        ).toHaveLength(1);
        expect(p.effects).toHaveLength(1);
      } finally {
        await close();
      }
    });

    it("a second effect alerted on a settled operation: one 'two effects' event, not one per retry of the write", async () => {
      // As late-answers' "two different receipts": attempt 1's late receipt settles the row attempt
      // 3 holds, then attempt 3's own request takes effect too. The move that says so keeps the
      // status, so a retry after its commit matched the row again and wrote it twice.
      try {
        let now = Date.now();
        const effects: { key: string; id: string }[] = [];
        const opens: (() => void)[] = [];
        const gates = [0, 1].map(() => new Promise<void>((r) => opens.push(r)));
        let calls = 0;
        const action = defineAction<{ to: string }, { id: string }>({
          type: "lost.two",
          capabilities: { lookup: true },
          execute: async (_a, op) => {
            await gates[calls++];
            const id = `obj_${effects.length + 1}`;
            effects.push({ key: op.key, id });
            return { id };
          },
          reconcile: async (_a, op) => {
            const hit = effects.find((e) => e.key === op.key);
            return hit
              ? { found: true as const, receipt: { id: hit.id } }
              : { found: false as const, proof: "absent" as const, reason: "not at the provider" };
          },
        });
        const { ledger, lost } = await lossy("succeeded", "two effects", {
          clock: () => now,
          leaseMs: 30_000,
          actions: [action],
          budget: { attempts: 1 },
        });
        const tenant = uniqueTenant();
        const first = ledger.run(action, { tenant, key: ["k"], args: { to: "x" } });
        while (calls < 1) await sleep(5);
        now += 31_000;
        const [op] = await ledger.admin.list({ tenant });
        const stop = new AbortController();
        stop.abort();
        await ledger.daemon.settle({ tenant, id: op!.id, actor: "daemon", stop: stop.signal });
        const third = ledger.run(action, { tenant, key: ["k"], args: { to: "x" } });
        while (calls < 2) await sleep(5);
        opens[0]!();
        await first;
        opens[1]!();
        const thirdOut = await third;
        const { operation, events } = await ledger.get({ tenant, id: op!.id });
        expect(lost()).toBe(1);
        expect(thirdOut, story(events)).toMatchObject({
          status: "succeeded",
          receipt: { id: "obj_2" },
          replayed: false,
        });
        expect(operation.reason, story(events)).toMatch(/^two effects: attempt 3's request took effect too/);
        expect(
          events.filter((e) => e.reason?.startsWith("two effects")),
          story(events),
        ).toHaveLength(1);
      } finally {
        await close();
      }
    });

    // A second effect whose receipt cannot be stored, on a settled operation: attempt 1's request is
    // out past its lease; a lookup finds nothing yet; attempt 3's request takes effect, its receipt
    // recorded; then attempt 1's takes effect too, its receipt too large to store. The alert keeps
    // the status: a retry after its commit must match nothing. With `refusedMs`, every retry is
    // refused until the lease runs out, so the move throws; the next look read the row carrying
    // this very alert and wrote it again (a second event, the delivered alert due again).
    for (const c of [
      {
        name: "a second effect whose receipt cannot be stored, on a settled operation: one 'two effects' event, not one per retry",
        type: "lost.two.unstorable",
        leaseMs: 30_000,
        refusedMs: 0,
      },
      {
        name: "the same, the retries then refused for a lease: one 'two effects' event, not another on the next look",
        type: "lost.two.unstorable.outage",
        leaseMs: 2_000,
        refusedMs: 2_500,
      },
    ])
      it(c.name, async () => {
        try {
          let now = Date.now();
          const effects: { key: string; id: string }[] = [];
          const opens: (() => void)[] = [];
          const gates = [0, 1].map(() => new Promise<void>((r) => opens.push(r)));
          let calls = 0;
          const action = defineAction<{ to: string }, { id: string; pad: string }>({
            type: c.type,
            capabilities: { lookup: true },
            execute: async (_a, op) => {
              const call = calls++;
              await gates[call];
              const id = `obj_${effects.length + 1}`;
              effects.push({ key: op.key, id });
              return { id, pad: "x".repeat(call === 0 ? 200 : 0) }; // attempt 1's too large to store
            },
            reconcile: async () => ({ found: false as const, proof: "absent" as const, reason: "not at the provider" }),
          });
          const { ledger, lost } = await lossy(
            "succeeded",
            "two effects",
            { clock: () => now, leaseMs: c.leaseMs, maxResultBytes: 50, actions: [action], budget: { attempts: 1 } },
            "lost",
            c.refusedMs,
          );
          const tenant = uniqueTenant();
          const first = ledger.run(action, { tenant, key: ["k"], args: { to: "x" } }).catch((e: unknown) => e);
          while (calls < 1) await sleep(5);
          now += c.leaseMs + 1_000;
          const [op] = await ledger.admin.list({ tenant });
          const stop = new AbortController();
          stop.abort();
          await ledger.daemon.settle({ tenant, id: op!.id, actor: "daemon", stop: stop.signal });
          const third = ledger.run(action, { tenant, key: ["k"], args: { to: "x" } });
          while (calls < 2) await sleep(5);
          opens[1]!();
          expect(await third).toMatchObject({ status: "succeeded", attempt: 3, receipt: { id: "obj_1" } });
          opens[0]!();
          const firstOut = await first;
          const { operation, events } = await ledger.get({ tenant, id: op!.id });
          expect(lost()).toBe(1);
          expect(firstOut, story(events)).toMatchObject({ name: "PayloadTooLargeError", operationId: op!.id });
          expect(operation, story(events)).toMatchObject({ status: "succeeded", result: { id: "obj_1" } });
          expect(operation.reason, story(events)).toMatch(/^two effects: attempt 1's request took effect too/);
          expect(
            events.filter((e) => e.reason?.startsWith("two effects")),
            story(events),
          ).toHaveLength(1);
          expect(effects).toHaveLength(2);
        } finally {
          await close();
        }
      });

    it("a late receipt on an operation a person resolved as succeeded without one: one event, not one per retry", async () => {
      // Attempt 1's request is out past its lease; nothing can check the provider, so the daemon
      // parks it; a person says it happened, with no receipt to give; then attempt 1's receipt
      // comes. Its write keeps the status: a retry after its commit matched the row again.
      try {
        let now = Date.now();
        const p = new TestProvider();
        const action = p.action("lost.verdict", {});
        let release: () => void = () => {};
        p.gate = new Promise<void>((r) => (release = r));
        const { ledger, lost } = await lossy("succeeded", "after a person resolved it as succeeded without one", {
          clock: () => now,
          leaseMs: 30_000,
          actions: [action],
          budget: { attempts: 1 },
        });
        const tenant = uniqueTenant();
        const first = ledger.run(action, { tenant, key: ["k"], args: { to: "x" } }).catch((e: unknown) => e);
        await p.called(1);
        now += 31_000;
        const [op] = await ledger.admin.list({ tenant });
        expect(await ledger.daemon.settle({ tenant, id: op!.id, actor: "daemon" })).toMatchObject({
          state: "needs_review",
        });
        const seen = (await ledger.get({ tenant, id: op!.id })).operation;
        await ledger.admin.resolve({
          tenant,
          id: op!.id,
          actor: "alice",
          reason: "the charge is in the dashboard",
          outcome: "succeeded",
          seen,
        });
        release();
        const out = await first;
        const { operation, events } = await ledger.get({ tenant, id: op!.id });
        expect(lost()).toBe(1);
        expect(out, story(events)).toMatchObject({ status: "succeeded", receipt: { id: "obj_1" } });
        expect(operation, story(events)).toMatchObject({ status: "succeeded", result: { id: "obj_1" } });
        // Before: two, the retry after the lost commit writing it again.
        expect(
          events.filter((e) => e.reason?.includes("after a person resolved it as succeeded without one")),
          story(events),
        ).toHaveLength(1);
        expect(p.effects).toHaveLength(1);
      } finally {
        await close();
      }
    });

    // A lookup's ending (found absent, inconclusive, never provable, a refusal on record) and a
    // row parked for a person: before, written once, so the caller read LedgerUnavailableError
    // and the row stayed running until its lease ran out.
    describe.each(FAULTS)("a lookup's ending or a move to a person, its write %s", (fault) => {
      const budget = { attempts: 2, baseDelayMs: 1, maxDelayMs: 2 };
      const timedOut = {
        when: "before" as const,
        cls: { kind: "ambiguous" as const, reason: "timeout (nothing done)" },
      };

      // Each ending: the provider's answers, the move whose answer is lost (status, reason's start),
      // what the caller reads, and what else the row shows.
      const endings: {
        name: string;
        type: string;
        lookup: boolean;
        answer?: TestProvider["lookupAnswer"];
        fault?: (typeof TestProvider.prototype.faults)[number];
        move: [string, string];
        out: Record<string, unknown>;
        also?: (o: { operation: Operation; events: OperationEvent[]; effects: number }) => void;
      }[] = [
        {
          name: "proven absent, recorded as pending: the call runs it again",
          type: "lost.absent",
          lookup: true,
          move: ["pending", "reconciled: not at the provider"],
          out: { status: "succeeded", replayed: false, receipt: { id: "obj_1" } },
          also: ({ events, effects }) => {
            expect(events.filter((e) => e.to === "pending")).toHaveLength(1);
            expect(effects).toBe(1);
          },
        },
        {
          name: "inconclusive, recorded as unknown: 'verification continues', counted once",
          type: "lost.inconclusive",
          lookup: true,
          answer: "inconclusive",
          move: ["unknown", "inconclusive: index lags"],
          out: {
            status: "pending_verification",
            state: "unknown",
            reason: "outcome unknown, verification continues: index lags",
          },
          also: ({ operation, effects }) => {
            expect(operation).toMatchObject({ status: "unknown", checks: 1 });
            expect(effects).toBe(0);
          },
        },
        {
          name: "a refusal on the provider's record, recorded as failed: the caller reads its own failure",
          type: "lost.refused",
          lookup: true,
          answer: "refused",
          move: ["failed", "reconciled: the provider's record shows it declined"],
          out: {
            status: "failed",
            replayed: false,
            error: { kind: "permanent", reason: "the provider's record shows it declined" },
          },
        },
        {
          name: "a lookup that can never prove absence, parked for a person: one event",
          type: "lost.never",
          lookup: true,
          answer: "never",
          move: ["needs_review", "copies are appended by the client"],
          out: { status: "pending_verification", state: "needs_review", reason: "copies are appended by the client" },
          also: ({ events }) => expect(events.filter((e) => e.to === "needs_review")).toHaveLength(1),
        },
        {
          name: "nothing can check the provider: the unknown outcome parked for a person",
          type: "lost.review",
          lookup: false,
          fault: { when: "after", cls: { kind: "ambiguous", reason: "timeout after the body" } },
          move: ["needs_review", "the provider neither dedupes nor can be queried"],
          out: {
            status: "pending_verification",
            state: "needs_review",
            reason: "outcome unknown: the provider neither dedupes nor can be queried",
          },
          also: ({ events, effects }) => {
            expect(events.filter((e) => e.to === "needs_review")).toHaveLength(1);
            expect(effects).toBe(1);
          },
        },
      ];
      for (const ending of endings)
        it(ending.name, async () => {
          try {
            const p = new TestProvider();
            const action = p.action(ending.type, ending.lookup ? { lookup: true } : {});
            p.faults.push(ending.fault ?? timedOut);
            if (ending.answer) p.lookupAnswer = ending.answer;
            const { ledger, lost } = await lossy(...ending.move, { actions: [action], budget }, fault);
            const tenant = uniqueTenant();
            const out = await ledger.run(action, { tenant, key: ["k"], args: { to: "a" } }).catch((e: unknown) => e);
            expect(lost()).toBe(1);
            const [op] = await ledger.admin.list({ tenant });
            const { operation, events } = await ledger.get({ tenant, id: op!.id });
            // Before: LedgerUnavailableError, and the row running until its lease ran out.
            expect(out, story(events)).toMatchObject(ending.out);
            expect(
              events.filter((e) => e.reason?.startsWith("fenced")),
              story(events),
            ).toEqual([]);
            ending.also?.({ operation, events, effects: p.effects.length });
          } finally {
            await close();
          }
        });
    });
    // Attempt 1's request, out past its lease, ends after another attempt moved the row (proved
    // absence, failed, or is ending): the move that reopens the row or voids the other's end. And
    // the daemon parking an operation no action of its config can settle. Before, each was written
    // once: a brief outage left the caller reading LedgerUnavailableError and the row where it was
    // (pending, known not done, while attempt 1's request may have committed: run again, two effects).
    const lateEnds: LateEnd[] = [
      {
        name: "absence proven while attempt 1 was out, then its timeout: unknown again",
        move: ["unknown", "still in flight when absence was proven"],
        reader: "first",
        out: { state: "unknown", reason: "outcome unknown: attempt 1 may have committed" },
      },
      {
        name: "attempt 3 refused while attempt 1 was out, then its timeout: a person decides",
        third: { cls: { kind: "permanent", reason: "validation: refused" }, during: false },
        move: ["needs_review", "still in flight when the operation failed"],
        reader: "first",
        out: {
          state: "needs_review",
          reason: "attempt 1 may have committed after the operation failed; a person decides",
        },
      },
      {
        name: "attempt 1's timeout while attempt 3 is out, which is then refused: a person decides",
        third: { cls: { kind: "permanent", reason: "validation: refused" }, during: true },
        move: ["needs_review", "ended meanwhile and may have committed"],
        reader: "third",
        out: { state: "needs_review", reason: expect.stringMatching(/^attempt 3 ended \(validation: refused\)/) },
      },
      {
        name: "attempt 1's timeout while attempt 3 is out, which is then not sent (503): unknown",
        third: { cls: { kind: "transient", reason: "503 before execution" }, during: true },
        move: ["unknown", "ended meanwhile and may have committed"],
        reader: "third",
        out: { state: "unknown", reason: expect.stringMatching(/^attempt 3 ended \(503 before execution\)/) },
      },
    ];
    /** Runs `end` with `fault` on its move, or on the read before it. */
    async function lateEnd(end: LateEnd, fault: Fault) {
      try {
        let now = Date.now();
        const p = new TestProvider();
        const action = p.action("lost.late", { lookup: true });
        let release: () => void = () => {};
        p.gate = new Promise<void>((r) => (release = r));
        p.faults.push({ when: "after", cls: { kind: "ambiguous", reason: "timeout after the body" } });
        const { ledger, lost } = await lossy(
          ...end.move,
          { clock: () => now, leaseMs: 30_000, actions: [action], budget: { attempts: 1 } },
          fault,
        );
        const tenant = uniqueTenant();
        const run = (a: typeof action) =>
          ledger.run(a, { tenant, key: ["k"], args: { to: "a" } }).catch((e: unknown) => e);
        const first = run(action);
        await p.called(1);
        now += 31_000;
        const [op] = await ledger.admin.list({ tenant });
        const stop = new AbortController();
        stop.abort(); // a stopping daemon: it looks up but sends nothing
        const settled = await ledger.daemon.settle({ tenant, id: op!.id, actor: "daemon", stop: stop.signal });
        expect(settled).toMatchObject({ state: "pending" });
        const later = end.third && answering(action, end.third.cls);
        const third = later && run(later.action);
        if (later && end.third?.during) await later.sent;
        else if (later) later.answer();
        if (!end.third?.during) await third;
        release(); // attempt 1's request commits; its answer is a timeout
        const firstOut = await first;
        later?.answer();
        const out = end.reader === "first" ? firstOut : await third;
        const { operation, events } = await ledger.get({ tenant, id: op!.id });
        // Before: LedgerUnavailableError; the row as the other attempt left it (outage), or a
        // "lease lost" answer for its own move (lost). The read's outage: the same for attempt 1's
        // reader; for attempt 3's, attempt 1's end went unnoted, so its refusal or 503 was written.
        expect(out, story(events)).toMatchObject({ status: "pending_verification", ...end.out });
        // A read fault hits each late end's read: attempt 1's, then (during) attempt 3's.
        expect(lost()).toBe(fault === "read" && end.third?.during ? 2 : 1);
        expect(operation.status, story(events)).toBe(end.out.state);
        expect(
          events.filter((e) => e.reason?.includes(end.move[1])),
          story(events),
        ).toHaveLength(1);
        expect(p.effects).toHaveLength(1);
      } finally {
        await close();
      }
    }

    describe.each(FAULTS)("a late end's move, its write %s", (fault) => {
      for (const end of lateEnds) it(end.name, () => lateEnd(end, fault));

      it("an operation no registered action can settle, past the daemon's limits: parked for a person, alerted", async () => {
        try {
          const HOUR = 3_600_000;
          const app = await db.open({ budget: { attempts: 1 } });
          const tenant = uniqueTenant();
          const p = new TestProvider();
          p.faults.push({ when: "after", cls: { kind: "ambiguous", reason: "timeout" } });
          const out = await app.run(p.action("crm.note", { lookup: true }), { tenant, key: ["n"], args: { to: "x" } });
          expect(out).toMatchObject({ state: "unknown" });
          const now = Date.now() + 2 * HOUR;
          const { ledger, lost } = await lossy("needs_review", "no action of type crm.note", {
            actions: [],
            clock: () => now,
          });
          const escalate = { maxChecks: 5, maxAgeMs: HOUR };
          const parked = await ledger.daemon
            .settle({ tenant, id: out.operationId, actor: "daemon", escalate })
            .catch((e: unknown) => e);
          const { operation, events } = await ledger.get({ tenant, id: out.operationId });
          expect(lost()).toBe(1);
          // Before: LedgerUnavailableError from the settlement; the row unknown (outage), no alert.
          expect(parked, story(events)).toMatchObject({
            status: "pending_verification",
            state: "needs_review",
            reason: expect.stringMatching(/^still unknown after .*no action of type crm\.note/),
          });
          expect(operation.status).toBe("needs_review");
          expect(events.filter((e) => e.to === "needs_review")).toHaveLength(1);
          expect((await ledger.daemon.alertsDue({ limit: 100 })).map((a) => a.id)).toContain(out.operationId);
        } finally {
          await close();
        }
      });
    });
    // The read each late end decides its move on (fenced's, lateEndDuring's), the database briefly
    // unreachable: before, read once, so the caller read LedgerUnavailableError and the row stayed
    // as the other attempt left it (pending while attempt 1's request may have committed).
    describe("a late end's read before its move, the database briefly unreachable", () => {
      for (const end of lateEnds) it(end.name, () => lateEnd(end, "read"));
    });
  });
}
