/**
 * The public face of the core: `openLedger(url)` and the `Ledger` it returns. `run` performs an
 * action once per (tenant, key); the rest is what operators, the daemon and the CLI need, every
 * method scoped by tenant.
 */
import { hostname } from "node:os";
import { setTimeout as sleep } from "node:timers/promises";
import type { Dialect, Kysely } from "kysely";
import { parseArgs, type Action } from "./action.js";
import { canonicalJson, sha256 } from "./canonical.js";
import { GuardrailError, InvalidTransitionError, InvalidValueError, LedgerConfigError, OperationNotFoundError, UnknownActionError } from "./errors.js";
import { operationKey, requireName, requireText, type KeyPart, type OperationKey } from "./keys.js";
import type { DialectName } from "./migrations/index.js";
import { connect, migrate, schemaStatus, type ConnectionOptions } from "./open.js";
import { DEFAULT_BUDGET, type RetryBudget } from "./policy.js";
import type { DirectExecutor } from "./query-cache.js";
import type { RunResult, StoredError } from "./result.js";
import { Runner, checkSize, pending, replayOf, type Call, type Escalation, type RunnerSettings } from "./runner.js";
import type { HistoryEvent, IdemDatabase, Status } from "./schema.js";
import { Store, type ListFilter, type Row } from "./store.js";

export interface LedgerOptions extends ConnectionOptions {
  /** Apply pending migrations on open. Default true. */
  readonly migrate?: boolean;
  /** Lease of a running attempt, extended by heartbeats while the action runs. Default 30 s. */
  readonly leaseMs?: number;
  /** How long `run` waits for another worker's live lease to end in a receipt. Default 0 (answer "in progress" at once). */
  readonly waitMs?: number;
  /** Retry budget of one `run` call. */
  readonly budget?: Partial<RetryBudget>;
  /** Largest canonical args JSON accepted, in bytes. Default 256 KiB. */
  readonly maxArgsBytes?: number;
  /** Largest canonical receipt JSON stored, in bytes. Default 64 KiB. */
  readonly maxResultBytes?: number;
  /** How long completed operations are kept before `prune` may delete them; null keeps them. Default 30 days. */
  readonly retentionMs?: number | null;
  /** Actions that `settle` (the daemon, `idem retry`) may run for stored operations. */
  readonly actions?: readonly Action<any, any>[];
  /** Worker identity recorded as lease owner. Default host:pid. */
  readonly owner?: string;
  /**
   * Which action types each tenant may run at all, checked before anything is claimed (a
   * guardrail outside the model). Keys are tenants, `"*"` for the rest; absent: every action.
   */
  readonly allowedActions?: Readonly<Record<string, readonly string[]>>;
  /** Test clock (ms since epoch) replacing the database clock. */
  readonly clock?: () => number;
  /**
   * Called with every `run` result (for metrics: duplicates answered from the ledger are
   * `succeeded`/`failed` with `replayed: true`). Must not throw; it runs on the caller's path.
   */
  readonly onResult?: (result: RunResult<unknown>, info: { action: string; tenant: string }) => void;
}

export interface RunInput<A, I = A> {
  readonly tenant: string;
  /** Business identity parts (["weekly-report", clientId, isoWeek]) or a key from `operationKey`. */
  readonly key: readonly KeyPart[] | OperationKey;
  /** The args, hashed and checked on every call; or a function run for the first attempt only, whose result is stored and sent by every later attempt. */
  readonly args: I | (() => A | Promise<A>);
  /** Who acts (agent, run id, tool version); recorded in the audit events. */
  readonly actor?: string;
  /** Overrides the ledger's `waitMs` for this call. */
  readonly waitMs?: number;
  /** Store the args (needed for the daemon to replay or reconcile without the caller). Default true; lazy args are always stored. */
  readonly storeArgs?: boolean;
  /** Keep the readable key label. Default true; false keeps only the hash. */
  readonly keepKeyLabel?: boolean;
  readonly budget?: Partial<RetryBudget>;
  readonly signal?: AbortSignal;
}

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
  readonly providerReference: string | null;
  readonly result: unknown;
  readonly error: StoredError | null;
  readonly reason: string | null;
  readonly checks: number;
  readonly nextCheckAt: number | null;
  readonly createdAt: number;
  readonly updatedAt: number;
  readonly completedAt: number | null;
  readonly expiresAt: number | null;
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
}

/** Opens (and by default migrates) a ledger: `sqlite:./idem.db`, `postgres://…`, or a kysely Dialect. */
export async function openLedger(target: string | Dialect, options: LedgerOptions = {}): Promise<Ledger> {
  if (options.owner !== undefined) requireName(options.owner, "owner");
  const { db, dialect, direct } = await connect(target, options);
  try {
    // One read of the schema decides both: refuse a newer ledger, and migrate only when behind.
    const { pending, unknown } = await schemaStatus(db);
    if (unknown.length) throw new LedgerConfigError(`this ledger was migrated by a newer idem (${unknown.join(", ")}): upgrade @idem/core to use it`);
    if (options.migrate !== false && pending.length) await migrate(db, dialect);
  } catch (error) {
    await db.destroy();
    throw error;
  }
  return new Ledger(db, dialect, options, direct);
}

export class Ledger {
  readonly store: Store;
  private readonly runner: Runner;
  private readonly settings: RunnerSettings;
  private readonly actions = new Map<string, Action<any, any>>();
  private closed = false;

  constructor(readonly db: Kysely<IdemDatabase>, readonly dialect: DialectName, private readonly options: LedgerOptions, direct?: DirectExecutor) {
    this.store = new Store(db, dialect, options.clock, direct);
    this.runner = new Runner(this.store);
    this.settings = {
      owner: options.owner ?? `${hostname()}:${process.pid}`,
      leaseMs: positive(options.leaseMs ?? 30_000, "leaseMs"),
      waitMs: options.waitMs ?? 0,
      budget: { ...DEFAULT_BUDGET, ...options.budget },
      maxArgsBytes: options.maxArgsBytes ?? 256 * 1024,
      maxResultBytes: options.maxResultBytes ?? 64 * 1024,
      retentionMs: options.retentionMs === undefined ? 30 * 24 * 3600 * 1000 : options.retentionMs,
    };
    for (const a of options.actions ?? []) this.actions.set(a.type, a);
  }

  /**
   * Performs `action` once for (tenant, key). Duplicates get the stored outcome (`replayed: true`);
   * ambiguous outcomes come back as `pending_verification`, never as a guess. Throws only for
   * caller bugs: `ArgsMismatchError`, `InvalidValueError`, `PayloadTooLargeError` (nothing written).
   */
  async run<A, R, I = A>(action: Action<A, R, I>, input: RunInput<A, I>): Promise<RunResult<R>> {
    this.assertOpen();
    requireName(input.tenant, "tenant");
    if (input.actor !== undefined && input.actor !== null) requireName(input.actor, "actor");
    this.checkAllowed(input.tenant, action.type);
    const key = isOperationKey(input.key) ? input.key : operationKey({ tenant: input.tenant, action: action.type, parts: input.key });
    let args: Call<A, R>["args"];
    if (typeof input.args === "function") {
      args = { kind: "lazy", make: input.args as () => A | Promise<A> };
    } else {
      const value = action.input ? await parseArgs(action.input, input.args) : (input.args as unknown as A);
      const json = canonicalJson(value, "args");
      checkSize("args", json, this.settings.maxArgsBytes);
      action.validate?.(value);
      args = { kind: "given", value, json, hash: sha256(json) };
    }
    const result = await this.runner.run({
      // The runner sees args after the schema: the input type has done its work here.
      action: action as unknown as Action<A, R>, tenant: input.tenant, args, actor: input.actor ?? null, signal: input.signal,
      key: { hash: key.hash, label: input.keepKeyLabel === false ? null : key.label },
      storeArgs: input.storeArgs ?? true,
      settings: { ...this.settings, waitMs: input.waitMs ?? this.settings.waitMs, budget: { ...this.settings.budget, ...input.budget } },
    });
    this.options.onResult?.(result, { action: action.type, tenant: input.tenant });
    return result;
  }

  /**
   * Recovers a stored operation without its caller (daemon, `idem retry`): replays, reconciles or
   * parks it by the replay policy, using the args stored with it. Throws `UnknownActionError` when
   * its action type was not registered in `options.actions` (the row is untouched). `escalate`: an
   * unknown outcome checked `maxChecks` times, or older than `maxAgeMs` by the database clock,
   * goes to a person instead of being checked again.
   */
  async settle(tenant: string, operationId: string, actor: string | null = null, options: { escalate?: Escalation } = {}): Promise<RunResult<unknown>> {
    this.assertOpen();
    if (actor !== null) requireName(actor, "actor");
    const row = await this.find(tenant, operationId);
    const action = this.actions.get(row.action);
    if (!action) throw new UnknownActionError(row.action, row.id);
    const call: Call<unknown, unknown> = {
      action, tenant, actor, key: { hash: row.key, label: row.key_label }, storeArgs: true,
      args: row.args_json !== null && row.args_hash !== null
        ? { kind: "given", value: JSON.parse(row.args_json), json: row.args_json, hash: row.args_hash }
        : { kind: "stored" },
      settings: this.settings,
    };
    return this.runner.settle(call, row, options.escalate);
  }

  /**
   * What `run` would answer a later caller about this operation, without running anything:
   * `succeeded`/`failed` (replayed) once settled, else `pending_verification` with its state.
   * `OperationNotFoundError` for an id of another tenant.
   */
  async status(tenant: string, operationId: string): Promise<RunResult<unknown>> {
    this.assertOpen();
    return outcomeOf(await this.find(tenant, operationId));
  }

  /**
   * Resolves once the operation is settled (`succeeded` or `failed`), or with its current state
   * (`pending_verification`) when `timeoutMs` (default 30 s) passes or `signal` aborts. It polls,
   * from 50 ms up to every second; what settles it is the worker, the daemon or a person.
   */
  async wait(tenant: string, operationId: string, options: { timeoutMs?: number; signal?: AbortSignal } = {}): Promise<RunResult<unknown>> {
    const deadline = performance.now() + (options.timeoutMs ?? 30_000);
    for (let delay = 50; ; delay = Math.min(delay * 1.5, 1_000)) {
      const out = await this.status(tenant, operationId);
      const left = deadline - performance.now();
      if (out.status !== "pending_verification" || left <= 0 || options.signal?.aborted) return out;
      await sleep(Math.min(delay, left), undefined, options.signal ? { signal: options.signal } : {}).catch(() => {});
    }
  }

  /** One operation with its audit events and stored args, or `OperationNotFoundError` (also for another tenant's id). */
  async get(tenant: string, operationId: string): Promise<{ operation: Operation; events: OperationEvent[]; args: unknown }> {
    this.assertOpen();
    const row = await this.find(tenant, operationId);
    const events = await this.store.events(tenant, operationId);
    // The stored args (null when the caller kept them out, or lazy args were never generated).
    return { operation: toOperation(row), events: events.map(toEvent), args: row.args_json === null ? null : JSON.parse(row.args_json) };
  }

  /** This tenant's operations, newest first, filtered by status, action and age. */
  async list(filter: ListFilter): Promise<Operation[]> {
    this.assertOpen();
    requireName(filter.tenant, "tenant");
    if (filter.limit !== undefined && !(Number.isInteger(filter.limit) && filter.limit > 0)) throw new InvalidValueError("limit", "must be a positive whole number");
    if (filter.olderThanMs !== undefined && !(Number.isInteger(filter.olderThanMs) && filter.olderThanMs >= 0)) throw new InvalidValueError("olderThanMs", "must be a whole number of ms ≥ 0");
    return (await this.store.list(filter)).map(toOperation);
  }

  /**
   * A person's verdict on a `needs_review` operation: it happened (`succeeded`, with the
   * reference they found) or it did not and must not be retried (`failed`).
   */
  async resolve(tenant: string, operationId: string, verdict: { outcome: "succeeded" | "failed"; reason: string; actor: string; reference?: string; receipt?: unknown }): Promise<Operation> {
    this.assertOpen();
    requireVerdict(verdict);
    if (verdict.reference !== undefined) requireText(verdict.reference, "reference", 1_000);
    const row = await this.find(tenant, operationId);
    if (row.status !== "needs_review") throw new InvalidTransitionError(row.id, row.status, verdict.outcome);
    const reason = `resolved by a person: ${verdict.reason}`;
    const receipt = verdict.outcome === "succeeded" ? (verdict.receipt ?? { resolvedBy: verdict.actor, reference: verdict.reference ?? null }) : undefined;
    const done = await this.store.transition(row, verdict.outcome, {
      actor: verdict.actor, reason, completed: true, retentionMs: this.settings.retentionMs, alert: false,
      ...(verdict.reference !== undefined && { provider_reference: verdict.reference }),
      ...(receipt !== undefined
        ? { result_json: canonicalJson(receipt, "receipt") }
        : { error_json: JSON.stringify({ kind: "permanent", reason } satisfies StoredError) }),
    });
    if (!done) throw new InvalidTransitionError(row.id, "changed concurrently", verdict.outcome);
    return toOperation(done);
  }

  /**
   * Marks an operation as known not done so the next call or the daemon runs it again with the
   * same key: for `needs_review` after a person checked the provider, or `failed` after the cause
   * was fixed.
   */
  async retry(tenant: string, operationId: string, verdict: { reason: string; actor: string }): Promise<Operation> {
    this.assertOpen();
    requireVerdict(verdict);
    const row = await this.find(tenant, operationId);
    if (!["needs_review", "failed", "unknown"].includes(row.status)) throw new InvalidTransitionError(row.id, row.status, "pending");
    // A person's word that it was not done: the checks of the earlier outcome start over.
    const back = await this.store.transition(row, "pending", { actor: verdict.actor, reason: `retry asked: ${verdict.reason}`, checkAfterMs: 0, checks: 0, result_json: null, alert: false });
    if (!back) throw new InvalidTransitionError(row.id, "changed concurrently", "pending");
    return toOperation(back);
  }

  /**
   * Sends an unknown operation to a person (the daemon, after too many inconclusive lookups or
   * too long): `needs_review`, with an alert.
   */
  async escalate(tenant: string, operationId: string, verdict: { reason: string; actor: string }): Promise<Operation> {
    this.assertOpen();
    requireVerdict(verdict);
    const row = await this.find(tenant, operationId);
    if (row.status !== "unknown") throw new InvalidTransitionError(row.id, row.status, "needs_review");
    const parked = await this.store.transition(row, "needs_review", { actor: verdict.actor, reason: verdict.reason, alert: true });
    if (!parked) throw new InvalidTransitionError(row.id, "changed concurrently", "needs_review");
    return toOperation(parked);
  }

  /** Deletes this tenant's completed operations past their retention; returns how many. */
  async prune(tenant: string, options: { limit?: number } = {}): Promise<number> {
    this.assertOpen();
    requireName(tenant, "tenant");
    return this.store.prune(tenant, options.limit ?? 10_000);
  }

  // ---- Operator scope: across tenants, for the daemon and `idem stats`. Not for agents. ----

  /**
   * Claims up to `limit` operations the daemon must settle (running with an expired lease,
   * unknown or pending and due), hiding each from other daemons for `claimMs`. On Postgres the
   * scan skips rows another daemon is claiming (FOR UPDATE SKIP LOCKED); settling is fenced by
   * attempt anyway, so a row is never settled twice.
   */
  async claimDue(limit: number, claimMs: number): Promise<{ id: string; tenant: string; status: Status; action: string }[]> {
    this.assertOpen();
    return (await this.store.claimDue(limit, claimMs)).map((r) => ({ id: r.id, tenant: r.tenant_id, status: r.status, action: r.action }));
  }

  /** Operations whose last transition a person must hear about (needs_review, auth/policy failures). */
  async alertsDue(limit: number): Promise<Operation[]> {
    this.assertOpen();
    return (await this.store.alertsDue(limit)).map(toOperation);
  }

  /** Marks the alert for this transition as delivered (a newer transition keeps its own). */
  async ackAlert(op: Pick<Operation, "id" | "tenant" | "updatedAt">): Promise<void> {
    this.assertOpen();
    await this.store.ackAlert(op.tenant, op.id, op.updatedAt);
  }

  /**
   * Operations running (under a live or dead lease) for longer than `olderThanMs` in their current
   * attempt, with how long (`runningForMs`, by the database clock).
   */
  async stuck(olderThanMs: number, limit = 1_000): Promise<(Operation & { runningForMs: number })[]> {
    this.assertOpen();
    return (await this.store.stuck(olderThanMs, limit)).map((r) => ({ ...toOperation(r), runningForMs: r.age_ms }));
  }

  /** Counts by status, action and tenant (a GROUP BY over the ledger: cache it). */
  async stats(tenant?: string): Promise<{ tenant: string; action: string; status: Status; count: number }[]> {
    this.assertOpen();
    if (tenant !== undefined) requireName(tenant, "tenant");
    return this.store.stats(tenant);
  }

  /** The migrations this ledger still needs (opened with `migrate: false`); empty when it is current. */
  async pendingMigrations(): Promise<string[]> {
    this.assertOpen();
    return (await schemaStatus(this.db)).pending;
  }

  /** Applies pending migrations (`migrate: false` at open leaves them to this). */
  async migrate(): Promise<string[]> {
    this.assertOpen();
    return migrate(this.db, this.dialect);
  }

  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    await this.db.destroy();
  }

  private checkAllowed(tenant: string, type: string): void {
    const allowed = this.options.allowedActions;
    if (!allowed) return;
    const list = allowed[tenant] ?? allowed["*"];
    if (!list?.includes(type)) throw new GuardrailError(tenant, type, "the action type is not allowed for this tenant");
  }

  /** The tenant's operation, or `OperationNotFoundError`; names are checked first so a malformed one cannot match another's. */
  private async find(tenant: string, operationId: string): Promise<NonNullable<Awaited<ReturnType<Store["findById"]>>>> {
    requireName(tenant, "tenant");
    requireName(operationId, "operation id");
    const row = await this.store.findById(tenant, operationId);
    if (!row) throw new OperationNotFoundError(tenant, operationId);
    return row;
  }

  private assertOpen(): void {
    if (this.closed) throw new LedgerConfigError("the ledger is closed");
  }
}

function isOperationKey(key: unknown): key is OperationKey {
  return !Array.isArray(key) && typeof key === "object" && key !== null && typeof (key as OperationKey).hash === "string";
}

/** A person's or the daemon's decision: who (a name) and why (text stored in the audit trail). */
function requireVerdict(verdict: { reason: string; actor: string }): void {
  requireName(verdict.actor, "actor");
  if (typeof verdict.reason !== "string" || !verdict.reason.trim()) throw new InvalidValueError("reason", "a decision needs a reason");
  requireText(verdict.reason, "reason", 2_000);
}

function positive(n: number, what: string): number {
  if (!(n > 0)) throw new LedgerConfigError(`${what} must be positive`);
  return n;
}

const WAITING_FOR: Record<Exclude<Status, "succeeded" | "failed">, string> = {
  running: "a worker is performing it now",
  unknown: "the outcome is unknown and is being checked with the provider",
  needs_review: "a person must decide whether it happened",
  pending: "it is known not done and will be run again with the same key",
};

function outcomeOf(r: Row): RunResult<unknown> {
  if (r.status === "succeeded" || r.status === "failed") return replayOf(r);
  // A running row's reason is how its attempt began ("claimed"); the others' say why they wait.
  const why = r.status === "running" || !r.reason ? "" : ` (${r.reason})`;
  return pending(r, WAITING_FOR[r.status] + why);
}

function toOperation(r: Row): Operation {
  return {
    id: r.id, tenant: r.tenant_id, key: r.key, keyLabel: r.key_label, action: r.action, argsHash: r.args_hash,
    status: r.status, attempt: r.attempt, leaseOwner: r.lease_owner, leaseExpiresAt: r.lease_expires_at,
    providerReference: r.provider_reference, result: r.result_json === null ? null : JSON.parse(r.result_json),
    error: r.error_json === null ? null : (JSON.parse(r.error_json) as StoredError), reason: r.reason,
    checks: r.checks, nextCheckAt: r.next_check_at, createdAt: r.created_at, updatedAt: r.updated_at,
    completedAt: r.completed_at, expiresAt: r.expires_at,
  };
}

function toEvent(e: HistoryEvent & { seq: number }): OperationEvent {
  return { id: e.seq, from: e.from, to: e.to, attempt: e.attempt, actor: e.actor, reason: e.reason, providerReference: e.ref, at: e.at };
}
