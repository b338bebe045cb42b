/** Table shapes as kysely sees them; one shape on SQLite and Postgres (times are ms since epoch). */
import type { Generated } from "kysely";

export const STATUSES = ["running", "succeeded", "failed", "unknown", "needs_review", "pending"] as const;
export type Status = (typeof STATUSES)[number];

export interface OperationsTable {
  id: string;
  tenant_id: string;
  key: string;
  key_label: string | null;
  action: string;
  /** Null only while lazily generated args have not been stored yet. */
  args_hash: string | null;
  args_json: string | null;
  status: Status;
  attempt: number;
  lease_owner: string | null;
  lease_expires_at: number | null;
  provider_reference: string | null;
  result_json: string | null;
  error_json: string | null;
  /** A person's verdict on a needs_review operation (migration 0004): `{ outcome, actor, reason, evidence }`. */
  resolution_json: string | null;
  /** Who made the last transition and why; the audit trigger copies both into `history`. */
  actor: string | null;
  reason: string | null;
  /** When the daemon should look at an unknown or pending row again (backoff). */
  next_check_at: number | null;
  /** Reconciliation tries that were inconclusive. */
  checks: number;
  /**
   * 1 from the moment an attempt may have reached the provider until a proof (found, proven
   * absent, a person) clears it; never 1 on a `pending` row (migration 0003, a CHECK).
   */
  maybe_committed: number;
  /** 1 while a person must be alerted about this row's last transition (the daemon clears it). */
  alert_pending: number;
  /**
   * The latest moment an execution of this operation could have taken effect: when one started
   * (claim, takeover to execute) or ended without an answer. Lookups count settle windows from
   * here, not from later inconclusive checks.
   */
  last_execution_at: number | null;
  /**
   * When the operation's key was first sent (migration 0009): the start of the first execution
   * since the operation was last known not done (a claim; a takeover that executes a `pending` row
   * starts it anew, one that replays a row that may have committed keeps it). A provider's key
   * retention counts from here. NULL on rows from before 0009: they count from `created_at`.
   */
  first_execution_at: number | null;
  /**
   * 1 on a `pending` row a person reopened from a state that may have committed (migration 0012),
   * and on the `running` row of the lookup that follows: its effect is looked up before it runs
   * again (a late request may land after the person looked). NULL otherwise: cleared once the row
   * executes or settles. NULL too on a ledger this process reads before 0012 (see `Store.looksFirst`).
   */
  look_first: number | null;
  /**
   * The latest attempt that ran the operation from `pending` (known not done) after it was first
   * sent (migration 0013): its request may be an effect of its own, so an earlier attempt's late
   * answer proving an effect may be one of two (fence.ts). A run that ended having sent nothing
   * that could take effect puts back the attempt it replaced (`TransitionPatch.rerunBefore`). NULL
   * until then, on rows from before, and on a ledger this process reads before 0013 (see
   * `Store.marksReruns`). Only `findById` reads it, and a takeover that marks a rerun (`takeOver`).
   */
  rerun_attempt: Generated<number | null>;
  created_at: number;
  updated_at: number;
  completed_at: number | null;
  expires_at: number | null;
  /**
   * How long the operation is kept once completed, as the ledger that claimed it was opened
   * (migration 0007): ms, or -1 to keep it. NULL on rows claimed before 0007, which take the
   * completer's retention. Only a completion's statement reads it.
   */
  retention_ms: number | null;
  /**
   * The audit events of this operation, oldest first, appended by the trigger of every
   * transition (migration 0002): JSON text on SQLite, jsonb (read as an array) on Postgres.
   */
  history: Generated<string | HistoryEvent[]>;
  /** Events dropped from the middle of `history` (it keeps the first 10 and the last 90). */
  history_elided: Generated<number>;
}

/** One audit event as stored in `history`. */
export interface HistoryEvent {
  from: Status | null;
  to: Status;
  attempt: number;
  actor: string | null;
  reason: string | null;
  ref: string | null;
  at: number;
  /** What a person checked before a retry (`admin.retry`'s `evidence`); absent on every other event. */
  evidence?: string;
}

/** The daemons' heartbeats (migration 0008): one row per daemon name, written at every tick. */
export interface DaemonsTable {
  name: string;
  /** The last beat (database clock, ms). */
  beat_at: number;
  /** Beats so far: each write changes the row, whatever the clock says. */
  beats: number;
}

export interface IdemDatabase {
  idem_operations: OperationsTable;
  idem_daemons: DaemonsTable;
}

/**
 * The columns read by name (store.ts `ROW_COLUMNS`): everything but the history, which only
 * `events` reads, the retention, which only a completion reads, `rerun_attempt`, which only the
 * fence reads (`Store.findById`), and `look_first`, which a ledger
 * opened without migrating may lack (before 0012): every read selects it as `Store.lookFirst()`,
 * NULL in its place there, and store.ts `Row` adds it.
 */
export type OperationRow = Omit<
  OperationsTable,
  "history" | "history_elided" | "retention_ms" | "look_first" | "rerun_attempt"
>;
