/**
 * Pure decisions of the runner and the daemon, kept apart so they are the same everywhere and
 * tested directly (test/policy.test.ts).
 */
import type { Capabilities, Classification } from "./action.js";
import type { Status } from "./schema.js";

/** How to recover a `running` row whose lease expired, or an `unknown` row. */
export type Recovery =
  /**
   * Send the same request with the same key: the provider returns the first result, or the effect
   * is harmless to repeat (`repeatable`). `until`: when the provider's retention (minus the
   * margin), counted from the key's first send, ends; a replay must not start after it. Absent:
   * a repeatable effect, which no provider must remember.
   */
  | { readonly kind: "replay"; readonly reason: string; readonly until?: number }
  /** Ask the provider whether the effect exists. */
  | { readonly kind: "reconcile"; readonly reason: string }
  /** Nothing can prove either way: a person decides. */
  | { readonly kind: "review"; readonly reason: string };

const DEFAULT_DEDUPE_MARGIN_MS = 60 * 60 * 1000;

/**
 * The replay policy table of docs/design.md, as one function. `firstSentAt`: when the operation's
 * key was first sent (see `keySentAt`): a provider keeps a key for its retention from the first
 * request that carried it, not from the operation's creation. Given a time earlier than the true
 * first send, the key is thought forgotten early (a lookup or a person); a later one would replay
 * a key the provider may have forgotten, a second effect.
 */
export function recoveryFor(
  caps: Capabilities,
  firstSentAt: number,
  now: number,
  last?: { replayable?: boolean | undefined },
): Recovery {
  // A second effect is harmless, and no one could tell the first from none: do it again.
  if (caps.repeatable) return { kind: "replay", reason: "the effect is safe to repeat" };
  // The provider saved an error under our key: a replay would only repeat it.
  if (caps.dedupe && last?.replayable !== false) {
    const usable = caps.dedupe.retentionMs - (caps.dedupe.marginMs ?? DEFAULT_DEDUPE_MARGIN_MS);
    // The provider still remembers our key: it answers a replay with the first result.
    if (now - firstSentAt < usable)
      return {
        kind: "replay",
        reason: "provider dedupes on the key and it is still retained",
        until: firstSentAt + usable,
      };
  }
  // Why the key does not answer: past its retention, or a replay would only repeat what the
  // provider saved under it (the key is still kept then).
  const keyDone = !caps.dedupe
    ? undefined
    : last?.replayable === false
      ? "a replay with the key would only repeat the provider's saved answer"
      : "key retention passed";
  // A lookup can find the effect (or prove its absence) whatever its age.
  if (caps.lookup)
    return { kind: "reconcile", reason: keyDone ? `${keyDone}; looking the effect up` : "looking the effect up" };
  // Neither: replaying could duplicate, assuming absence could lose the effect.
  return {
    kind: "review",
    reason: keyDone
      ? `${keyDone} and the provider cannot be queried`
      : "the provider neither dedupes nor can be queried",
  };
}

/**
 * Where a failure class leaves the operation. `maybeCommitted`: an EARLIER attempt may have
 * committed (this one was a replay of an unknown outcome). A transient answer, or a refusal of
 * our credentials, then proves nothing about that earlier attempt, so the operation stays
 * `unknown`: only a proof clears it.
 */
export function statusAfter(
  cls: Classification,
  maybeCommitted = false,
): Extract<Status, "failed" | "pending" | "unknown"> {
  switch (cls.kind) {
    case "rejected":
      // Refused before it was sent: no answer about an earlier attempt that may have committed
      // (a stricter validation deployed since, a config changed), only about this one.
      return maybeCommitted ? "unknown" : "failed";
    case "permanent":
      // A permanent answer: replayed to later callers, no effect. But an auth or policy refusal
      // (alert) of a replay is no answer about the earlier attempt: a validation error or a
      // decline saved under the key is, a revoked token is not.
      return maybeCommitted && cls.alert ? "unknown" : "failed";
    case "rate_limited":
    case "transient":
      // this attempt did not commit; an earlier one still may have
      return maybeCommitted ? "unknown" : "pending";
    case "ambiguous":
      return "unknown"; // may have committed: only reconciliation decides
  }
}

/**
 * Everything a decision about an existing operation needs, read in one statement (the snapshot).
 * Every write that follows the decision is conditioned on `status` and `attempt` as read here.
 */
export interface Snapshot {
  readonly status: Status;
  readonly attempt: number;
  readonly leaseExpiresAt: number | null;
  readonly nextCheckAt: number | null;
  /** Inconclusive checks of an unknown outcome so far; of work known not done, tries the provider refused. */
  readonly checks: number;
  /** An attempt may have committed and nothing has proven otherwise yet (sticky, see docs/design.md). */
  readonly maybeCommitted: boolean;
  /** The args are stored with the operation (lazy args are stored just before the first execution). */
  readonly hasArgs: boolean;
  /**
   * A person reopened the operation from a state that may have committed (`look_first`, migration
   * 0012): pending by their word, but the earlier request may land after they looked, so its effect
   * is looked up before it runs again; also the lookup's own running row. Absent: false.
   */
  readonly lookFirst?: boolean | undefined;
  readonly createdAt: number;
  /**
   * When the last attempt's request ended, or may have (a dead worker's lease), by the database
   * clock; null on a row older than the column. An unknown outcome is as old as this.
   */
  readonly lastExecutionAt: number | null;
  /**
   * When the operation's key was first sent (the start of the first execution since it was last
   * known not done), by the database clock; null on a row older than the column. Read only while
   * the operation may have committed: a `pending` row's is its last run's, and its next execution
   * starts it anew. See `keySentAt`.
   */
  readonly firstExecutionAt: number | null;
  /** The database's time when the snapshot was read: the only clock decisions use. */
  readonly now: number;
  /** The last stored error's `replayable` flag (a provider that saved an error under our key). */
  readonly replayable?: boolean | undefined;
  /** The last stored error was the provider's rate limit: its wait (`nextCheckAt`) binds every caller. */
  readonly rateLimited?: boolean | undefined;
}

/** What the caller can bring to a decision. */
export interface Caller {
  /** How much longer it may wait for another worker or for a check to fall due, ms. */
  readonly mayWaitMs: number;
  /** The retry budget still allows an execution (and the call is not closing). */
  readonly mayExecute: boolean;
  /** Why no execution is allowed when it is not the budget: the ledger is closing, the settlement was stopped. */
  readonly closing?: string | undefined;
  /** It has args to execute with (given or lazy) when none are stored. */
  readonly hasArgs: boolean;
  /** This call already executed and is in its own backoff (a new caller is not bound by another's). */
  readonly retrying?: boolean;
  /**
   * Settling on purpose (the daemon claimed the row because it was due, or an operator asked):
   * the row's schedule (`nextCheckAt`) does not hold it back.
   */
  readonly dueNow?: boolean;
  /**
   * The daemon's escalation limits, when the caller is the daemon: for unknown outcomes (checks,
   * age), and for work known not done that the provider refused on every try (`maxChecks` tries).
   */
  readonly escalate?: { readonly maxChecks: number; readonly maxAgeMs: number } | undefined;
}

/** The decision on a snapshot. The writes it leads to name the snapshot's status and attempt. */
export type Decision =
  /** Settled (succeeded or failed): answer with the stored outcome. */
  | { readonly kind: "replay_outcome" }
  /** Nothing to do now: answer `pending_verification` with this reason. */
  | { readonly kind: "answer"; readonly reason: string }
  /** Look again after this many ms (a live lease, or a check not yet due). */
  | { readonly kind: "wait"; readonly ms: number }
  /**
   * Take the operation over and execute: work known not done, or a replay with the same key that
   * must start before `replayUntil` (the takeover checks it by the database clock).
   */
  | { readonly kind: "execute"; readonly reason: string; readonly replayUntil?: number }
  /** Take it over and look the effect up. */
  | { readonly kind: "reconcile"; readonly reason: string }
  /** Take it over and hand it to a person. */
  | { readonly kind: "review"; readonly reason: string }
  /** A dead attempt never got to execute: known not done, back to `pending` for a caller with args. */
  | { readonly kind: "release"; readonly reason: string };

/**
 * When a provider's key retention for this operation began, as far as the ledger can tell: its
 * first send, or on a row older than that column its creation (earlier: the safe side).
 */
export function keySentAt(s: Pick<Snapshot, "firstExecutionAt" | "createdAt">): number {
  return s.firstExecutionAt ?? s.createdAt;
}

/**
 * How an escalation's reason begins when an unknown outcome goes to a person (`escalationReason`).
 * `isEscalation` tells every escalation's reason; this prefix alone misses work known not done.
 */
export const ESCALATED = "still unknown after";
/** How it begins when work known not done goes to a person (`notDoneEscalationReason`). */
export const ESCALATED_NOT_DONE = "still not done after";

/**
 * Whether `reason` is an escalation's: the daemon sent the operation to a person because it passed
 * the daemon's limits (`maxChecks`, `maxAgeMs`), an unknown outcome or work known not done, its
 * action registered with the daemon or not. A review that passed no limit (nothing can check the
 * provider, args not stored) is not one. `idem_escalations_total` counts the settlements it accepts.
 */
export function isEscalation(reason: string): boolean {
  return reason.startsWith(ESCALATED) || reason.startsWith(ESCALATED_NOT_DONE);
}

/** What an escalation's age is measured on: the database clock, and when the outcome became unknown. */
export interface Age {
  readonly checks: number;
  readonly now: number;
  readonly createdAt: number;
  readonly lastExecutionAt: number | null;
}

/**
 * How long an unsettled operation has waited, ms: since its last execution ended (the request
 * whose outcome is unknown, or the last attempt of one known not done), or since its creation on
 * a row older than that column. Not since creation: an operation first run a day after it was
 * created (pending meanwhile) would reach a person on its first unknown outcome without one
 * check. A dedupe provider's replays move it, but each that proves nothing counts a check, so
 * `maxChecks` still bounds them.
 */
export function waitedMs(s: Age): number {
  return s.now - (s.lastExecutionAt ?? s.createdAt);
}

/** Whether an unknown outcome is past the daemon's limits (checks, or `waitedMs` by the database clock): a person decides. */
export function pastEscalation(e: Caller["escalate"], s: Age): boolean {
  return e !== undefined && (s.checks >= e.maxChecks || waitedMs(s) > e.maxAgeMs);
}

/** An escalation's reason: the limit it passed, said as what it measures. */
export function escalationReason(e: NonNullable<Caller["escalate"]>, s: Age): string {
  return s.checks >= e.maxChecks
    ? `${ESCALATED} ${counted(s.checks, "inconclusive check", "inconclusive checks")}`
    : `${ESCALATED} ${hours(waitedMs(s))} h since its last execution ended (${counted(s.checks, "inconclusive check", "inconclusive checks")})`;
}

/**
 * The reason work known not done goes to a person: the limit it passed, said as what it measures.
 * Its checks are the tries the provider refused for now; its age counts from its last attempt.
 */
export function notDoneEscalationReason(e: NonNullable<Caller["escalate"]>, s: Age): string {
  return s.checks >= e.maxChecks
    ? `${ESCALATED_NOT_DONE} ${counted(s.checks, "try", "tries")} the provider refused for now`
    : `${ESCALATED_NOT_DONE} ${hours(waitedMs(s))} h since its last attempt (${counted(s.checks, "try", "tries")} the provider refused for now)`;
}

/** `n` and the noun, one or many: "1 try", "0 tries". */
function counted(n: number, one: string, many: string): string {
  return `${n} ${n === 1 ? one : many}`;
}

/** ms as hours with one decimal. */
export function hours(ms: number): number {
  return Math.round(ms / 360_000) / 10;
}

/** The statuses a takeover may start from; nothing else can be taken over. */
export const TAKEOVER_FROM = ["running", "unknown", "pending"] as const satisfies readonly Status[];

/**
 * The runner's and the daemon's decision about an existing operation, as one pure function of
 * the snapshot, the action's capabilities and what the caller can do.
 */
export function decide(s: Snapshot, caps: Capabilities, c: Caller): Decision {
  switch (s.status) {
    case "succeeded":
    case "failed":
      return { kind: "replay_outcome" };
    case "needs_review":
      return { kind: "answer", reason: "a person must decide whether the effect happened" };
    case "running": {
      const leaseLeft = (s.leaseExpiresAt ?? 0) - s.now;
      if (leaseLeft > 0) {
        // A live lease: the winner may be performing the effect right now.
        if (c.mayWaitMs <= 0)
          return {
            kind: "answer",
            reason: `in progress: attempt ${s.attempt} holds the lease for ${leaseLeft} ms more`,
          };
        return { kind: "wait", ms: Math.min(c.mayWaitMs, leaseLeft + 5) };
      }
      const why = `attempt ${s.attempt}'s lease expired`;
      // The dead attempt never stored args, so it never executed: known not done. Unless it was
      // the lookup of a person's retry (lookFirst): that one died before it proved anything.
      if (!s.maybeCommitted && !s.lookFirst) {
        if ((s.hasArgs || c.hasArgs) && c.mayExecute) return { kind: "execute", reason: `${why} before it executed` };
        return { kind: "release", reason: `${why} before it executed: known not done` };
      }
      return recover(s, caps, c, why);
    }
    case "unknown": {
      if (c.escalate && pastEscalation(c.escalate, s))
        return { kind: "review", reason: `${escalationReason(c.escalate, s)}; a person must decide` };
      // Nothing can check this provider: a person decides now, not after a backoff.
      const r = recoveryFor(caps, keySentAt(s), s.now, { replayable: s.replayable });
      if (r.kind === "review") return { kind: "review", reason: `outcome unknown: ${r.reason}` };
      const dueIn = c.dueNow ? 0 : (s.nextCheckAt ?? 0) - s.now;
      if (dueIn > 0) {
        if (c.mayWaitMs < dueIn)
          return { kind: "answer", reason: `outcome unknown, verification continues; next check in ${dueIn} ms` };
        return { kind: "wait", ms: dueIn };
      }
      return recover(s, caps, c, "outcome unknown");
    }
    case "pending": {
      // Only a caller can run it (its args are not stored): its tries are its own to make, and the
      // daemon, which can make none, parks nothing for them.
      if (!s.hasArgs && !c.hasArgs)
        return {
          kind: "answer",
          reason: s.lookFirst
            ? `${REOPENED}, by a caller with the args, which must run it again`
            : "known not done; a caller with the args must run it again",
        };
      // A person's retry of an outcome that may have committed: what would recover it, were it
      // unknown, decides whether it may run now. A lookup looks first (`lookAfterRetry`); a key the
      // provider still holds is replayed (below); an action that can neither runs on their word.
      const reopened = s.lookFirst ? recoveryFor(caps, keySentAt(s), s.now, { replayable: s.replayable }) : undefined;
      if (reopened?.kind === "reconcile") return lookAfterRetry(s, c, reopened.reason);
      // Each try the provider refused for now (503, a rate limit) counted a check: past the
      // daemon's limit a person decides whether the work is still wanted, rather than a provider
      // down for days being tried for ever and the work done whenever it comes back.
      if (c.escalate && s.checks >= c.escalate.maxChecks)
        return {
          kind: "review",
          reason: `${notDoneEscalationReason(c.escalate, s)}; a person must decide whether to run it again`,
        };
      if (!c.mayExecute)
        return {
          kind: "answer",
          // Without stored args only a caller can run it: the daemon never claims it (0011).
          reason: `known not done; ${c.closing ?? "retry budget spent"}, ${s.hasArgs ? "the daemon or a later call retries" : "a later call with the args retries (they are not stored: the daemon cannot)"}`,
        };
      const bound = !c.dueNow && (c.retrying === true || s.rateLimited === true);
      const dueIn = bound ? (s.nextCheckAt ?? 0) - s.now : 0;
      if (dueIn > 0) {
        // The provider asked us to wait (Retry-After) or the backoff has not run out.
        if (c.mayWaitMs < dueIn) return { kind: "answer", reason: `known not done; retried in ${dueIn} ms` };
        return { kind: "wait", ms: dueIn };
      }
      if (reopened?.kind === "replay")
        return {
          kind: "execute",
          reason: `retried by a person, its last execution may have committed: ${reopened.reason}`,
          ...(reopened.until !== undefined && { replayUntil: reopened.until }),
        };
      return { kind: "execute", reason: "retry of work known not done" };
    }
  }
}

/** Why a person's retry of an outcome that may have committed is not run at once. */
const REOPENED = "retried by a person, but its last execution may have committed: its effect is looked up first";

/**
 * A pending row a person reopened from a state that may have committed, whose action can be
 * looked up: the look is scheduled as an unknown outcome's checks are (due when the last one
 * asked, counted toward `maxChecks`), but not by the row's age, which counts from the earlier
 * execution a person has just decided on.
 */
function lookAfterRetry(s: Snapshot, c: Caller, why: string): Decision {
  if (c.escalate && s.checks >= c.escalate.maxChecks)
    return {
      kind: "review",
      reason: `${ESCALATED} ${counted(s.checks, "inconclusive check", "inconclusive checks")} since a person's retry; a person must decide`,
    };
  const dueIn = c.dueNow ? 0 : (s.nextCheckAt ?? 0) - s.now;
  if (dueIn > 0) {
    if (c.mayWaitMs < dueIn) return { kind: "answer", reason: `${REOPENED}; next look in ${dueIn} ms` };
    return { kind: "wait", ms: dueIn };
  }
  return { kind: "reconcile", reason: `${REOPENED}: ${why}` };
}

/** The replay policy for an attempt that may have committed. */
function recover(s: Snapshot, caps: Capabilities, c: Caller, why: string): Decision {
  const r = recoveryFor(caps, keySentAt(s), s.now, { replayable: s.replayable });
  if (r.kind === "replay") {
    if (!c.mayExecute)
      return { kind: "answer", reason: `${why}; ${c.closing ?? "retry budget spent"} before the replay` };
    if (!s.hasArgs && !c.hasArgs)
      return { kind: "review", reason: `${why}: the args are not stored, so the request cannot be replayed` };
    return { kind: "execute", reason: `${why}: ${r.reason}`, ...(r.until !== undefined && { replayUntil: r.until }) };
  }
  if (r.kind === "reconcile") {
    if (!s.hasArgs && !c.hasArgs)
      return { kind: "review", reason: `${why}: the args are not stored, so the effect cannot be looked up` };
    return { kind: "reconcile", reason: `${why}: ${r.reason}` };
  }
  return { kind: "review", reason: `${why}: ${r.reason}` };
}

/**
 * Backoff between checks of an unknown outcome: doubles per check, capped at an hour, spread (see
 * `spread`) so that operations that failed together are not checked together; never sooner than
 * the provider asked.
 */
export function checkDelay(baseDelayMs: number, checks: number, providerWaitMs?: number, random = Math.random): number {
  const ours = spread(Math.min(baseDelayMs * 2 ** Math.min(checks, 20), 3_600_000), random);
  return Math.max(providerWaitMs === undefined ? 0 : afterProvider(providerWaitMs, random), ours);
}

/**
 * A wait spread over [ms/2, ms] ("equal jitter"): callers that failed at the same moment (a burst
 * of 503s) come back at different moments instead of in step, and none comes back at once.
 */
export function spread(ms: number, random = Math.random): number {
  return Math.round(ms / 2 + (random() * ms) / 2);
}

/**
 * A provider's wait (Retry-After) plus up to a tenth more (at most a second): never shorter than
 * the provider asked, and the callers it held back together do not all return on the same tick.
 * The wait comes off the network, and becomes a stored time (`next_check_at`): one past
 * MAX_WAIT_MS (a Retry-After of 1e17 s, a server's or a proxy's bug) is kept at it, where it was a
 * time past Postgres's bigint whose transition failed as an outage of the ledger database, retried
 * for the lease and leaving the operation running (and on SQLite a row never due again); one that
 * is no number of ms ≥ 0 (NaN, negative) is no signal.
 */
export function afterProvider(ms: number, random = Math.random): number {
  const wait = ms >= 0 ? Math.min(ms, MAX_WAIT_MS) : 0;
  return Math.round(wait + random() * Math.min(wait / 10, 1_000));
}

/** The longest wait the ledger stores or keeps a timer for: 2147483647 ms, about 24.8 days (the longest a timer waits). */
export const MAX_WAIT_MS = 2 ** 31 - 1;

/**
 * What is wrong with a retry budget's delays, if anything: they become stored times (a check's
 * `next_check_at`, even after an attempt that may have committed) and timers, so each must be a
 * number of ms from 0 to MAX_WAIT_MS. A larger one failed that write on Postgres (past its bigint)
 * as an outage of the ledger database, where it is the caller's value.
 */
export function budgetProblem(budget: Partial<RetryBudget>): { path: string; reason: string } | undefined {
  for (const name of ["baseDelayMs", "maxDelayMs"] as const) {
    const v: unknown = budget[name];
    if (v !== undefined && !(typeof v === "number" && v >= 0 && v <= MAX_WAIT_MS))
      return {
        path: `budget.${name}`,
        reason: `must be a number of ms from 0 to ${MAX_WAIT_MS} (about 24.8 days) (got ${String(v)})`,
      };
  }
  return undefined;
}

/** Retry budget of one `run` call: attempts and elapsed time, outside the model. */
export interface RetryBudget {
  /** Executions of the action within one call, first included. Default 3. */
  readonly attempts: number;
  /**
   * Stop retrying once this much time passed since the call began. Default 30 s. Also the longest
   * a lookup may take: one that has not answered by then proves nothing (still unknown, checked
   * again). A settlement's (`ledger.daemon.settle`) request is bounded by the time left of it too
   * (see `SettleOptions.timeoutMs`); a caller's request is not (a caller bounds it with `signal`).
   */
  readonly elapsedMs: number;
  /** First backoff for transient failures; doubles each time, capped by `maxDelayMs`. Default 100 ms. */
  readonly baseDelayMs: number;
  /** Default 5 s. A provider's rate-limit signal longer than the remaining budget ends the call. */
  readonly maxDelayMs: number;
}

export const DEFAULT_BUDGET: RetryBudget = { attempts: 3, elapsedMs: 30_000, baseDelayMs: 100, maxDelayMs: 5_000 };

/**
 * The wait before execution number `executed + 1`, or null when the budget is spent. A provider's
 * own signal (Retry-After) wins over our backoff but is never shortened.
 */
export function nextDelay(
  budget: RetryBudget,
  executed: number,
  elapsedMs: number,
  providerWaitMs?: number,
  random = Math.random,
): number | null {
  if (executed >= budget.attempts) return null;
  const wait = providerWaitMs ?? backoff(budget, executed, random);
  if (elapsedMs + wait > budget.elapsedMs) return null;
  return wait;
}

/** Our own wait before execution number `executed + 1`: doubles from `baseDelayMs`, capped by `maxDelayMs`, spread. */
export function backoff(budget: RetryBudget, executed: number, random = Math.random): number {
  return spread(Math.min(budget.maxDelayMs, budget.baseDelayMs * 2 ** Math.max(0, executed - 1)), random);
}
