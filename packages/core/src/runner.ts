/**
 * `run`: the state machine of DESIGN.md for one call. Claim (one winner), replay what is
 * settled, wait on a live lease, recover an expired lease or an unknown outcome by the replay
 * policy, execute under a heartbeat-extended lease, classify failures and retry within the
 * budget. Every write is a fenced single statement in store.ts.
 */
import { randomUUID } from "node:crypto";
import { setTimeout as sleep } from "node:timers/promises";
import { describeError, type Action, type Classification, type OperationContext } from "./action.js";
import { canonicalJson, sha256 } from "./canonical.js";
import { ArgsMismatchError, PayloadTooLargeError } from "./errors.js";
import { nextDelay, recoveryFor, statusAfter, type RetryBudget } from "./policy.js";
import type { RunResult, StoredError } from "./result.js";
import type { Peek, Row, Store } from "./store.js";

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
}

type Step<R> = { done: RunResult<R> } | { again: number };

export class Runner {
  constructor(private readonly store: Store) {}

  async run<A, R>(call: Call<A, R>): Promise<RunResult<R>> {
    const started = Date.now();
    const state = { executed: 0, waited: 0, started };
    const owner = `${call.settings.owner}/${randomUUID().slice(0, 8)}`;
    for (;;) {
      call.signal?.throwIfAborted();
      const step = await this.step(call, owner, state);
      if ("done" in step) return step.done;
      if (step.again > 0) await sleep(step.again, undefined, call.signal ? { signal: call.signal } : undefined);
    }
  }

  /** Recovers a stored operation without a caller (the daemon, `idem retry`): args come from the ledger. */
  async settle<A, R>(call: Call<A, R>, row: Row & { db_now: number }): Promise<RunResult<R>> {
    const owner = `${call.settings.owner}/${randomUUID().slice(0, 8)}`;
    const state = { executed: 0, waited: 0, started: Date.now() };
    const step = await this.fromExisting(call, owner, state, row, true);
    if ("done" in step) return step.done;
    return this.run(call);
  }

  private async step<A, R>(call: Call<A, R>, owner: string, state: CallState): Promise<Step<R>> {
    const s = call.settings;
    const given = call.args.kind === "given" ? call.args : undefined;
    const claim = await this.store.claim({
      tenant: call.tenant, key: call.key.hash, keyLabel: call.key.label, action: call.action.type,
      argsHash: given?.hash ?? null, argsJson: given && call.storeArgs ? given.json : null,
      owner, leaseMs: s.leaseMs, actor: call.actor,
    });
    if (!claim) return { again: 0 }; // pruned between our insert and read: claim again
    return claim.fresh ? this.perform(call, claim.row, state) : this.fromExisting(call, owner, state, claim.row, false);
  }

  private async fromExisting<A, R>(call: Call<A, R>, owner: string, state: CallState, row: Peek, settling: boolean): Promise<Step<R>> {
    const s = call.settings;
    if (call.args.kind === "given" && row.args_hash !== null && row.args_hash !== call.args.hash) {
      const action = (await this.store.findById(call.tenant, row.id))?.action ?? call.action.type;
      throw new ArgsMismatchError(row.id, row.args_hash, call.args.hash, action);
    }
    switch (row.status) {
      case "succeeded":
        return { done: succeeded(row, JSON.parse(row.result_json!) as R, true) };
      case "failed":
        return { done: failed(row, JSON.parse(row.error_json!) as StoredError, true) };
      case "needs_review": {
        const reason = (await this.store.findById(call.tenant, row.id))?.reason;
        return { done: pending(row, reason ?? "a person must decide whether the effect happened") };
      }
      case "running": {
        const leaseLeft = (row.lease_expires_at ?? 0) - row.db_now;
        if (leaseLeft > 0) {
          // A live lease: the winner may be performing the effect right now.
          const remaining = (settling ? 0 : s.waitMs) - state.waited;
          if (remaining <= 0) return { done: pending(row, `in progress: attempt ${row.attempt} holds the lease for ${leaseLeft} ms more`) };
          // Poll gently: often at first (the winner is usually quick), less as the wait grows.
          const wait = Math.min(remaining, leaseLeft + 5, 20 + Math.floor(state.waited / 4));
          state.waited += wait;
          return { again: wait };
        }
        return this.recover(call, owner, state, row, `attempt ${row.attempt}'s lease expired`);
      }
      case "unknown":
        return this.recover(call, owner, state, row, "outcome unknown");
      case "pending": {
        const wait = nextDelay(s.budget, state.executed, Date.now() - state.started, 0);
        if (wait === null) return { done: pending(row, "known not done; retry budget spent, the daemon or a later call retries") };
        const full = await this.store.findById(call.tenant, row.id);
        const mine = full && (await this.store.takeOver(full, { owner, leaseMs: s.leaseMs, actor: call.actor, reason: "retry of work known not done", execute: true }));
        return mine ? this.perform(call, mine, state) : { again: 0 };
      }
    }
  }

  /** The replay policy for an expired lease or an unknown outcome. */
  private async recover<A, R>(call: Call<A, R>, owner: string, state: CallState, peeked: Peek, why: string): Promise<Step<R>> {
    const s = call.settings;
    const row = await this.store.findById(call.tenant, peeked.id);
    if (!row) return { again: 0 };
    const last = row.error_json === null ? undefined : (JSON.parse(row.error_json) as StoredError);
    const policy = recoveryFor(call.action.capabilities, row.created_at, row.db_now, last);
    if (policy.kind === "replay" && nextDelay(s.budget, state.executed, Date.now() - state.started, 0) === null) {
      return { done: pending(row, `${why}; retry budget spent before the replay`) };
    }
    const mine = await this.store.takeOver(row, { owner, leaseMs: s.leaseMs, actor: call.actor, reason: `${why}: ${policy.reason}`, execute: policy.kind === "replay" });
    if (!mine) return { again: 0 }; // another worker recovered it first; look again
    if (policy.kind === "review") return this.toReview(call, mine, `${why}: ${policy.reason}`);
    if (policy.kind === "replay") return this.perform(call, mine, state);

    const args = this.argsFor(call, mine);
    if (args === undefined) return this.toReview(call, mine, `${why}: the args are not stored, so the effect cannot be looked up`);
    let found;
    try {
      // No effect is younger than the last execution, or than a dead worker's lease (it may have
      // been executing until then); later inconclusive checks do not restart the window.
      const lastAttemptAt = Math.max(row.last_execution_at ?? row.created_at, row.status === "running" ? (row.lease_expires_at ?? 0) : 0);
      found = await this.withLease(call, mine, (ctx) => call.action.reconcile!(args, ctx), lastAttemptAt);
    } catch (error) {
      found = { found: false as const, proof: "inconclusive" as const, reason: `lookup failed: ${describeError(error)}` };
    }
    if (found.found) return this.complete(call, mine, found.receipt, "reconciled: the effect was found");
    if (found.proof === "absent") {
      const back = await this.store.move(mine, "pending", { actor: call.actor, reason: `reconciled: ${found.reason}`, checkAfterMs: 0 });
      return back ? { again: 0 } : this.fenced(call, mine, "pending", found.reason);
    }
    if (found.proof === "never") return this.toReview(call, mine, found.reason);
    const checkAfterMs = found.retryAfterMs ?? Math.min(s.budget.baseDelayMs * 2 ** Math.min(mine.checks, 20), 3_600_000);
    const still = await this.store.move(mine, "unknown", { actor: call.actor, reason: `inconclusive: ${found.reason}`, checkAfterMs, checks: mine.checks + 1 });
    return still ? { done: pending(still, `outcome unknown, verification continues: ${found.reason}`) } : this.fenced(call, mine, "unknown", found.reason);
  }

  /** Executes the effect under our lease and records what happened. */
  private async perform<A, R>(call: Call<A, R>, row: Row, state: CallState): Promise<Step<R>> {
    let args: A | undefined = this.argsFor(call, row);
    if (args === undefined) {
      // Lazy args never stored means no attempt got as far as executing: generate them now, once.
      if (call.args.kind !== "lazy") return this.toReview(call, row, "the args were not stored and this caller gave none");
      const made = await this.generate(call, row);
      if (!("args" in made)) return made;
      args = made.args;
    }
    let current = row;
    if (call.action.providerReference && row.provider_reference === null) {
      const ref = call.action.providerReference(args, context(row, new LazyAbort()));
      if (!(await this.store.patchRunning(row, { provider_reference: ref }))) return this.fenced(call, row, "running", "reference");
      current = { ...row, provider_reference: ref };
    }
    state.executed += 1;
    let outcome: { ok: true; receipt: R } | { ok: false; cls: Classification };
    try {
      outcome = { ok: true, receipt: await this.withLease(call, current, (ctx) => call.action.execute(args as A, ctx)) };
    } catch (error) {
      outcome = { ok: false, cls: safeClassify(call.action, error, context(current, new LazyAbort())) };
    }
    if (outcome.ok) return this.complete(call, current, outcome.receipt, "the effect happened");

    const cls = outcome.cls;
    const to = statusAfter(cls);
    const error: StoredError = {
      kind: cls.kind, reason: cls.reason,
      ...(cls.kind === "permanent" && cls.alert && { alert: true }),
      ...("providerRequestId" in cls && cls.providerRequestId && { providerRequestId: cls.providerRequestId }),
      ...(cls.kind === "ambiguous" && cls.replayable === false && { replayable: false }),
    };
    if (to === "failed") {
      const done = await this.store.move(current, "failed", {
        actor: call.actor, reason: cls.reason, error_json: JSON.stringify(error), completed: true, retentionMs: call.settings.retentionMs,
        ...(error.alert && { alert: true }),
      });
      return done ? { done: failed(done, error, false) } : this.fenced(call, current, "failed", cls.reason);
    }
    const wait = to === "pending"
      ? nextDelay(call.settings.budget, state.executed, Date.now() - state.started, "retryAfterMs" in cls ? cls.retryAfterMs : undefined)
      : 0;
    const moved = await this.store.move(current, to, {
      actor: call.actor, reason: `${cls.kind}: ${cls.reason}`, error_json: JSON.stringify(error),
      checkAfterMs: wait ?? call.settings.budget.maxDelayMs,
      ...(to === "unknown" && { executionEnded: true }),
    });
    if (!moved) return this.fenced(call, current, to, cls.reason);
    if (to === "pending" && wait === null) return { done: pending(moved, `${cls.kind}: ${cls.reason}; retry budget spent`) };
    // pending: wait as told, then run again with the same key; unknown: recover right away.
    return { again: wait ?? 0 };
  }

  /**
   * Generates lazy args, checks them like given ones and stores them before anything is sent, so
   * every later attempt sends exactly this content. A generator or validation error is a
   * rejection: the operation fails with no effect.
   */
  private async generate<A, R>(call: Call<A, R>, row: Row): Promise<{ args: A } | Step<R>> {
    let made: A;
    let json: string;
    try {
      made = await (call.args as { make: () => A | Promise<A> }).make();
      json = canonicalJson(made, "args");
      checkSize("args", json, call.settings.maxArgsBytes, row.id);
      call.action.validate?.(made);
    } catch (error) {
      const err: StoredError = { kind: "rejected", reason: describeError(error) };
      const done = await this.store.move(row, "failed", {
        actor: call.actor, reason: `rejected before send: ${err.reason}`, error_json: JSON.stringify(err), completed: true, retentionMs: call.settings.retentionMs,
      });
      if (!done) return this.fenced(call, row, "failed", err.reason);
      return { done: failed(done, err, false) };
    }
    if (!(await this.store.patchRunning(row, { args_hash: sha256(json), args_json: json }))) return this.fenced(call, row, "running", "args");
    return { args: made };
  }

  private async complete<A, R>(call: Call<A, R>, row: Row, receipt: R, reason: string): Promise<Step<R>> {
    let json: string;
    try {
      json = canonicalJson(receipt, "result");
      checkSize("result", json, call.settings.maxResultBytes, row.id);
    } catch (error) {
      // The effect happened but its receipt cannot be kept: park it for a person, then tell the caller.
      await this.store.move(row, "needs_review", {
        actor: call.actor, reason: `the effect happened but its receipt cannot be stored: ${describeError(error)}`, alert: true,
        error_json: JSON.stringify({ kind: "invalid_result", reason: describeError(error) } satisfies StoredError),
      });
      throw error;
    }
    const done = await this.store.move(row, "succeeded", {
      actor: call.actor, reason, result_json: json, error_json: null, completed: true, retentionMs: call.settings.retentionMs,
    });
    return done ? { done: succeeded(done, JSON.parse(json) as R, false) } : this.fenced(call, row, "succeeded", json);
  }

  private async toReview<A, R>(call: Call<A, R>, row: Row, reason: string): Promise<Step<R>> {
    const parked = await this.store.move(row, "needs_review", { actor: call.actor, reason, alert: true });
    return parked ? { done: pending(parked, reason) } : this.fenced(call, row, "needs_review", reason);
  }

  /**
   * Our attempt lost its lease (a newer attempt or a person changed the row): the write is
   * refused, and the refusal is recorded with what we tried to write, as evidence.
   */
  private async fenced<A, R>(call: Call<A, R>, mine: Row, wanted: string, detail: string): Promise<Step<R>> {
    const now = await this.store.findById(call.tenant, mine.id);
    if (!now) return { again: 0 };
    await this.store.recordEvent(now, {
      attempt: mine.attempt, actor: call.actor, to: now.status,
      reason: `fenced: attempt ${mine.attempt} tried to write ${wanted} (${detail.slice(0, 300)}); the operation is at attempt ${now.attempt}, ${now.status}`,
    });
    if (now.status === "succeeded") return { done: succeeded(now, JSON.parse(now.result_json!) as R, true) };
    if (now.status === "failed") return { done: failed(now, JSON.parse(now.error_json!) as StoredError, true) };
    return { done: pending(now, `lease lost to attempt ${now.attempt}; the operation is ${now.status}`) };
  }

  /** Runs `fn` while a heartbeat keeps our lease; the signal aborts if the lease is lost. */
  private async withLease<A, R, T>(call: Call<A, R>, row: Row, fn: (ctx: OperationContext) => Promise<T>, lastAttemptAt?: number): Promise<T> {
    const controller = new LazyAbort();
    const onAbort = () => controller.abort(call.signal?.reason);
    call.signal?.addEventListener("abort", onAbort, { once: true });
    const every = Math.max(10, Math.floor(call.settings.leaseMs / 3));
    const timer = setInterval(() => {
      this.store.heartbeat(row, call.settings.leaseMs).then(
        (kept) => { if (!kept) controller.abort(new Error(`lease of attempt ${row.attempt} lost`)); },
        () => {}, // the database is briefly unreachable: the lease may still hold; the next beat retries
      );
    }, every);
    try {
      return await fn(context(row, controller, lastAttemptAt));
    } finally {
      clearInterval(timer);
      call.signal?.removeEventListener("abort", onAbort);
    }
  }

  /** The args for this attempt: the caller's, or the ones stored by an earlier attempt. */
  private argsFor<A, R>(call: Call<A, R>, row: Row): A | undefined {
    if (row.args_json !== null) return JSON.parse(row.args_json) as A;
    if (call.args.kind === "given") return call.args.value;
    return undefined;
  }
}

interface CallState { executed: number; waited: number; started: number }

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

function context(row: Row, abort: LazyAbort, lastAttemptAt = row.updated_at): OperationContext {
  return {
    id: row.id, tenant: row.tenant_id, key: row.key, keyLabel: row.key_label, attempt: row.attempt,
    createdAt: row.created_at, lastAttemptAt, providerReference: row.provider_reference,
    get signal() { return abort.signal; },
  };
}

/** A classify that throws must not lose the outcome: treat it as ambiguous. */
function safeClassify<A, R>(action: Action<A, R>, error: unknown, ctx: OperationContext): Classification {
  try {
    return action.classify(error, ctx);
  } catch (bug) {
    return { kind: "ambiguous", reason: `classify threw (${describeError(bug)}) on ${describeError(error)}` };
  }
}

export function checkSize(what: "args" | "result", json: string, limit: number, operationId?: string): void {
  const bytes = Buffer.byteLength(json);
  if (bytes > limit) throw new PayloadTooLargeError(what, bytes, limit, operationId);
}

/** The columns the results below are built from. */
type Settled = Pick<Row, "id" | "attempt" | "status">;

function succeeded<R>(row: Settled, receipt: R, replayed: boolean): RunResult<R> {
  return { status: "succeeded", receipt, replayed, operationId: row.id, attempt: row.attempt };
}
function failed<R>(row: Settled, error: StoredError, replayed: boolean): RunResult<R> {
  return { status: "failed", error, replayed, operationId: row.id, attempt: row.attempt };
}
function pending<R>(row: Settled, reason: string): RunResult<R> {
  return { status: "pending_verification", state: row.status, reason, operationId: row.id, attempt: row.attempt };
}
