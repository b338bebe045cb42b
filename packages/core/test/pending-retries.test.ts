/**
 * Work known not done that the provider refuses for now on every try (503 before executing; not a
 * rate limit, whose wait is the provider's and whose tries do not count): each try counts, the daemon's tries back off as an unknown outcome's checks do
 * (doubling, capped at an hour) instead of coming back every tick at the first try's delay, and
 * past the daemon's `maxChecks` the work goes to a person, alerted, never tried again unasked.
 * An outcome that becomes unknown after such tries starts its own checks from nothing.
 */
import { describe, expect, it } from "vitest";
import { DIALECTS } from "@idem/testkit";
import { ledgers, uniqueTenant } from "./support/ledgers.js";
import { answering, TestProvider } from "./support/provider.js";

const UNAVAILABLE = { when: "before", cls: { kind: "transient", reason: "503 service unavailable" } } as const;

for (const dialect of DIALECTS) {
  describe(`work the provider refuses on every try, ${dialect}`, () => {
    const db = ledgers(dialect);

    async function refusedOnce(p: TestProvider) {
      const mail = p.action("mail", { lookup: true });
      // One try per call or settlement: each settlement below is one try.
      const ledger = await db.open({ actions: [mail], budget: { attempts: 1 } });
      const tenant = uniqueTenant();
      p.faults.push(UNAVAILABLE);
      const out = await ledger.run(mail, { tenant, key: ["m"], args: { to: "x" } });
      expect(out).toMatchObject({ status: "pending_verification", state: "pending" });
      return { ledger, mail, tenant, id: out.operationId };
    }

    it("each try counts, and the daemon's tries wait longer each time (not every tick at the first try's delay)", async () => {
      const p = new TestProvider();
      const { ledger, tenant, id } = await refusedOnce(p);
      const seen: { checks: number; waitMs: number }[] = [];
      for (let i = 0; i < 8; i++) {
        p.faults.push(UNAVAILABLE);
        expect(await ledger.daemon.settle({ tenant, id, actor: "daemon" })).toMatchObject({ state: "pending" });
        const { operation: op } = await ledger.get({ tenant, id });
        seen.push({ checks: op.checks, waitMs: op.nextCheckAt! - op.updatedAt });
      }
      expect(p.calls).toBe(9);
      expect(seen.map((s) => s.checks)).toEqual([2, 3, 4, 5, 6, 7, 8, 9]);
      // 100 ms doubled per try and spread over [d/2, d]: the 9th try's wait is at least 12.8 s.
      // Before: checks stayed 0 and every wait was the first try's (at most 100 ms), so the daemon
      // tried again each tick for as long as the provider was down.
      expect(seen.at(-1)!.waitMs, JSON.stringify(seen)).toBeGreaterThanOrEqual(12_800);
      expect(seen.at(-1)!.waitMs).toBeGreaterThan(8 * seen[0]!.waitMs);
      expect(p.effects).toHaveLength(0);
    });

    it("past the daemon's maxChecks it goes to a person, alerted, without another try; a person's retry starts over", async () => {
      const p = new TestProvider();
      const { ledger, mail, tenant, id } = await refusedOnce(p);
      const escalate = { maxChecks: 3, maxAgeMs: 3_600_000 };
      for (let i = 0; i < 2; i++) {
        p.faults.push(UNAVAILABLE);
        expect(await ledger.daemon.settle({ tenant, id, actor: "daemon", escalate })).toMatchObject({
          state: "pending",
        });
      }
      expect(p.calls).toBe(3);
      // Before: tried again (a 4th call), and again each time it came due, for ever.
      const parked = await ledger.daemon.settle({ tenant, id, actor: "daemon", escalate });
      expect(parked).toMatchObject({
        status: "pending_verification",
        state: "needs_review",
        reason: expect.stringMatching(/^still not done after 3 tries.*a person must decide/),
      });
      expect(p.calls).toBe(3);
      const due = await ledger.daemon.alertsDue({ limit: 100 });
      expect(due.filter((op) => op.id === id)).toMatchObject([{ status: "needs_review" }]);
      // The provider is back; a person says run it again: it runs once.
      const back = await ledger.admin.retry({ tenant, id, actor: "ops", reason: "provider back" });
      expect(back).toMatchObject({ status: "pending", checks: 0 });
      expect(await ledger.run(mail, { tenant, key: ["m"], args: { to: "x" } })).toMatchObject({
        status: "succeeded",
        replayed: false,
      });
      expect(p.effects).toHaveLength(1);
    });

    /** `refusedOnce`, then `n` more of the daemon's tries refused: the row holds `n + 1` tries. */
    async function refusedTimes(p: TestProvider, n: number) {
      const first = await refusedOnce(p);
      for (let i = 0; i < n; i++) {
        p.faults.push(UNAVAILABLE);
        await first.ledger.daemon.settle({ tenant: first.tenant, id: first.id, actor: "daemon" });
      }
      expect((await first.ledger.get(first)).operation).toMatchObject({ status: "pending", checks: n + 1 });
      return first;
    }

    it("a caller's own retries keep its budget, whatever the daemon's tries made the row's backoff", async () => {
      const p = new TestProvider();
      const { ledger, mail, tenant } = await refusedTimes(p, 9);
      // The provider is back after one more 503: the caller's second try (of 3) is done.
      p.faults.push(UNAVAILABLE);
      const out = await ledger.run(mail, { tenant, key: ["m"], args: { to: "x" }, budget: { attempts: 3 } });
      // Before the fix: one try, then "retry budget spent" (1 of 3 tries, nothing of 30 s used):
      // its next wait was the row's 10th check's (51 to 102 s), past its 30 s.
      expect(out).toMatchObject({ status: "succeeded", replayed: false });
      expect(p.calls).toBe(12);
      expect(p.effects).toHaveLength(1);
    });

    // Found in review of 5a7d5b2: a rate limit the daemon met bound every caller to the daemon's
    // backoff, as if the provider had asked for it. A rate limit keeps the provider's wait.
    it("a rate limit holds a new caller for the provider's wait, not for the daemon's backoff", async () => {
      const p = new TestProvider();
      const { ledger, mail, tenant, id } = await refusedTimes(p, 9);
      // The provider is back, and answers the daemon's next try with a rate limit asking no wait.
      p.faults.push({
        when: "before",
        cls: { kind: "rate_limited", reason: "429 too many requests", retryAfterMs: 0 },
      });
      const before = (await ledger.get({ tenant, id })).operation.checks;
      await ledger.daemon.settle({ tenant, id, actor: "daemon" });
      // The provider said when to come back: no try it refused toward a person.
      expect((await ledger.get({ tenant, id })).operation.checks).toBe(before);
      // A new caller willing to wait 5 s. Before: "known not done; retried in ~80000 ms", the
      // daemon's 11th backoff binding every caller as if the provider had asked for it.
      const out = await ledger.run(mail, { tenant, key: ["m"], args: { to: "x" }, waitMs: 5_000 });
      expect(out).toMatchObject({ status: "succeeded", replayed: false });
      expect(p.effects).toHaveLength(1);
    });

    it("an attempt never sent (the caller gave up first) is no try the provider refused", async () => {
      const p = new TestProvider();
      const mail = p.action("mail", { lookup: true });
      const ledger = await db.open({ actions: [mail], budget: { attempts: 1 } });
      const tenant = uniqueTenant();
      const gaveUp = new AbortController();
      const out = await ledger.run(mail, {
        tenant,
        key: ["m"],
        signal: gaveUp.signal,
        // The caller gives up while its args are made: nothing is sent.
        args: () => {
          gaveUp.abort(new Error("caller left"));
          return { to: "x" };
        },
      });
      expect(out).toMatchObject({ status: "pending_verification", state: "pending" });
      expect(p.calls).toBe(0);
      const [op] = await ledger.admin.list({ tenant });
      // Before the fix: checks 1, counted toward "still not done after N tries the provider refused".
      expect(op).toMatchObject({ status: "pending", checks: 0 });
    });

    it("work whose args are not stored, refused on its callers' tries: the daemon, which cannot run it, does not park it", async () => {
      const p = new TestProvider();
      const mail = p.action("mail", { lookup: true });
      const ledger = await db.open({ actions: [mail], budget: { attempts: 1 } });
      const tenant = uniqueTenant();
      const run = () => ledger.run(mail, { tenant, key: ["m"], args: { to: "x" }, storeArgs: false });
      for (let i = 0; i < 3; i++) {
        p.faults.push(UNAVAILABLE);
        expect(await run()).toMatchObject({ state: "pending" });
      }
      const [op] = await ledger.admin.list({ tenant });
      const escalate = { maxChecks: 3, maxAgeMs: 3_600_000 };
      // Before the fix: needs_review ("still not done after 3 tries"), tries the daemon never made
      // nor could, and the caller's next call refused until a person retried it.
      expect(await ledger.daemon.settle({ tenant, id: op!.id, actor: "daemon", escalate })).toMatchObject({
        state: "pending",
        reason: "known not done; a caller with the args must run it again",
      });
      expect(await run()).toMatchObject({ status: "succeeded", replayed: false });
      expect(p.effects).toHaveLength(1);
    });

    it("an unknown outcome after refused tries starts its checks from nothing", async () => {
      const p = new TestProvider();
      const { ledger, tenant, id } = await refusedOnce(p);
      p.faults.push(UNAVAILABLE);
      await ledger.daemon.settle({ tenant, id, actor: "daemon" });
      expect((await ledger.get({ tenant, id })).operation).toMatchObject({ status: "pending", checks: 2 });
      // The next try times out after it was sent: the outcome is unknown, with no check made yet.
      p.faults.push({ when: "after", cls: { kind: "ambiguous", reason: "timeout after send" } });
      expect(await ledger.daemon.settle({ tenant, id, actor: "daemon" })).toMatchObject({ state: "unknown" });
      expect((await ledger.get({ tenant, id })).operation).toMatchObject({ status: "unknown", checks: 0 });
      expect(p.effects).toHaveLength(1);
    });
    /**
     * Attempt 1 sent and held (its request out past its lease), a stopping daemon's lookup finding
     * nothing yet (known not done), then three tries refused (503): `release` lets attempt 1's
     * request commit and answer a timeout.
     */
    async function outWhileRefused(p: TestProvider) {
      let now = Date.now();
      const mail = p.action("mail", { lookup: true });
      const ledger = await db.open({ clock: () => now, leaseMs: 30_000, actions: [mail], budget: { attempts: 1 } });
      const tenant = uniqueTenant();
      const run = (a = mail) => ledger.run(a, { tenant, key: ["m"], args: { to: "x" } });
      let release: () => void = () => {};
      p.gate = new Promise<void>((r) => (release = r));
      p.faults.push({ when: "after", cls: { kind: "ambiguous", reason: "timeout after the body" } });
      const first = run();
      await p.called(1);
      now += 31_000;
      const [op] = await ledger.admin.list({ tenant });
      const stop = new AbortController();
      stop.abort();
      expect(await ledger.daemon.settle({ tenant, id: op!.id, actor: "daemon", stop: stop.signal })).toMatchObject({
        state: "pending",
      });
      p.gate = undefined;
      for (let i = 0; i < 3; i++) {
        p.faults.push(UNAVAILABLE);
        expect(await run()).toMatchObject({ state: "pending" });
      }
      const checksOf = async () => (await ledger.get({ tenant, id: op!.id })).operation;
      return { mail, run, first, release, checksOf };
    }

    // Before the fix, each left checks 3: the refused tries read as inconclusive checks of attempt
    // 1's outcome, which had none (the daemon escalated it early, "after N inconclusive checks").
    it("an attempt out while the work was tried and refused, then ended: unknown again, its checks from nothing", async () => {
      const p = new TestProvider();
      const { first, release, checksOf } = await outWhileRefused(p);
      release();
      expect(await first).toMatchObject({ state: "unknown", reason: "outcome unknown: attempt 1 may have committed" });
      expect(await checksOf()).toMatchObject({ status: "unknown", checks: 0 });
      expect(p.effects).toHaveLength(1);
    });

    it("a try refused after an earlier attempt's request, still out, ended: unknown, its checks from nothing", async () => {
      const p = new TestProvider();
      const { mail, run, first, release, checksOf } = await outWhileRefused(p);
      // Another try is out when attempt 1's request ends (a timeout); then it is refused (503).
      const later = answering(mail, UNAVAILABLE.cls);
      const out = run(later.action);
      await later.sent;
      release();
      await first;
      later.answer();
      expect(await out).toMatchObject({
        state: "unknown",
        reason: expect.stringMatching(/ended meanwhile and may have/),
      });
      expect(await checksOf()).toMatchObject({ status: "unknown", checks: 0 });
      expect(p.effects).toHaveLength(1);
    });
  });
}
