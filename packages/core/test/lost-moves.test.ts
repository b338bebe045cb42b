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
import { defineAction, type Ledger, type Operation, type OperationEvent } from "@idem/core";
import { openTestLedger, type TestLedgerOptions } from "@idem/core/testing";
import { DIALECTS } from "@idem/testkit";
import { dialectFor, hooked } from "./support/dialects.js";
import { ledgers, uniqueTenant } from "./support/ledgers.js";
import { TestProvider } from "./support/provider.js";

const isMove = (q: CompiledQuery, to: string, reason: string) =>
  q.sql.startsWith('update "idem_operations" set "status"') &&
  q.parameters.includes(to) &&
  q.parameters.some((p) => typeof p === "string" && p.includes(reason));

const story = (events: readonly OperationEvent[]) =>
  events.map((e) => `${e.from}>${e.to}@${e.attempt} ${e.reason}`).join(" | ");

/** A move's answer lost after its commit, or the database unreachable for the move (nothing committed). */
type Fault = "lost" | "outage";
const FAULTS: readonly Fault[] = ["lost", "outage"];

for (const dialect of DIALECTS) {
  describe(`an attempt's end whose answer was lost after it committed (${dialect})`, () => {
    const db = ledgers(dialect);
    const opened: Ledger[] = [];

    /**
     * A ledger whose first move to `to` with `reason` in it commits, then fails as a connection
     * cut after the commit does (the answer is lost); or, `outage`, fails before it ran (the
     * database briefly unreachable: nothing committed).
     */
    async function lossy(to: string, reason: string, options: TestLedgerOptions, fault: Fault = "lost") {
      await (await db.open()).close(); // migrated
      let lost = 0;
      const dialectWithLoss = hooked(await dialectFor(dialect, db.url()), {
        async query(q, run) {
          if (fault === "outage" && lost === 0 && isMove(q, to, reason)) {
            lost += 1;
            throw new Error("connection refused (test)");
          }
          const out = await run();
          if (fault === "outage" || lost > 0 || !isMove(q, to, reason)) return out;
          lost += 1;
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
  });
}
