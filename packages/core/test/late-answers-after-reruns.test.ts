/**
 * An earlier attempt's late answer (a given-up lookup's finding) after the operation was run again
 * from known not done (a rerun, `rerun_attempt`, migration 0013): a possible second effect is
 * alerted only when a rerun may have sent one. A rerun that ended having sent nothing (its read
 * before sending found an earlier end; the provider refused it for now) gives back the mark its
 * takeover replaced, so a lookup that settles the row later does not make it one that ran, and an
 * earlier rerun that did send keeps its mark (found by helper-213; failed first: alerted as
 * possibly two effects with one at the provider, and attempt 6 named for attempt 4's request or
 * nothing said at all).
 */
import { describe, expect, it } from "vitest";
import { setTimeout as sleep } from "node:timers/promises";
import { defineAction, type Ledger } from "@idem/core";
import { openTestLedger } from "@idem/core/testing";
import { dialectFor, hooked } from "./support/dialects.js";
import { ProviderError } from "./support/provider.js";
import { DIALECTS, scaled } from "@idem/testkit";
import { ledgers, uniqueTenant } from "./support/ledgers.js";
import type { CompiledQuery } from "kysely";

/** An UPDATE that sets the attempt: a takeover (the one that runs a pending row again marks it a rerun). */
const isTakeover = (q: CompiledQuery) =>
  /^\s*update "idem_operations"/i.test(q.sql) && /"attempt" = /.test(q.sql.split(" where ")[0] ?? "");

/** What a rerun (the provider's second request and later) does, in order. */
type Rerun =
  | "refused" // a 503: not processed, no effect
  | "lands" // takes effect, seen by a lookup at once; its answer is lost
  | "lags"; // takes effect, not yet seen by a lookup (an index that lags); its answer is lost

/**
 * A provider without dedupe. Attempt 1's request is held until `land1()` (then it takes effect,
 * obj_1) and answers without an answer (a timeout) once `end1()` is called too. The first lookup
 * is held until `answerLookup()`, ignoring its signal (given up), and reads the provider then.
 */
function provider(type: string, reruns: Rerun[]) {
  const seen: string[] = []; // effects a lookup sees
  let lagging = 0; // effects a lookup does not see yet
  let calls = 0;
  let lookups = 0;
  let land1: () => void = () => {};
  const landed1 = new Promise<void>((r) => (land1 = r));
  let end1: () => void = () => {};
  const ended1 = new Promise<void>((r) => (end1 = r));
  let answerLookup: () => void = () => {};
  const heldLookup = new Promise<void>((r) => (answerLookup = r));
  const effect = () => `obj_${seen.length + lagging + 1}`;
  const action = defineAction<{ to: string }, { id: string }>({
    type,
    capabilities: { lookup: true },
    execute: async () => {
      calls += 1;
      if (calls === 1) {
        await landed1;
        seen.push(effect());
        await ended1;
        throw new ProviderError({ kind: "ambiguous", reason: "timeout after the body was sent" });
      }
      const what = reruns[calls - 2];
      if (what === "refused") throw new ProviderError({ kind: "transient", reason: "503: not processed" });
      if (what === "lags") lagging += 1;
      else seen.push(effect());
      throw new ProviderError({ kind: "ambiguous", reason: "timeout after the body was sent" });
    },
    classify: (e) => (e instanceof ProviderError ? e.cls : { kind: "ambiguous", reason: String(e) }),
    reconcile: async () => {
      lookups += 1;
      if (lookups === 1) await heldLookup; // ignores its signal; reads the provider when released
      return seen.length
        ? { found: true as const, receipt: { id: seen[0]! } }
        : { found: false as const, proof: "absent" as const, reason: "not at the provider" };
    },
  });
  return {
    action,
    calls: () => calls,
    effects: () => seen.length + lagging,
    land1,
    end1,
    answerLookup,
  };
}

async function until(cond: () => boolean | Promise<boolean>, ms = scaled(10_000)): Promise<void> {
  const end = Date.now() + ms;
  while (!(await cond())) {
    if (Date.now() > end) throw new Error("condition not met in time");
    await sleep(5);
  }
}

for (const dialect of DIALECTS) {
  describe(`an earlier attempt's late finding after a rerun, on ${dialect}`, () => {
    const db = ledgers(dialect);

    /**
     * Attempt 1's request is out past its lease; attempt 2's lookup is given up at the
     * settlement's bound (it answers later); attempt 3's reads absence and attempt 4 runs the
     * operation again. `rerun` says how attempt 4 ends; then the row is looked up until settled.
     */
    async function start(type: string, reruns: Rerun[], { endBeforeSend = false, loseRerun = false } = {}) {
      let now = Date.now();
      const p = provider(type, reruns);
      let first: Promise<unknown> | undefined;
      let armed = false;
      let rerunTakeover = false;
      let lose = loseRerun;
      const dialectHooked = hooked(await dialectFor(dialect, db.url()), {
        async query(q, run) {
          // An executing takeover from pending (it marks a rerun): attempt 4's, once armed.
          const marks = isTakeover(q) && q.sql.includes("rerun_attempt");
          if (armed && marks) rerunTakeover = true;
          const out = await run();
          if (!lose || !marks) return out;
          lose = false;
          throw new Error("connection reset after commit (test)"); // committed, its answer lost
        },
        async released() {
          if (!rerunTakeover) return;
          rerunTakeover = armed = false;
          // The takeover committed: attempt 1's request lands and ends without an answer now,
          // recorded (fenced) before attempt 4 sends.
          p.land1();
          p.end1();
          await first;
        },
      });
      const ledger: Ledger = await openTestLedger(dialectHooked, {
        clock: () => now,
        leaseMs: 30_000,
        actions: [p.action],
        budget: { attempts: 1 },
      });
      const tenant = uniqueTenant();
      first = ledger.run(p.action, { tenant, key: ["k"], args: { to: "x" } }).catch((e: unknown) => e);
      await until(() => p.calls() === 1);
      now += 31_000; // attempt 1's lease runs out, its request still out
      const [op] = await ledger.admin.list({ tenant });
      const ref = { tenant, id: op!.id, actor: "daemon" };
      // Attempt 2's lookup, given up at the settlement's bound: unknown.
      expect(await ledger.daemon.settle({ ...ref, timeoutMs: 200 })).toMatchObject({ state: "unknown" });
      now += 3_600_000; // due again
      armed = endBeforeSend;
      // Attempt 3 reads absence, attempt 4 takes it over to run it again.
      const rerun = await ledger.daemon.settle(ref).catch((e: unknown) => e);
      if (endBeforeSend) expect(armed, "the rerun's takeover was seen").toBe(false);
      const story = async () =>
        (await ledger.get(ref)).events.map((e) => `${e.from}>${e.to}@${e.attempt} ${e.reason}`).join(" | ");
      const verdictOf = async (on: Ledger) => {
        const { operation } = await on.get(ref);
        const alerts = await on.daemon.alertsDue({ limit: 1000 });
        return {
          effects: p.effects(),
          status: operation.status,
          result: operation.result,
          alerted: alerts.some((a) => a.id === op!.id),
          reason: operation.reason,
        };
      };
      let closed = false;
      const close = async () => {
        if (closed) return;
        closed = true;
        p.land1();
        p.end1();
        p.answerLookup();
        await ledger.close();
      };
      // Every late answer recorded (the ledger waits for them as it closes), then read afresh.
      const afterLateAnswers = async () => {
        closed = true;
        expect(await ledger.close({ waitMs: scaled(10_000) })).toMatchObject({ lateAnswers: [] });
        const reader = await openTestLedger(await dialectFor(dialect, db.url()), { actions: [p.action] });
        try {
          const { events } = await reader.get(ref);
          return {
            verdict: await verdictOf(reader),
            story: events.map((e) => `${e.from}>${e.to}@${e.attempt} ${e.reason}`).join(" | "),
          };
        } finally {
          await reader.close();
        }
      };
      return {
        ledger,
        ref,
        p,
        rerun,
        story,
        verdict: () => verdictOf(ledger),
        afterLateAnswers,
        close,
        first: () => first!,
        later: () => {
          now += 3_600_000;
        },
        /** The next rerun's takeover commits and its answer is lost: given back, nothing sent. */
        loseNextRerun: () => {
          lose = true;
        },
      };
    }

    it("a rerun that sent nothing (an earlier end before its send), then a lookup settles: one effect, not alerted", async () => {
      const t = await start("late.after.rerun.unsent", [], { endBeforeSend: true });
      try {
        expect({ rerun: t.rerun, calls: t.p.calls() }, await t.story()).toMatchObject({
          rerun: { status: "pending_verification", state: "unknown" },
          calls: 1,
        });
        t.later();
        // Attempt 5's lookup finds attempt 1's effect.
        expect(await t.ledger.daemon.settle(t.ref)).toMatchObject({ status: "succeeded", receipt: { id: "obj_1" } });
        t.p.answerLookup(); // attempt 2's lookup answers now: attempt 1's effect, the only one
        const { verdict, story } = await t.afterLateAnswers();
        expect(verdict, story).toEqual({
          effects: 1,
          status: "succeeded",
          result: { id: "obj_1" },
          alerted: false,
          reason: expect.not.stringMatching(/^possibly two effects/),
        });
      } finally {
        await t.close();
      }
    });

    it("a rerun the provider refused for now (pending), then attempt 1's end and a lookup that settles: one effect, not alerted", async () => {
      const t = await start("late.after.rerun.refused", ["refused"]);
      try {
        expect({ rerun: t.rerun, calls: t.p.calls() }, await t.story()).toMatchObject({
          rerun: { status: "pending_verification", state: "pending" },
          calls: 2,
        });
        // Attempt 1's request lands and ends without an answer: the row is unknown again.
        t.p.land1();
        t.p.end1();
        await t.first();
        t.later();
        // Attempt 5's lookup finds attempt 1's effect.
        expect(await t.ledger.daemon.settle(t.ref)).toMatchObject({ status: "succeeded", receipt: { id: "obj_1" } });
        t.p.answerLookup(); // attempt 2's lookup answers now: attempt 1's effect, the only one
        const { verdict, story } = await t.afterLateAnswers();
        expect(verdict, story).toEqual({
          effects: 1,
          status: "succeeded",
          result: { id: "obj_1" },
          alerted: false,
          reason: expect.not.stringMatching(/^possibly two effects/),
        });
      } finally {
        await t.close();
      }
    });

    // The control: the rerun did send (its answer lost), so a second effect is possible (here
    // there is one): still alerted after a lookup settled the row.
    it("a rerun that sent (its answer lost), then a lookup settles: alerted as possibly two effects", async () => {
      const t = await start("late.after.rerun.sent", ["lands"]);
      try {
        expect({ rerun: t.rerun, calls: t.p.calls() }, await t.story()).toMatchObject({
          rerun: { status: "pending_verification", state: "unknown" },
          calls: 2,
        });
        t.p.land1();
        t.p.end1();
        await t.first();
        t.later();
        // Attempt 5's lookup finds the rerun's effect (the first it sees).
        expect(await t.ledger.daemon.settle(t.ref)).toMatchObject({ status: "succeeded", receipt: { id: "obj_1" } });
        t.p.answerLookup(); // attempt 2's lookup answers now
        const { verdict, story } = await t.afterLateAnswers();
        expect(verdict, story).toEqual({
          effects: 2,
          status: "succeeded",
          result: { id: "obj_1" },
          alerted: true,
          reason: expect.stringMatching(/^possibly two effects: .*attempt 4 ran the operation again/),
        });
      } finally {
        await t.close();
      }
    });

    // An earlier rerun sent (attempt 4, its effect not yet seen by a lookup), a later one sent
    // nothing (attempt 6, refused for now): attempt 4's mark survives attempt 6's, whether the
    // late finding comes while the row is pending (before: not said at all, as attempt 6 ran
    // nothing) or after a lookup settled it (before: said of attempt 6, which sent nothing).
    for (const when of ["while pending", "after a lookup settled it"] as const)
      it(`an earlier rerun that sent, a later one refused for now, then attempt 2's finding ${when}: alerted of the earlier rerun`, async () => {
        const t = await start(`late.after.reruns.${when === "while pending" ? "pending" : "settled"}`, [
          "lags",
          "refused",
        ]);
        try {
          expect({ rerun: t.rerun, calls: t.p.calls() }, await t.story()).toMatchObject({
            rerun: { status: "pending_verification", state: "unknown" },
            calls: 2,
          });
          t.later();
          // Attempt 5's lookup reads absence (attempt 4's effect lags), attempt 6 is refused for now.
          expect(await t.ledger.daemon.settle(t.ref), await t.story()).toMatchObject({
            status: "pending_verification",
            state: "pending",
          });
          expect(t.p.calls()).toBe(3);
          t.p.land1(); // attempt 1's request takes effect (obj_2); its answer is still out
          if (when === "after a lookup settled it") {
            t.p.end1(); // ... and ends without an answer: the row is unknown again
            await t.first();
            t.later();
            // Attempt 7's lookup finds attempt 1's effect.
            expect(await t.ledger.daemon.settle(t.ref)).toMatchObject({
              status: "succeeded",
              receipt: { id: "obj_2" },
            });
          } else {
            // Attempt 1's request is still out: its late end would say a second effect is possible
            // itself, so the finding is read as it settles the row (its receipt's write), before.
            t.p.answerLookup();
            await until(async () => (await t.ledger.get(t.ref)).operation.status === "succeeded");
            const verdict = await t.verdict();
            expect(verdict, await t.story()).toEqual({
              effects: 2,
              status: "succeeded",
              result: { id: "obj_2" },
              alerted: true,
              reason: expect.stringMatching(/^possibly two effects: .*attempt 4 ran the operation again/),
            });
            return;
          }
          t.p.answerLookup(); // attempt 2's lookup answers now: attempt 1's effect
          const { verdict, story } = await t.afterLateAnswers();
          expect(verdict, story).toEqual({
            effects: 2,
            status: "succeeded",
            result: { id: "obj_2" },
            alerted: true,
            reason: expect.stringMatching(/^possibly two effects: .*attempt 4 ran the operation again/),
          });
        } finally {
          await t.close();
        }
      });

    // A rerun's takeover that committed but whose answer was lost (an outage) is given back: it
    // sent nothing, so it puts back the mark it replaced, as a rerun that ended so does (before:
    // its own mark stayed on the row, helper-213's note).
    it("a rerun whose takeover's answer was lost (given back), then attempt 1's end and a lookup that settles: one effect, not alerted", async () => {
      const t = await start("late.after.rerun.lost", [], { loseRerun: true });
      try {
        expect({ rerun: t.rerun, calls: t.p.calls() }, await t.story()).toMatchObject({
          rerun: { name: "LedgerUnavailableError" },
          calls: 1,
        });
        expect((await t.ledger.get(t.ref)).operation, await t.story()).toMatchObject({ status: "pending", attempt: 4 });
        // Attempt 1's request lands and ends without an answer: the row is unknown again.
        t.p.land1();
        t.p.end1();
        await t.first();
        t.later();
        // Attempt 5's lookup finds attempt 1's effect.
        expect(await t.ledger.daemon.settle(t.ref)).toMatchObject({ status: "succeeded", receipt: { id: "obj_1" } });
        t.p.answerLookup(); // attempt 2's lookup answers now: attempt 1's effect, the only one
        const { verdict, story } = await t.afterLateAnswers();
        expect(verdict, story).toEqual({
          effects: 1,
          status: "succeeded",
          result: { id: "obj_1" },
          alerted: false,
          reason: expect.not.stringMatching(/^possibly two effects/),
        });
      } finally {
        await t.close();
      }
    });

    // An earlier rerun sent (attempt 4, its effect not yet seen by a lookup); a later rerun's
    // takeover (attempt 6) is given back after an outage: attempt 4's mark is back on the row, so
    // attempt 2's finding while it is pending says so (before: the row pending at attempt 6, its
    // own mark, read as a rerun that ran nothing: settled in silence with two effects out there).
    it("an earlier rerun that sent, a later one given back after an outage, then attempt 2's finding while pending: alerted of the earlier rerun", async () => {
      const t = await start("late.after.reruns.lost", ["lags"]);
      try {
        expect({ rerun: t.rerun, calls: t.p.calls() }, await t.story()).toMatchObject({
          rerun: { status: "pending_verification", state: "unknown" },
          calls: 2,
        });
        t.later();
        // Attempt 5's lookup reads absence (attempt 4's effect lags); attempt 6's takeover is lost.
        t.loseNextRerun();
        await expect(t.ledger.daemon.settle(t.ref)).rejects.toMatchObject({ name: "LedgerUnavailableError" });
        expect((await t.ledger.get(t.ref)).operation, await t.story()).toMatchObject({ status: "pending", attempt: 6 });
        expect(t.p.calls()).toBe(2);
        t.p.land1(); // attempt 1's request takes effect (obj_2); its answer is still out
        t.p.answerLookup(); // attempt 2's lookup answers now: attempt 1's effect
        await until(async () => (await t.ledger.get(t.ref)).operation.status === "succeeded");
        expect(await t.verdict(), await t.story()).toEqual({
          effects: 2,
          status: "succeeded",
          result: { id: "obj_2" },
          alerted: true,
          reason: expect.stringMatching(/^possibly two effects: .*attempt 4 ran the operation again/),
        });
      } finally {
        await t.close();
      }
    });
  });
}
