/**
 * The daemon's surface (`ledger.daemon`): across every tenant of the ledger, beat (the ledger
 * takes writes), claim the operations that need settling, settle them by the replay policy with
 * the args stored with them, and find what a person must hear about. `idem retry --now` settles
 * through it too.
 */
import type { Action } from "./action.js";
import { toOperation, type LedgerContext, type Operation, type OperationRef } from "./context.js";
import { heartbeat } from "./daemon-heartbeat.js";
import { InvalidValueError, UnknownActionError } from "./errors.js";
import { requireName, requireWhole } from "./keys.js";
import { requireStuckFilter, type StuckFilter } from "./reports.js";
import type { RunResult } from "./result.js";
import {
  budgetProblem,
  escalationReason,
  notDoneEscalationReason,
  pastEscalation,
  type RetryBudget,
} from "./policy.js";
import type { Call, Escalation, RunnerSettings } from "./call.js";
import { pending } from "./row-results.js";
import type { Status } from "./schema.js";
import { resultAttributes } from "./tracing.js";
import type { Row, TenantActions } from "./store.js";

/**
 * What `settle` takes: the operation, who acts, the daemon's escalation limits, a stop signal, and
 * the settlement's own bounds.
 */
export type SettleOptions = OperationRef & {
  readonly actor?: string;
  readonly escalate?: Escalation;
  readonly stop?: AbortSignal;
  /**
   * Overrides the ledger's retry budget for this settlement, as `RunInput.budget` does for a call
   * (`{ attempts: 1 }`: one execution, whatever it answers; the next settlement tries again).
   */
  readonly budget?: Partial<RetryBudget>;
  /**
   * The longest this settlement may take, ms: the budget's `elapsedMs`, lowered to it (never
   * raised). A lookup not answered by then is given up, an inconclusive check (the operation
   * stays unknown, counted, checked again after its backoff; a finding it answers later is
   * recorded then, through the fence, as a late receipt is), and no request or retry starts
   * after it. A request under way then has its `op.signal` aborted: an action that honours it
   * ends as its `classify` says (cut before anything was sent: not done; after: unknown). One
   * that has not answered a second later is no longer awaited: the operation is unknown (the
   * request may have been sent; first checked a lease later), never "not done", and its answer,
   * if one comes, is recorded then, fenced as any late answer is (a receipt settles it).
   */
  readonly timeoutMs?: number;
};

/** An operation the daemon claimed, to settle next. */
export interface DueOperation {
  readonly id: string;
  readonly tenant: string;
  readonly status: Status;
  readonly action: string;
  /**
   * When the claim ends (database clock, ms): the `next_check_at` the claim set, by which
   * `release` tells the claim from a later change to the row.
   */
  readonly claimedUntil: number;
}

export class LedgerDaemon {
  readonly #context: LedgerContext;
  /** The daemon names that have beaten on this ledger (`heartbeat`): each sweeps gone daemons' rows once. */
  readonly #beaten = new Set<string>();

  /** @internal Reached as `ledger.daemon`. */
  constructor(context: LedgerContext) {
    this.#context = context;
  }

  /**
   * Records that the daemon `name` reached the ledger now (database clock): its row in
   * `idem_daemons` written, a page committed. `idem daemon` beats before each tick, so that a
   * ledger that answers reads but takes no writes (a full disk) makes it unhealthy, as it makes the
   * agents' claims fail. Throws `LedgerUnavailableError` when the write fails (a full disk, a
   * read-only file, the database gone); `InvalidValueError` for a malformed name. The first beat
   * of a name on this ledger also removes the rows of daemons not heard from for a week.
   */
  heartbeat(name: string): Promise<void> {
    return heartbeat(this.#context, name, this.#beaten);
  }

  /**
   * Claims up to `limit` operations the daemon must settle (running with an expired lease,
   * unknown or pending and due), hiding each from other daemons for `claimMs`. On Postgres the
   * scan skips rows another daemon is claiming (FOR UPDATE SKIP LOCKED); settling is fenced by
   * attempt anyway, so a row is never settled twice. `except`: a tenant's operations of these
   * action types are neither claimed nor hidden, left to a daemon that can settle them (one whose
   * config has an alert sink this one lacks). `reserved`: these action types are the daemon's own
   * in this tenant alone (its alert sinks); another tenant's operation of such a type is never
   * claimed, so it is never run with the daemon's action (its credentials, its channel).
   */
  async claimDue(options: {
    readonly limit: number;
    readonly claimMs: number;
    readonly except?: TenantActions;
    readonly reserved?: TenantActions;
  }): Promise<DueOperation[]> {
    this.#context.assertOpen();
    requireWhole(options.limit, "limit", 1);
    requireWhole(options.claimMs, "claimMs", 1);
    const filter = (f: TenantActions | undefined, name: string) => {
      if (!f) return undefined;
      requireName(f.tenant, `${name}.tenant`);
      for (const a of f.actions) requireName(a, `${name}.actions`);
      return f.actions.length > 0 ? f : undefined;
    };
    const filters = { except: filter(options.except, "except"), reserved: filter(options.reserved, "reserved") };
    return (await this.#context.store.claimDue(options.limit, options.claimMs, filters)).map((r) => ({
      id: r.id,
      tenant: r.tenant_id,
      status: r.status,
      action: r.action,
      // Set by the claim's own statement: never null on a row it returns.
      claimedUntil: r.next_check_at!,
    }));
  }

  /**
   * Gives back operations of a `claimDue` that this daemon will not settle (it is stopping, or its
   * tick ended early), so that another daemon may claim them at once rather than once `claimMs`
   * has passed: each becomes due now, by the database clock. Only a row that still carries the
   * claim (its status and its claim's end unchanged) is released; a row that a worker, a person or
   * another daemon changed since keeps what they set. Returns how many were released.
   */
  async release(claimed: readonly DueOperation[]): Promise<number> {
    this.#context.assertOpen();
    for (const c of claimed) {
      if (typeof c.id !== "string") throw new InvalidValueError("id", "must be an operation id");
      requireName(c.tenant, "tenant");
      requireWhole(c.claimedUntil, "claimedUntil", 0);
    }
    return this.#context.store.releaseClaims(claimed);
  }

  /**
   * Recovers a stored operation without its caller: replays, reconciles or parks it by the replay
   * policy, using the args stored with it. Throws `UnknownActionError` when its action type was
   * not registered in the ledger's `actions` (the row is untouched). `escalate`: an unknown
   * outcome checked `maxChecks` times, or older than `maxAgeMs` by the database clock, goes to a
   * person instead of being checked again. `stop`: once it aborts (the daemon is stopping), the
   * settlement ends as a closing ledger's calls do: nothing more is sent, a pause (a backoff, a
   * Retry-After) ends at once, and the effect under way is recorded; the operation is left as it
   * then is (pending, unknown), for the next settlement.
   */
  settle(options: SettleOptions): Promise<RunResult<unknown>> {
    // In flight from its first read: a close begun meanwhile waits for it.
    return this.#context.runner.track(() => this.#settle(options));
  }

  async #settle(options: SettleOptions): Promise<RunResult<unknown>> {
    const context = this.#context;
    if (options.actor !== undefined) requireName(options.actor, "actor");
    const settings = settingsOf(context.settings, options);
    const row = await context.find(options);
    const action: Action<unknown, unknown> | undefined = context.actions.get(row.action);
    if (!action) return this.#unsettleable(row, options);
    const call: Call<unknown, unknown> = {
      action,
      tenant: options.tenant,
      actor: options.actor ?? null,
      key: { hash: row.key, label: row.key_label },
      storeArgs: true,
      args:
        row.args_json !== null && row.args_hash !== null
          ? { kind: "given", value: JSON.parse(row.args_json), json: row.args_json, hash: row.args_hash, stored: true }
          : { kind: "stored" },
      settings,
      stop: options.stop,
    };
    const attributes = {
      "idem.action": row.action,
      "idem.tenant": options.tenant,
      "idem.operation.id": row.id,
      "idem.from": row.status,
    };
    return context.tracing.span("idem.settle", attributes, async (span) => {
      const out = await context.runner.settle(call, row, options.escalate);
      span?.setAttributes(resultAttributes(out));
      return out;
    });
  }

  /**
   * An operation this ledger has no action for: untouched (`UnknownActionError`), unless it is an
   * unknown outcome or a pending one past the escalation's limits, which goes to a person,
   * alerted, as if checked: no daemon of this config can ever check or run it, and the caller was
   * told the daemon would. That is an escalation as any other (`isEscalation`): its reason begins
   * with the limit it passed, as decide()'s do. Not a pending one whose args are not stored: only
   * its caller can run it, and decide() leaves it to that caller too.
   */
  async #unsettleable(row: Row & { db_now: number }, options: SettleOptions): Promise<RunResult<unknown>> {
    // Aged as decide() ages an unknown outcome: from its last execution, not its creation.
    const age = {
      checks: row.checks,
      now: row.db_now,
      createdAt: row.created_at,
      lastExecutionAt: row.last_execution_at,
    };
    if (
      (row.status === "unknown" || (row.status === "pending" && row.args_json !== null)) &&
      options.escalate &&
      pastEscalation(options.escalate, age)
    ) {
      const reason =
        row.status === "unknown"
          ? `${escalationReason(options.escalate, age)}, and no action of type ${row.action} is registered to check it; a person must decide`
          : `${notDoneEscalationReason(options.escalate, age)}, and no action of type ${row.action} is registered to run it again; a person must decide whether to run it again`;
      // Retried through a brief outage, a lost answer recognised as its own (`moveDurably`):
      // written once, the settlement failed, the row left unalerted (or parked unbeknown to us).
      const parked = await this.#context.runner.writes.moveDurably(
        { tenant: row.tenant_id, settings: this.#context.settings },
        row,
        "needs_review",
        {
          actor: options.actor ?? null,
          reason,
          alert: true,
          unchangedSince: { updatedAt: row.updated_at, checks: row.checks },
        },
      );
      if (parked) return pending(parked, reason);
    }
    throw new UnknownActionError(row.action, row.id);
  }

  /**
   * Operations whose last transition a person must hear about (needs_review, auth/policy failures,
   * two effects, an effect not done in full: `Operation.attention`), oldest first.
   */
  async alertsDue(options: {
    readonly limit: number;
    /** The last of the previous page: the rows after it (a page left undelivered must not hide the next). */
    readonly after?: Pick<Operation, "updatedAt" | "id">;
  }): Promise<Operation[]> {
    this.#context.assertOpen();
    requireWhole(options.limit, "limit", 1);
    const a = options.after;
    if (a !== undefined) {
      requireWhole(a.updatedAt, "after.updatedAt", 0);
      if (typeof a.id !== "string") throw new InvalidValueError("after.id", "must be an operation id");
    }
    return (await this.#context.store.alertsDue(options.limit, a)).map((r) => toOperation(r, this.#context.actions));
  }

  /** Marks the alert for this transition as delivered (a newer transition keeps its own). */
  async ackAlert(op: Pick<Operation, "id" | "tenant" | "updatedAt">): Promise<void> {
    this.#context.assertOpen();
    await this.#context.store.ackAlert(op.tenant, op.id, op.updatedAt);
  }

  /**
   * Operations running (under a live or dead lease) for longer than `olderThanMs` in their current
   * attempt, with how long (`runningForMs`, by the database clock). `tenants`, `action`: only
   * these (the limit applies after them: another tenant's many stuck rows do not hide these).
   * `exceptActions`: not these action types (read apart with their own threshold: their many
   * long runs, within it, must not hide another action's stuck run behind the limit). `except`:
   * not these action types in this tenant (the daemon's own alert deliveries), also before the limit.
   */
  async stuck(options: StuckFilter): Promise<(Operation & { runningForMs: number })[]> {
    this.#context.assertOpen();
    requireStuckFilter(options);
    if (options.tenants?.length === 0) return [];
    return (await this.#context.reports.stuck(options.olderThanMs, options.limit ?? 1_000, stuckOnly(options))).map(
      (r) => ({ ...toOperation(r), runningForMs: r.age_ms }),
    );
  }

  /**
   * How many operations `stuck` finds with these options and no limit: the count a gauge shows,
   * which a read's limit must not cap (its rows are for alerts, a page at a time).
   */
  async countStuck(options: Omit<StuckFilter, "limit">): Promise<number> {
    this.#context.assertOpen();
    requireStuckFilter(options);
    if (options.tenants?.length === 0) return 0;
    return this.#context.reports.countStuck(options.olderThanMs, stuckOnly(options));
  }
}

/** What narrows a stuck read besides its threshold and limit. */
function stuckOnly(f: Omit<StuckFilter, "limit">) {
  return { tenants: f.tenants, action: f.action, exceptActions: f.exceptActions, except: f.except };
}

/** The ledger's settings with a settlement's own budget and time bound (`SettleOptions`). */
function settingsOf(settings: RunnerSettings, options: SettleOptions): RunnerSettings {
  const { budget, timeoutMs } = options;
  if (budget === undefined && timeoutMs === undefined) return settings;
  for (const [name, value] of Object.entries(budget ?? {}))
    if (value !== undefined) requireWhole(value, `budget.${name}`, name === "attempts" || name === "elapsedMs" ? 1 : 0);
  const badBudget = budget && budgetProblem(budget);
  if (badBudget) throw new InvalidValueError(badBudget.path, badBudget.reason);
  if (timeoutMs !== undefined) requireWhole(timeoutMs, "timeoutMs", 1);
  const merged = { ...settings.budget, ...budget };
  return {
    ...settings,
    budget: timeoutMs === undefined ? merged : { ...merged, elapsedMs: Math.min(merged.elapsedMs, timeoutMs) },
  };
}
