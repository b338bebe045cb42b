/**
 * `run`: the state machine of docs/design.md for one call. Claim (one winner), or read one snapshot
 * of the row that holds the key and decide on it (policy.ts `decide`): replay what is settled,
 * wait on a live lease, take over what may be taken over, execute under a heartbeat-extended
 * lease with a local deadline, classify failures and retry within the budget. Every write is a
 * single statement in store.ts conditioned on the status and attempt the decision was made on.
 * Its parts that are not the decisions live beside it: the shapes of a call (call.ts), results read
 * from rows (row-results.ts), the lease around the action (lease.ts), writes that outlast a brief
 * outage (durable-writes.ts), a write refused by the fence (fence.ts), one effect or two
 * (effects.ts), and guards around the action's own code (action-guards.ts).
 */
import { randomUUID } from "node:crypto";
import { setImmediate as yieldToLoop, setTimeout as sleep } from "node:timers/promises";
import { describeError, type Classification, type OperationContext, type ReconcileResult } from "./action.js";
import { answerWithin, describeTwice, givenUp, safeClassify, verdictOf } from "./action-guards.js";
import type { Call, Escalation, Held, RunnerSettings, Step } from "./call.js";
import { canonicalJson, sha256 } from "./canonical.js";
import { DurableWrites } from "./durable-writes.js";
import { attentionOf, dedupedOntoFirst, firstSentOf, severalEffects, withAttention } from "./effects.js";
import {
  ArgsMismatchError,
  InvalidValueError,
  LedgerUnavailableError,
  OperationNotFoundError,
  PayloadTooLargeError,
} from "./errors.js";
import { fenced } from "./fence.js";
import { POSSIBLY_TWO, SETTLED_BEFORE_RETRY } from "./reasons.js";
import { withLease } from "./lease.js";
import {
  afterProvider,
  backoff,
  checkDelay,
  decide,
  nextDelay,
  recoveryFor,
  statusAfter,
  type Snapshot,
} from "./policy.js";
import { boundEvidence, type RunResult, type StoredError } from "./result.js";
import { checkSize, failed, knownPerformed, pending, replayOf, succeeded } from "./row-results.js";
import type { Address, Outcome, Peek, Row, Store } from "./store.js";
import type { Tracing } from "./tracing.js";

/** How `complete` records a receipt: see there. */
interface CompleteOptions {
  readonly performed?: boolean | undefined;
  readonly twice?: string | undefined;
  readonly alert?: boolean | undefined;
  readonly rerun?: boolean | undefined;
}

interface CallState {
  executed: number;
  waited: number;
  readonly started: number;
  readonly owner: string;
  /** The daemon or an operator settling a stored operation: no caller waits for it. */
  readonly settling: boolean;
  /** The operation, once a claim or a read named it (the database failing after that is said of it). */
  operationId?: string;
  /**
   * Lazy args this call generated but could not store (its lease passed on meanwhile): sent by its
   * next attempt, so that the generator runs once per call.
   */
  generated?: { args: unknown };
  /** The hash of the lazy args this call generated and validated: its later attempts send them unchecked. */
  validatedHash?: string;
}

export class Runner {
  /** The writes that outlast a brief outage of the ledger (durable-writes.ts); the daemon's own moves too. */
  readonly writes: DurableWrites;

  /**
   * `closing`: the ledger is closing, so no request is sent from now on (an attempt about to send
   * ends "not sent", pending); the calls in flight end, and `close` waits for them (`quiesce`).
   */
  constructor(
    private readonly store: Store,
    private readonly tracing: Tracing,
    private readonly closingSignal: AbortSignal = new AbortController().signal,
  ) {
    this.writes = new DurableWrites(store, tracing);
  }

  /** What a call answers when it may not send because of `closing`. */
  private closingWhy(): string {
    return this.closingSignal.aborted ? "the ledger was closing" : "the settlement was stopped";
  }

  /** The ledger is closing, or this call was asked to stop (`Call.stop`). */
  private closing(call: Call<unknown, unknown>): boolean {
    return this.closingSignal.aborted || call.stop?.aborted === true;
  }

  /** Calls (and settlements) in flight, and who waits for there to be none. */
  private inFlight = 0;
  private idle: (() => void)[] = [];
  /** The operations whose late answer (`recordLate`) is awaited now: what a close cut short leaves unrecorded. */
  private readonly late = new Set<{ readonly tenant: string; readonly id: string }>();

  /**
   * The operations whose late answer is still awaited, in the order their requests were cut off,
   * each named once (an abandoned execute's and a given-up lookup's answer may both be out).
   */
  lateAnswers(): { tenant: string; id: string }[] {
    return namedOnce(this.late);
  }

  /** Resolves true once no call is in flight, or false after `ms` with some still running. */
  async quiesce(ms: number): Promise<boolean> {
    if (this.inFlight === 0) return true;
    let timer: NodeJS.Timeout | undefined;
    const done = new Promise<boolean>((resolve) => this.idle.push(() => resolve(true)));
    const late = new Promise<boolean>((resolve) => (timer = setTimeout(() => resolve(false), ms)));
    try {
      return await Promise.race([done, late]);
    } finally {
      clearTimeout(timer);
    }
  }

  /** Counts `work` as a call in flight, from now (synchronously) until it ends: `close` waits for it. */
  async track<T>(work: () => Promise<T>): Promise<T> {
    this.inFlight += 1;
    try {
      return await work();
    } finally {
      this.inFlight -= 1;
      if (this.inFlight === 0) for (const resolve of this.idle.splice(0)) resolve();
    }
  }

  /** The calls and settlements under way (`run`, `settle`), each with its state (its operation once known). */
  private readonly calls = new Set<{ readonly tenant: string; readonly state: CallState }>();

  /**
   * The operations whose calls or settlements have not ended, each named once: what a close that
   * stopped waiting leaves unrecorded (`Closed.inFlight`). A call whose claim was not answered yet
   * knows no operation, and is not named.
   */
  inFlightOperations(): { tenant: string; id: string }[] {
    return namedOnce([...this.calls].map(({ tenant, state }) => ({ tenant, id: state.operationId })));
  }

  /**
   * The keys claimed after the close stopped waiting (Store.closed): a claim already on its way
   * then, answered granted before the connection closed. A claim waiting for a lock is refused
   * instead (SQLite: sqlite-driver.ts `close`; Postgres: cancelled on the server, ending-pool.ts),
   * but for one the Postgres server granted before the cancel reached it, and one made through
   * kysely's way (a test clock, a connection being opened again). Its row is running under a lease nobody renews: the close names it.
   */
  claimedAfterClose(): readonly { tenant: string; id: string }[] {
    return this.lateClaims;
  }

  private readonly lateClaims: { tenant: string; id: string }[] = [];

  /**
   * A call that `run` would answer by replaying a settled operation at once (its first snapshot,
   * onSnapshot's first rules), answered without its steps: the stored outcome (see
   * Store.settledNow). Undefined for any other, and for one whose action or args do not match
   * (`run` refuses it, saying why).
   */
  replayNow<A, R>(call: Call<A, R>): RunResult<R> | undefined {
    if (call.signal?.aborted) return undefined;
    const snap = this.store.settledNow(call.tenant, call.key.hash);
    if (snap === undefined || snap.action !== call.action.type) return undefined;
    if (call.args.kind === "given" && snap.args_hash !== null && snap.args_hash !== call.args.hash) return undefined;
    return replayOf<R>(snap);
  }

  /** A call; its caller (Ledger.run) counts it in flight from its first line (`track`). */
  async run<A, R>(call: Call<A, R>): Promise<RunResult<R>> {
    const state: CallState = {
      executed: 0,
      waited: 0,
      started: Date.now(),
      owner: ownerOf(call.settings),
      settling: false,
    };
    const under = { tenant: call.tenant, state };
    this.calls.add(under);
    try {
      for (;;) {
        call.signal?.throwIfAborted();
        const step = await this.step(call, state);
        if ("done" in step) return step.done;
        await this.pause(call, step.again);
      }
    } catch (error) {
      throw ofOperation(error, state.operationId);
    } finally {
      this.calls.delete(under);
    }
  }

  /**
   * Recovers a stored operation without a caller (the daemon, `idem retry`): decides on `row`,
   * then on fresh snapshots while its own steps ask to look again. Its caller (daemon.settle)
   * counts it in flight (`track`).
   */
  async settle<A, R>(call: Call<A, R>, row: Row & { db_now: number }, escalate?: Escalation): Promise<RunResult<R>> {
    const state: CallState = {
      executed: 0,
      waited: 0,
      started: Date.now(),
      owner: ownerOf(call.settings),
      settling: true,
      operationId: row.id,
    };
    const under = { tenant: call.tenant, state };
    this.calls.add(under);
    const at = { tenant: call.tenant, key: call.key.hash, id: row.id };
    let snap: Peek | undefined = { ...row, has_args: row.args_json === null ? 0 : 1 };
    try {
      for (;;) {
        const step = await this.onSnapshot(call, state, at, snap, escalate);
        if ("done" in step) return step.done;
        await this.pause(call, step.again);
        snap = await this.store.peek(call.tenant, call.key.hash);
        // Deleted meanwhile (pruned once completed, or by a person): what a settlement of an
        // operation already gone answers. Not the database failing: the daemon would end its
        // tick and report an outage.
        if (!snap) throw new OperationNotFoundError(call.tenant, row.id);
      }
    } catch (error) {
      throw ofOperation(error, row.id);
    } finally {
      this.calls.delete(under);
    }
  }

  private async pause<A, R>(call: Call<A, R>, ms: number): Promise<void> {
    // A step that lost a race looks again at once, but lets timers and signals run first. A
    // ledger closing ends the pause: the next step answers without waiting or sending.
    const signals = [call.signal, call.stop].filter((x) => x !== undefined);
    const signal = signals.length ? AbortSignal.any([...signals, this.closingSignal]) : this.closingSignal;
    try {
      if (ms > 0) await sleep(ms, undefined, { signal });
      else await yieldToLoop();
    } catch (error) {
      call.signal?.throwIfAborted(); // the caller's own reason, not the timer's AbortError
      if (this.closing(call)) return;
      throw error;
    }
  }

  private async step<A, R>(call: Call<A, R>, state: CallState): Promise<Step<R>> {
    const s = call.settings;
    const given = call.args.kind === "given" ? call.args : undefined;
    const since = this.store.local();
    const claim = await this.tracing.span("idem.claim", {}, async (span) => {
      const out = await this.store
        .claim({
          tenant: call.tenant,
          key: call.key.hash,
          keyLabel: call.key.label,
          action: call.action.type,
          argsHash: given?.hash ?? null,
          argsJson: given && call.storeArgs ? given.json : null,
          owner: state.owner,
          leaseMs: s.leaseMs,
          actor: call.actor,
          retentionMs: s.retentionMs,
        })
        .catch(async (error: unknown) => {
          await this.writes.giveBack(
            call,
            state.owner,
            1,
            { status: "pending", maybeCommitted: 0, executed: true },
            error,
          );
          throw error;
        });
      span?.setAttributes({ "idem.claim.fresh": out?.fresh === true, ...(out && { "idem.operation.id": out.row.id }) });
      return out;
    });
    if (!claim) return { again: 0 }; // pruned between our insert and read: claim again
    state.operationId = claim.row.id;
    if (claim.fresh && this.store.closed) this.lateClaims.push({ tenant: call.tenant, id: claim.row.id });
    if (claim.fresh) return this.perform(call, { row: claim.row, since }, state, false);
    return this.onSnapshot(call, state, { tenant: call.tenant, key: call.key.hash, id: claim.row.id }, claim.row);
  }

  /** Decides on one snapshot of an existing row; every write that follows is conditioned on it. */
  private async onSnapshot<A, R>(
    call: Call<A, R>,
    state: CallState,
    at: Address,
    snap: Peek | Outcome,
    escalate?: Escalation,
  ): Promise<Step<R>> {
    const s = call.settings;
    // A key made by hand (not by operationKey, which carries its action) may name another
    // action's operation: its receipt is not this call's answer, nor its row this call's to run.
    if (snap.action !== call.action.type)
      throw new InvalidValueError(
        "key",
        `names operation ${snap.id}, of action "${snap.action}", not "${call.action.type}": build the key from this action's own parts (operationKey with its action, or key parts)`,
      );
    if (call.args.kind === "given" && snap.args_hash !== null && snap.args_hash !== call.args.hash) {
      const action = (await this.store.findById(call.tenant, snap.id))?.action ?? call.action.type;
      throw new ArgsMismatchError(snap.id, snap.args_hash, call.args.hash, action, snap.status, knownPerformed(snap));
    }
    // Settled: its outcome, to every caller (decide's first rule; an Outcome holds nothing else).
    if (isSettled(snap)) return { done: replayOf<R>(snap) };
    const elapsed = Date.now() - state.started;
    // A call already inside its own retry loop may wait out its backoff; a duplicate waits waitMs.
    // A settlement waits for no one, but a row it left pending is its own retry loop too: its
    // pause may end before the database's clock says the row is due (a timer counts from the
    // loop's cached time), and it then waits the rest rather than end with its budget unspent.
    // A ledger closing neither waits nor sends: the next caller or the daemon will.
    const closing = this.closing(call);
    const waitsForNoOne = state.settling && !(state.executed > 0 && snap.status === "pending");
    const mayWaitMs =
      waitsForNoOne || closing ? 0 : state.executed > 0 ? s.budget.elapsedMs - elapsed : s.waitMs - state.waited;
    const decision = decide(snapshotOf(snap), call.action.capabilities, {
      mayWaitMs,
      mayExecute: !closing && nextDelay(s.budget, state.executed, elapsed, 0) !== null,
      closing: closing ? this.closingWhy() : undefined,
      // Lazy args count only where none were fixed: a row holding an args hash was (maybe) sent
      // with args it did not store, and a generator would make other ones under the same key.
      hasArgs: call.args.kind === "given" || (call.args.kind === "lazy" && snap.args_hash === null),
      escalate,
      dueNow: state.settling && state.executed === 0,
      retrying: state.executed > 0,
    });
    switch (decision.kind) {
      case "replay_outcome":
        return { done: replayOf<R>(snap) };
      case "answer":
        return {
          done: pending(
            snap,
            snap.status === "needs_review" ? (snap.reason ?? decision.reason) : decision.reason,
            knownPerformed(snap),
          ),
        };
      case "wait": {
        // Poll gently: often at first (the winner is usually quick), less as the wait grows.
        const ms = Math.max(1, Math.min(decision.ms, 20 + Math.floor(state.waited / 4)));
        state.waited += ms;
        return { again: ms };
      }
      case "release":
        await this.store.release(at, snap, call.actor, decision.reason);
        return { again: 0 };
      case "execute":
      case "reconcile":
      case "review": {
        const since = this.store.local();
        // Running a pending row again marks it a rerun: the mark it replaces is read first, to be
        // put back if this run sends nothing (given back below, or as it ends).
        const rerun = decision.kind === "execute" && snap.status === "pending";
        const replaces = rerun ? await this.store.rerunMark(at, snap) : undefined;
        if (rerun && !replaces) return { again: 0 }; // the row changed since the snapshot
        const row = await this.store
          .takeOver(at, snap, {
            owner: state.owner,
            leaseMs: s.leaseMs,
            actor: call.actor,
            reason: decision.reason,
            execute: decision.kind === "execute",
            before: decision.kind === "execute" ? decision.replayUntil : undefined,
            replaces,
          })
          .catch(async (error: unknown) => {
            // A running row taken over (its lease expired) has no state of ours to go back to: the
            // new lease runs out as the old one did.
            if (snap.status === "pending" || snap.status === "unknown")
              await this.writes.giveBack(
                call,
                state.owner,
                snap.attempt + 1,
                {
                  status: snap.status,
                  maybeCommitted: snap.maybe_committed === 1 ? 1 : 0,
                  executed: decision.kind === "execute",
                  ...(replaces && { rerunBefore: replaces.rerun_attempt }),
                },
                error,
              );
            throw error;
          });
        if (!row) return { again: 0 }; // the row changed since the snapshot: decide again on a new one
        const mine = { row, since, rerun };
        if (decision.kind === "review") return this.toReview(call, row, decision.reason);
        // A replay with the key (replayUntil) may repeat an earlier attempt that committed, also on a
        // row a person reopened (lookFirst): a transient answer to it proves nothing of that one.
        if (decision.kind === "execute")
          return this.perform(call, mine, state, snap.maybe_committed === 1 || decision.replayUntil !== undefined);
        return this.reconcile(call, mine);
      }
    }
  }

  /** Looks the effect up under our lease: found, proven absent, refused, or still unknown (counted, backed off). */
  private async reconcile<A, R>(call: Call<A, R>, mine: Held): Promise<Step<R>> {
    const row = mine.row;
    // A person's retry of an outcome that may have committed (look_first): their word that it was
    // not done stands once the lookup cannot contradict it; until then the row stays pending.
    const reopened = row.look_first === 1;
    const args = this.argsFor(call, row) as A; // decide() sent rows without args to review
    // No effect is younger than the last execution, or than a dead worker's lease (our takeover
    // of its row recorded that end as the last execution); inconclusive checks do not restart it.
    const lastAttemptAt = row.last_execution_at ?? row.created_at;
    let found: ReconcileResult<R>;
    // A lookup refused for good (its error classified with `alert` by the action: a credential
    // revoked, a server certificate not trusted) fails every later check the same way: a person
    // must hear of it now, though the outcome stays unknown (the daemon's check_refused alert).
    let refused = false;
    let asked: Promise<ReconcileResult<R>> | undefined;
    try {
      // A lookup has no effect to lose: one that outlasts the call's time budget (a client with no
      // timeout, a signal ignored) is given up; its heartbeat would otherwise hold the lease forever.
      const ms = call.settings.budget.elapsedMs;
      found = await withLease(
        this.store,
        call,
        mine,
        (ctx, _held, abandon) => {
          asked = Promise.resolve(call.action.reconcile!(args, ctx));
          return givenUp(asked, ctx.signal, ms, abandon).then(verdictOf, (error: unknown) => {
            const cls = safeClassify(call.action, error, ctx);
            refused = (cls.kind === "permanent" || cls.kind === "ambiguous") && cls.alert === true;
            throw error;
          });
        },
        lastAttemptAt,
      );
    } catch (error) {
      // Given up (its lease lost, its time bound spent, its caller gone), it may still answer.
      if (asked) this.recordLateFinding(call, row, asked);
      if (call.signal?.aborted) {
        // The caller gave up: no check was made. Back to unknown (or to a person's retry, still to
        // be looked up), due at once, and the caller hears its own reason, whatever the move did
        // (fenced, or failed: our lease then expires and the daemon takes the row).
        await this.store
          .move(row, reopened ? "pending" : "unknown", {
            actor: call.actor,
            reason: "the caller gave up during the lookup",
            checkAfterMs: 0,
            checks: row.checks,
            ...(reopened && { lookFirst: true }),
          })
          .catch(() => undefined);
        call.signal.throwIfAborted();
      }
      found = {
        found: false as const,
        proof: "inconclusive" as const,
        reason: `lookup failed: ${describeError(error)}`,
      };
    }
    if (found.found) return this.recordFound(call, row, found, false);
    // What the lookup proved is known to this process only: each move below is retried through a
    // brief outage of the ledger and recognises its own commit whose answer was lost
    // (`moveDurably`), as an execution's end is. Written once, a failure left the row running
    // until its lease ran out, and the caller read LedgerUnavailableError for a lookup that answered.
    // A lookup that can never prove absence leaves a person's retry to their word: they decided,
    // knowing what the provider shows. Anywhere else a person decides (below).
    if (found.proof === "absent" || (found.proof === "never" && reopened)) {
      const back = await this.writes.moveDurably(call, row, "pending", {
        actor: call.actor,
        reason:
          found.proof === "absent"
            ? `reconciled: ${found.reason}`
            : `the lookup cannot prove absence (${found.reason}): run on the word of the person who retried it`,
        checkAfterMs: 0,
        checks: 0,
        noExecutionSince: row.last_execution_at,
        lookFirst: false,
      });
      if (back) return { again: 0 };
      // An earlier attempt, its request still out when we took over, answered while we looked
      // (fenced() moved last_execution_at): what the provider showed us may predate its commit.
      const voided = await this.writes.moveDurably(call, row, "unknown", {
        actor: call.actor,
        reason: `inconclusive: an earlier attempt answered during the lookup, so its absence proves nothing (${found.reason})`,
        checkAfterMs: call.settings.budget.baseDelayMs,
        checks: row.checks + 1,
      });
      return voided
        ? {
            done: pending(
              voided,
              "outcome unknown: an earlier attempt answered during the lookup; verification continues",
            ),
          }
        : fenced(this.writes, call, row, "pending", found.reason);
    }
    if (found.proof === "never") return this.toReview(call, row, found.reason);
    if (found.proof === "refused") {
      // The provider's own record of its final answer: what the request's answer would have said.
      const error: StoredError = { kind: "permanent", reason: found.reason, ...boundEvidence(found.evidence) };
      const done = await this.writes.moveDurably(call, row, "failed", {
        actor: call.actor,
        reason: `reconciled: ${found.reason}`,
        error_json: JSON.stringify(error),
        completed: true,
        retentionMs: call.settings.retentionMs,
      });
      return done ? { done: failed(done, error, false) } : fenced(this.writes, call, row, "failed", found.reason);
    }
    const checkAfterMs = checkDelay(call.settings.budget.baseDelayMs, row.checks, found.retryAfterMs);
    // Its args are not stored: the lookup reads them, so no one can look again but a later call
    // that brings them, and the daemon never claims such a row (0011). Left pending, it waited for
    // a call that may never come, its caller told it would be looked at again. As an unknown
    // outcome with no stored args does, it goes to a person, alerted (who may retry it again).
    if (reopened && row.args_json === null)
      return this.toReview(call, row, `${REOPENED_INCONCLUSIVE} (${found.reason}), and ${NO_LOOK_WITHOUT_ARGS}`);
    if (reopened) {
      // Pending by a person's word, looked at again when due; never run before a look answers.
      const later = await this.writes.moveDurably(call, row, "pending", {
        actor: call.actor,
        reason: `${REOPENED_INCONCLUSIVE}: ${found.reason}`,
        checkAfterMs,
        checks: row.checks + 1,
        lookFirst: true,
        ...(refused ? { alert: true } : {}),
      });
      return later
        ? { done: pending(later, `${REOPENED_INCONCLUSIVE} (${found.reason}); it is looked at again later`) }
        : fenced(this.writes, call, row, "pending", found.reason, { sent: false });
    }
    const still = await this.writes.moveDurably(call, row, "unknown", {
      actor: call.actor,
      reason: `inconclusive: ${found.reason}`,
      checkAfterMs,
      checks: row.checks + 1,
      ...(refused ? { alert: true } : {}),
    });
    return still
      ? { done: pending(still, `outcome unknown, verification continues: ${found.reason}`) }
      : // A lookup sent nothing: its end says nothing of what an earlier request did meanwhile.
        fenced(this.writes, call, row, "unknown", found.reason, { sent: false });
  }

  /**
   * Executes the effect under our lease and records what happened. `maybeCommitted`: an earlier
   * attempt may have committed, so this one is a replay and a transient answer proves nothing.
   */
  private async perform<A, R>(
    call: Call<A, R>,
    mine: Held,
    state: CallState,
    maybeCommitted: boolean,
  ): Promise<Step<R>> {
    state.executed += 1;
    const ran = await withLease(
      this.store,
      call,
      mine,
      async (
        ctx,
        held,
        abandon,
        onLost,
      ): Promise<
        | { step: Step<R> }
        | { ok: true; receipt: R }
        | { ok: false; cls: Classification; row: Row; sent: boolean; abandoned?: true }
      > => {
        let row: Row = mine.row;
        // A write before the request is sent, kept through a brief outage; given up, the row is
        // given back (nothing was sent) and this is the step that answers the caller.
        const beforeSend = (what: string, patch: Parameters<Store["patchRunning"]>[1]) =>
          this.beforeSend(call, state, row, maybeCommitted, what, patch);
        let args = this.argsFor(call, row);
        // A caller's own args were checked by `run`, the ones it generated by `generate`.
        let checked =
          (call.args.kind === "given" && call.args.stored !== true) ||
          (state.validatedHash !== undefined && state.validatedHash === row.args_hash);
        if (args === undefined) {
          // Lazy args never stored: no attempt got as far as executing. Generate them now, once,
          // under the lease (a slow model call keeps it), and store them before anything is sent.
          const made = await this.generate(call, state, row, beforeSend);
          if (!("args" in made)) return { step: made };
          args = made.args;
          checked = true;
        } else if (row.args_hash === null && call.args.kind === "given") {
          // A row whose lazy args were never stored, taken over by a caller that gives them: they
          // are recorded before anything is sent, as generated ones are, so that a crash from here
          // on leaves an outcome that may have committed, not one known not done.
          const given = call.args;
          const patch = { args_hash: given.hash, args_json: call.storeArgs ? given.json : null };
          const stored = await beforeSend("args", patch);
          if (stored !== true) return { step: stored };
          row = { ...row, ...patch };
        } else if (call.args.kind === "given" && row.args_hash !== null && row.args_hash !== call.args.hash) {
          // Other args were fixed after our snapshot (a holder whose lease had run out wrote them
          // late): ours must not go out under this key. What that holder sent is not known.
          const moved = await this.writes.moveDurably(call, row, "unknown", {
            actor: call.actor,
            reason: `attempt ${row.attempt - 1} stored other args after this caller read the operation; its outcome is unknown`,
            checkAfterMs: 0,
            checks: row.checks,
          });
          if (!moved) return { step: await fenced(this.writes, call, row, "unknown", "args", { sent: false }) };
          throw new ArgsMismatchError(row.id, row.args_hash, call.args.hash, call.action.type, "unknown");
        }
        // Args stored by an earlier attempt (the daemon's and a lazy caller's only ones) were
        // checked by the version that stored them: one whose validate has since learnt to refuse
        // what is unsafe to send (an email header value nodemailer writes as it is) must not send
        // them unchecked. Refused, nothing is sent: rejected (failed, or unknown when an earlier
        // attempt may have sent them, statusAfter).
        if (!checked && row.args_json !== null && call.action.validate) {
          try {
            call.action.validate(args);
          } catch (error) {
            const reason = `the stored args are refused by the action's validation, nothing sent: ${describeError(error)}`;
            return { ok: false, cls: { kind: "rejected", reason }, row, sent: false };
          }
        }
        // The reference is made before the first send and kept once an attempt may have sent. An
        // operation no attempt may have performed yet (known not sent: pending, or never tried)
        // gets the reference of this attempt's config: the earlier one describes no effect, and
        // kept it would tie the operation for good to a config corrected since (a wrong journal).
        if (call.action.providerReference && (row.provider_reference === null || !maybeCommitted)) {
          let ref: string;
          try {
            ref = call.action.providerReference(args, ctx);
          } catch (error) {
            // A bug of the action, before this attempt sent anything, that every attempt would meet
            // again. An earlier attempt may have sent without it: then a person decides.
            const reason = `providerReference threw: ${describeError(error)}`;
            if (maybeCommitted) return { step: await this.toReview(call, row, reason) };
            return { ok: false, cls: { kind: "permanent", reason, alert: true }, row, sent: false };
          }
          if (ref !== row.provider_reference) {
            const stored = await beforeSend("reference", { provider_reference: ref });
            if (stored !== true) return { step: stored };
            row = { ...row, provider_reference: ref };
          }
        }
        // Run again from known not done (a proof of absence, a person's word) while an earlier
        // attempt's request, out past its lease when that proof was read, could still end: one
        // that ended without an answer since our takeover (fenced() moved last_execution_at) may
        // have taken effect after the proof. Ours is not sent then: the outcome is unknown, looked
        // up. Before, it was sent, and a possible second effect alerted after (`overlappedRerun`).
        // One read, on a rerun only; an end after it is still alerted so. A row no longer ours (an
        // earlier attempt's late receipt or lookup's finding settled it, fenced, or a person moved
        // it) is not sent to either: that read is as good as a lost lease.
        if (mine.rerun) {
          const now = await this.writes.durably(call, () => this.store.findById(call.tenant, row.id));
          if (now?.status !== "running" || now.attempt !== row.attempt) {
            const reason = `the operation was moved (${now ? `${now.status} at attempt ${now.attempt}` : "gone"}) before attempt ${row.attempt}'s request was sent`;
            return { ok: false, cls: { kind: "transient", reason }, row, sent: false };
          }
          if (now.last_execution_at !== row.last_execution_at) {
            const why = `not sent: an earlier attempt's request ended without an answer after attempt ${row.attempt} took the operation over`;
            const heard = await this.lateEndDuring(call, row, "unknown", why, { kind: "transient", reason: why }, now);
            if (heard) return { step: heard };
          }
        }
        // Nothing is sent once our lease may have passed to another worker (the statement that
        // granted it, or a write since, answered too late, and the other may have looked the
        // effect up, found nothing and done it), nor once the caller gave up, nor once the ledger
        // is closing (its process is shutting down), nor once a settlement's time is spent. Not
        // sent, so a transient failure of this attempt. A settlement's time left (its budget's
        // elapsedMs, lowered to its timeoutMs) bounds its request as it bounds its lookups; a
        // caller's request is bounded by the caller's own signal instead.
        const left = state.settling ? call.settings.budget.elapsedMs - (Date.now() - state.started) : undefined;
        const unsent = !held()
          ? `the lease of attempt ${row.attempt} ran out before its request was sent`
          : call.signal?.aborted
            ? `the caller gave up before attempt ${row.attempt}'s request was sent`
            : this.closing(call)
              ? `${this.closingWhy()} before attempt ${row.attempt}'s request was sent`
              : left !== undefined && left <= 0
                ? `the settlement's time bound was spent before attempt ${row.attempt}'s request was sent`
                : undefined;
        if (unsent !== undefined) return { ok: false, cls: { kind: "transient", reason: unsent }, row, sent: false };
        const a = args;
        // Spread only when the reference changed: a spread reads the lazy signal (an AbortController).
        const op =
          row.provider_reference === ctx.providerReference
            ? ctx
            : { ...ctx, providerReference: row.provider_reference };
        const attributes = {
          "idem.operation.id": row.id,
          "idem.attempt": row.attempt,
          "idem.action": call.action.type,
        };
        let sending: Promise<R>;
        try {
          sending = this.tracing.span("idem.execute", attributes, () => call.action.execute(a, op));
        } catch (error) {
          sending = Promise.reject(error); // a JavaScript execute that throws before its promise
        }
        // A settlement's bound, the caller's signal or a lost lease ends the wait (a grace later).
        const answer = await answerWithin(sending, {
          boundMs: left,
          gaveUp: call.signal,
          onLost,
          abandon,
          attempt: row.attempt,
        });
        if ("abandoned" in answer) {
          // No longer awaited, its request perhaps sent: unknown (below), never "not done". Its
          // answer, if one comes, is recorded then, through the fence.
          this.recordLate(call, row, sending, ctx, maybeCommitted);
          return { ok: false, cls: { kind: "ambiguous", reason: answer.abandoned }, row, sent: true, abandoned: true };
        }
        const settled = answer.answer;
        if (settled.status === "fulfilled") return { ok: true, receipt: settled.value };
        return { ok: false, cls: safeClassify(call.action, settled.reason, ctx), row, sent: true };
      },
      undefined,
      maybeCommitted,
    );
    if ("step" in ran) return ran.step;
    if (ran.ok) return this.complete(call, mine.row, ran.receipt, HAPPENED, { performed: true, rerun: mine.rerun });

    const { cls, row, sent, abandoned } = ran;
    const to = statusAfter(cls, maybeCommitted);
    const error: StoredError = {
      kind: cls.kind,
      reason: cls.reason,
      ...((cls.kind === "permanent" || cls.kind === "ambiguous") && cls.alert && { alert: true }),
      ...("providerRequestId" in cls && cls.providerRequestId && { providerRequestId: cls.providerRequestId }),
      ...(cls.kind === "permanent" && boundEvidence(cls.evidence)),
      ...(cls.kind === "permanent" && cls.mayHaveTaken === true && { mayHaveTaken: true }),
      ...(cls.kind === "ambiguous" && cls.replayable === false && { replayable: false }),
    };
    // Only this process knows how the attempt ended (not sent, refused): a brief outage of the
    // ledger must not leave the row running, to be read after its lease as "may have committed".
    if (to === "failed") {
      const done = await this.writes.moveDurably(call, row, "failed", {
        actor: call.actor,
        reason: cls.reason,
        error_json: JSON.stringify(error),
        completed: true,
        retentionMs: call.settings.retentionMs,
        ...(error.alert && { alert: true }),
        noExecutionSince: row.last_execution_at,
      });
      if (done) return { done: failed(done, error, false) };
      const late = await this.lateEndDuring(call, row, "needs_review", cls.reason, error);
      return late ?? fenced(this.writes, call, row, "failed", cls.reason);
    }
    const b = call.settings.budget;
    const providerWait = "retryAfterMs" in cls ? cls.retryAfterMs : undefined;
    // The row keeps the longer of the provider's signal and our backoff, even past our budget.
    // Work known not done that the provider refused for now: each try sent counts a check, and a
    // settlement's row waits as an unknown outcome's checks do (doubling, capped at an hour), so
    // that the daemon's tries of a provider down for hours back off instead of coming every tick
    // (escalated past maxChecks). A caller's row waits its own backoff: its next try within the
    // call is bound by it, and after many of the daemon's tries it was past the call's budget (one
    // try, "retry budget spent"). A rate limit is neither: the provider said when to come back, and
    // its wait binds every caller, so it is kept as asked and no try it refused counts toward a
    // person. An outcome that becomes unknown here starts its own checks.
    const counted = sent && cls.kind !== "rate_limited";
    const ownWait = Math.max(providerWait === undefined ? 0 : afterProvider(providerWait), backoff(b, state.executed));
    // An abandoned request may still be out: its first check waits a lease, as a dead worker's
    // would, so that its answer (recorded when it comes) is likelier to arrive before a lookup
    // that would read its absence.
    const checkAfterMs = abandoned
      ? Math.max(call.settings.leaseMs, checkDelay(b.baseDelayMs, maybeCommitted ? row.checks : 0))
      : to !== "pending"
        ? checkDelay(b.baseDelayMs, maybeCommitted ? row.checks : 0, providerWait)
        : state.settling && counted
          ? Math.max(ownWait, checkDelay(b.baseDelayMs, row.checks, providerWait))
          : ownWait;
    // A rerun not sent or refused for now took no effect: it gives back the mark its takeover
    // replaced (`Row.rerun_before`; fence.ts `rerunAfter`).
    const nothingDone = !abandoned && (!sent || cls.kind === "transient" || cls.kind === "rate_limited");
    const moved = await this.writes.moveDurably(call, row, to, {
      actor: call.actor,
      reason: `${cls.kind}: ${cls.reason}`,
      error_json: JSON.stringify(error),
      checkAfterMs,
      // A replay of an unknown outcome that proved nothing is one more check; one never sent is neither.
      ...(to === "unknown" && sent && { executionEnded: true, checks: maybeCommitted ? row.checks + 1 : 0 }),
      // A refused credential a person must hear of, though the outcome stays unknown (statusAfter).
      ...(error.alert && { alert: true }),
      // Not sent (the lease ran out, the caller gave up, closing), or rate limited: not counted.
      ...(to === "pending" && {
        noExecutionSince: row.last_execution_at,
        checks: counted ? row.checks + 1 : row.checks,
      }),
      ...(nothingDone && markBack(row)),
    });
    if (!moved) {
      const late = to === "pending" ? await this.lateEndDuring(call, row, "unknown", cls.reason, error) : undefined;
      return late ?? fenced(this.writes, call, row, to, cls.reason, { sent });
    }
    // A caller that gave up hears its own reason, as after a lookup it gave up.
    if (abandoned) call.signal?.throwIfAborted();
    // Unknown, and nothing can check it (no key window, no lookup): on to a person at once.
    if (
      to === "unknown" &&
      recoveryFor(call.action.capabilities, firstSentOf(mine.row), mine.row.db_now, error).kind === "review"
    )
      return { again: 0 };
    // A replay refused for our setup (a revoked credential; alerted): the call's next replay meets
    // the same refusal until a person fixes it. Unknown, alerted; checked again when due.
    if (to === "unknown" && error.alert)
      return {
        done: pending(
          moved,
          `outcome unknown (${cls.kind}: ${cls.reason}); a person must fix the setup, verification continues`,
        ),
      };
    // A ledger closing tries nothing again: the next caller or the daemon will.
    const closing = this.closing(call);
    const wait = closing ? null : nextDelay(b, state.executed, Date.now() - state.started, checkAfterMs);
    if (wait === null) {
      const why =
        to === "pending"
          ? `${cls.kind}: ${cls.reason}${closing ? "" : "; retry budget spent"}`
          : `outcome unknown (${cls.kind}: ${cls.reason}); verification continues`;
      return { done: pending(moved, why) };
    }
    // pending: run again with the same key; unknown: recover by the replay policy once due.
    return { again: wait };
  }

  /**
   * The answer of an execute no longer awaited (`answerWithin`), when it comes: recorded as any
   * late end is, through the fence. A receipt settles an operation not yet proven (`complete`,
   * then `fenced`: a second effect alerted); an ambiguous end reopens one proven absent meanwhile;
   * a refusal is noted only, the operation left as others left it (unknown: looked up). Counted
   * in flight: `close` waits for it as for a call, up to a lease (or its `waitMs`), and names it
   * when it stopped waiting first (`lateAnswers`). An answer that finds the ledger
   * closed or failing is lost; the operation's lookup or replay settles it then.
   */
  private recordLate<A, R>(
    call: Call<A, R>,
    row: Row,
    sending: Promise<R>,
    ctx: OperationContext,
    maybeCommitted: boolean,
  ): void {
    const awaited = { tenant: call.tenant, id: row.id };
    this.late.add(awaited);
    this.track(async () => {
      let receipt: R;
      try {
        receipt = await sending;
      } catch (error) {
        const cls = safeClassify(call.action, error, ctx);
        await fenced(this.writes, call, row, statusAfter(cls, maybeCommitted), `${cls.kind}: ${cls.reason}`);
        return;
      }
      await this.complete(call, row, receipt, HAPPENED, { performed: true });
    })
      .catch(() => {})
      .finally(() => this.late.delete(awaited));
  }

  /**
   * The answer of a lookup given up (its lease lost, its time bound spent, its caller gone), when
   * it comes: a finding proves the effect and is recorded as a lookup's finding is, through the
   * fence (`complete`): it settles an operation not yet proven, and a second effect it tells of
   * (`twice`, or an effect other than the one recorded) is alerted. Dropped, it was lost, and with
   * it the only read that saw two effects (the interleavings' seed 571). Absence or a failure read
   * this late proves nothing: dropped. Awaited by `close` as a late execute's answer is.
   */
  private recordLateFinding<A, R>(call: Call<A, R>, row: Row, asked: Promise<ReconcileResult<R>>): void {
    const awaited = { tenant: call.tenant, id: row.id };
    this.late.add(awaited);
    this.track(async () => {
      const found = verdictOf(await asked);
      if (found.found) await this.recordFound(call, row, found, true);
    })
      .catch(() => {})
      .finally(() => this.late.delete(awaited));
  }

  /**
   * A lookup's finding: it proves the effect, so the operation settles with it (nothing runs
   * again), and a second effect it tells of (`twice`) is alerted. A person's retry's lookup that
   * finds it done: they hear of it (their look at the provider was too early). `late`: the lookup
   * answered after it was given up (`recordLateFinding`).
   */
  private recordFound<A, R>(
    call: Call<A, R>,
    row: Row,
    found: { readonly receipt: R; readonly twice?: string },
    late: boolean,
  ): Promise<Step<R>> {
    const twice =
      found.twice === undefined
        ? undefined
        : `two effects: ${late ? "a lookup answered after it was given up" : "the lookup"} found the effect more than once (${describeTwice(found.twice)}); a person must check the provider`;
    if (row.look_first === 1) return this.complete(call, row, found.receipt, REOPENED_FOUND, { twice, alert: true });
    return this.complete(call, row, found.receipt, late ? LATE_FINDING : FOUND, { twice });
  }

  /**
   * Generates lazy args, checks them like given ones and stores them before anything is sent, so
   * every later attempt sends exactly this content. A generator or validation error is a
   * rejection: the operation fails with no effect.
   */
  private async generate<A, R>(
    call: Call<A, R>,
    state: CallState,
    row: Row,
    beforeSend: (what: string, patch: Parameters<Store["patchRunning"]>[1]) => Promise<true | Step<R>>,
  ): Promise<{ args: A } | Step<R>> {
    if (call.args.kind !== "lazy")
      return this.toReview(call, row, "the args were not stored and this caller gave none");
    // A generator must not replace args an earlier attempt may have sent. decide() counts lazy
    // args only for a row without an args hash, but a holder whose lease had run out may have
    // stored its hash after our snapshot.
    if (row.args_hash !== null)
      return this.toReview(call, row, "the args an earlier attempt may have sent were not stored");
    let made: A;
    let json: string;
    try {
      made = state.generated ? (state.generated.args as A) : await call.args.make();
      json = canonicalJson(made, "args");
      checkSize("args", json, call.settings.maxArgsBytes, row.id);
      call.action.validate?.(made);
    } catch (error) {
      if (call.signal?.aborted) {
        // The caller gave up while its args were made (a generator that honours the same signal
        // rejects with its reason): no refusal of the work, and nothing was sent. Known not done,
        // for a caller with args, and the caller hears its own reason, as after a lookup it gave
        // up. Failed here, every later call of this work was answered "failed" for good.
        await this.store
          .move(row, "pending", {
            actor: call.actor,
            reason: "the caller gave up while its args were generated; nothing was sent",
            noExecutionSince: row.last_execution_at,
          })
          .catch(() => undefined);
        call.signal.throwIfAborted();
      }
      const err: StoredError = { kind: "rejected", reason: describeError(error) };
      const done = await this.writes.moveDurably(call, row, "failed", {
        actor: call.actor,
        reason: `rejected before send: ${err.reason}`,
        error_json: JSON.stringify(err),
        completed: true,
        retentionMs: call.settings.retentionMs,
      });
      if (!done) return fenced(this.writes, call, row, "failed", err.reason);
      return { done: failed(done, err, false) };
    }
    const hash = sha256(json);
    const stored = await beforeSend("args", { args_hash: hash, args_json: json });
    if (stored === true) {
      state.validatedHash = hash;
      return { args: made };
    }
    // Not stored, nothing sent: our lease passed on while the args were made (a daemon found it run
    // out and gave the row back as known not done), or the ledger failed and the row was given
    // back. A row left pending without args is run by no one but a caller that has them: this
    // one decides again, with the args it holds (the attempt sent nothing, so it is not counted).
    // Answered "pending", the caller (a model: "do not retry") waited for a run that never came.
    if (
      !state.settling &&
      "done" in stored &&
      stored.done.status === "pending_verification" &&
      stored.done.state === "pending"
    ) {
      state.generated = { args: made };
      state.executed -= 1;
      return { again: 0 };
    }
    return stored;
  }

  /**
   * Writes `patch` on our running attempt before its request is sent, retried through a brief
   * outage as a receipt is (`durably`). True once written; otherwise the step that answers: the
   * row changed (`fenced`), or the ledger stayed unreachable, and then the row is given back as a
   * lost claim's is (nothing was sent under it): known not done, or unknown as an earlier attempt
   * left it. Before, it stayed running as "may have committed", and an action that can neither
   * dedupe nor be looked up went to a person for a request that never left the process.
   */
  private async beforeSend<A, R>(
    call: Call<A, R>,
    state: CallState,
    row: Row,
    maybeCommitted: boolean,
    what: string,
    patch: Parameters<Store["patchRunning"]>[1],
  ): Promise<true | Step<R>> {
    let written: boolean;
    try {
      written = await this.writes.durably(call, () => this.store.patchRunning(row, patch));
    } catch (error) {
      const to = {
        status: maybeCommitted ? ("unknown" as const) : ("pending" as const),
        maybeCommitted: maybeCommitted ? (1 as const) : (0 as const),
        executed: true, // perform runs under a claim or a takeover that executes
        ...markBack(row), // nothing sent
      };
      const reason = `attempt ${row.attempt} could not record its ${what} before sending (the ledger failed); nothing was sent under it`;
      if (!(await this.writes.giveBack(call, state.owner, row.attempt, to, error, reason))) throw error;
      const now = await this.store.findById(call.tenant, row.id).catch(() => undefined);
      if (!now || now.status === "succeeded" || now.status === "failed" || now.status === "running") throw error;
      return { done: pending(now, reason, knownPerformed(now)) };
    }
    return written ? true : fenced(this.writes, call, row, "running", what);
  }

  /**
   * Records the receipt. The effect has happened, so a failing write is retried with backoff for
   * up to a lease; if the ledger stays unreachable the caller gets the receipt on a typed error.
   * `performed`: this attempt's own request made it (execute answered), not a lookup's finding.
   * `twice`: the lookup said it found the effect more than once, in the reason to record instead.
   * `alert`: a person hears of it even when nothing else says so (a person's retry found done).
   * A receipt whose ids (`effectId`) name several effects is two effects too, however it came
   * (a lookup that did not say so, an execute that found copies of earlier sends): the reason and
   * the alert are the same, never a silent settlement. A receipt the action's `attention` says was
   * not done in full is alerted too, with those words. `rerun`: our request ran the operation
   * again from `pending` (see `overlappedRerun`).
   */
  private async complete<A, R>(
    call: Call<A, R>,
    row: Row,
    receipt: R,
    reason: string,
    { performed = false, twice, alert = false, rerun = false }: CompleteOptions = {},
  ): Promise<Step<R>> {
    let json: string;
    try {
      json = canonicalJson(receipt, "result");
      checkSize("result", json, call.settings.maxResultBytes, row.id);
    } catch (error) {
      // The effect happened but its receipt cannot be kept: park it for a person, then tell the caller.
      await this.writes.unstorable(
        call,
        row,
        describeError(error),
        performed,
        receipt,
        twice ?? severalEffects(call.action, receipt),
      );
      // Named by its operation, as the too large one is: the effect happened, the caller must know which.
      if (error instanceof PayloadTooLargeError) throw error;
      throw error instanceof InvalidValueError
        ? new InvalidValueError(error.path, error.reason, row.id)
        : new InvalidValueError("result", describeError(error), row.id);
    }
    // The receipt as a later replay will read it (canonical JSON), parsed once.
    const stored = JSON.parse(json) as R;
    const several = twice ?? severalEffects(call.action, stored);
    // An effect not done in full: a person hears of it once (withAttention: where its words go).
    // An execution's own answer says no more than its attention does.
    const attention = attentionOf(call.action, stored);
    const said =
      several !== undefined
        ? withAttention(several, attention, true)
        : reason === HAPPENED && attention !== undefined
          ? attention
          : withAttention(reason, attention, false);
    const done = await this.writes.recordReceipt(call, row, json, stored, said, {
      alert: alert || several !== undefined || attention !== undefined,
      ...(rerun && { noExecutionSince: row.last_execution_at }),
    });
    if (done) return { done: succeeded(done, stored, false) };
    const overlapped =
      rerun && several === undefined ? await this.overlappedRerun(call, row, json, stored, said, attention) : undefined;
    return (
      overlapped ??
      fenced(this.writes, call, row, "succeeded", json, {
        receipt: stored,
        performed,
        several,
        attention,
        foundOnRetry: isFoundOnRetry(reason) ? reason : undefined,
      })
    );
  }

  /**
   * Our run again from `pending` (a proof of absence, or a person's word) took effect, but an
   * earlier attempt's request, out past its lease when that proof was read, ended without an
   * answer during our run (fenced() moved last_execution_at; a receipt would have settled the row):
   * it may have taken effect too, which our receipt cannot say. Recorded, and a person hears of
   * two, perhaps, unless the provider deduped our request onto that one (`dedupedOntoFirst`).
   * Undefined when the row moved otherwise (fenced() reads it).
   */
  private async overlappedRerun<A, R>(
    call: Call<A, R>,
    row: Row,
    json: string,
    stored: R,
    said: string,
    attention: string | undefined,
  ): Promise<Step<R> | undefined> {
    const now = await this.earlierEndDuring(call, row);
    if (!now) return undefined;
    const deduped = dedupedOntoFirst(call.action, row, now);
    const told = `${POSSIBLY_TWO}attempt ${row.attempt}'s request took effect, run again from a proof that it was not done, and an earlier attempt's request, out past its lease, ended without an answer during it: it may have taken effect too; a person must check the provider`;
    const done = await this.writes.recordReceipt(
      call,
      now,
      json,
      stored,
      deduped ? said : withAttention(told, attention, true),
      { alert: !deduped || attention !== undefined },
    );
    return done ? { done: succeeded(done, stored, false) } : undefined;
  }

  /**
   * Our attempt's end says nothing was done (pending) or the provider refused it (failed), but the
   * move was refused: an earlier attempt, its request out past its lease, ended during ours and may
   * have committed (fenced() moved last_execution_at). Then the outcome is not known: `to` (unknown,
   * looked up; or a person for a refusal, which may be the earlier effect's "already exists"), with
   * our end's error kept on the row for whoever decides. Undefined when the row moved otherwise
   * (fenced() reads it). `read`: the row as `earlierEndDuring` returned it, when already read.
   */
  private async lateEndDuring<A, R>(
    call: Call<A, R>,
    row: Row,
    to: "unknown" | "needs_review",
    why: string,
    error: StoredError,
    read?: Row,
  ): Promise<Step<R> | undefined> {
    // The read and the move are each retried through a brief outage: left running, the row's lease
    // would run out and its end be lost (a "not sent" pending is exactly what must not be written now).
    const now = read ?? (await this.earlierEndDuring(call, row));
    if (!now) return undefined;
    const reason = `attempt ${row.attempt} ended (${why.slice(0, 200)}), but an earlier attempt's request, out past its lease, ended meanwhile and may have committed`;
    const moved = await this.writes.moveDurably(call, now, to, {
      actor: call.actor,
      reason,
      error_json: JSON.stringify(error),
      // The row's checks were tries of work known not done: the earlier attempt's outcome has had none.
      ...(to === "unknown" ? { checkAfterMs: 0, checks: 0 } : { alert: true }),
      // Unknown only after our own end that took no effect (not sent, refused for now): a rerun
      // gives back the mark its takeover replaced (`Row.rerun_before`).
      ...(to === "unknown" && markBack(row)),
    });
    return moved ? { done: pending(moved, reason) } : undefined;
  }

  /**
   * Our held row, read again (retried through a brief outage), when it is still ours and an
   * earlier attempt's execution ended during our run (fenced() moved last_execution_at): what
   * `lateEndDuring` and `overlappedRerun` decide on. Undefined when the row moved otherwise.
   */
  private async earlierEndDuring<A, R>(call: Call<A, R>, row: Row) {
    const now = await this.writes.durably(call, () => this.store.findById(call.tenant, row.id));
    const ours = now?.status === "running" && now.attempt === row.attempt;
    return ours && now.last_execution_at !== row.last_execution_at ? now : undefined;
  }

  /** Parks our held row for a person (alerted), retried through a brief outage (`moveDurably`). */
  private async toReview<A, R>(call: Call<A, R>, row: Row, reason: string): Promise<Step<R>> {
    const parked = await this.writes.moveDurably(call, row, "needs_review", { actor: call.actor, reason, alert: true });
    return parked ? { done: pending(parked, reason) } : fenced(this.writes, call, row, "needs_review", reason);
  }

  /** The args for this attempt: the ones stored by an earlier attempt, or the caller's. */
  private argsFor<A, R>(call: Call<A, R>, row: Row): A | undefined {
    if (row.args_json !== null) return JSON.parse(row.args_json) as A;
    if (call.args.kind === "given") return call.args.value;
    return undefined;
  }
}

/** What an execution's own answer (a receipt) is recorded with. */
const HAPPENED = "the effect happened";
/** What a lookup's finding in time is recorded with. */
const FOUND = "reconciled: the effect was found";
/** What a lookup's finding that answered after it was given up is recorded with (`recordLateFinding`). */
const LATE_FINDING = "reconciled: the effect was found by a lookup that answered after it was given up";
/** What a lookup after a person's retry (of an outcome that may have committed) says when it finds the effect. */
const REOPENED_FOUND =
  "reconciled after a person's retry: the effect was found (the earlier attempt committed after all); not run again";
/** ... and when it proves nothing yet. */
const REOPENED_INCONCLUSIVE =
  "retried by a person, but its last execution may have committed: its effect is looked up first, and the lookup proved nothing yet";

/**
 * Whether `reason` is a success's that a person's retry found done (its lookup found the earlier
 * attempt's effect, or that attempt's late answer settled the row before the retry ran, fence.ts
 * `SETTLED_BEFORE_RETRY`: one effect, the retry not run), alerted so the person hears it. Not when
 * the effect was found twice, or the action's `attention` speaks of it: those words come first.
 */
export function isFoundOnRetry(reason: string): boolean {
  return reason.startsWith(REOPENED_FOUND) || reason.startsWith(SETTLED_BEFORE_RETRY);
}

/** Why a person's retry whose args are not stored is back with a person after a look that proved nothing. */
const NO_LOOK_WITHOUT_ARGS =
  "its args are not stored, so only a call that brings them can look again (the daemon cannot); a person must decide: resolve it, or retry it again for the next such call";

/** Tells this process's calls apart from another's under the same owner (a restarted worker). */
const PROCESS_TAG = randomUUID().slice(0, 8);
let calls = 0;

/**
 * This call's lease owner, for operators to tell calls apart: the worker's identity, the process's
 * tag and a count. Nothing compares owners (attempts fence), so it need not be random per call.
 */
function ownerOf(settings: RunnerSettings): string {
  calls += 1;
  return `${settings.owner}/${PROCESS_TAG}.${calls.toString(36)}`;
}

/** Operations named once each, in first-seen order; entries that know no operation yet are left out. */
export function namedOnce(
  entries: Iterable<{ tenant: string; id?: string | undefined }>,
): { tenant: string; id: string }[] {
  const named = new Map<string, { tenant: string; id: string }>();
  for (const { tenant, id } of entries) if (id !== undefined) named.set(JSON.stringify([tenant, id]), { tenant, id });
  return [...named.values()];
}

/**
 * What an end that sent nothing writes so a rerun puts back the mark its takeover replaced
 * (`Row.rerun_before`, `TransitionPatch.rerunBefore`): nothing on a row no rerun holds.
 */
function markBack(row: Row): { rerunBefore?: number | null } {
  return row.rerun_before === undefined ? {} : { rerunBefore: row.rerun_before };
}

/**
 * The database failing in a statement that names no operation (a read of the key, a claim), once
 * the call knows its operation: said of it, since an attempt of it may have reached the provider
 * (callers and agents must not read it as "nothing was done").
 */
function ofOperation(error: unknown, operationId: string | undefined): unknown {
  if (!(error instanceof LedgerUnavailableError) || error.operationId !== undefined || operationId === undefined)
    return error;
  // A claim the close refused unwritten, after this call found the key held by an operation (a
  // step before, which asked to look again): that row is gone since (the claim read none), or the
  // ledger closed before it read again. Its id is said as what it is, not as this claim's.
  if (error.unclaimed)
    return new LedgerUnavailableError(
      `the ledger was closed before this call's claim was written: nothing was sent under it. An earlier step of this call found its key held by operation ${operationId}, which may be gone since (idem show tells); calling again with the same key on an open ledger is safe`,
      operationId,
      { cause: error, closed: true },
    );
  // Its flags said again: the cause kept may be the driver's error, which carries none of them.
  return new LedgerUnavailableError(error.message, operationId, {
    cause: error.cause ?? error,
    reopen: error.reopen,
    reopensItself: error.reopensItself,
    closed: error.closed,
  });
}

/** Settled, whether read as an Outcome or peeked at whole. */
function isSettled(snap: Peek | Outcome): snap is Outcome {
  return snap.status === "succeeded" || snap.status === "failed";
}

function snapshotOf(p: Peek): Snapshot {
  const error = p.error_json === null ? undefined : (JSON.parse(p.error_json) as StoredError);
  return {
    status: p.status,
    attempt: p.attempt,
    leaseExpiresAt: p.lease_expires_at,
    nextCheckAt: p.next_check_at,
    checks: p.checks,
    maybeCommitted: p.maybe_committed === 1,
    hasArgs: p.has_args === 1,
    lookFirst: p.look_first === 1,
    createdAt: p.created_at,
    lastExecutionAt: p.last_execution_at,
    firstExecutionAt: p.first_execution_at === null ? null : Number(p.first_execution_at),
    now: p.db_now,
    replayable: error?.replayable,
    rateLimited: error?.kind === "rate_limited",
  };
}
