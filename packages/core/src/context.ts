/**
 * What the ledger's three surfaces share (the agents' `Ledger`, the operators' `LedgerAdmin`, the
 * daemon's `LedgerDaemon`): one connection, one store, one runner, the settings and the registered
 * actions. Internal: none of it is exported from the package.
 */
import type { Kysely } from "kysely";
import type { Action } from "./action.js";
import { attentionOf } from "./effects.js";
import { ChangedSinceSeenError, InvalidValueError, LedgerConfigError, OperationNotFoundError } from "./errors.js";
import { requireName, requireText } from "./keys.js";
import type { DialectName } from "./migrations/index.js";
import type { StoredError } from "./result.js";
import type { RunnerSettings } from "./call.js";
import { resolutionOf } from "./row-results.js";
import { namedOnce, Runner } from "./runner.js";
import type { Resolution } from "./result.js";
import type { HistoryEvent, IdemDatabase, Status } from "./schema.js";
import { Reports } from "./reports.js";
import type { Row, Store } from "./store.js";
import type { Tracing } from "./tracing.js";

/** An operation as operators see it. */
export interface Operation {
  readonly id: string;
  readonly tenant: string;
  readonly key: string;
  readonly keyLabel: string | null;
  readonly action: string;
  readonly argsHash: string | null;
  readonly status: Status;
  readonly attempt: number;
  readonly leaseOwner: string | null;
  readonly leaseExpiresAt: number | null;
  /** What the provider knows the effect by (Message-ID, external id, PaymentIntent id). */
  readonly providerReference: string | null;
  /** The action's receipt (null when none: not done yet, failed, or a person resolved it without one). */
  readonly result: unknown;
  readonly error: StoredError | null;
  /** A person's verdict, when one settled it. */
  readonly resolution: Resolution | null;
  readonly reason: string | null;
  readonly checks: number;
  readonly nextCheckAt: number | null;
  readonly createdAt: number;
  /**
   * When the first attempt that could carry the key to the provider began (database clock): a
   * provider keeps our idempotency key from then (Stripe: 24 h), so key windows count from it
   * (`OperationContext.firstSentAt`). It starts anew when a run of an operation known not done
   * begins (a person's retry included). Null on an operation no attempt has run yet, or written
   * before migration 0009 (its windows count from `createdAt`).
   */
  readonly firstSentAt: number | null;
  readonly updatedAt: number;
  readonly completedAt: number | null;
  readonly expiresAt: number | null;
  /**
   * A person retried this operation while its last execution may have committed (`admin.retry` of
   * an `unknown` one, or of a `needs_review` one that may have), and no lookup has answered since:
   * whoever runs it next checks the provider before anything is sent again (looks the effect up, or
   * replays the key the provider still keeps; an action that can do neither runs on the person's
   * word). Found, it settles as succeeded. Its lookup reads the args: an operation whose args are
   * not stored waits for a call that brings them (the daemon cannot look). True also on the
   * `running` operation of that lookup; false once a lookup answers or the operation settles, and
   * on a ledger before migration 0012.
   */
  readonly lookFirst: boolean;
  /**
   * What a person must hear about this succeeded operation's effect, not done in full: its
   * action's `attention` on the receipt (the daemon's `incomplete` alert, when it is the reason
   * the operation was alerted with). Absent when nothing, not succeeded with a receipt, or the
   * action is not among this ledger's `actions`.
   */
  readonly attention?: string;
}

export interface OperationEvent {
  /** Position in the operation's history, from 1. */
  readonly id: number;
  readonly from: Status | null;
  readonly to: Status;
  readonly attempt: number;
  readonly actor: string | null;
  readonly reason: string | null;
  readonly providerReference: string | null;
  readonly at: number;
  /**
   * What the person who made this transition checked, when it was a retry given evidence
   * (`admin.retry`): a retry is no verdict, so the operation keeps none, and this is its record.
   * A verdict's evidence is the operation's `resolution.evidence`. Absent otherwise.
   */
  readonly evidence?: string;
}

/** Names an operation: every call about one stored operation takes these two. */
export interface OperationRef {
  readonly tenant: string;
  /** The operation id (`op_…`). */
  readonly id: string;
}

/** A person's or the daemon's decision: who (a name) and why (text stored in the audit trail). */
export interface Verdict {
  readonly actor: string;
  readonly reason: string;
  /**
   * The operation as the person saw it (from `get` or `list`): the decision is refused
   * (`ChangedSinceSeenError`) if the operation changed since, so a stale page cannot decide it.
   * Status, attempt and checks tell apart changes made within the same millisecond.
   */
  readonly seen?: Seen;
}

/** What identifies one state of an operation: any transition or check changes one of these. */
export type Seen = Pick<Operation, "status" | "attempt" | "checks" | "updatedAt">;

/** What a close did not wait for (`Ledger.close`). */
export interface Closed {
  /**
   * The operations whose request was cut off (no longer awaited: unknown), or whose lookup was
   * given up, and whose late answer was still out when the close stopped waiting: not recorded,
   * each stays as its cut-off left it (unknown, settled by its lookup or replay, or a person's).
   * Empty when every one was recorded.
   */
  readonly lateAnswers: readonly OperationRef[];
  /**
   * The operations whose calls (`run`, `daemon.settle`) had not ended when the close stopped
   * waiting: a request, a lookup or lazy args still under way. No statement of theirs is sent from
   * then on, so their outcome is not recorded: each stays as the call's last write left it,
   * `running` under its lease while its request was out, and is settled by the replay policy once
   * that lease ends (looked up, replayed with its key, or a person's). But a write already on its
   * way as the close stopped waiting (waiting for another process's lock on SQLite, or sent to
   * Postgres) still ends, and may record it: the operation's own state is the truth. Their
   * actions' `op.signal` aborts as the close stops waiting (with the close's
   * `LedgerUnavailableError`, `closed`: the lease is no longer renewed), and their callers are
   * answered when the work ends (or a second later, an action ignoring its signal; lazy args,
   * `make()` handed no signal, when they return):
   * `CompletionNotRecordedError` with the receipt of an effect that happened, else
   * `LedgerUnavailableError` (`closed`). Unlike `lateAnswers`, whose callers were answered already
   * and whose rows were recorded unknown. A call whose claim was not answered yet names none, unless
   * that claim is granted before the connection closes: a claim still waiting for a lock is
   * refused, nothing written, its caller told so (`LedgerUnavailableError.unclaimed`): on SQLite at
   * its next try, on Postgres cancelled on the server as the pool ends (one granted before the
   * cancel reached it is named), but for one made through kysely's way (a test clock, a
   * connection being opened again), which is named. Empty when every call ended.
   */
  readonly inFlight: readonly OperationRef[];
}

export class LedgerContext {
  readonly runner: Runner;
  readonly reports: Reports;
  readonly actions = new Map<string, Action<any, any>>();
  private closed = false;

  constructor(
    readonly db: Kysely<IdemDatabase>,
    readonly dialect: DialectName,
    readonly store: Store,
    readonly settings: RunnerSettings,
    actions: readonly Action<any, any>[],
    readonly tracing: Tracing,
  ) {
    this.runner = new Runner(store, tracing, this.closingController.signal);
    this.reports = new Reports(store);
    for (const a of actions) this.actions.set(a.type, a);
  }

  assertOpen(): void {
    if (this.closed) throw new LedgerConfigError("the ledger is closed");
    if (this.closingController.signal.aborted) throw new LedgerConfigError("the ledger is closing");
  }

  /** Aborted once `close` began: no call starts, none waits, and no request is sent (see Runner). */
  private readonly closingController = new AbortController();
  private closure: Promise<Closed> | undefined;

  /**
   * Closes gracefully: new calls are refused, no request is sent from now on, and the calls in
   * flight end (an effect under way is recorded, a request not yet sent is left pending), and the
   * late answers of requests no longer awaited are recorded (Runner.recordLate), for up to
   * `waitMs` (default a lease); then the connection closes, and what had not ended is named
   * (`Closed`). Before, the claims waiting for their commit were committed at close and their
   * effects sent after it returned, with nowhere to record them. A second close answers as the first.
   */
  close(waitMs = this.settings.leaseMs): Promise<Closed> {
    this.closure ??= (async () => {
      this.closingController.abort(); // pauses end; no call starts, waits or sends from now on
      const quiet = await this.runner.quiesce(waitMs);
      const lateAnswers = quiet ? [] : this.runner.lateAnswers();
      const inFlight = quiet ? [] : this.runner.inFlightOperations();
      this.closed = true;
      // A call still in flight meets the close in its next statement, said as such (not retried as
      // an outage), and its action's signal aborts now, with the close as its reason.
      this.store.markClosed();
      await this.db.destroy();
      if (quiet) return { lateAnswers, inFlight };
      // Claims answered since (sent before and waiting on Postgres's server, or through kysely's
      // way on SQLite) are named too, once their answers reached their calls: that is microtasks.
      await new Promise<void>((resolve) => setImmediate(resolve));
      return { lateAnswers, inFlight: namedOnce([...inFlight, ...this.runner.claimedAfterClose()]) };
    })();
    return this.closure;
  }

  /** The tenant's operation, or `OperationNotFoundError`; names are checked first so a malformed one cannot match another's. */
  async find(ref: OperationRef): Promise<NonNullable<Awaited<ReturnType<Store["findById"]>>>> {
    this.assertOpen();
    requireName(ref.tenant, "tenant");
    requireName(ref.id, "operation id");
    const row = await this.store.findById(ref.tenant, ref.id);
    if (!row) throw new OperationNotFoundError(ref.tenant, ref.id);
    return row;
  }

  /** Refuses a person's decision taken on an older view of the row (see `Verdict.seen`). */
  checkSeen(row: Row, verdict: Verdict, to: string): void {
    const s = verdict.seen;
    if (!s) return;
    if (
      s.status !== row.status ||
      s.attempt !== row.attempt ||
      s.checks !== row.checks ||
      s.updatedAt !== row.updated_at
    ) {
      throw new ChangedSinceSeenError(row.id, to, s, seenOf(row), true);
    }
  }

  /**
   * The refusal of a decision taken on `row` whose write found the operation changed meanwhile
   * (another decision, the daemon): read again, so the refusal says what it is now. Gone (pruned
   * meanwhile), it is not found.
   */
  async changedWhileDeciding(row: Row, verdict: Verdict & OperationRef, to: string): Promise<ChangedSinceSeenError> {
    const now = await this.store.findById(verdict.tenant, row.id);
    if (!now) throw new OperationNotFoundError(verdict.tenant, row.id);
    return new ChangedSinceSeenError(row.id, to, verdict.seen ?? seenOf(row), seenOf(now), verdict.seen !== undefined);
  }
}

/** What identifies the row's state (`Seen`), as a decision names it. */
function seenOf(r: Row): Seen {
  return { status: r.status, attempt: r.attempt, checks: r.checks, updatedAt: r.updated_at };
}

export function requireVerdict(verdict: Verdict): void {
  requireName(verdict.actor, "actor");
  const s = verdict.seen;
  if (s !== undefined && !(typeof s.status === "string" && [s.attempt, s.checks, s.updatedAt].every(Number.isInteger)))
    throw new InvalidValueError("seen", "must be the operation's status, attempt, checks and updatedAt as shown");
  if (typeof verdict.reason !== "string" || !verdict.reason.trim())
    throw new InvalidValueError("reason", "a decision needs a reason");
  requireText(verdict.reason, "reason", 2_000);
}

/** `actions`: the ledger's, to read a succeeded row's receipt with its action (`Operation.attention`). */
export function toOperation(r: Row, actions?: ReadonlyMap<string, Pick<Action<any, any>, "attention">>): Operation {
  const action = r.status === "succeeded" && r.result_json !== null ? actions?.get(r.action) : undefined;
  const attention = action && attentionOf(action, r.result_json, { stored: true });
  return {
    id: r.id,
    tenant: r.tenant_id,
    key: r.key,
    keyLabel: r.key_label,
    action: r.action,
    argsHash: r.args_hash,
    status: r.status,
    attempt: r.attempt,
    leaseOwner: r.lease_owner,
    leaseExpiresAt: r.lease_expires_at,
    providerReference: r.provider_reference,
    result: r.result_json === null ? null : JSON.parse(r.result_json),
    error: r.error_json === null ? null : (JSON.parse(r.error_json) as StoredError),
    resolution: resolutionOf(r) ?? null,
    reason: r.reason,
    checks: r.checks,
    nextCheckAt: r.next_check_at,
    createdAt: r.created_at,
    // Number(): a pool we did not configure may read the BIGINT as a string.
    firstSentAt: r.first_execution_at === null ? null : Number(r.first_execution_at),
    updatedAt: r.updated_at,
    completedAt: r.completed_at,
    expiresAt: r.expires_at,
    lookFirst: r.look_first !== null && Number(r.look_first) === 1,
    ...(attention !== undefined && { attention }),
  };
}

export function toEvent(e: HistoryEvent & { seq: number }): OperationEvent {
  return {
    id: e.seq,
    from: e.from,
    to: e.to,
    attempt: e.attempt,
    actor: e.actor,
    reason: e.reason,
    providerReference: e.ref,
    at: e.at,
    ...(typeof e.evidence === "string" && { evidence: e.evidence }),
  };
}
