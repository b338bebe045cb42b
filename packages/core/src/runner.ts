/**
 * `run`: the state machine of docs/design.md for one call. Claim (one winner), or read one snapshot
 * of the row that holds the key and decide on it (policy.ts `decide`): replay what is settled,
 * wait on a live lease, take over what may be taken over, execute under a heartbeat-extended
 * lease with a local deadline, classify failures and retry within the budget. Every write is a
 * single statement in store.ts conditioned on the status and attempt the decision was made on.
 */
import { randomUUID } from "node:crypto";
import { setImmediate as yieldToLoop, setTimeout as sleep } from "node:timers/promises";
import { performance } from "node:perf_hooks";
import pRetry from "p-retry";
import {
  describeError,
  type Action,
  type Classification,
  type OperationContext,
  type ReconcileResult,
} from "./action.js";
import { canonicalJson, sha256 } from "./canonical.js";
import {
  ArgsMismatchError,
  CompletionNotRecordedError,
  InvalidValueError,
  LeaseDeadlineError,
  LedgerUnavailableError,
  PayloadTooLargeError,
} from "./errors.js";
import {
  backoff,
  checkDelay,
  decide,
  keySentAt,
  nextDelay,
  recoveryFor,
  statusAfter,
  type RetryBudget,
  type Snapshot,
} from "./policy.js";
import {
  boundEvidence,
  performedProof,
  type Resolution,
  type RunResult,
  type StoredError,
  type Unsettled,
} from "./result.js";
import type { Status } from "./schema.js";
import {
  storable,
  type Address,
  type Outcome,
  type Peek,
  type Row,
  type Store,
  type TransitionPatch,
} from "./store.js";
import type { Tracing } from "./tracing.js";

export interface RunnerSettings {
  readonly owner: string;
  readonly leaseMs: number;
  readonly waitMs: number;
  readonly budget: RetryBudget;
  readonly maxArgsBytes: number;
  readonly maxResultBytes: number;
  readonly retentionMs: number | null;
}

/** One call's view: the action, its args (given or to be generated) and its settings. */
export interface Call<A, R> {
  readonly action: Action<A, R>;
  readonly tenant: string;
  readonly key: { hash: string; label: string | null };
  /** Given args, hashed up front; or a generator run once, for the first attempt only. */
  readonly args:
    | { kind: "given"; value: A; hash: string; json: string }
    | { kind: "lazy"; make: () => A | Promise<A> }
    /** Settling without a caller: only the args stored by an earlier attempt can be used. */
    | { kind: "stored" };
  readonly storeArgs: boolean;
  readonly actor: string | null;
  readonly settings: RunnerSettings;
  readonly signal?: AbortSignal | undefined;
  /**
   * Once aborted, this call ends as a closing ledger's calls do (a daemon stopping): nothing more
   * is sent, a pause ends at once, the effect under way is recorded.
   */
  readonly stop?: AbortSignal | undefined;
}

/** The daemon's limits: an unknown outcome checked this often, or this old, goes to a person. */
export interface Escalation {
  readonly maxChecks: number;
  readonly maxAgeMs: number;
}

type Step<R> = { done: RunResult<R> } | { again: number };

/** A row our attempt holds, with the local time the statement that gave us the lease was sent. */
interface Held {
  readonly row: Row & { db_now: number };
  readonly since: number;
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
}

export class Runner {
  /**
   * `closing`: the ledger is closing, so no request is sent from now on (an attempt about to send
   * ends "not sent", pending); the calls in flight end, and `close` waits for them (`quiesce`).
   */
  constructor(
    private readonly store: Store,
    private readonly tracing: Tracing,
    private readonly closingSignal: AbortSignal = new AbortController().signal,
  ) {}

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
    try {
      for (;;) {
        call.signal?.throwIfAborted();
        const step = await this.step(call, state);
        if ("done" in step) return step.done;
        await this.pause(call, step.again);
      }
    } catch (error) {
      throw ofOperation(error, state.operationId);
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
    };
    const at = { tenant: call.tenant, key: call.key.hash, id: row.id };
    let snap: Peek | undefined = { ...row, has_args: row.args_json === null ? 0 : 1 };
    try {
      for (;;) {
        const step = await this.onSnapshot(call, state, at, snap, escalate);
        if ("done" in step) return step.done;
        await this.pause(call, step.again);
        snap = await this.store.peek(call.tenant, call.key.hash);
        if (!snap) throw new LedgerUnavailableError("the operation disappeared while it was being settled", row.id);
      }
    } catch (error) {
      throw ofOperation(error, row.id);
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
          await this.giveBack(call, state.owner, 1, { status: "pending", maybeCommitted: 0, executed: true }, error);
          throw error;
        });
      span?.setAttributes({ "idem.claim.fresh": out?.fresh === true, ...(out && { "idem.operation.id": out.row.id }) });
      return out;
    });
    if (!claim) return { again: 0 }; // pruned between our insert and read: claim again
    state.operationId = claim.row.id;
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
        const row = await this.store
          .takeOver(at, snap, {
            owner: state.owner,
            leaseMs: s.leaseMs,
            actor: call.actor,
            reason: decision.reason,
            execute: decision.kind === "execute",
            before: decision.kind === "execute" ? decision.replayUntil : undefined,
          })
          .catch(async (error: unknown) => {
            // A running row taken over (its lease expired) has no state of ours to go back to: the
            // new lease runs out as the old one did.
            if (snap.status === "pending" || snap.status === "unknown")
              await this.giveBack(
                call,
                state.owner,
                snap.attempt + 1,
                {
                  status: snap.status,
                  maybeCommitted: snap.maybe_committed === 1 ? 1 : 0,
                  executed: decision.kind === "execute",
                },
                error,
              );
            throw error;
          });
        if (!row) return { again: 0 }; // the row changed since the snapshot: decide again on a new one
        const mine = { row, since };
        if (decision.kind === "review") return this.toReview(call, row, decision.reason);
        if (decision.kind === "execute") return this.perform(call, mine, state, snap.maybe_committed === 1);
        return this.reconcile(call, mine);
      }
    }
  }

  /** Looks the effect up under our lease: found, proven absent, refused, or still unknown (counted, backed off). */
  private async reconcile<A, R>(call: Call<A, R>, mine: Held): Promise<Step<R>> {
    const row = mine.row;
    const args = this.argsFor(call, row) as A; // decide() sent rows without args to review
    // No effect is younger than the last execution, or than a dead worker's lease (our takeover
    // of its row recorded that end as the last execution); inconclusive checks do not restart it.
    const lastAttemptAt = row.last_execution_at ?? row.created_at;
    let found: ReconcileResult<R>;
    // A lookup refused for good (its error classified with `alert` by the action: a credential
    // revoked, a server certificate not trusted) fails every later check the same way: a person
    // must hear of it now, though the outcome stays unknown (the daemon's check_refused alert).
    let refused = false;
    try {
      // A lookup has no effect to lose: one that outlasts the call's time budget (a client with no
      // timeout, a signal ignored) is given up; its heartbeat would otherwise hold the lease forever.
      const ms = call.settings.budget.elapsedMs;
      found = await this.withLease(
        call,
        mine,
        (ctx, _held, abandon) =>
          givenUp(call.action.reconcile!(args, ctx), ctx.signal, ms, abandon).then(verdictOf, (error: unknown) => {
            const cls = safeClassify(call.action, error, ctx);
            refused = (cls.kind === "permanent" || cls.kind === "ambiguous") && cls.alert === true;
            throw error;
          }),
        lastAttemptAt,
      );
    } catch (error) {
      if (call.signal?.aborted) {
        // The caller gave up: no check was made. Back to unknown, due at once, and the caller
        // hears its own reason, whatever the move did (fenced, or failed: our lease then expires
        // and the daemon takes the row).
        await this.store
          .move(row, "unknown", {
            actor: call.actor,
            reason: "the caller gave up during the lookup",
            checkAfterMs: 0,
            checks: row.checks,
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
    if (found.found) {
      // Found more than once: settled as found (it happened), and a person hears of the second.
      const twice =
        found.twice === undefined
          ? undefined
          : `two effects: the lookup found the effect more than once (${describeTwice(found.twice)}); a person must check the provider`;
      return this.complete(call, row, found.receipt, "reconciled: the effect was found", false, twice);
    }
    // What the lookup proved is known to this process only: each move below is retried through a
    // brief outage of the ledger and recognises its own commit whose answer was lost
    // (`moveDurably`), as an execution's end is. Written once, a failure left the row running
    // until its lease ran out, and the caller read LedgerUnavailableError for a lookup that answered.
    if (found.proof === "absent") {
      const back = await this.moveDurably(call, row, "pending", {
        actor: call.actor,
        reason: `reconciled: ${found.reason}`,
        checkAfterMs: 0,
        checks: 0,
        noExecutionSince: row.last_execution_at,
      });
      if (back) return { again: 0 };
      // An earlier attempt, its request still out when we took over, answered while we looked
      // (fenced() moved last_execution_at): what the provider showed us may predate its commit.
      const voided = await this.moveDurably(call, row, "unknown", {
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
        : this.fenced(call, row, "pending", found.reason);
    }
    if (found.proof === "never") return this.toReview(call, row, found.reason);
    if (found.proof === "refused") {
      // The provider's own record of its final answer: what the request's answer would have said.
      const error: StoredError = { kind: "permanent", reason: found.reason, ...boundEvidence(found.evidence) };
      const done = await this.moveDurably(call, row, "failed", {
        actor: call.actor,
        reason: `reconciled: ${found.reason}`,
        error_json: JSON.stringify(error),
        completed: true,
        retentionMs: call.settings.retentionMs,
      });
      return done ? { done: failed(done, error, false) } : this.fenced(call, row, "failed", found.reason);
    }
    const checkAfterMs = checkDelay(call.settings.budget.baseDelayMs, row.checks, found.retryAfterMs);
    const still = await this.moveDurably(call, row, "unknown", {
      actor: call.actor,
      reason: `inconclusive: ${found.reason}`,
      checkAfterMs,
      checks: row.checks + 1,
      ...(refused ? { alert: true } : {}),
    });
    return still
      ? { done: pending(still, `outcome unknown, verification continues: ${found.reason}`) }
      : // A lookup sent nothing: its end says nothing of what an earlier request did meanwhile.
        this.fenced(call, row, "unknown", found.reason, { sent: false });
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
    const ran = await this.withLease(
      call,
      mine,
      async (
        ctx,
        held,
      ): Promise<
        { step: Step<R> } | { ok: true; receipt: R } | { ok: false; cls: Classification; row: Row; sent: boolean }
      > => {
        let row: Row = mine.row;
        // A write before the request is sent, kept through a brief outage; given up, the row is
        // given back (nothing was sent) and this is the step that answers the caller.
        const beforeSend = (what: string, patch: Parameters<Store["patchRunning"]>[1]) =>
          this.beforeSend(call, state, row, maybeCommitted, what, patch);
        let args = this.argsFor(call, row);
        if (args === undefined) {
          // Lazy args never stored: no attempt got as far as executing. Generate them now, once,
          // under the lease (a slow model call keeps it), and store them before anything is sent.
          const made = await this.generate(call, state, row, beforeSend);
          if (!("args" in made)) return { step: made };
          args = made.args;
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
          const moved = await this.moveDurably(call, row, "unknown", {
            actor: call.actor,
            reason: `attempt ${row.attempt - 1} stored other args after this caller read the operation; its outcome is unknown`,
            checkAfterMs: 0,
            checks: row.checks,
          });
          if (!moved) return { step: await this.fenced(call, row, "unknown", "args", { sent: false }) };
          throw new ArgsMismatchError(row.id, row.args_hash, call.args.hash, call.action.type, "unknown");
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
        // Nothing is sent once our lease may have passed to another worker (the statement that
        // granted it, or a write since, answered too late, and the other may have looked the
        // effect up, found nothing and done it), nor once the caller gave up, nor once the ledger
        // is closing (its process is shutting down). Not sent, so a transient failure of this attempt.
        const unsent = !held()
          ? `the lease of attempt ${row.attempt} ran out before its request was sent`
          : call.signal?.aborted
            ? `the caller gave up before attempt ${row.attempt}'s request was sent`
            : this.closing(call)
              ? `${this.closingWhy()} before attempt ${row.attempt}'s request was sent`
              : undefined;
        if (unsent !== undefined) return { ok: false, cls: { kind: "transient", reason: unsent }, row, sent: false };
        try {
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
          return {
            ok: true,
            receipt: await this.tracing.span("idem.execute", attributes, () => call.action.execute(a, op)),
          };
        } catch (error) {
          return { ok: false, cls: safeClassify(call.action, error, ctx), row, sent: true };
        }
      },
      undefined,
      maybeCommitted,
    );
    if ("step" in ran) return ran.step;
    if (ran.ok) return this.complete(call, mine.row, ran.receipt, "the effect happened", true);

    const { cls, row, sent } = ran;
    const to = statusAfter(cls, maybeCommitted);
    const error: StoredError = {
      kind: cls.kind,
      reason: cls.reason,
      ...((cls.kind === "permanent" || cls.kind === "ambiguous") && cls.alert && { alert: true }),
      ...("providerRequestId" in cls && cls.providerRequestId && { providerRequestId: cls.providerRequestId }),
      ...(cls.kind === "permanent" && boundEvidence(cls.evidence)),
      ...(cls.kind === "ambiguous" && cls.replayable === false && { replayable: false }),
    };
    // Only this process knows how the attempt ended (not sent, refused): a brief outage of the
    // ledger must not leave the row running, to be read after its lease as "may have committed".
    if (to === "failed") {
      const done = await this.moveDurably(call, row, "failed", {
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
      return late ?? this.fenced(call, row, "failed", cls.reason);
    }
    const b = call.settings.budget;
    const providerWait = "retryAfterMs" in cls ? cls.retryAfterMs : undefined;
    // The row keeps the longer of the provider's signal and our backoff, even past our budget.
    // Work known not done that the provider refused for now: each try counts a check, and the row
    // waits as an unknown outcome's checks do (doubling, capped at an hour), so that the daemon's
    // tries of a provider down for hours back off instead of coming every tick (escalated past
    // maxChecks). An outcome that becomes unknown here starts its own checks.
    const checkAfterMs =
      to === "pending"
        ? Math.max(backoff(b, state.executed), checkDelay(b.baseDelayMs, row.checks, providerWait))
        : checkDelay(b.baseDelayMs, maybeCommitted ? row.checks : 0, providerWait);
    const moved = await this.moveDurably(call, row, to, {
      actor: call.actor,
      reason: `${cls.kind}: ${cls.reason}`,
      error_json: JSON.stringify(error),
      checkAfterMs,
      // A replay of an unknown outcome that proved nothing is one more check; one never sent is neither.
      ...(to === "unknown" && sent && { executionEnded: true, checks: maybeCommitted ? row.checks + 1 : 0 }),
      // A refused credential a person must hear of, though the outcome stays unknown (statusAfter).
      ...(error.alert && { alert: true }),
      ...(to === "pending" && { noExecutionSince: row.last_execution_at, checks: row.checks + 1 }),
    });
    if (!moved) {
      const late = to === "pending" ? await this.lateEndDuring(call, row, "unknown", cls.reason, error) : undefined;
      return late ?? this.fenced(call, row, to, cls.reason, { sent });
    }
    // Unknown, and nothing can check it (no key window, no lookup): on to a person at once.
    if (
      to === "unknown" &&
      recoveryFor(call.action.capabilities, firstSentOf(mine.row), mine.row.db_now, error).kind === "review"
    )
      return { again: 0 };
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
      const done = await this.moveDurably(call, row, "failed", {
        actor: call.actor,
        reason: `rejected before send: ${err.reason}`,
        error_json: JSON.stringify(err),
        completed: true,
        retentionMs: call.settings.retentionMs,
      });
      if (!done) return this.fenced(call, row, "failed", err.reason);
      return { done: failed(done, err, false) };
    }
    const stored = await beforeSend("args", { args_hash: sha256(json), args_json: json });
    if (stored === true) return { args: made };
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
      written = await this.durably(call, () => this.store.patchRunning(row, patch));
    } catch (error) {
      const to = {
        status: maybeCommitted ? ("unknown" as const) : ("pending" as const),
        maybeCommitted: maybeCommitted ? (1 as const) : (0 as const),
        executed: true, // perform runs under a claim or a takeover that executes
      };
      const reason = `attempt ${row.attempt} could not record its ${what} before sending (the ledger failed); nothing was sent under it`;
      if (!(await this.giveBack(call, state.owner, row.attempt, to, error, reason))) throw error;
      const now = await this.store.findById(call.tenant, row.id).catch(() => undefined);
      if (!now || now.status === "succeeded" || now.status === "failed" || now.status === "running") throw error;
      return { done: pending(now, reason, knownPerformed(now)) };
    }
    return written ? true : this.fenced(call, row, "running", what);
  }

  /**
   * Records the receipt. The effect has happened, so a failing write is retried with backoff for
   * up to a lease; if the ledger stays unreachable the caller gets the receipt on a typed error.
   * `performed`: this attempt's own request made it (execute answered), not a lookup's finding.
   * `twice`: the lookup said it found the effect more than once, in the reason to record instead.
   * A receipt whose ids (`effectId`) name several effects is two effects too, however it came
   * (a lookup that did not say so, an execute that found copies of earlier sends): the reason and
   * the alert are the same, never a silent settlement.
   */
  private async complete<A, R>(
    call: Call<A, R>,
    row: Row,
    receipt: R,
    reason: string,
    performed = false,
    twice?: string,
  ): Promise<Step<R>> {
    let json: string;
    try {
      json = canonicalJson(receipt, "result");
      checkSize("result", json, call.settings.maxResultBytes, row.id);
    } catch (error) {
      // The effect happened but its receipt cannot be kept: park it for a person, then tell the caller.
      await this.unstorable(
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
    const done = await this.recordReceipt(call, row, json, stored, several ?? reason, { alert: several !== undefined });
    return done
      ? { done: succeeded(done, stored, false) }
      : this.fenced(call, row, "succeeded", json, { receipt: stored, performed, several });
  }

  /**
   * Parks an operation whose effect happened but whose receipt cannot be stored (too large, not
   * JSON) for a person, with the proof on the row (error kind `invalid_result`: `knownPerformed`,
   * and a person's retry or "failed" is refused). `performed`: the receipt is our own request's
   * (execute answered), not a lookup's finding; the proof names its attempt (`performedBy`). Our
   * row first; if another attempt or the daemon moved it meanwhile, the row as it is now, whatever
   * is not yet proven by a receipt:
   * - pending, unknown, or running under a later attempt (looking it up, or sending too): left as
   *   it was, it would run again; a holder is fenced off as a receipt fences it (`fenced`), so its
   *   later end cannot replace the proof;
   * - failed (a later attempt refused, say "already exists", or a person found nothing): reopened;
   * - needs_review (parked for a person): the proof added, alerted, and its version moved, so a
   *   decision taken on a view from before it is refused;
   * - needs_review with another attempt's proof of its own request's effect: ours is a second
   *   effect (unless the provider deduped it onto the first), said and alerted as one. A proof
   *   naming our attempt is ours already; a lookup's finding may be this very effect: our attempt
   *   is named on it, not alerted, so that a later receipt of another request counts as a second.
   * A row settled `succeeded` keeps its receipt (the one replayed to every other caller), and the
   * refused proof goes to its history; but our own request's answer, on a row another attempt
   * settled with a receipt, is a second effect (unless the provider deduped it onto the first, or
   * its ids say it is the recorded one: `effectId`), alerted as one, as `fenced` alerts a storable
   * receipt that differs (this one, unstorable, cannot be the receipt recorded). Each move is
   * retried through a brief outage (`moveDurably`).
   */
  private async unstorable<A, R>(
    call: Call<A, R>,
    row: Row,
    why: string,
    performed: boolean,
    receipt: R,
    /** The receipt tells of two effects (`complete`'s reason for it): said and alerted wherever the row is. */
    several?: string,
  ): Promise<void> {
    const proof: StoredError = {
      kind: "invalid_result",
      reason: why,
      ...(performed && { performedBy: [row.attempt] }),
    };
    const unstorable = `the effect happened but its receipt cannot be stored: ${why}`;
    const patch = {
      actor: call.actor,
      reason: several === undefined ? unstorable : `${several}; ${unstorable}`,
      alert: true,
      error_json: JSON.stringify(proof),
      executionEnded: true,
      firstSentAt: firstSentOf(row),
    };
    const mine = await this.moveDurably(call, row, "needs_review", patch).catch(() => undefined);
    if (mine) return;
    for (let look = 1; look <= 5; look++) {
      const now = await this.store.findById(call.tenant, row.id).catch(() => undefined);
      if (!now) return this.noteUnstorable(call, row, now, why);
      // Written on the row as read: a change since (another proof, a person) is read again, and a
      // retry after a commit whose answer was lost matches nothing instead of writing it twice.
      const asRead = { unchangedSince: { updatedAt: now.updated_at, checks: now.checks } };
      if (now.status === "succeeded") {
        // A lookup's finding, a person's "it happened" without a receipt, or the row settled at our
        // own attempt (a person's verdict while we held it): not another request's effect.
        const another = performed && now.result_json !== null && now.attempt !== row.attempt;
        const second =
          another && !dedupedOntoFirst(call.action, row, now) && !namesEach(call.action, now.result_json!, receipt);
        const reason =
          several !== undefined && !alertedBefore(call.action, now, several, receipt)
            ? `${several}; its receipt not storable (${why.slice(0, 200)}), and the operation was settled by another receipt`
            : second
              ? `two effects: attempt ${row.attempt}'s request took effect too, its receipt not storable (${why.slice(0, 200)}), and the receipt recorded at attempt ${now.attempt} is another; a person must check the provider`
              : undefined;
        if (reason === undefined) return this.noteUnstorable(call, row, now, why);
        // Our own alert, committed on a try whose answer was lost (as moveDurably tells its own
        // write): written again, it would be a second event and a delivered alert due again.
        const ours = (r: Row | undefined) => r?.status === "succeeded" && r.reason === reason && r.actor === call.actor;
        if (ours(now)) return;
        const alerted = await this.moveDurably(call, now, "succeeded", {
          actor: call.actor,
          reason,
          alert: true,
          ...asRead,
        }).catch(
          () => null, // the ledger failed for a lease: its first try may have committed all the same
        );
        if (alerted) return;
        if (alerted === null) {
          const after = await this.store.findById(call.tenant, row.id).catch(() => undefined);
          return ours(after) ? undefined : this.noteUnstorable(call, row, after, why);
        }
        continue;
      }
      const earlier = rowPerformedProof(now);
      if (earlier) {
        const by = earlier.performedBy ?? [];
        if (performed && by.includes(row.attempt)) return; // our own proof
        // Ours tells of two effects not said on the row yet: said and alerted, whatever else is so.
        const saySeveral = several !== undefined && !alertedBefore(call.action, now, several, receipt);
        // A lookup's finding, or our request's answer deduped onto the proven effect: the same one.
        const same = !performed || (by.length > 0 && dedupedOntoFirst(call.action, row, now));
        if (same && !saySeveral) return this.noteUnstorable(call, row, now, why);
        const named = same ? earlier : ({ ...earlier, performedBy: [...by, row.attempt] } satisfies StoredError);
        // After a lookup's finding (no attempt named) ours is not proven a second effect, but it is
        // named on the proof: only noted, another attempt's own receipt later read the proof as the
        // lookup's alone and settled as one effect what were two. Its alert, if still due, stays.
        const { alert: _, ...quiet } = patch;
        const told =
          same || by.length > 0
            ? `two effects: attempt ${row.attempt}'s request took effect, and so did attempt ${by.join(" and ")}'s; neither receipt could be stored (${why.slice(0, 200)}); a person must check the provider`
            : `attempt ${row.attempt}'s request took effect, its receipt not storable either (${why.slice(0, 200)}); the effect a lookup found before is taken to be this one`;
        const added = await this.moveDurably(call, now, "needs_review", {
          ...(by.length > 0 || saySeveral ? patch : quiet),
          ...asRead,
          reason: same ? patch.reason : saySeveral ? `${several}; ${told}` : told,
          error_json: JSON.stringify(named),
        }).catch(() => undefined);
        if (added) return;
        continue;
      }
      // Still ours: the ledger failed for a lease (the caller's error names the operation).
      if (now.status === "running" && now.attempt === row.attempt) return;
      const held = now.status === "running" ? `, while attempt ${now.attempt} held it` : "";
      const moved = await this.moveDurably(call, now, "needs_review", {
        ...patch,
        ...asRead,
        reason: `attempt ${row.attempt}: ${patch.reason}${held}`,
        ...(now.status === "failed" && { reopened: true }),
      }).catch(() => undefined);
      if (moved) return;
    }
    return this.noteUnstorable(call, row, await this.store.findById(call.tenant, row.id).catch(() => undefined), why);
  }

  /** The proof `unstorable` could not put on the row, kept in its history (best effort: the caller is told anyway). */
  private async noteUnstorable<A, R>(call: Call<A, R>, row: Row, now: Row | undefined, why: string): Promise<void> {
    if (!now) return;
    await this.store
      .recordEvent(now, {
        attempt: row.attempt,
        actor: call.actor,
        to: now.status,
        reason: `fenced: attempt ${row.attempt}'s effect happened but its receipt cannot be stored: ${why.slice(0, 300)}`,
        executionEnded: true,
        firstSentAt: firstSentOf(row),
      })
      .catch(() => undefined);
  }

  /**
   * Our attempt's end says nothing was done (pending) or the provider refused it (failed), but the
   * move was refused: an earlier attempt, its request out past its lease, ended during ours and may
   * have committed (fenced() moved last_execution_at). Then the outcome is not known: `to` (unknown,
   * looked up; or a person for a refusal, which may be the earlier effect's "already exists"), with
   * our end's error kept on the row for whoever decides. Undefined when the row moved otherwise
   * (fenced() reads it).
   */
  private async lateEndDuring<A, R>(
    call: Call<A, R>,
    row: Row,
    to: "unknown" | "needs_review",
    why: string,
    error: StoredError,
  ): Promise<Step<R> | undefined> {
    // The read and the move are each retried through a brief outage: left running, the row's lease
    // would run out and its end be lost (a "not sent" pending is exactly what must not be written now).
    const now = await this.durably(call, () => this.store.findById(call.tenant, row.id));
    if (now?.status !== "running" || now.attempt !== row.attempt || now.last_execution_at === row.last_execution_at)
      return undefined;
    const reason = `attempt ${row.attempt} ended (${why.slice(0, 200)}), but an earlier attempt's request, out past its lease, ended meanwhile and may have committed`;
    const moved = await this.moveDurably(call, now, to, {
      actor: call.actor,
      reason,
      error_json: JSON.stringify(error),
      ...(to === "unknown" ? { checkAfterMs: 0, checks: now.checks } : { alert: true }),
    });
    return moved ? { done: pending(moved, reason) } : undefined;
  }

  /**
   * Our claim or takeover failed without an answer, so it may have committed: a row running under
   * this call's lease, marked as maybe sent, though nothing was (or a write before the send failed
   * for good, `beforeSend`). Put it back (known not done, or as found), trying a failing database
   * again for a moment. Without this the row waited out the lease and, for an action that cannot
   * look its effect up, went to a person with no effect anywhere. True when it was given back.
   */
  private async giveBack<A, R>(
    call: Call<A, R>,
    owner: string,
    attempt: number,
    to: { status: "pending" | "unknown"; maybeCommitted: 0 | 1; executed: boolean },
    error: unknown,
    reason = `attempt ${attempt}'s ${attempt === 1 ? "claim" : "takeover"} was answered by no one; nothing was sent under it`,
  ): Promise<boolean> {
    if (!(error instanceof LedgerUnavailableError)) return false; // the database answered: nothing written
    return pRetry(
      () =>
        this.store.giveBack({ tenant: call.tenant, key: call.key.hash }, owner, attempt, {
          ...to,
          actor: call.actor,
          reason,
        }),
      { retries: 4, minTimeout: 50, maxTimeout: 500, randomize: true, maxRetryTime: 2_000 },
    ).catch(() => false); // still unreachable: the lease runs out, as before
  }

  /**
   * `write`, retried with backoff while the database fails (LedgerUnavailableError), for up to a
   * lease from now: what only this process knows (a receipt, "not sent", a refusal, the args
   * fixed before a send) must outlast a brief outage, and so must the read such a write is
   * decided on (a late end's, in `fenced` and `lateEndDuring`). Any other error (and one that
   * needs the ledger reopened), and the last failure, are thrown. Every write retried is
   * conditioned as it was (status, attempt), so a retry after another attempt took over matches
   * nothing. The first try runs outside p-retry: setting it up
   * (options, an abort signal) cost about 5 % of a call's CPU, for a write that nearly always
   * succeeds at once. `unanswered` is set once a try failed: it may have committed all the same.
   */
  private durably<T>(
    call: Pick<Call<unknown, unknown>, "settings">,
    write: () => Promise<T>,
    unanswered?: { failed: boolean },
  ): Promise<T> {
    const started = performance.now();
    return write().catch((error: unknown) => {
      // A ledger whose SQLite file was replaced never writes again (`reopen`): no retry passes.
      if (!(error instanceof LedgerUnavailableError) || error.reopen) throw error;
      if (unanswered) unanswered.failed = true;
      // p-retry's first attempt is the one that just failed: it waits before the second.
      let retrying = false;
      const again = () => {
        if (retrying) return write();
        retrying = true;
        throw error;
      };
      return pRetry(again, {
        retries: 8,
        minTimeout: 50,
        maxTimeout: 2_000,
        randomize: true, // workers that failed together do not retry together
        maxRetryTime: Math.max(0, call.settings.leaseMs - (performance.now() - started)),
        shouldRetry: ({ error }) => error instanceof LedgerUnavailableError && !error.reopen,
      });
    });
  }

  /**
   * `store.move`, retried through a brief outage (`durably`). A try whose answer was lost may have
   * committed, and then the retry matches nothing: the row is already where the move put it. The
   * row found in exactly that state (`to` at the attempt it was written on, with this reason and
   * actor) is the move's own answer, as if it had arrived: no other writer leaves that state. A
   * status at an attempt is written only by the call holding that attempt or by one that read the
   * row at it (each write conditioned on the row as read), each with a reason of its own (naming
   * its attempt, a person's verdict, a lookup's finding), and a takeover changes the attempt.
   * Without it a caller read its own end as another's ("moved meanwhile", "failed earlier, not
   * tried again") and stopped retrying. A move that keeps the status (a proof added, a second
   * effect alerted) is conditioned on the row as read (`unchangedSince`), so that a retry after
   * its commit matches nothing instead of writing it twice. Public for the daemon's own moves
   * (an operation no registered action can settle), which have a tenant and settings, no Call.
   */
  async moveDurably(
    call: Pick<Call<unknown, unknown>, "tenant" | "settings">,
    row: Row,
    to: Status,
    patch: TransitionPatch,
  ) {
    const unanswered = { failed: false };
    const moved = await this.durably(call, () => this.store.move(row, to, patch), unanswered);
    if (moved || !unanswered.failed) return moved;
    const now = await this.store.findById(call.tenant, row.id);
    const own =
      now !== undefined &&
      now.status === to &&
      now.attempt === row.attempt &&
      now.reason === storable(patch.reason) &&
      now.actor === patch.actor;
    return own ? { id: now.id, attempt: now.attempt, status: to } : undefined;
  }

  /**
   * Writes `succeeded` with the receipt, retrying a failing database for up to a lease. A receipt
   * settles the row on its own evidence: a person's verdict goes (a reopened row's "failed" must
   * not be read with the receipt), unless `keepVerdict` (their "it happened" given without one).
   * `alert`: a person must hear of it (`reason` says why). `unchangedSince`: only on the row as
   * read, for a move that keeps the status (see `moveDurably`).
   */
  private async recordReceipt<A, R>(
    call: Call<A, R>,
    row: Row,
    json: string,
    receipt: R,
    reason: string,
    {
      keepVerdict = false,
      alert = false,
      unchangedSince,
    }: { keepVerdict?: boolean; alert?: boolean; unchangedSince?: TransitionPatch["unchangedSince"] } = {},
  ) {
    try {
      return await this.tracing.span(
        "idem.complete",
        { "idem.operation.id": row.id, "idem.attempt": row.attempt },
        () =>
          this.moveDurably(call, row, "succeeded", {
            actor: call.actor,
            reason,
            result_json: json,
            error_json: null,
            ...(!keepVerdict && { resolution_json: null }),
            completed: true,
            retentionMs: call.settings.retentionMs,
            alert,
            ...(unchangedSince && { unchangedSince }),
          }),
      );
    } catch (cause) {
      throw new CompletionNotRecordedError(row.id, row.attempt, receipt, { cause });
    }
  }

  /** Parks our held row for a person (alerted), retried through a brief outage (`moveDurably`). */
  private async toReview<A, R>(call: Call<A, R>, row: Row, reason: string): Promise<Step<R>> {
    const parked = await this.moveDurably(call, row, "needs_review", { actor: call.actor, reason, alert: true });
    return parked ? { done: pending(parked, reason) } : this.fenced(call, row, "needs_review", reason);
  }

  /**
   * Our write matched no row. Either a newer attempt or a person changed the row (the fence: our
   * write is refused and recorded as evidence), or the row is not where we left it, which is not a
   * fence but a ledger failure and is thrown as one. A receipt we hold proves the effect: it
   * settles a row that is not yet proven (unknown, pending, needs_review), and is never answered
   * as anything but an effect. `performed`: the receipt is our own request's (execute answered),
   * not a lookup's finding, so one that differs from the recorded receipt is a second effect,
   * unless the provider's ids say it is the same one (`effectId`: a lookup's finding says less).
   * `several`: the receipt tells of two effects (`complete`'s reason for it): alerted whatever the
   * row became meanwhile, unless the receipt recorded already names each of them.
   */
  private async fenced<A, R>(
    call: Call<A, R>,
    mine: Row,
    wanted: string,
    detail: string,
    {
      receipt,
      sent = true,
      performed = false,
      several,
    }: { receipt?: R; sent?: boolean; performed?: boolean; several?: string | undefined } = {},
  ): Promise<Step<R>> {
    // A receipt we hold reaches the caller whatever the database does meanwhile: it proves the effect.
    const unrecorded = (cause: unknown) =>
      receipt === undefined ? cause : new CompletionNotRecordedError(mine.id, mine.attempt, receipt, { cause });
    // An ended execution (a receipt, or an end that may have committed) says our request was out
    // until now: what others decided meanwhile may not know it. Each write below is conditioned on
    // the row as read; one that finds the row changed reads it again and decides anew.
    const ended = receipt !== undefined || (wanted === "unknown" && sent);
    for (let look = 1; ; look++) {
      // Retried through a brief outage, as the moves below are: read once, an outage here left an
      // ambiguous end unnoted, and the row pending (run again) while our request may have committed.
      const now = await this.durably(call, () => this.store.findById(call.tenant, mine.id)).catch((error: unknown) => {
        throw unrecorded(error);
      });
      if (!now || (now.status === "running" && now.attempt === mine.attempt)) {
        const cause = new LedgerUnavailableError(
          `attempt ${mine.attempt}'s write of ${wanted} matched no row, yet no other attempt holds the operation`,
          mine.id,
        );
        throw unrecorded(cause);
      }
      const lastLook = look >= 5;
      // Evidence of the refused write; a receipt must not be lost to it, so with one it is best effort.
      // It also moves last_execution_at: a lookup another attempt is making, or its own end saying
      // nothing was done, proves nothing of our request (reconcile and perform condition on it).
      const noted = await this.store
        .recordEvent(now, {
          attempt: mine.attempt,
          actor: call.actor,
          to: now.status,
          reason: `fenced: attempt ${mine.attempt} tried to write ${wanted} (${detail.slice(0, 300)}); the operation is at attempt ${now.attempt}, ${now.status}`,
          executionEnded: ended,
          ...(ended && { firstSentAt: firstSentOf(mine) }),
          unchanged: ended && !lastLook,
        })
        .catch((error: unknown) => {
          if (receipt === undefined) throw error;
          return { updatedAt: now.updated_at }; // not noted: the row as read
        });
      if (!noted) continue; // changed since read: decide on the row as it is now
      // A receipt we hold proves the effect. It settles a row not yet proven (a later attempt's
      // included: looking it up, or sending too, which no write of ours can stop now), and outranks
      // a verdict given without it: "failed" (a later attempt refused, say "already exists" as ours
      // had committed; a person who found nothing yet) is replaced, and a person's "succeeded"
      // with no receipt to give gets this one.
      const unproven =
        now.status === "unknown" ||
        now.status === "pending" ||
        now.status === "needs_review" ||
        now.status === "running";
      const verdictWithout = now.status === "failed" || (now.resolution_json !== null && now.result_json === null);
      if (receipt !== undefined && (unproven || verdictWithout)) {
        const overruled = now.status === "failed";
        const after = overruled
          ? now.resolution_json !== null
            ? ", after a person resolved it as failed"
            : `, after attempt ${now.attempt} failed`
          : unproven
            ? now.status === "running"
              ? `, while attempt ${now.attempt} held it`
              : ""
            : ", after a person resolved it as succeeded without one";
        // An effect already proven without its receipt (too large to store) by another attempt's
        // own request: ours is another one. A lookup's finding (no attempt named) may be this very
        // effect: not proven two, so the receipt is recorded and the proof kept in its history.
        const proof = rowPerformedProof(now);
        const by = proof?.performedBy ?? [];
        const second = performed && by.some((a) => a !== mine.attempt) && !dedupedOntoFirst(call.action, mine, now);
        const twice = second || several !== undefined;
        const before = by.length ? `attempt ${by.join(" and ")}'s request` : "a lookup's finding";
        const proven = await this.recordReceipt(
          call,
          now,
          canonicalJson(receipt, "result"),
          receipt,
          several !== undefined
            ? `${several}${after && ` (recorded${after})`}${second ? `; so did attempt ${by.join(" and ")}'s request, whose receipt could not be stored` : ""}`
            : second
              ? `two effects: attempt ${mine.attempt}'s request took effect, and so did attempt ${by.join(" and ")}'s, whose receipt could not be stored; a person must check the provider`
              : proof
                ? `attempt ${mine.attempt}'s receipt proves the effect happened; the effect known before without its receipt (${before}: ${proof.reason.slice(0, 200)}) is taken to be this one`
                : `attempt ${mine.attempt}'s receipt proves the effect happened${after}`,
          // A person's "it happened" agrees with the receipt; any other verdict is void now. Their
          // row keeps its status, so the write is on the row as read and noted: a retry after it
          // committed unseen matches nothing (moveDurably knows its own write), and another late
          // receipt written meanwhile is read again, and found to be a second effect if it differs.
          now.status === "succeeded"
            ? { keepVerdict: true, alert: twice, unchangedSince: { updatedAt: noted.updatedAt, checks: now.checks } }
            : { alert: twice },
        );
        if (proven) return { done: succeeded(proven, receipt, false) };
        if (!lastLook) continue;
      }
      if (
        several !== undefined &&
        receipt !== undefined &&
        now.status === "succeeded" &&
        now.result_json !== null &&
        !alertedBefore(call.action, now, several, receipt)
      ) {
        // Settled by another receipt meanwhile, and ours tells of two effects: a person hears of
        // them, whatever that receipt says (it is replayed to every other caller all the same).
        const alerted = await this.moveDurably(call, now, "succeeded", {
          actor: call.actor,
          reason: `${several}; attempt ${mine.attempt} found this after the operation was settled by another receipt`,
          alert: true,
          ...asNoted(noted, now, lastLook),
        }).catch((error: unknown) => {
          throw unrecorded(error);
        });
        if (alerted || lastLook) return { done: performed ? succeeded(mine, receipt, false) : replayOf<R>(now) };
        continue;
      }
      if (performed && receipt !== undefined && now.status === "succeeded" && now.result_json !== null) {
        // Settled by another attempt's receipt, and ours differs: our request took effect too,
        // unless the provider deduped it onto the first (then it is the same effect, told again,
        // however its answer differs). Our caller gets its own receipt, not "already done
        // earlier", and a person hears of the second effect (the row keeps the receipt it
        // replays to every other caller).
        const ours = canonicalJson(receipt, "result");
        // One effect told twice: the provider's id for it is the recorded receipt's (a lookup's
        // finding says less than the request's answer). Our caller gets its own request's answer.
        if (ours !== now.result_json && namesEach(call.action, now.result_json, receipt))
          return { done: succeeded(mine, receipt, false) };
        if (ours !== now.result_json && !dedupedOntoFirst(call.action, mine, now)) {
          const alerted = await this.moveDurably(call, now, "succeeded", {
            actor: call.actor,
            reason: `two effects: attempt ${mine.attempt}'s request took effect too, and its receipt differs from the one recorded; a person must check the provider`,
            alert: true,
            ...asNoted(noted, now, lastLook),
          }).catch((error: unknown) => {
            throw unrecorded(error);
          });
          if (alerted || lastLook) return { done: succeeded(mine, receipt, false) };
          continue;
        }
      }
      // Still unrecorded after every look (the row kept changing under us): the effect happened,
      // and the caller holds its receipt, whatever the row says now.
      if (receipt !== undefined && now.status !== "succeeded")
        throw unrecorded(
          new LedgerUnavailableError(
            `attempt ${mine.attempt}'s receipt could not be recorded: the operation kept changing (${now.status} at attempt ${now.attempt})`,
            mine.id,
          ),
        );
      if (wanted === "unknown" && sent && (now.status === "pending" || now.status === "failed")) {
        // Absence was proven, or the operation failed (a later attempt refused, a person found
        // nothing), while this attempt was still in flight: its ambiguous end voids that. Unknown
        // again, looked up; after a failure, a person decides (the refusal may be our effect's
        // "already exists"), and the operation is no longer settled.
        // Retried through a brief outage (`moveDurably`): left pending, the row would be run
        // again while our request may have committed; left failed, replayed as no effect.
        const reopened =
          now.status === "pending"
            ? await this.moveDurably(call, now, "unknown", {
                actor: call.actor,
                reason: `attempt ${mine.attempt}, still in flight when absence was proven, may have committed: ${detail.slice(0, 200)}`,
                checkAfterMs: call.settings.budget.baseDelayMs,
                executionEnded: true,
                firstSentAt: firstSentOf(mine),
              })
            : await this.moveDurably(call, now, "needs_review", {
                actor: call.actor,
                reason: `attempt ${mine.attempt}, still in flight when the operation failed, may have committed: ${detail.slice(0, 200)}; a person decides`,
                alert: true,
                reopened: true,
              });
        if (reopened) {
          const what =
            reopened.status === "unknown"
              ? `outcome unknown: attempt ${mine.attempt} may have committed`
              : `attempt ${mine.attempt} may have committed after the operation failed; a person decides`;
          return { done: pending(reopened, what) };
        }
        if (!lastLook) continue;
      }
      // Settled by another attempt or a person: what every caller gets (a verdict may have no receipt).
      if (now.status === "succeeded" || now.status === "failed") return { done: replayOf<R>(now) };
      // At our own attempt nothing took the lease from us: a person, the daemon, or an earlier
      // attempt's proof (its effect happened, its receipt too large to store) moved the row.
      const performedBefore = knownPerformed(now);
      const why = performedBefore
        ? `an earlier attempt's effect happened (its receipt could not be stored) while attempt ${mine.attempt} held the operation; a person records it`
        : now.attempt === mine.attempt
          ? `attempt ${mine.attempt} was moved meanwhile (by a person or the daemon); the operation is ${now.status}`
          : `lease lost to attempt ${now.attempt}; the operation is ${now.status}`;
      return { done: pending(now, why, performedBefore) };
    }
  }

  /**
   * Runs `fn` while a heartbeat keeps our lease. The action's signal aborts when the lease is lost,
   * when the caller gives up, or locally when no heartbeat succeeded for most of a lease (the
   * database is unreachable: another worker may take over once the lease runs out).
   */
  private async withLease<A, R, T>(
    call: Call<A, R>,
    mine: Held,
    /** `abandon`: aborts the action's signal, when its answer is no longer awaited (a lookup given up). */
    fn: (ctx: OperationContext, held: () => boolean, abandon: (reason: Error) => void) => Promise<T>,
    lastAttemptAt?: number,
    /** Whether an earlier attempt may have taken effect (`OperationContext.mayHaveCommitted`); a lookup's: yes. */
    mayHaveCommitted = true,
  ): Promise<T> {
    const { row } = mine;
    const leaseMs = call.settings.leaseMs;
    const controller = new LazyAbort();
    const onAbort = () => controller.abort(call.signal?.reason);
    call.signal?.addEventListener("abort", onAbort, { once: true });
    if (call.signal?.aborted) onAbort(); // given up while the lease was being granted: no event comes
    let finished = false;
    // The lease counts from when the statement that granted or extended it was SENT: a conservative end.
    const margin = Math.min(Math.floor(leaseMs / 5), 2_000);
    const clock = this.store.local;
    let until = 0;
    let lost = false;
    let deadline: NodeJS.Timeout | undefined;
    const armDeadline = (from: number) => {
      until = from + leaseMs - margin;
      clearTimeout(deadline);
      deadline = setTimeout(
        () => {
          lost = true;
          controller.abort(new LeaseDeadlineError(row.id, row.attempt));
        },
        Math.max(0, until - clock()),
      );
    };
    armDeadline(mine.since);
    const timer = setInterval(
      () => {
        const asked = clock();
        this.store.heartbeat(row, leaseMs).then(
          (kept) => {
            if (finished) return; // answered after the call ended: nothing to keep, no deadline to arm
            if (kept) return armDeadline(asked);
            lost = true;
            controller.abort(new Error(`lease of attempt ${row.attempt} lost`));
          },
          () => {}, // unreachable for now: the deadline above stops the action if it lasts
        );
      },
      Math.max(10, Math.floor(leaseMs / 3)),
    );
    // The heartbeat alone does not keep the process running: an action that waits on nothing
    // (it ignored its signal) after the ledger closed must not hold the process open for ever.
    timer.unref();
    // Read synchronously, before a request is sent: the deadline's timer may not have fired yet
    // when the answer that granted the lease arrived late.
    const held = () => !lost && clock() < until;
    try {
      return await fn(context(row, controller, lastAttemptAt, mayHaveCommitted), held, (reason) =>
        controller.abort(reason),
      );
    } finally {
      finished = true;
      clearInterval(timer);
      clearTimeout(deadline);
      call.signal?.removeEventListener("abort", onAbort);
    }
  }

  /** The args for this attempt: the ones stored by an earlier attempt, or the caller's. */
  private argsFor<A, R>(call: Call<A, R>, row: Row): A | undefined {
    if (row.args_json !== null) return JSON.parse(row.args_json) as A;
    if (call.args.kind === "given") return call.args.value;
    return undefined;
  }
}

/**
 * A lookup's answer, checked: a JavaScript reconcile may resolve to anything, and what is not a
 * verdict fails the lookup (inconclusive) instead of the call (a TypeError reading `found`).
 */
function verdictOf<R>(answer: ReconcileResult<R>): ReconcileResult<R> {
  const a = answer as unknown as { found?: unknown } | null | undefined;
  if (typeof a !== "object" || a === null || typeof a.found !== "boolean")
    throw new Error(`the lookup answered no verdict (${describeValue(answer)}): expected { found: true | false, … }`);
  return answer;
}

/** A lookup's `twice`, as its alert says it: its words, or what it gave instead (an action's bug, still alerted). */
function describeTwice(twice: unknown): string {
  return typeof twice === "string" && twice.trim() !== "" ? twice.slice(0, 300) : `said as ${describeValue(twice)}`;
}

function describeValue(v: unknown): string {
  try {
    return (JSON.stringify(v) ?? String(v)).slice(0, 100);
  } catch {
    return typeof v;
  }
}

/** `lookup`, or a rejection once `signal` aborts or `elapsedMs` pass, whichever comes first. */
function givenUp<T>(
  lookup: Promise<T>,
  signal: AbortSignal,
  elapsedMs: number,
  /** Told when the lookup is given up: its signal aborts, so its request does not run on unseen. */
  abandon: (reason: Error) => void,
): Promise<T> {
  // A timer takes 1 ms to 2^31-1 ms (about 24 days); outside, node fires it at once.
  const ms = Math.min(Math.max(1, elapsedMs), 2 ** 31 - 1);
  const answer = Promise.resolve(lookup); // a plain value from a JavaScript reconcile too
  answer.catch(() => {}); // observed even when given up before it settles
  return new Promise<T>((resolve, reject) => {
    let timer: NodeJS.Timeout | undefined;
    const onAbort = () => settle(() => reject(signal.reason ?? new Error("aborted")));
    const settle = (then: () => void) => {
      clearTimeout(timer);
      signal.removeEventListener("abort", onAbort);
      then();
    };
    if (signal.aborted) return onAbort();
    signal.addEventListener("abort", onAbort, { once: true });
    timer = setTimeout(
      () =>
        settle(() => {
          const late = new Error(`no answer within ${ms} ms (the lookup's time bound)`);
          abandon(late);
          reject(late);
        }),
      ms,
    );
    answer.then(
      (v) => settle(() => resolve(v)),
      (e) => settle(() => reject(e)),
    );
  });
}

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

/**
 * The database failing in a statement that names no operation (a read of the key, a claim), once
 * the call knows its operation: said of it, since an attempt of it may have reached the provider
 * (callers and agents must not read it as "nothing was done").
 */
function ofOperation(error: unknown, operationId: string | undefined): unknown {
  if (!(error instanceof LedgerUnavailableError) || error.operationId !== undefined || operationId === undefined)
    return error;
  return new LedgerUnavailableError(error.message, operationId, { cause: error.cause ?? error });
}

/**
 * What a receipt whose ids (`effectId`) name more than one effect says, as the reason recorded
 * with it; undefined for one effect, none named, or a receipt the action cannot read.
 */
function severalEffects(action: Pick<Action<unknown, unknown>, "effectId">, receipt: unknown): string | undefined {
  const ids = effectIds(action, receipt);
  if (ids.length < 2) return undefined;
  const named = ids.slice(0, 5).join(", ") + (ids.length > 5 ? `, and ${ids.length - 5} more` : "");
  return `two effects: the receipt names ${ids.length} effects (${named.slice(0, 300)}); a person must check the provider`;
}

/**
 * A fenced attempt's alert of a second effect is written on the row as read and noted: a retry
 * after it committed unseen must not write it twice. On the last look (the row kept changing
 * under us, other late answers noting themselves on it) it is written on the row as it is, its
 * status and attempt: a person may hear of it twice then, never not at all.
 */
function asNoted(noted: { updatedAt: number }, now: Row, lastLook: boolean) {
  return lastLook ? {} : { unchangedSince: { updatedAt: noted.updatedAt, checks: now.checks } };
}

/**
 * Whether the provider's ids (`effectId`) say each effect our receipt describes is one the
 * recorded receipt describes: the same effect told twice (a lookup's finding says less than the
 * request's answer), or one of several a finding named (alerted then). False when the action
 * gives none or either receipt has none (then a difference is alerted).
 */
function namesEach(
  action: Pick<Action<unknown, unknown>, "effectId">,
  recorded: string,
  ours: unknown,
  mine = effectIds(action, ours),
): boolean {
  if (mine.length === 0) return false;
  const known = new Set(effectIds(action, recorded, { stored: true }));
  return mine.every((id) => known.has(id));
}

/**
 * Whether the two effects `several` tells of were said on `row` already: it was recorded or
 * alerted with this very finding (a lookup that took over while ours was out, our own alert whose
 * answer was lost), or its receipt names each of ours, which itself is alerted when recorded. A
 * receipt of one id says nothing of a second effect a lookup's `twice` tells of.
 */
function alertedBefore(
  action: Pick<Action<unknown, unknown>, "effectId">,
  row: Pick<Row, "reason" | "result_json">,
  several: string,
  ours: unknown,
): boolean {
  if (row.reason?.startsWith(several)) return true;
  const mine = effectIds(action, ours);
  return row.result_json !== null && mine.length > 1 && namesEach(action, row.result_json, ours, mine);
}

/**
 * A receipt's distinct effect ids, none when the action gives none or cannot read it. `stored`:
 * the receipt is the row's JSON text (`result_json`), parsed here, where a bad one reads as none.
 */
function effectIds(
  action: Pick<Action<unknown, unknown>, "effectId">,
  receipt: unknown,
  { stored = false } = {},
): string[] {
  if (!action.effectId) return [];
  try {
    const id = action.effectId(stored ? JSON.parse(receipt as string) : receipt);
    const ids = typeof id === "string" ? [id] : Array.isArray(id) ? id : [];
    return [...new Set(ids.filter((i): i is string => typeof i === "string" && i !== ""))];
  } catch {
    return [];
  }
}

/**
 * Two requests that each took effect by their answer, of `attempt` (our held row: `updated_at` is
 * when it started) and of the attempt that recorded `other` (a receipt, or a proof; its
 * `updated_at` is no earlier than that attempt's start): the provider dedupes on our key and the
 * later of them started inside its retention counted from the key's first send, so it was
 * answered with the first one's effect, never made a second. The first send is the earlier that
 * either row counts (an earlier attempt's late end may come after a run from known not done
 * started the count anew), and the later start is over-estimated: a doubt says "two effects", a
 * person looks.
 */
function dedupedOntoFirst(
  action: Pick<Action<unknown, unknown>, "capabilities">,
  attempt: Pick<Row, "first_execution_at" | "created_at" | "updated_at">,
  other: Pick<Row, "first_execution_at" | "created_at" | "updated_at">,
): boolean {
  const dedupe = action.capabilities.dedupe;
  if (dedupe === undefined) return false;
  const first = Math.min(firstSentOf(attempt), firstSentOf(other));
  return Math.max(Number(attempt.updated_at), Number(other.updated_at)) - first < dedupe.retentionMs;
}

/** When the key of the row's operation was first sent, as the row says (policy.ts `keySentAt`). */
function firstSentOf(row: Pick<Row, "first_execution_at" | "created_at">): number {
  // Number(): a pool we did not configure may read the BIGINT as a string.
  return Number(keySentAt({ firstExecutionAt: row.first_execution_at, createdAt: row.created_at }));
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
    createdAt: p.created_at,
    lastExecutionAt: p.last_execution_at,
    firstExecutionAt: p.first_execution_at === null ? null : Number(p.first_execution_at),
    now: p.db_now,
    replayable: error?.replayable,
    rateLimited: error?.kind === "rate_limited",
  };
}

/**
 * An AbortController made when its signal is first read: most actions never read it, and making
 * one costs more (~5 µs) than the rest of a replayed call's bookkeeping.
 */
class LazyAbort {
  private controller: AbortController | undefined;
  private reason: { value: unknown } | undefined;

  get signal(): AbortSignal {
    if (!this.controller) {
      this.controller = new AbortController();
      if (this.reason) this.controller.abort(this.reason.value);
    }
    return this.controller.signal;
  }

  abort(reason: unknown): void {
    if (this.controller) this.controller.abort(reason);
    else this.reason ??= { value: reason };
  }
}

function context(
  row: Row & { db_now: number },
  abort: LazyAbort,
  lastAttemptAt = row.updated_at,
  mayHaveCommitted = true,
): OperationContext {
  return {
    id: row.id,
    tenant: row.tenant_id,
    key: row.key,
    keyLabel: row.key_label,
    attempt: row.attempt,
    createdAt: row.created_at,
    firstSentAt: firstSentOf(row),
    lastAttemptAt,
    mayHaveCommitted,
    now: row.db_now,
    providerReference: row.provider_reference,
    get signal() {
      return abort.signal;
    },
  };
}

/** A classify that throws must not lose the outcome: treat it as ambiguous. */
function safeClassify<A, R>(action: Action<A, R>, error: unknown, ctx: OperationContext): Classification {
  let cls: Classification;
  try {
    cls = action.classify(error, ctx);
  } catch (bug) {
    return { kind: "ambiguous", reason: `classify threw (${describeError(bug)}) on ${describeError(error)}` };
  }
  // A JavaScript classify may return anything (a missing return): what is no classification is
  // not understood, so it may have committed, as when classify throws. Read as one, it threw a
  // TypeError out of the call and left the row running until its lease ran out.
  const c = cls as unknown as { kind?: unknown; reason?: unknown } | null | undefined;
  if (typeof c !== "object" || c === null || !CLASSES.includes(c.kind as Classification["kind"]))
    return {
      kind: "ambiguous",
      reason: `classify answered no classification (${describeValue(cls)}) on ${describeError(error)}`,
    };
  if (typeof c.reason !== "string") return { ...cls, reason: describeError(error) } as Classification;
  return cls;
}

const CLASSES: readonly Classification["kind"][] = ["rejected", "permanent", "rate_limited", "transient", "ambiguous"];

export function checkSize(what: "args" | "result", json: string, limit: number, operationId?: string): void {
  const bytes = Buffer.byteLength(json);
  if (bytes > limit) throw new PayloadTooLargeError(what, bytes, limit, operationId);
}

/** The columns the results below are built from. */
type Settled = Pick<Row, "id" | "attempt" | "status">;

/** A settled row's stored outcome, as every later caller gets it (`ledger.status` too). */
export function replayOf<R>(
  row: Settled & Pick<Row, "result_json" | "error_json" | "resolution_json"> & { completed_at?: number | null },
): RunResult<R> {
  const resolution = resolutionOf(row);
  const by = resolution === undefined ? {} : { resolution };
  if (row.status === "failed") return { ...failed<R>(row, JSON.parse(row.error_json!) as StoredError, true), ...by };
  // A person may have said "it happened" without a receipt: then there is none to replay.
  if (row.result_json === null && resolution)
    return {
      status: "succeeded",
      receipt: null,
      replayed: true,
      operationId: row.id,
      attempt: row.attempt,
      resolution,
    };
  return { ...succeeded(row, JSON.parse(row.result_json!) as R, true), ...by };
}

/** The stored verdict of a person, if one settled the row; its time is the row's completion. */
export function resolutionOf(
  row: Pick<Row, "resolution_json"> & { completed_at?: number | null; updated_at?: number },
): Resolution | undefined {
  if (row.resolution_json === null) return undefined;
  const stored = JSON.parse(row.resolution_json) as Omit<Resolution, "at">;
  return { ...stored, evidence: stored.evidence ?? null, at: row.completed_at ?? row.updated_at ?? 0 };
}

function succeeded<R>(row: Settled, receipt: R, replayed: boolean): RunResult<R> {
  return { status: "succeeded", receipt, replayed, operationId: row.id, attempt: row.attempt };
}
function failed<R>(row: Settled, error: StoredError, replayed: boolean): RunResult<R> {
  return { status: "failed", error, replayed, operationId: row.id, attempt: row.attempt };
}
export function pending<R>(row: Settled, reason: string, performed = false): RunResult<R> {
  // Callers pass unsettled rows only: a settled one is replayed (replayOf), never reported pending.
  return {
    status: "pending_verification",
    state: row.status as Unsettled,
    reason,
    operationId: row.id,
    attempt: row.attempt,
    ...(performed && { performed: true }),
  };
}

/**
 * Parked because its receipt could not be stored (`unstorable`): the effect happened. What every
 * reader goes by: the runner (a caller is told it was performed, a second such receipt is a second
 * effect), a mismatch of args, and a person's decision (admin: no retry, no "failed").
 */
export function knownPerformed(row: Pick<Row, "status" | "error_json">): boolean {
  return rowPerformedProof(row) !== undefined;
}

/** The proof on a row whose effect is known performed (result.ts `performedProof`), or undefined. */
export function rowPerformedProof(row: Pick<Row, "status" | "error_json">): StoredError | undefined {
  // Only a row waiting for a person can hold one: no other's error is parsed.
  if (row.status !== "needs_review" || row.error_json === null) return undefined;
  return performedProof({ status: row.status, error: JSON.parse(row.error_json) as StoredError });
}
