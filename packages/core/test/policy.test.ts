import { describe, expect, it } from "vitest";
import { DEFAULT_BUDGET, isEscalation } from "@idem/core";
// The policy's pure functions are internal: unit-tested here from the source, as the runner uses them.
import {
  TAKEOVER_FROM,
  decide,
  checkDelay,
  keySentAt,
  nextDelay,
  notDoneEscalationReason,
  pastEscalation,
  recoveryFor,
  statusAfter,
  type Caller,
  type Snapshot,
  waitedMs,
} from "../src/policy.js";

const HOUR = 3_600_000;

describe("recoveryFor (the replay policy table)", () => {
  const stripeLike = { dedupe: { retentionMs: 24 * HOUR }, lookup: true };
  it("replays with the same key while the provider retains it (minus the margin)", () => {
    expect(recoveryFor(stripeLike, 0, 22 * HOUR).kind).toBe("replay");
    expect(recoveryFor({ dedupe: { retentionMs: 24 * HOUR } }, 0, 22 * HOUR).kind).toBe("replay");
  });
  it("looks the effect up once the key retention (with its margin) has passed", () => {
    expect(recoveryFor(stripeLike, 0, 23.5 * HOUR).kind).toBe("reconcile");
    expect(recoveryFor(stripeLike, 0, 30 * HOUR).kind).toBe("reconcile");
  });
  it("honours a custom margin", () => {
    expect(recoveryFor({ dedupe: { retentionMs: 10_000, marginMs: 1_000 } }, 0, 8_999).kind).toBe("replay");
    expect(recoveryFor({ dedupe: { retentionMs: 10_000, marginMs: 1_000 } }, 0, 9_000).kind).toBe("review");
  });
  it("looks the effect up instead of replaying when the provider saved an error under the key", () => {
    expect(recoveryFor(stripeLike, 0, HOUR, { replayable: false }).kind).toBe("reconcile");
    expect(recoveryFor({ dedupe: { retentionMs: 24 * HOUR } }, 0, HOUR, { replayable: false }).kind).toBe("review");
    expect(recoveryFor(stripeLike, 0, HOUR, { replayable: true }).kind).toBe("replay");
    // The key is still kept: the reason says why it does not answer (before: "key retention passed").
    expect(recoveryFor(stripeLike, 0, HOUR, { replayable: false }).reason).toBe(
      "a replay with the key would only repeat the provider's saved answer; looking the effect up",
    );
    expect(recoveryFor({ dedupe: { retentionMs: 24 * HOUR } }, 0, HOUR, { replayable: false }).reason).toBe(
      "a replay with the key would only repeat the provider's saved answer and the provider cannot be queried",
    );
    expect(recoveryFor(stripeLike, 0, 30 * HOUR).reason).toBe("key retention passed; looking the effect up");
  });
  it("reconciles a provider that can only be queried", () => {
    expect(recoveryFor({ lookup: true }, 0, 1).kind).toBe("reconcile");
  });
  it("sends to review when the provider neither dedupes nor can be queried", () => {
    expect(recoveryFor({}, 0, 1).kind).toBe("review");
    expect(recoveryFor({ dedupe: { retentionMs: HOUR * 24 } }, 0, 48 * HOUR).kind).toBe("review");
  });
  it("does again an effect that is safe to repeat (a log line), whatever its age, with no key window to keep", () => {
    for (const caps of [{ repeatable: true }, { repeatable: true, lookup: true }, { repeatable: true, ...stripeLike }])
      expect(recoveryFor(caps, 0, 48 * HOUR, { replayable: false })).toEqual({
        kind: "replay",
        reason: "the effect is safe to repeat",
      });
  });
});

describe("statusAfter (failure classes)", () => {
  it.each([
    ["rejected", "failed"],
    ["permanent", "failed"],
    ["rate_limited", "pending"],
    ["transient", "pending"],
    ["ambiguous", "unknown"],
  ] as const)("%s leaves the operation %s", (kind, status) => {
    const cls = kind === "rate_limited" ? { kind, reason: "r", retryAfterMs: 1 } : { kind, reason: "r" };
    expect(statusAfter(cls)).toBe(status);
  });
});

describe("nextDelay (retry budget)", () => {
  const budget = { ...DEFAULT_BUDGET, attempts: 4, elapsedMs: 1_000, baseDelayMs: 100, maxDelayMs: 300 };
  it("backs off exponentially, capped, each wait spread over its upper half", () => {
    expect([1, 2, 3].map((n) => nextDelay(budget, n, 0, undefined, () => 1))).toEqual([100, 200, 300]);
    expect([1, 2, 3].map((n) => nextDelay(budget, n, 0, undefined, () => 0))).toEqual([50, 100, 150]);
  });
  it("spreads the waits of callers that failed together (a burst of 503s does not retry in step)", () => {
    const waits = Array.from({ length: 200 }, () => nextDelay(budget, 2, 0)!);
    for (const w of waits) expect(w >= 100 && w <= 200, String(w)).toBe(true);
    expect(new Set(waits).size).toBeGreaterThan(20);
  });
  it("never checks an unknown outcome sooner than the provider asked, and spreads those it held back together", () => {
    const waits = Array.from({ length: 200 }, () => checkDelay(100, 0, 5_000));
    for (const w of waits) expect(w >= 5_000 && w <= 5_500, String(w)).toBe(true);
    expect(new Set(waits).size).toBeGreaterThan(20);
    expect(checkDelay(100, 3, undefined, () => 1)).toBe(800);
    expect(checkDelay(100, 3, undefined, () => 0)).toBe(400);
  });
  it("stops after the attempts", () => {
    expect(nextDelay(budget, 4, 0)).toBeNull();
  });
  it("stops when the wait would pass the elapsed budget", () => {
    // From 951 ms even the shortest spread wait (50 ms) passes 1,000. At 950 a draw under 0.01
    // rounds the wait to 50, which ends on the budget, not past it: this failed 1 run in 100.
    expect(nextDelay(budget, 1, 951)).toBeNull();
    expect(nextDelay(budget, 1, 950, undefined, () => 1)).toBeNull();
  });
  it("waits as long as the provider says, never shorter", () => {
    expect(nextDelay(budget, 1, 0, 700)).toBe(700);
    expect(nextDelay(budget, 1, 0, 2_000)).toBeNull();
  });
});

describe("statusAfter once an earlier attempt may have committed", () => {
  it("a transient answer to a replay proves nothing: unknown, not pending", () => {
    expect(statusAfter({ kind: "transient", reason: "503" }, true)).toBe("unknown");
    expect(statusAfter({ kind: "rate_limited", reason: "429", retryAfterMs: 1 }, true)).toBe("unknown");
    expect(statusAfter({ kind: "permanent", reason: "400" }, true)).toBe("failed");
  });
  it("a replay refused before it was sent (input caught locally: a stricter validation deployed since) says nothing of the earlier attempt: unknown, not failed", () => {
    expect(statusAfter({ kind: "rejected", reason: "invalid message" }, true)).toBe("unknown");
    expect(statusAfter({ kind: "rejected", reason: "invalid message" })).toBe("failed");
  });
  it("an auth or policy refusal of a replay says nothing of the earlier attempt: unknown, not failed", () => {
    expect(statusAfter({ kind: "permanent", reason: "401", alert: true }, true)).toBe("unknown");
    expect(statusAfter({ kind: "permanent", reason: "401", alert: true })).toBe("failed");
  });
});

describe("decide (one snapshot, one decision)", () => {
  const base: Snapshot = {
    status: "pending",
    attempt: 2,
    leaseExpiresAt: null,
    nextCheckAt: null,
    checks: 0,
    maybeCommitted: false,
    hasArgs: true,
    createdAt: 0,
    lastExecutionAt: null,
    firstExecutionAt: null,
    now: 1_000,
  };
  const caller: Caller = { mayWaitMs: 0, mayExecute: true, hasArgs: true };
  const dedupe = { dedupe: { retentionMs: 24 * HOUR } };

  it("replays settled outcomes and never takes them over", () => {
    expect(decide({ ...base, status: "succeeded" }, dedupe, caller).kind).toBe("replay_outcome");
    expect(decide({ ...base, status: "failed" }, dedupe, caller).kind).toBe("replay_outcome");
    expect(decide({ ...base, status: "needs_review", maybeCommitted: true }, dedupe, caller).kind).toBe("answer");
  });
  it("only running (lease expired), unknown and pending can be taken over", () => {
    expect(TAKEOVER_FROM).toEqual(["running", "unknown", "pending"]);
  });
  it("waits on a live lease or answers in progress; recovers an expired one by the policy", () => {
    const live = { ...base, status: "running" as const, maybeCommitted: true, leaseExpiresAt: 5_000 };
    expect(decide(live, dedupe, caller)).toMatchObject({
      kind: "answer",
      reason: expect.stringMatching(/in progress/),
    });
    expect(decide(live, dedupe, { ...caller, mayWaitMs: 10_000 })).toEqual({ kind: "wait", ms: 4_005 });
    const expired = { ...live, leaseExpiresAt: 900 };
    expect(decide(expired, dedupe, caller)).toMatchObject({ kind: "execute", replayUntil: 23 * HOUR });
    expect(decide(expired, { lookup: true }, caller).kind).toBe("reconcile");
    expect(decide(expired, {}, caller).kind).toBe("review");
    // Safe to repeat: run again, with no provider window to start within.
    expect(decide(expired, { repeatable: true }, caller)).toEqual({
      kind: "execute",
      reason: "attempt 2's lease expired: the effect is safe to repeat",
    });
    expect(decide({ ...expired, status: "unknown" }, { repeatable: true }, caller)).toMatchObject({ kind: "execute" });
    expect(decide(expired, { repeatable: true }, { ...caller, mayExecute: false }).kind).toBe("answer");
  });
  it("a dead attempt that never executed (lazy args never stored) is known not done", () => {
    const unsent = { ...base, status: "running" as const, leaseExpiresAt: 900, maybeCommitted: false, hasArgs: false };
    expect(decide(unsent, {}, { ...caller, hasArgs: false }).kind).toBe("release");
    expect(decide(unsent, {}, caller)).toMatchObject({ kind: "execute" });
    expect(decide(unsent, {}, caller)).not.toHaveProperty("replayUntil");
  });
  it("unknown: checked only when due (unless settling on purpose), escalated past the daemon's limits, reviewed at once when nothing can check it", () => {
    const unknown = { ...base, status: "unknown" as const, maybeCommitted: true, nextCheckAt: 3_000 };
    expect(decide(unknown, { lookup: true }, caller).kind).toBe("answer");
    expect(decide(unknown, { lookup: true }, { ...caller, dueNow: true }).kind).toBe("reconcile");
    expect(
      decide({ ...unknown, checks: 5 }, { lookup: true }, { ...caller, escalate: { maxChecks: 5, maxAgeMs: HOUR } })
        .kind,
    ).toBe("review");
    expect(
      decide({ ...unknown, now: 2 * HOUR }, { lookup: true }, { ...caller, escalate: { maxChecks: 5, maxAgeMs: HOUR } })
        .kind,
    ).toBe("review");
    expect(decide(unknown, {}, caller).kind).toBe("review");
    // past the key window a deduping provider without lookup cannot be replayed
    expect(decide({ ...unknown, nextCheckAt: null, now: 30 * HOUR }, dedupe, caller).kind).toBe("review");
  });
  it("an unknown outcome's age counts from its last execution, not the operation's creation; its checks still bound it", () => {
    // The review of 66d1b33: created a day ago, run (and made unknown) just now, it went to a
    // person on the daemon's first look, "still unknown after 0 inconclusive checks".
    const escalate = { maxChecks: 20, maxAgeMs: 24 * HOUR };
    const fresh = {
      ...base,
      status: "unknown" as const,
      maybeCommitted: true,
      createdAt: 0,
      lastExecutionAt: 25 * HOUR,
      now: 25 * HOUR + 1_000,
    };
    const daemon = { ...caller, dueNow: true, escalate };
    expect(pastEscalation(escalate, fresh)).toBe(false);
    expect(decide(fresh, { lookup: true }, daemon).kind).toBe("reconcile");
    // A day after that execution: a person decides, and the reason says what was measured.
    const old = { ...fresh, now: 50 * HOUR, checks: 3 };
    expect(waitedMs(old)).toBe(25 * HOUR);
    expect(decide(old, { lookup: true }, daemon)).toMatchObject({
      kind: "review",
      reason: "still unknown after 25 h since its last execution ended (3 inconclusive checks); a person must decide",
    });
    // Replays keep moving the last execution, but each counts a check: the checks bound them.
    expect(decide({ ...fresh, checks: 20 }, dedupe, daemon)).toMatchObject({
      kind: "review",
      reason: "still unknown after 20 inconclusive checks; a person must decide",
    });
    // A row from before the column: its age counts from creation.
    expect(waitedMs({ ...fresh, lastExecutionAt: null })).toBe(25 * HOUR + 1_000);
    expect(pastEscalation(escalate, { ...fresh, lastExecutionAt: null })).toBe(true);
    expect(pastEscalation(undefined, old)).toBe(false);
  });
  it("the key window counts from the key's first send, not the operation's creation; a row from before the column from its creation", () => {
    // Created, rate limited (nothing kept under the key), first sent a day later, its answer lost.
    const sentLate = {
      ...base,
      status: "unknown" as const,
      maybeCommitted: true,
      createdAt: 0,
      firstExecutionAt: 25 * HOUR,
      lastExecutionAt: 25 * HOUR,
      now: 25 * HOUR + 1_000,
    };
    expect(decide(sentLate, dedupe, caller)).toMatchObject({ kind: "execute", replayUntil: 48 * HOUR });
    expect(decide({ ...sentLate, now: 48 * HOUR }, dedupe, caller).kind).toBe("review");
    expect(decide({ ...sentLate, now: 48 * HOUR }, { ...dedupe, lookup: true }, caller).kind).toBe("reconcile");
    expect(decide({ ...sentLate, status: "running", leaseExpiresAt: 0 }, dedupe, caller)).toMatchObject({
      kind: "execute",
      replayUntil: 48 * HOUR,
    });
    // Before: "key retention passed and the provider cannot be queried", the day it was first sent.
    expect(decide({ ...sentLate, firstExecutionAt: null }, dedupe, caller)).toMatchObject({
      kind: "review",
      reason: "outcome unknown: key retention passed and the provider cannot be queried",
    });
    expect(keySentAt(sentLate)).toBe(25 * HOUR);
    expect(keySentAt({ ...sentLate, firstExecutionAt: null })).toBe(0);
  });
  it("pending: executed by a new caller at once; a rate limit binds every caller; no args, no execution", () => {
    const later = { ...base, nextCheckAt: 5_000 };
    expect(decide(later, {}, caller).kind).toBe("execute");
    expect(decide(later, {}, { ...caller, retrying: true }).kind).toBe("answer");
    expect(decide({ ...later, rateLimited: true }, {}, caller).kind).toBe("answer");
    expect(decide({ ...base, hasArgs: false }, {}, { ...caller, hasArgs: false }).kind).toBe("answer");
    expect(decide(base, {}, { ...caller, mayExecute: false }).kind).toBe("answer");
    // Who may run it, truthfully: the daemon never claims a row without stored args (0011). Before,
    // both said "the daemon or a later call retries".
    expect(decide(base, {}, { ...caller, mayExecute: false })).toMatchObject({
      reason: "known not done; retry budget spent, the daemon or a later call retries",
    });
    expect(decide({ ...base, hasArgs: false }, {}, { ...caller, mayExecute: false })).toMatchObject({
      reason:
        "known not done; retry budget spent, a later call with the args retries (they are not stored: the daemon cannot)",
    });
  });
});

describe("decide on a person's retry of an outcome that may have committed (lookFirst)", () => {
  // Pending by the person's word; the earlier execution (lastExecutionAt 0) may land late.
  const reopened: Snapshot = {
    status: "pending",
    attempt: 2,
    leaseExpiresAt: null,
    nextCheckAt: 1_000,
    checks: 0,
    maybeCommitted: false,
    hasArgs: true,
    createdAt: 0,
    lastExecutionAt: 0,
    firstExecutionAt: 0,
    now: 1_000,
    lookFirst: true,
  };
  const caller: Caller = { mayWaitMs: 0, mayExecute: true, hasArgs: true };
  const both = { dedupe: { retentionMs: 24 * HOUR }, lookup: true };

  it("an action that can be looked up looks first, when due, and the daemon escalates its looks by count, not by the row's age", () => {
    expect(decide(reopened, { lookup: true }, caller)).toMatchObject({
      kind: "reconcile",
      reason: expect.stringMatching(/looked up first/),
    });
    const later = { ...reopened, nextCheckAt: 61_000, checks: 1 };
    expect(decide(later, { lookup: true }, caller)).toMatchObject({
      kind: "answer",
      reason: expect.stringMatching(/looked up first; next look in 60000 ms/),
    });
    expect(decide(later, { lookup: true }, { ...caller, mayWaitMs: 60_000 })).toEqual({ kind: "wait", ms: 60_000 });
    expect(decide(later, { lookup: true }, { ...caller, dueNow: true }).kind).toBe("reconcile");
    // Retried a week after its execution: the age limit that sends an unknown outcome to a person does not apply.
    const old = { ...reopened, now: 7 * 24 * HOUR };
    const escalate = { maxChecks: 3, maxAgeMs: HOUR };
    expect(decide({ ...old, nextCheckAt: old.now }, { lookup: true }, { ...caller, escalate }).kind).toBe("reconcile");
    const review = decide({ ...old, checks: 3 }, { lookup: true }, { ...caller, escalate });
    expect(review).toMatchObject({ kind: "review", reason: expect.stringMatching(/since a person's retry/) });
    expect(isEscalation((review as { reason: string }).reason)).toBe(true);
  });
  it("a key the provider still holds is replayed, inside its window; an action that can neither runs on the person's word", () => {
    expect(decide(reopened, both, caller)).toMatchObject({ kind: "execute", replayUntil: 23 * HOUR });
    expect(decide({ ...reopened, now: 30 * HOUR }, both, caller).kind).toBe("reconcile");
    expect(decide(reopened, {}, caller)).toEqual({ kind: "execute", reason: "retry of work known not done" });
    expect(decide({ ...reopened, lookFirst: false }, { lookup: true }, caller).kind).toBe("execute");
    // Args not stored: only a caller that has them can look (and run), and the answer says so, not "known not done".
    expect(decide({ ...reopened, hasArgs: false }, { lookup: true }, { ...caller, hasArgs: false })).toMatchObject({
      kind: "answer",
      reason: expect.stringMatching(/looked up first, by a caller with the args/),
    });
  });
  it("its lookup's worker died (running, lease expired, nothing committed by it): looked up again, never run blind", () => {
    const dead = { ...reopened, status: "running" as const, leaseExpiresAt: 900 };
    expect(decide(dead, { lookup: true }, caller).kind).toBe("reconcile");
    // Before 0012's mark, as a dead attempt that never executed: run at once.
    expect(decide({ ...dead, lookFirst: false }, { lookup: true }, caller).kind).toBe("execute");
  });
});

describe("isEscalation (what idem_escalations_total counts), on the reasons decide() gives", () => {
  const escalate = { maxChecks: 5, maxAgeMs: 24 * HOUR };
  const daemon: Caller = { mayWaitMs: 0, mayExecute: true, hasArgs: false, dueNow: true, escalate };
  const unknown: Snapshot = {
    status: "unknown",
    attempt: 1,
    leaseExpiresAt: null,
    nextCheckAt: 0,
    checks: 0,
    maybeCommitted: true,
    hasArgs: true,
    createdAt: 0,
    lastExecutionAt: 0,
    firstExecutionAt: 0,
    now: HOUR,
  };
  const pending: Snapshot = { ...unknown, status: "pending", maybeCommitted: false };
  /** decide()'s reason, checked to be a review's when `review`. */
  const reason = (s: Snapshot, caps: Parameters<typeof decide>[1], review = true) => {
    const d = decide(s, caps, daemon);
    expect(d.kind).toBe(review ? "review" : "answer");
    return "reason" in d ? d.reason : "";
  };

  it("the daemon's limits passed: an unknown outcome's checks or age, work known not done refused maxChecks times", () => {
    const escalations = [
      reason({ ...unknown, checks: 5 }, { lookup: true }),
      reason({ ...unknown, now: 25 * HOUR }, { lookup: true }),
      reason({ ...pending, checks: 5 }, {}),
    ];
    expect(escalations).toEqual([
      "still unknown after 5 inconclusive checks; a person must decide",
      "still unknown after 25 h since its last execution ended (0 inconclusive checks); a person must decide",
      "still not done after 5 tries the provider refused for now; a person must decide whether to run it again",
    ]);
    for (const r of escalations) expect(isEscalation(r), r).toBe(true);
  });
  it("a review that passed no limit, and an answer, are not escalations", () => {
    const others = [
      // Nothing can check the provider: a person at once, whatever the limits.
      reason(unknown, {}),
      reason({ ...unknown, status: "running", leaseExpiresAt: 0 }, {}),
      // The args are not stored: neither a replay nor a lookup can be made.
      reason({ ...unknown, hasArgs: false }, { lookup: true }),
      reason({ ...unknown, hasArgs: false }, { dedupe: { retentionMs: 24 * HOUR } }),
      // Already with a person; known not done with no args to run it (a caller's to run).
      reason({ ...unknown, status: "needs_review" }, {}, false),
      reason({ ...pending, checks: 5, hasArgs: false }, {}, false),
    ];
    for (const r of others) expect(isEscalation(r), r).toBe(false);
  });
  it("the reasons of work known not done say the limit passed: its tries, or its age since its last attempt", () => {
    expect(notDoneEscalationReason(escalate, { ...pending, checks: 5 })).toBe(
      "still not done after 5 tries the provider refused for now",
    );
    const old = notDoneEscalationReason(escalate, { ...pending, checks: 2, now: 25 * HOUR });
    expect(old).toBe("still not done after 25 h since its last attempt (2 tries the provider refused for now)");
    expect(isEscalation(old)).toBe(true);
  });
});
