/**
 * The time bound of a settlement (`ledger.daemon.settle`'s `timeoutMs`, its budget's `elapsedMs`)
 * and a caller's signal bound the request under way too, as they bound a lookup: its `op.signal`
 * aborts, and an execute that does not answer for it (a client with no deadline of its own, an
 * SMTP server holding its answer) is no longer awaited. Its request may have been sent, so the
 * operation is unknown (looked up later), never "not done"; its answer, if one comes, is recorded
 * through the fence. Before: a 300 ms bound held the settlement, its lease heartbeat with it, for
 * as long as the request hung (a helper measured 8.2 s for 1 s against an SMTP server).
 * A lease lost under the request (taken over once it ran out, or not renewed in time) ends the
 * wait the same way: another owner may hold the row, so the answer is the fence's.
 */
import { describe, expect, it } from "vitest";
import { defineAction, type Ledger } from "@idem/core";
import { openTestLedger } from "@idem/core/testing";
import { DIALECTS, freshDatabase, orLate, scaled } from "@idem/testkit";
import { dialectFor, hooked } from "./support/dialects.js";
import { uniqueTenant } from "./support/ledgers.js";
import { ProviderError } from "./support/provider.js";

/**
 * A provider that takes the request at once (the effect commits) and holds its answer until
 * `answer()`: with `honours`, it gives up when its signal aborts (rejecting with the signal's
 * reason); without, it ignores the signal. Its first request is refused before anything is done
 * (a 503), so that the operation is left pending for a settlement to run again. Looked up by key.
 */
function heldAnswers(honours: boolean) {
  const effects: { key: string; id: string }[] = [];
  const signals: AbortSignal[] = [];
  let answer: () => void = () => {};
  const answered = new Promise<void>((r) => (answer = r));
  let requests = 0;
  const action = defineAction<{ to: string }, { id: string }>({
    type: honours ? "mail.held-honours" : "mail.held-ignores",
    capabilities: { lookup: true },
    execute: async (_args, op) => {
      requests += 1;
      if (requests === 1) throw new ProviderError({ kind: "transient", reason: "503 before the request ran" });
      signals.push(op.signal);
      const id = `obj_${effects.length + 1}`;
      effects.push({ key: op.key, id });
      const gaveUp = honours
        ? new Promise<never>((_, reject) => op.signal.addEventListener("abort", () => reject(op.signal.reason)))
        : new Promise<never>(() => {});
      await Promise.race([answered, gaveUp]);
      return { id };
    },
    classify: (e) => (e instanceof ProviderError ? e.cls : { kind: "ambiguous", reason: String(e) }),
    reconcile: async (_args, op) => {
      const hit = effects.find((e) => e.key === op.key);
      return hit
        ? { found: true as const, receipt: { id: hit.id } }
        : { found: false as const, proof: "absent" as const, reason: "not at the provider" };
    },
  });
  return { action, effects, signals, answer };
}

/** The operation's events, one line each, for a failure message. */
async function story(ledger: Ledger, tenant: string, id: string): Promise<string> {
  const { events } = await ledger.get({ tenant, id });
  return events.map((e) => `${e.from}>${e.to}@${e.attempt} ${e.reason}`).join(" | ");
}

/** Resolves once `check` holds, polling; throws `what` if it does not within `ms`. */
async function until(check: () => Promise<boolean>, what: string, ms = scaled(10_000)): Promise<void> {
  const end = performance.now() + ms;
  while (!(await check())) {
    if (performance.now() > end) throw new Error(`${what} within ${ms} ms`);
    await new Promise((r) => setTimeout(r, 5));
  }
}

for (const dialect of DIALECTS) {
  describe(`an execute bounded by the settlement's time, on ${dialect}`, () => {
    /** A ledger with the action, one execution a call, and an operation left pending by a refused first request. */
    async function pendingOperation(p: ReturnType<typeof heldAnswers>) {
      const tenant = uniqueTenant();
      const url = await freshDatabase(dialect);
      const ledger = await openTestLedger(url, { actions: [p.action], poolSize: 2, budget: { attempts: 1 } });
      const first = await ledger.run(p.action, { tenant, key: ["k"], args: { to: "x" } });
      expect(first).toMatchObject({ status: "pending_verification", state: "pending" });
      return { ledger, tenant, id: first.operationId! };
    }

    /** A settlement bounded at 300 ms ends within the bound (scaled), unknown, its execute's signal aborted. */
    async function settledAtBound(ledger: Ledger, tenant: string, id: string, p: ReturnType<typeof heldAnswers>) {
      const started = performance.now();
      const out = await orLate(
        ledger.daemon.settle({ tenant, id, timeoutMs: 300 }),
        scaled(10_000),
        "still running" as const,
      );
      expect(out, await story(ledger, tenant, id)).toMatchObject({ status: "pending_verification", state: "unknown" });
      expect(performance.now() - started).toBeLessThan(scaled(10_000));
      expect(p.signals.map((s) => s.aborted)).toEqual([true]);
    }

    it("an execute that ignores its signal is abandoned at the bound: unknown (it may have been sent), and its late receipt settles it, one effect", async () => {
      const p = heldAnswers(false);
      const { ledger, tenant, id } = await pendingOperation(p);
      try {
        // Before: "still running", for as long as the provider held its answer.
        await settledAtBound(ledger, tenant, id, p);
        const { operation, events } = await ledger.get({ tenant, id });
        // Never pending (known not done): the provider has the request.
        expect(operation).toMatchObject({ status: "unknown", attempt: 2 });
        expect(p.effects).toHaveLength(1);
        expect(events.at(-1)).toMatchObject({ from: "running", to: "unknown", attempt: 2 });
        expect(events.at(-1)!.reason).toMatch(
          /^ambiguous: attempt 2's request had no answer within \d+ ms \(the settlement's time bound\), nor 1000 ms after its signal aborted: it may have been sent/,
        );
        // Its answer comes late, nobody having moved the operation meanwhile: the receipt settles it.
        p.answer();
        const settled = await ledger.wait({ tenant, id, timeoutMs: scaled(10_000) });
        expect(settled, await story(ledger, tenant, id)).toMatchObject({
          status: "succeeded",
          receipt: { id: "obj_1" },
        });
        const { events: after } = await ledger.get({ tenant, id });
        expect(after.at(-1)).toMatchObject({ from: "unknown", to: "succeeded", attempt: 2 });
        expect(after.at(-1)!.reason).toMatch(/^attempt 2's receipt proves the effect happened/);
        // Settled: every later call replays it, nothing is sent again.
        const again = await ledger.run(p.action, { tenant, key: ["k"], args: { to: "x" } });
        expect(again).toMatchObject({ status: "succeeded", replayed: true, receipt: { id: "obj_1" } });
        expect(p.effects).toHaveLength(1);
      } finally {
        p.answer();
        await ledger.close();
      }
    });

    it("an abandoned execute's late receipt, after a lookup found its effect: recorded as evidence, one effect, no alert", async () => {
      const p = heldAnswers(false);
      const { ledger, tenant, id } = await pendingOperation(p);
      try {
        expect(await ledger.daemon.settle({ tenant, id, timeoutMs: 300 })).toMatchObject({ state: "unknown" });
        // The next settlement looks the effect up (the provider committed it) and settles it.
        expect(await ledger.daemon.settle({ tenant, id })).toMatchObject({
          status: "succeeded",
          receipt: { id: "obj_1" },
        });
        const before = (await ledger.get({ tenant, id })).events.length;
        p.answer();
        // The late receipt is noted on the settled operation (fenced), which it does not change.
        await until(
          async () => (await ledger.get({ tenant, id })).events.length > before,
          "the late receipt was not noted",
        );
        const { operation, events } = await ledger.get({ tenant, id });
        expect(events.at(-1)!.reason).toMatch(/^fenced: attempt 2 tried to write succeeded/);
        expect(operation).toMatchObject({ status: "succeeded", attempt: 3, result: { id: "obj_1" } });
        expect(events.map((e) => e.reason).join(" | ")).not.toMatch(/two effects/);
        expect(p.effects).toHaveLength(1);
      } finally {
        p.answer();
        await ledger.close();
      }
    });

    it("an execute that honours its signal ends at the bound as its classify says: unknown, nothing left waiting", async () => {
      const p = heldAnswers(true);
      const { ledger, tenant, id } = await pendingOperation(p);
      try {
        // Before: "still running": its signal never aborted, so it waited for the answer.
        await settledAtBound(ledger, tenant, id, p);
        const { operation, events } = await ledger.get({ tenant, id });
        expect(operation).toMatchObject({ status: "unknown", attempt: 2 });
        // The action's own answer to the abort (here: an error its classify cannot explain, so ambiguous).
        expect(events.at(-1)!.reason).toMatch(/^ambiguous: .*no answer within \d+ ms \(the settlement's time bound\)/);
        // Looked up when settled next: found, one effect.
        expect(await ledger.daemon.settle({ tenant, id })).toMatchObject({ status: "succeeded" });
        expect(p.effects).toHaveLength(1);
      } finally {
        p.answer();
        await ledger.close();
      }
    });
  });

  describe(`an execute bounded by the caller's signal, on ${dialect}`, () => {
    it("a caller that gives up is not held by an execute that ignores its signal: unknown, the late receipt recorded", async () => {
      const p = heldAnswers(false);
      const tenant = uniqueTenant();
      const url = await freshDatabase(dialect);
      const ledger = await openTestLedger(url, { actions: [p.action], poolSize: 2, budget: { attempts: 2 } });
      try {
        const gaveUp = new AbortController();
        // The first request is refused (503), the second is taken and its answer held.
        const call = ledger.run(p.action, { tenant, key: ["k"], args: { to: "x" }, signal: gaveUp.signal });
        await until(async () => p.signals.length > 0, "the second request was not sent");
        gaveUp.abort(new Error("the agent's turn ended"));
        const out = await orLate(
          call.then(
            (v) => ({ answered: v }),
            (e: unknown) => ({ rejected: e }),
          ),
          scaled(10_000),
          "still running" as const,
        );
        // Before: "still running" until the provider answered.
        expect(out).toMatchObject({ rejected: { message: "the agent's turn ended" } });
        expect(p.signals.map((s) => s.aborted)).toEqual([true]);
        const op = (await ledger.admin.list({ tenant }))[0]!;
        expect(op).toMatchObject({ status: "unknown", attempt: 2 });
        expect(op.reason).toMatch(/^ambiguous: the caller gave up and attempt 2's request did not answer/);
        p.answer();
        const settled = await ledger.wait({ tenant, id: op.id, timeoutMs: scaled(10_000) });
        expect(settled).toMatchObject({ status: "succeeded", receipt: { id: "obj_1" } });
        expect(p.effects).toHaveLength(1);
      } finally {
        p.answer();
        await ledger.close();
      }
    });
  });
}

/** The store's lease heartbeat: the one statement that sets only the lease's end. */
const isHeartbeat = (sql: string) => sql.startsWith('update "idem_operations" set "lease_expires_at"');

/**
 * A provider without dedupe, looked up by key, that holds a request's answer until `answer()`
 * and ignores its signal; the effect commits when it answers (a lookup meanwhile finds nothing).
 */
function committedOnAnswer() {
  const effects: { key: string; id: string }[] = [];
  let abortedAt: number | undefined;
  let sent = 0;
  let answer: () => void = () => {};
  const answered = new Promise<void>((r) => (answer = r));
  const action = defineAction<{ to: string }, { id: string }>({
    type: "mail.lease-lost",
    capabilities: { lookup: true },
    execute: async (_args, op) => {
      sent += 1;
      op.signal.addEventListener("abort", () => (abortedAt = performance.now()), { once: true });
      await answered;
      const id = `obj_${effects.length + 1}`;
      effects.push({ key: op.key, id });
      return { id };
    },
    reconcile: async (_args, op) => {
      const hit = effects.find((e) => e.key === op.key);
      return hit
        ? { found: true as const, receipt: { id: hit.id } }
        : { found: false as const, proof: "absent" as const, reason: "not at the provider" };
    },
  });
  return { action, effects, answer, sent: () => sent, abortedAt: () => abortedAt };
}

for (const dialect of DIALECTS) {
  describe(`an execute whose lease is lost, on ${dialect}`, () => {
    for (const loss of ["taken over", "not renewed"] as const)
      it(`a lease ${loss} while an execute ignores its signal: the caller is answered a grace after the loss, the late receipt recorded once through the fence`, async () => {
        const p = committedOnAnswer();
        const tenant = uniqueTenant();
        const url = await freshDatabase(dialect);
        await (await openTestLedger(url)).close(); // migrated
        // The database's clock, moved by the test; heartbeats every 500 ms, refused once `refusing`.
        let at = Date.now();
        const leaseMs = 1_500;
        let refusing = false;
        const refused = hooked(await dialectFor(dialect, url), {
          query: (q, run) =>
            refusing && isHeartbeat(q.sql) ? Promise.reject(new Error("connection refused (test)")) : run(),
        });
        const ledger = await openTestLedger(refused, {
          clock: () => at,
          leaseMs,
          actions: [p.action],
          budget: { attempts: 1 },
        });
        try {
          const call = ledger.run(p.action, { tenant, key: ["k"], args: { to: "x" } });
          await until(async () => p.sent() === 1, "the request was not sent");
          const [op] = await ledger.admin.list({ tenant });
          if (loss === "taken over") {
            // Its lease runs out by the database's clock, and a stopping daemon takes the row over
            // and looks the effect up: not there (nothing sent again). Again if a heartbeat came
            // between the clock's move and the takeover.
            const stop = AbortSignal.abort();
            let settled = await ledger.daemon.settle({ tenant, id: op!.id, actor: "daemon", stop });
            for (let tries = 1; settled.status === "pending_verification" && settled.state === "running"; tries++) {
              expect(tries, "the lease was never taken over").toBeLessThan(20);
              at += 2 * leaseMs;
              settled = await ledger.daemon.settle({ tenant, id: op!.id, actor: "daemon", stop });
            }
            expect(settled).toMatchObject({ status: "pending_verification", state: "pending" });
          } else refusing = true; // the database refuses its heartbeats: the lease is not renewed in time
          await until(async () => p.abortedAt() !== undefined, "the execute's signal did not abort");
          const out = await orLate(
            call.then(
              (v) => ({ answered: v, at: performance.now() }),
              (e: unknown) => ({ rejected: e, at: performance.now() }),
            ),
            scaled(10_000),
            "still running" as const,
          );
          // Before: "still running", for as long as the provider held its answer.
          expect(out, await story(ledger, tenant, op!.id)).toMatchObject({
            answered: {
              status: "pending_verification",
              state: "unknown",
              reason: expect.stringMatching(/attempt 1 may have committed|outcome unknown/),
            },
          });
          // A grace (ABANDON_AFTER_MS, 1 s) after the signal aborted, and little more.
          if (out === "still running") return;
          expect(out.at - p.abortedAt()!).toBeLessThan(scaled(3_000));
          const { operation, events } = await ledger.get({ tenant, id: op!.id });
          expect(operation).toMatchObject({ status: "unknown", attempt: loss === "taken over" ? 2 : 1 });
          expect(events.map((e) => e.reason).join(" | ")).toMatch(
            /attempt 1's lease was lost \(.*\) and its request did not answer within 1000 ms after its signal aborted/,
          );
          expect(p.effects).toHaveLength(0);
          // Its answer comes late: the effect committed, and its receipt settles the operation once.
          refusing = false;
          p.answer();
          const settled = await ledger.wait({ tenant, id: op!.id, timeoutMs: scaled(10_000) });
          expect(settled, await story(ledger, tenant, op!.id)).toMatchObject({
            status: "succeeded",
            receipt: { id: "obj_1" },
          });
          const { events: after } = await ledger.get({ tenant, id: op!.id });
          const recorded = after.filter((e) => e.to === "succeeded");
          expect(recorded, await story(ledger, tenant, op!.id)).toHaveLength(1);
          expect(recorded[0]!.reason).toMatch(/^attempt 1's receipt proves the effect happened/);
          expect(after.map((e) => e.reason).join(" | ")).not.toMatch(/two effects/);
          // Settled: a later call replays it, nothing is sent again.
          const again = await ledger.run(p.action, { tenant, key: ["k"], args: { to: "x" } });
          expect(again).toMatchObject({ status: "succeeded", replayed: true, receipt: { id: "obj_1" } });
          expect({ effects: p.effects.length, sent: p.sent() }).toEqual({ effects: 1, sent: 1 });
        } finally {
          p.answer();
          await ledger.close();
        }
      });
  });
}
