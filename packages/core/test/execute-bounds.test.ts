/**
 * The time bound of a settlement (`ledger.daemon.settle`'s `timeoutMs`, its budget's `elapsedMs`)
 * and a caller's signal bound the request under way too, as they bound a lookup: its `op.signal`
 * aborts, and an execute that does not answer for it (a client with no deadline of its own, an
 * SMTP server holding its answer) is no longer awaited. Its request may have been sent, so the
 * operation is unknown (looked up later), never "not done"; its answer, if one comes, is recorded
 * through the fence. Before: a 300 ms bound held the settlement, its lease heartbeat with it, for
 * as long as the request hung (a helper measured 8.2 s for 1 s against an SMTP server).
 */
import { describe, expect, it } from "vitest";
import { defineAction, type Ledger } from "@idem/core";
import { openTestLedger } from "@idem/core/testing";
import { DIALECTS, freshDatabase, scaled } from "@idem/testkit";
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

/** `work`'s answer, or "still running" once `ms` passed: a test that fails says so, rather than hang. */
function within<T>(work: Promise<T>, ms: number): Promise<T | "still running"> {
  let timer: NodeJS.Timeout | undefined;
  const late = new Promise<"still running">((r) => (timer = setTimeout(() => r("still running"), ms)));
  return Promise.race([work, late]).finally(() => clearTimeout(timer));
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
      const out = await within(ledger.daemon.settle({ tenant, id, timeoutMs: 300 }), scaled(10_000));
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
        const out = await within(
          call.then(
            (v) => ({ answered: v }),
            (e: unknown) => ({ rejected: e }),
          ),
          scaled(10_000),
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
