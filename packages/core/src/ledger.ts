/**
 * The public face of the core: `openLedger(url)` and the `Ledger` it returns. `run` performs an
 * action once per (tenant, key); `status`, `wait` and `get` read what became of it. What
 * operators need is on `ledger.admin` and what the daemon needs on `ledger.daemon`, kept apart
 * as graphile-worker keeps its admin work in `WorkerUtils`. Every method is scoped by tenant
 * and takes one options object.
 */
import { hostname } from "node:os";
import { setTimeout as sleep } from "node:timers/promises";
import type { Dialect } from "kysely";
import { parseArgsNow, requireCapabilities, type Action } from "./action.js";
import { LedgerAdmin } from "./admin.js";
import { canonicalJson, RecentHashes, sha256 } from "./canonical.js";
import {
  LedgerContext,
  type Closed,
  toEvent,
  toOperation,
  type Operation,
  type OperationEvent,
  type OperationRef,
} from "./context.js";
import { LedgerDaemon } from "./daemon.js";
import { GuardrailError, IdemError, InvalidValueError, LedgerConfigError, NewerLedgerError } from "./errors.js";
import { deriveKey, requireName, type KeyPart, type OperationKey } from "./keys.js";
import { connect, migrate, schemaStatus, type ConnectionOptions } from "./open.js";
import { NAME as MOVES_WRITE_EVENTS } from "./migrations/0010-transitions-write-their-event.js";
import { NAME as LOOK_FIRST } from "./migrations/0012-look-first-after-retry.js";
import { NAME as RERUNS } from "./migrations/0013-rerun-attempt.js";
import { DEFAULT_BUDGET, budgetProblem, type RetryBudget } from "./policy.js";
import type { RunResult } from "./result.js";
import type { Call, RunnerSettings } from "./call.js";
import { checkSize, knownPerformed, pending, replayOf } from "./row-results.js";
import type { Status } from "./schema.js";
import { Store, type Row } from "./store.js";
import { resultAttributes, tracing } from "./tracing.js";

export interface LedgerOptions extends ConnectionOptions {
  /** Apply pending migrations on open. Default true. */
  readonly migrate?: boolean;
  /**
   * Lease of a running attempt, extended by heartbeats while the action runs. Default 30 s; at
   * most 2147483647 ms (about 24.8 days, the longest a timer waits: the attempt's deadline is one).
   */
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
  /**
   * Actions that `settle` (the daemon, `idem retry`) may run for stored operations, each under its
   * own type: two different actions of one type are refused (`LedgerConfigError`).
   */
  readonly actions?: readonly Action<any, any>[];
  /** Worker identity recorded as lease owner. Default host:pid. */
  readonly owner?: string;
  /**
   * Which action types each tenant may run at all, checked before anything is claimed (a
   * guardrail outside the model). Keys are tenants, `"*"` for the rest; absent: every action.
   */
  readonly allowedActions?: Readonly<Record<string, readonly string[]>>;
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
  /** Overrides the ledger's retry budget for this call. */
  readonly budget?: Partial<RetryBudget>;
  /**
   * Gives up on the call: a wait for another worker or a pause between retries ends with the
   * signal's reason, and a running action sees `op.signal` aborted (pass it to the provider's
   * client): its answer then is recorded as its `classify` says. An action that has not answered
   * a second after the abort is no longer awaited: the operation is unknown (its request may have
   * been sent), the call rejects with the signal's reason, and the action's answer, if one comes,
   * is recorded then (a receipt settles the operation). `op.signal` is also aborted when the
   * attempt's lease could not be renewed in time (`LeaseDeadlineError`; a `LedgerUnavailableError`
   * marked `closed` when the ledger closed meanwhile). An effect that may have started is settled
   * by the replay policy.
   */
  readonly signal?: AbortSignal;
  /**
   * Stops the call as `close()` stops every call (a process shutting down): once it aborts,
   * nothing more is sent, a wait or a pause between retries ends at once with the operation's
   * state (pending, unknown), and the effect under way is recorded. Unlike `signal`, it never
   * aborts a request in flight, nor rejects.
   */
  readonly stop?: AbortSignal;
}

/** Opens (and by default migrates) a ledger: `sqlite:./idem.db`, `postgres://…`, or a kysely Dialect. */
export async function openLedger(target: string | Dialect, options: LedgerOptions = {}): Promise<Ledger> {
  return open(target, options);
}

/**
 * The daemon settles a stored operation with the action registered under its type: a second one
 * of that type was kept in the first's place, silently, and settled the first's operations with
 * its own provider config (another mailbox searched, the copy read as absent, the email sent
 * again). The same action given twice is one.
 */
function oneActionPerType(actions: readonly Action<any, any>[]): void {
  const byType = new Map<string, Action<any, any>>();
  for (const a of actions) {
    const other = byType.get(a.type);
    if (other !== undefined && other !== a)
      throw new LedgerConfigError(
        `actions: two different actions have the type ${JSON.stringify(a.type)}; the daemon settles an operation with the one registered under its type, so give each its own (emailActions' \`type\`, say)`,
      );
    byType.set(a.type, a);
  }
}

/**
 * `openLedger` with a clock replacing the database's (ms since epoch): for tests only, through
 * `@idem/core/testing`, which published builds do not contain.
 */
export async function open(target: string | Dialect, options: LedgerOptions, clock?: () => number): Promise<Ledger> {
  if (options.owner !== undefined) requireName(options.owner, "owner");
  // A hand-made action was never defined: its capabilities are checked as defineAction checks them.
  for (const a of options.actions ?? []) requireCapabilities(a);
  oneActionPerType(options.actions ?? []);
  const badBudget = budgetProblem(options.budget ?? {});
  if (badBudget) throw new LedgerConfigError(`${badBudget.path} ${badBudget.reason}`);
  const settings: RunnerSettings = {
    owner: options.owner ?? `${hostname()}:${process.pid}`,
    leaseMs: timerMs(options.leaseMs ?? 30_000, "leaseMs"),
    waitMs: whole(options.waitMs ?? 0, "waitMs", 0, 2 ** 31 - 1),
    budget: { ...DEFAULT_BUDGET, ...options.budget },
    maxArgsBytes: whole(options.maxArgsBytes ?? 256 * 1024, "maxArgsBytes", 1, MAX_JSON_BYTES),
    maxResultBytes: whole(options.maxResultBytes ?? 64 * 1024, "maxResultBytes", 1, MAX_JSON_BYTES),
    retentionMs:
      options.retentionMs === undefined
        ? 30 * 24 * 3600 * 1000
        : options.retentionMs === null
          ? null
          : whole(options.retentionMs, "retentionMs", 0, Number.MAX_SAFE_INTEGER),
  };
  const { db, dialect, direct, groupsCommits, removeMade } = await connect(target, options);
  const store = new Store(db, dialect, clock, direct, groupsCommits);
  try {
    // One read of the schema decides both: refuse a newer ledger, and migrate only when behind.
    const { pending, unknown } = await schemaStatus(db, dialect);
    if (unknown.length) throw new NewerLedgerError(unknown);
    if (options.migrate !== false && pending.length) await migrate(db, dialect);
    else {
      // Until admin.migrate(): statements of the schema this ledger has.
      if (pending.includes(MOVES_WRITE_EVENTS)) store.movesWriteEvents = false;
      if (pending.includes(LOOK_FIRST)) store.looksFirst = false;
      if (pending.includes(RERUNS)) store.marksReruns = false;
    }
  } catch (error) {
    await db.destroy();
    // A SQLite file this open made holds no ledger (its migrations commit as one, or not at all):
    // left there, an open with `create: false` would take it for one that needs migrations.
    removeMade?.();
    throw error;
  }
  const context = new LedgerContext(db, dialect, store, settings, options.actions ?? [], await tracing());
  const ledger = new Ledger(context, options);
  contexts.set(ledger, context);
  return ledger;
}

/** Each ledger's internals, for `@idem/core/testing` only (the objects themselves keep them private). */
const contexts = new WeakMap<Ledger, LedgerContext>();
export function contextOf(ledger: Ledger): LedgerContext {
  const context = contexts.get(ledger);
  if (!context) throw new LedgerConfigError("not a ledger opened by openLedger");
  return context;
}

/** The agents' surface. Opened with `openLedger`; `admin` is the operators', `daemon` the daemon's. */
export class Ledger {
  /** Operators' work: list, resolve, retry, prune, stats, migrations. */
  readonly admin: LedgerAdmin;
  /** The daemon's work (and `idem retry --now`): its heartbeat, claim due operations, settle them, alerts. */
  readonly daemon: LedgerDaemon;
  readonly #context: LedgerContext;
  readonly #options: LedgerOptions;
  /**
   * The SHA-256 of the key identities and args this ledger hashed last: a retry hashes the same
   * texts again (see RecentHashes). At most 8,191 texts of up to 256 characters (about 3 MB at
   * most, measured). Only texts the ledger stores anyway: a call that keeps no key label or stores
   * no args has those hashed anew.
   */
  readonly #hashes = new RecentHashes(4_096, 256);
  readonly #hash = (text: string) => this.#hashes.sha256(text);

  /** @internal Use `openLedger`. */
  constructor(context: LedgerContext, options: LedgerOptions) {
    this.#context = context;
    this.#options = options;
    this.admin = new LedgerAdmin(context);
    this.daemon = new LedgerDaemon(context);
  }

  /**
   * Performs `action` once for (tenant, key). Duplicates get the stored outcome (`replayed: true`);
   * ambiguous outcomes come back as `pending_verification`, never as a guess. Throws only for
   * caller bugs: `ArgsMismatchError`, `InvalidValueError`, `PayloadTooLargeError` (nothing written).
   */
  run<A, R, I = A>(action: Action<A, R, I>, input: RunInput<A, I>): Promise<RunResult<R>> {
    const context = this.#context;
    let call: Call<A, R> | Promise<Call<A, R>>;
    try {
      call = this.#call(action, input);
      // A retry of a settled operation is answered at once, with no promise made on the way but
      // the one returned (issue 16: a replay's awaits cost more than its code), unless its spans
      // are recorded. Nothing runs after it that a close would have to wait for.
      if (!(call instanceof Promise) && !context.tracing.recording()) {
        const result = context.runner.replayNow(call);
        if (result) return Promise.resolve(this.#answered(result, action.type, input.tenant));
      }
    } catch (error) {
      return Promise.reject(error);
    }
    // In flight from here, in the same turn as the checks above (args a schema parses at leisure
    // included): a close begun meanwhile waits for it.
    const made = call;
    return context.runner.track(async () => this.#run(action.type, input.tenant, await made));
  }

  async #run<A, R>(type: string, tenant: string, call: Call<A, R>): Promise<RunResult<R>> {
    const context = this.#context;
    const result = await context.tracing.span<RunResult<R>>(
      "idem.run",
      { "idem.action": type, "idem.tenant": tenant },
      (span) => {
        const out = context.runner.run(call);
        // Without a span (no tracing SDK) the runner's own promise is awaited: no extra hop.
        if (!span) return out;
        return out.then((o) => {
          span.setAttributes(resultAttributes(o));
          return o;
        });
      },
    );
    return this.#answered(result, type, tenant);
  }

  #answered<R>(result: RunResult<R>, action: string, tenant: string): RunResult<R> {
    this.#options.onResult?.(result, { action, tenant });
    return result;
  }

  /**
   * The call `run` makes of its input, checked: at once, or once a schema that validates
   * asynchronously has parsed the args. Throws (or rejects) with the caller's bad input.
   */
  #call<A, R, I>(action: Action<A, R, I>, input: RunInput<A, I>): Call<A, R> | Promise<Call<A, R>> {
    const context = this.#context;
    context.assertOpen();
    requireName(input.tenant, "tenant");
    if (input.actor !== undefined && input.actor !== null) requireName(input.actor, "actor");
    const badBudget = input.budget && budgetProblem(input.budget);
    if (badBudget) throw new InvalidValueError(badBudget.path, badBudget.reason);
    const waitMs = input.waitMs;
    if (waitMs !== undefined && !(Number.isInteger(waitMs) && waitMs >= 0 && waitMs <= 2 ** 31 - 1))
      throw new InvalidValueError("waitMs", `must be a whole number of ms from 0 to ${2 ** 31 - 1}`);
    this.#checkAllowed(input.tenant, action.type);
    const settings = context.settings;
    const key = isOperationKey(input.key)
      ? keyFor(input.key, input.tenant, action.type)
      : deriveKey(
          { tenant: input.tenant, action: action.type, parts: input.key },
          input.keepKeyLabel === false ? sha256 : this.#hash,
        );
    const call = (args: Call<A, R>["args"]): Call<A, R> => ({
      // The runner sees args after the schema: the input type has done its work here.
      action: action as unknown as Action<A, R>,
      tenant: input.tenant,
      args,
      actor: input.actor ?? null,
      signal: input.signal,
      stop: input.stop,
      key: { hash: key.hash, label: input.keepKeyLabel === false ? null : key.label },
      storeArgs: input.storeArgs ?? true,
      settings:
        input.waitMs === undefined && input.budget === undefined
          ? settings
          : {
              ...settings,
              waitMs: input.waitMs ?? settings.waitMs,
              budget: { ...settings.budget, ...input.budget },
            },
    });
    const given = (value: A): Call<A, R> => {
      const json = canonicalJson(value, "args");
      checkSize("args", json, settings.maxArgsBytes);
      try {
        action.validate?.(value);
      } catch (error) {
        // The action's refusal, with its reason, as the typed error of a caller's bad input.
        if (error instanceof IdemError) throw error;
        throw new InvalidValueError("args", error instanceof Error ? error.message : String(error));
      }
      return call({ kind: "given", value, json, hash: (input.storeArgs === false ? sha256 : this.#hash)(json) });
    };
    if (typeof input.args === "function") return call({ kind: "lazy", make: input.args as () => A | Promise<A> });
    if (!action.input) return given(input.args as unknown as A);
    const parsed = parseArgsNow(action.input, input.args);
    return parsed instanceof Promise ? parsed.then(given) : given(parsed);
  }

  /**
   * What `run` would answer a later caller about this operation, without running anything:
   * `succeeded`/`failed` (replayed) once settled, else `pending_verification` with its state.
   * `OperationNotFoundError` for an id of another tenant.
   */
  async status(ref: OperationRef): Promise<RunResult<unknown>> {
    return outcomeOf(await this.#context.find(ref));
  }

  /**
   * Resolves once the operation is settled (`succeeded` or `failed`), or with its current state
   * (`pending_verification`) when `timeoutMs` (default 30 s) passes or `signal` aborts. It polls,
   * from 50 ms up to every second; what settles it is the worker, the daemon or a person.
   */
  async wait(
    ref: OperationRef & { readonly timeoutMs?: number; readonly signal?: AbortSignal },
  ): Promise<RunResult<unknown>> {
    const deadline = performance.now() + (ref.timeoutMs ?? 30_000);
    for (let delay = 50; ; delay = Math.min(delay * 1.5, 1_000)) {
      const out = await this.status(ref);
      const left = deadline - performance.now();
      if (out.status !== "pending_verification" || left <= 0 || ref.signal?.aborted) return out;
      await sleep(Math.min(delay, left), undefined, ref.signal ? { signal: ref.signal } : {}).catch(() => {});
    }
  }

  /** One operation with its audit events and stored args, or `OperationNotFoundError` (also for another tenant's id). */
  async get(ref: OperationRef): Promise<{ operation: Operation; events: OperationEvent[]; args: unknown }> {
    const row = await this.#context.find(ref);
    const events = await this.#context.store.events(ref.tenant, ref.id);
    // The stored args (null when the caller kept them out, or lazy args were never generated).
    return {
      operation: toOperation(row, this.#context.actions),
      events: events.map(toEvent),
      args: row.args_json === null ? null : JSON.parse(row.args_json),
    };
  }

  /**
   * Closes the connection (pool); every later call throws `LedgerConfigError`. The calls in flight
   * end first, and the late answers of requests cut off are awaited, to be recorded, for up to
   * `waitMs` (default the lease). A process that must end within a shorter bound (a daemon's stop)
   * passes what is left of it: given options, the answer names the late answers not awaited
   * (`Closed.lateAnswers`) and the operations whose calls had not ended (`Closed.inFlight`: not
   * recorded, running under their leases; their callers hear `CompletionNotRecordedError` or
   * `LedgerUnavailableError` with `closed`). A `waitMs` that is no duration is refused
   * (`InvalidValueError`), the ledger left open.
   */
  close(): Promise<undefined>;
  close(options: { readonly waitMs?: number }): Promise<Closed>;
  async close(options?: { readonly waitMs?: number }): Promise<Closed | undefined> {
    const waitMs = options?.waitMs;
    if (waitMs !== undefined && !(waitMs >= 0 && waitMs <= 2 ** 31 - 1))
      throw new InvalidValueError("waitMs", `must be a duration from 0 to ${2 ** 31 - 1} ms (got ${waitMs})`);
    const closed = await this.#context.close(waitMs);
    return options && closed;
  }

  #checkAllowed(tenant: string, type: string): void {
    const allowed = this.#options.allowedActions;
    if (!allowed) return;
    const list = allowed[tenant] ?? allowed["*"];
    if (!list?.includes(type)) throw new GuardrailError(tenant, type, "the action type is not allowed for this tenant");
  }
}

function isOperationKey(key: unknown): key is OperationKey {
  return (
    !Array.isArray(key) && typeof key === "object" && key !== null && typeof (key as OperationKey).hash === "string"
  );
}

/** A key from `operationKey`, refused where it was derived for another tenant or action. */
function keyFor(key: OperationKey, tenant: string, action: string): OperationKey {
  const other =
    (key.tenant !== undefined && key.tenant !== tenant) || (key.action !== undefined && key.action !== action);
  if (other)
    throw new InvalidValueError(
      "key",
      `was built for tenant "${key.tenant}" and action "${key.action}" (operationKey) but passed to run for tenant "${tenant}" and action "${action}": it names another operation; build the key with this call's tenant and action, or pass its parts`,
    );
  return key;
}

/**
 * A positive duration that a timer waits for: at most 2^31-1 ms (about 24.8 days). Node fires a
 * longer timer at once: a lease of a month would end every attempt as soon as it began
 * (`LeaseDeadlineError`), and a close would stop waiting for the calls in flight at once.
 */
/**
 * The most a size limit may allow: half of the largest value SQLite stores (1e9 bytes, its default
 * SQLITE_MAX_LENGTH) and of Postgres's 1 GB, so a JSON text under the limit is always storable.
 */
const MAX_JSON_BYTES = 500_000_000;

/**
 * `n`, a whole number from `min` to `max`, or refused at open naming `what`. Each becomes a limit
 * a call checks or a stored value: NaN disabled a size limit, and a NaN retention reached the
 * database on every call as a value it refuses, read as an outage of the ledger.
 */
function whole(n: number, what: string, min: number, max: number): number {
  if (!(Number.isInteger(n) && n >= min && n <= max))
    throw new LedgerConfigError(`${what} must be a whole number from ${min} to ${max} (got ${n})`);
  return n;
}

function timerMs(n: number, what: string): number {
  if (!(n > 0)) throw new LedgerConfigError(`${what} must be positive`);
  if (!(n <= 2 ** 31 - 1))
    throw new LedgerConfigError(`${what} must be at most ${2 ** 31 - 1} ms, about 24.8 days (got ${n})`);
  return n;
}

/** A running row no lease holds now (`stalled`). */
const STALLED =
  "no worker holds it now (its lease ended before its outcome was recorded: a worker that stopped, or lost the database): the next caller or the daemon takes it over, checking with the provider first where it may have been sent";

const WAITING_FOR: Record<Exclude<Status, "succeeded" | "failed">, string> = {
  running: "a worker is performing it now",
  unknown: "the outcome is unknown and is being checked with the provider",
  needs_review: "a person must decide whether it happened",
  pending: "it is known not done and will be run again with the same key",
};

/**
 * Why a row a person's retry marked (`look_first`) waits: it is not known not done, and only a
 * lookup that reads the args can settle that, which the daemon cannot make without them stored.
 */
function reopenedWaiting(r: Row): string {
  if (r.status === "running") return "a worker is looking its effect up now, after a person's retry";
  return `retried by a person, but its last execution may have committed: its effect is looked up first, where its action can be, and it runs again with the same key only if not found${r.args_json === null ? "; its args are not stored, so only a call that brings them can look (the daemon cannot)" : ""}`;
}

function outcomeOf(r: Row & { db_now: number }): RunResult<unknown> {
  if (r.status === "succeeded" || r.status === "failed") return replayOf(r);
  // A running row whose lease ended (by the database's clock) is no worker's now: "performing it"
  // would be untrue of a worker that crashed. Its attempt may have sent all the same.
  const stalled = r.status === "running" && r.lease_expires_at !== null && r.lease_expires_at <= r.db_now;
  if (stalled) return pending(r, STALLED, false, true);
  // A running row's reason is how its attempt began ("claimed"); the others' say why they wait.
  const why = r.status === "running" || !r.reason ? "" : ` (${r.reason})`;
  // Its receipt could not be stored: it happened, and a person records it (nothing to decide).
  const performed = knownPerformed(r);
  const waiting = r.look_first === 1 ? reopenedWaiting(r) : WAITING_FOR[r.status];
  return pending(r, (performed ? "a person must record its outcome" : waiting) + why, performed);
}
