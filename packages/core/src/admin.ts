/**
 * The operators' surface (`ledger.admin`): list a tenant's operations, decide the ones that need
 * a person, prune, count, migrate. Every decision is checked against the operation's current
 * status in the same statement that records it, with the person's name in the audit trail.
 */
import { sql } from "kysely";
import { parseArgs } from "./action.js";
import { canonicalJson } from "./canonical.js";
import {
  requireVerdict,
  toOperation,
  type LedgerContext,
  type Operation,
  type OperationRef,
  type Verdict,
} from "./context.js";
import { InvalidTransitionError, InvalidValueError, LedgerConfigError } from "./errors.js";
import { requireName, requireTenants, requireText, requireWhole } from "./keys.js";
import { migrate, schemaStatus } from "./open.js";
import type { StoredError } from "./result.js";
import { RESOLVED_BY_PERSON, rowPerformedProof } from "./row-results.js";
import { STATUSES, type Status } from "./schema.js";
import type { Row } from "./store.js";
import { requireStuckFilter, type LedgerStats, type ListFilter, type ReadsAtOnce } from "./reports.js";

/** A person's verdict on a `needs_review` operation. */
export type Resolve = OperationRef &
  Verdict &
  (
    | {
        /** It happened: the provider shows the effect. */
        readonly outcome: "succeeded";
        /** What the person checked (a dashboard link, the provider's id); stored with the verdict, never as the receipt. */
        readonly evidence?: string;
        /**
         * The receipt they found, stored only when the action (registered with the ledger's
         * `actions`) declares a `receipt` schema that accepts it. Without it callers replay the
         * verdict with no receipt.
         */
        readonly receipt?: unknown;
      }
    | {
        /** It did not happen and must not be tried again. */
        readonly outcome: "failed";
        readonly evidence?: string;
      }
  );

/** A person's word that an operation was not done (`admin.retry`): run it again with the same key. */
export type Retry = OperationRef &
  Verdict & {
    /**
     * What the person checked (the provider's log searched, a dashboard link), at most 1,000
     * characters as a verdict's: kept in the retry's audit event (`OperationEvent.evidence`), apart
     * from the reason. A retry is no verdict, so the operation keeps none.
     */
    readonly evidence?: string;
  };

export class LedgerAdmin {
  readonly #context: LedgerContext;

  /** @internal Reached as `ledger.admin`. */
  constructor(context: LedgerContext) {
    this.#context = context;
  }

  /**
   * Operations newest first, filtered by status, action and age, of one tenant, of the tenants
   * an operator may see (`tenant: [...]`), or of every tenant (`allTenants: true`: an operator's
   * queue). Page with `before`: the id of the last operation of the previous page.
   */
  async list(filter: ListFilter): Promise<Operation[]> {
    this.#context.assertOpen();
    requireListFilter(filter);
    if (Array.isArray(filter.tenant) && filter.tenant.length === 0) return []; // an operator allowed no tenant sees nothing
    return (await this.#context.reports.list(filter)).map((r) => toOperation(r, this.#context.actions));
  }

  /**
   * Several lists (as `list` takes them) and stuck reads (as `ledger.daemon.stuck` takes them)
   * answered by one statement, so from one snapshot of the ledger: an operation that changes status
   * meanwhile is in the answer of the status it had, never in two answers or in none, as it could
   * be when they are read one after another. For a page that shows several statuses at once (the
   * console's queue). Each read keeps its own index, filters and limit.
   */
  async readAtOnce(reads: ReadsAtOnce): Promise<{
    lists: Operation[][];
    stuck: (Operation & { runningForMs: number })[][];
  }> {
    this.#context.assertOpen();
    for (const f of reads.lists ?? []) requireListFilter(f);
    for (const f of reads.stuck ?? []) requireStuckFilter(f);
    const out = await this.#context.reports.atOnce(reads);
    return {
      lists: out.lists.map((rows) => rows.map((r) => toOperation(r, this.#context.actions))),
      stuck: out.stuck.map((rows) => rows.map((r) => ({ ...toOperation(r), runningForMs: r.age_ms }))),
    };
  }

  /**
   * A person's verdict on a `needs_review` operation: it happened (`succeeded`) or it did not and
   * must not be retried (`failed`). The verdict (who, why, evidence) is stored apart from the
   * receipt and the provider reference, which keep what the provider gave. `failed` is refused
   * (`InvalidTransitionError`) on an operation whose effect is known to have happened (its
   * receipt came back but could not be stored): only `succeeded` agrees with that proof.
   */
  async resolve(verdict: Resolve): Promise<Operation> {
    const context = this.#context;
    requireVerdict(verdict);
    if (verdict.outcome !== "succeeded" && verdict.outcome !== "failed")
      throw new InvalidValueError("outcome", "must be succeeded or failed");
    if (verdict.evidence !== undefined) requireText(verdict.evidence, "evidence", 1_000);
    const row = await context.find(verdict);
    context.checkSeen(row, verdict, verdict.outcome);
    if (row.status !== "needs_review") throw new InvalidTransitionError(row.id, row.status, verdict.outcome);
    if (verdict.outcome === "failed") refuseIfPerformed(row, "failed");
    const receipt =
      verdict.outcome === "succeeded" && verdict.receipt !== undefined
        ? await this.#checkedReceipt(row.action, row.id, verdict.receipt)
        : undefined;
    const receiptJson = receipt === undefined ? null : canonicalJson(receipt, "receipt");
    // Every later caller replays it: no larger than a receipt the runner would keep.
    const bytes = receiptJson === null ? 0 : Buffer.byteLength(receiptJson);
    if (bytes > context.settings.maxResultBytes)
      throw new InvalidValueError(
        "receipt",
        `is ${bytes} bytes, over this ledger's limit of ${context.settings.maxResultBytes} (maxResultBytes): record the provider's ids in it, or give evidence instead`,
      );
    const reason = `${RESOLVED_BY_PERSON}${verdict.reason}`;
    const resolution = {
      outcome: verdict.outcome,
      actor: verdict.actor,
      reason: verdict.reason,
      evidence: verdict.evidence ?? null,
    };
    const done = await context.store.transition(row, verdict.outcome, {
      actor: verdict.actor,
      reason,
      completed: true,
      retentionMs: context.settings.retentionMs,
      alert: false,
      // The row as checked above (the person's view, when given, is that row): a proof that came
      // since, which would refuse a "failed", must not be overwritten by it.
      unchangedSince: { updatedAt: row.updated_at, checks: row.checks },
      resolution_json: JSON.stringify(resolution),
      ...(verdict.outcome === "succeeded"
        ? { result_json: receiptJson, error_json: null } // as the runner's success: the earlier error is over
        : { error_json: JSON.stringify({ kind: "permanent", reason } satisfies StoredError) }),
    });
    if (!done) throw await context.changedWhileDeciding(row, verdict, verdict.outcome);
    return toOperation(done);
  }

  /**
   * Marks an operation as known not done so the next call or the daemon runs it again with the
   * same key: for `needs_review` or `unknown` after a person checked the provider, or `failed`
   * after the cause was fixed. `evidence`, when given, is kept in the retry's audit event.
   *
   * An operation whose last execution may have committed (`unknown`, or `needs_review` after
   * one) is looked up first by whoever runs it next, when its action can be: the request may land
   * after the person looked. Found, it settles as succeeded (alerted: nothing runs twice); not
   * provable yet (a settle window, an index that lags), it stays pending and is looked at again;
   * proven absent, or by a lookup that never can prove it (the person's word is the proof then),
   * it runs. An action that dedupes on the key, while the provider keeps it, runs at once (the
   * provider answers the first result); one that can neither, on the person's word. The operation
   * shows it (`lookFirst`) until a look answers. Its args not stored, only a call that brings them
   * can look (the daemon cannot); when that look proves nothing it comes back to a person, alerted.
   */
  async retry(verdict: Retry): Promise<Operation> {
    const context = this.#context;
    requireVerdict(verdict);
    if (verdict.evidence !== undefined) {
      requireText(verdict.evidence, "evidence", 1_000);
      // Before 0010 the trigger writes the event, and it knows only the row's columns.
      if (!context.store.movesWriteEvents)
        throw new InvalidValueError(
          "evidence",
          "a retry's evidence is kept in its audit event, which this ledger writes only once migrated (run idem migrate): nothing was decided",
        );
    }
    const row = await context.find(verdict);
    context.checkSeen(row, verdict, "pending");
    if (!["needs_review", "failed", "unknown"].includes(row.status))
      throw new InvalidTransitionError(row.id, row.status, "pending");
    // Running it again would repeat an effect known to have happened.
    refuseIfPerformed(row, "pending");
    // Its last execution may have committed: the person found nothing at the provider, but the
    // request may land after they looked (mail queued at the server, an index that lags). The
    // runner that takes it, which knows the action's settle windows, looks it up first (`lookFirst`).
    // A failed operation's provider refused it: no effect to wait for, unless it refused what it
    // had taken whole (`mayHaveTaken`: a mail server's 5xx after the body, which some queue all the
    // same): its copy may land after the person looked, as a lost answer's may.
    const lookFirst =
      row.status === "unknown" ||
      (row.status === "needs_review" && row.maybe_committed === 1) ||
      (row.status === "failed" && mayHaveTaken(row));
    // The ledger's schema, not the operation's status, refuses it: a configuration to fix.
    if (lookFirst && !context.store.looksFirst)
      throw new LedgerConfigError(
        `operation ${row.id} is ${row.status}: its last execution may have committed, and a retry of it is looked up first, which this ledger records only once migrated (run idem migrate, or admin.migrate()); nothing was decided`,
      );
    // A person's word that it was not done: the checks of the earlier outcome start over.
    const back = await context.store.transition(row, "pending", {
      lookFirst,
      actor: verdict.actor,
      reason: `retry asked: ${verdict.reason}`,
      ...(verdict.evidence !== undefined && { evidence: verdict.evidence }),
      checkAfterMs: 0,
      checks: 0,
      result_json: null,
      resolution_json: null,
      reopened: true,
      alert: false,
      unchangedSince: { updatedAt: row.updated_at, checks: row.checks }, // the row as checked above
    });
    if (!back) throw await context.changedWhileDeciding(row, verdict, "pending");
    return toOperation(back);
  }

  /**
   * Deletes this tenant's completed operations past their retention, at most `limit` (a whole
   * number, at least 1; default 10,000) in this one statement; returns how many.
   */
  async prune(options: { readonly tenant: string; readonly limit?: number }): Promise<number> {
    this.#context.assertOpen();
    requireName(options.tenant, "tenant");
    const limit = options.limit ?? 10_000;
    // Checked here: SQLite reads LIMIT -1 as no limit, and Postgres's refusal would read as an outage.
    requireWhole(limit, "limit", 1);
    return this.#context.reports.prune(options.tenant, limit);
  }

  /**
   * Exact counts of the operations not settled yet (running, unknown, pending, needs_review) by
   * tenant, action and status, for one tenant or all: read from the partial indexes that hold
   * only those rows, so the cost follows the work waiting, not the ledger's size. Settled
   * operations are not counted (that would read every one); see `LedgerStats`.
   */
  async stats(options: { readonly tenant?: string } = {}): Promise<LedgerStats> {
    this.#context.assertOpen();
    if (options.tenant !== undefined) requireName(options.tenant, "tenant");
    return this.#context.reports.stats(options.tenant);
  }

  /**
   * Operations created per `bucketMs` (default 1 h) over the last `sinceMs` (default 24 h, by the
   * database clock), by status: one tenant's, several tenants' or, without `tenant`, all. For
   * charts of what came in and how it ended.
   */
  async activity(
    options: {
      readonly tenant?: string | readonly string[];
      readonly sinceMs?: number;
      readonly bucketMs?: number;
    } = {},
  ): Promise<{ at: number; status: Status; count: number }[]> {
    this.#context.assertOpen();
    const tenants = options.tenant;
    if (tenants !== undefined) requireTenants(tenants);
    if (Array.isArray(tenants) && tenants.length === 0) return [];
    const sinceMs = options.sinceMs ?? 24 * 3_600_000;
    const bucketMs = options.bucketMs ?? 3_600_000;
    requireWhole(sinceMs, "sinceMs", 1);
    requireWhole(bucketMs, "bucketMs", 1);
    return this.#context.reports.activity(tenants, sinceMs, bucketMs);
  }

  /**
   * The database's clock (ms since the epoch), the one every time in the ledger is written on: an
   * age shown to a person (`now - createdAt`) is measured on it, not on the reader's host clock,
   * which may run apart from it (another machine).
   */
  async now(): Promise<number> {
    this.#context.assertOpen();
    const store = this.#context.store;
    const { rows } = await store.guard(undefined, sql<{ now: number }>`select ${store.now()} as now`.execute(store.db));
    return Number(rows[0]?.now);
  }

  /** The migrations this ledger still needs (opened with `migrate: false`); empty when it is current. */
  async pendingMigrations(): Promise<string[]> {
    this.#context.assertOpen();
    return (await schemaStatus(this.#context.db)).pending;
  }

  /** Applies pending migrations (`migrate: false` at open leaves them to this). */
  async migrate(): Promise<string[]> {
    this.#context.assertOpen();
    const applied = await migrate(this.#context.db, this.#context.dialect);
    this.#context.store.movesWriteEvents = true; // 0010 is in, whoever applied it
    this.#context.store.looksFirst = true; // and 0012
    this.#context.store.marksReruns = true; // and 0013
    return applied;
  }

  /** A receipt a person gave, as the action's receipt schema reads it; refused when nothing can check it. */
  async #checkedReceipt(type: string, operationId: string, receipt: unknown): Promise<unknown> {
    const schema = this.#context.actions.get(type)?.receipt;
    if (!schema) {
      throw new InvalidValueError(
        "receipt",
        `action ${type} (operation ${operationId}) has no receipt schema registered with this ledger: give evidence instead, or register the action with a receipt schema`,
      );
    }
    return parseArgs(schema, receipt, "receipt");
  }
}

/**
 * Refuses a decision that the effect did not happen (`to`: "failed", or "pending" to run it again)
 * on an operation known to have performed it: its receipt came back but could not be stored
 * (`knownPerformed`, the runner's own test). A person resolves it as succeeded, with the receipt
 * they find at the provider or their evidence.
 */
function refuseIfPerformed(row: Row, to: Status): void {
  const proof = rowPerformedProof(row);
  if (!proof) return;
  const by = proof.performedBy?.length ? ` (attempt ${proof.performedBy.join(" and ")})` : "";
  throw new InvalidTransitionError(
    row.id,
    `${row.status}: its effect happened${by}, but the receipt could not be stored (${proof.reason.slice(0, 200)}); resolve it as succeeded, with the receipt or evidence you find at the provider`,
    to,
  );
}

/** Refuses a list's filter `admin.list` would refuse. */
function requireListFilter(filter: ListFilter): void {
  if (filter.allTenants === true) {
    if (filter.tenant !== undefined) throw new InvalidValueError("tenant", "give a tenant or allTenants, not both");
  } else if (filter.tenant !== undefined) requireTenants(filter.tenant);
  else throw new InvalidValueError("tenant", "give a tenant, a list of tenants, or allTenants: true");
  if (filter.before !== undefined) requireName(filter.before, "before");
  if (filter.limit !== undefined) requireWhole(filter.limit, "limit", 1);
  if (filter.olderThanMs !== undefined) requireWhole(filter.olderThanMs, "olderThanMs", 0);
  if (filter.status !== undefined) requireStatuses(filter.status);
}

/** A misspelt status would list nothing, which reads as "none of those": say it instead. */
function requireStatuses(status: unknown): void {
  for (const s of Array.isArray(status) ? status : [status])
    if (!(STATUSES as readonly unknown[]).includes(s))
      throw new InvalidValueError("status", `${JSON.stringify(s)} is not a status: one of ${STATUSES.join(", ")}`);
}

/** A failure the provider answered after it had the whole request (`Classification.mayHaveTaken`). */
function mayHaveTaken(row: Row): boolean {
  return row.error_json !== null && (JSON.parse(row.error_json) as StoredError).mayHaveTaken === true;
}
