/**
 * The ledger's SQL, written once with kysely for SQLite and Postgres. Every state change is a
 * single conditional statement (INSERT … ON CONFLICT DO NOTHING, UPDATE … WHERE status AND
 * attempt) so that exactly one of any number of racing workers wins, without explicit locks, on
 * both databases; the audit trigger puts its event in the same statement's transaction.
 *
 * Times are ms since epoch from the database clock (Postgres `statement_timestamp()`, SQLite
 * `unixepoch('subsec')`), so workers on several machines agree. Every tenant-facing query is
 * scoped by `tenant_id`.
 */
import { performance } from "node:perf_hooks";
import { randomUUID } from "node:crypto";
import { sql, type AliasedRawBuilder, type Kysely, type RawBuilder } from "kysely";
import { claimNotWritten, IdemError, LedgerUnavailableError } from "./errors.js";
import { PoolEndedError } from "./ending-pool.js";
import { QueryCache, rowObject, type DirectExecutor } from "./query-cache.js";
import type { DialectName } from "./migrations/index.js";
import { HISTORY } from "./migrations/0003-sticky-maybe-committed.js";
import { TAKEOVER_FROM } from "./policy.js";
import type { HistoryEvent, IdemDatabase, OperationRow, OperationsTable, Status } from "./schema.js";

/** A row as the ledger reads it: its named columns, and whether a person's retry asks for a look first. */
export type Row = OperationRow &
  Pick<OperationsTable, "look_first"> & {
    /**
     * Not a column: on the row a takeover that runs the operation again from `pending` returned
     * (`takeOver`), the `rerun_attempt` it replaced, which that run puts back if it ends having
     * sent nothing that could take effect (`TransitionPatch.rerunBefore`). Absent on every other row.
     */
    rerun_before?: number | null;
  };

/** Fields a transition may set besides status. */
export interface TransitionPatch {
  actor: string | null;
  reason: string;
  result_json?: string | null;
  error_json?: string | null;
  provider_reference?: string | null;
  /** A person's verdict (JSON), or null to clear it. */
  resolution_json?: string | null;
  /**
   * What a person checked before a decision that is no verdict (a retry), kept in the transition's
   * audit event (`evidence`), not on the row: the row's verdict (`resolution_json`) is cleared by
   * a retry, and the event is what the person's decision leaves. Needs migration 0010 (events
   * written by the statement, which the caller checks: the trigger's events carry none).
   */
  evidence?: string;
  /** When the daemon should look again, in ms from now (database clock); null clears it. */
  checkAfterMs?: number | null;
  checks?: number;
  completed?: boolean;
  /**
   * A settled operation is open again (a person's retry, a late answer that may have committed): it
   * is no longer completed, nor due for pruning, and a person's verdict on it no longer holds.
   */
  reopened?: boolean;
  /** A person must hear of this transition (needs_review, auth/policy failure): the daemon alerts. */
  alert?: boolean;
  /** This transition ends an execution without an answer: it may have taken effect until now. */
  executionEnded?: boolean;
  /**
   * With `executionEnded`: when the ended execution's attempt counted its key's first send from.
   * The row keeps the earlier of it and its own: an earlier attempt's late end may come after the
   * operation was run again from known not done (which starts the count anew), and its request
   * may have taken effect under the key it sent first.
   */
  firstSentAt?: number;
  /**
   * Retention after completion, ms (null: kept), for rows claimed before migration 0007: a row
   * claimed since keeps the retention its claim recorded.
   */
  retentionMs?: number | null;
  /**
   * A pending row's `look_first` (migration 0012): true when a person reopens an operation that
   * may have committed (its effect is looked up before it runs again), or a lookup that proved
   * nothing leaves it so; false once a proof answers it. Left as it is when not given by a move
   * to `pending` or `running`; every other move clears it (the row settled, or may have committed
   * again and is reconciled as such).
   */
  lookFirst?: boolean;
  /**
   * Only if the row is still as a person saw it (besides the status and attempt every transition
   * is conditioned on): last changed at this time, after this many checks.
   */
  unchangedSince?: { updatedAt: number; checks: number };
  /**
   * Only if no execution ended since the snapshot (`last_execution_at` unchanged): a lookup's proof
   * of absence is void once an earlier attempt's late answer says its request was out meanwhile.
   */
  noExecutionSince?: number | null;
  /**
   * A run again from `pending` that ended having sent nothing that could take effect (not sent,
   * refused for now): the `rerun_attempt` its takeover replaced (`takeOver`'s `rerun_before`), put
   * back in the same statement, so that a later attempt's settlement does not make this one a run
   * that may have sent, and an earlier run's mark is kept (migration 0013; fence.ts). Only while
   * the mark is still this attempt's; not written on a ledger before 0013 (`Store.marksReruns`).
   */
  rerunBefore?: number | null;
}

export interface NewClaim {
  id: string;
  tenant: string;
  key: string;
  keyLabel: string | null;
  action: string;
  argsHash: string | null;
  argsJson: string | null;
  owner: string;
  leaseMs: number;
  actor: string | null;
  /** The claiming ledger's retention, recorded in the row (migration 0007): ms, or null to keep it (stored as KEEP). */
  retentionMs: number | null;
}

/** `retention_ms` of an operation kept forever (NULL is a row claimed before 0007). */
const KEEP = -1;

/**
 * Literal statuses for the daemon's scans: SQLite uses a partial index only when the query's
 * WHERE repeats the index's condition literally, which a bound parameter does not.
 */
export const RUNNING = sql.lit("running") as unknown as "running";
const UNKNOWN = sql.lit("unknown") as unknown as "unknown";
const PENDING = sql.lit("pending") as unknown as "pending";

/** Every column but `history`, which grows with the operation and only `events` reads. */
export const ROW_COLUMNS = [
  "id",
  "tenant_id",
  "key",
  "key_label",
  "action",
  "args_hash",
  "args_json",
  "status",
  "attempt",
  "lease_owner",
  "lease_expires_at",
  "provider_reference",
  "result_json",
  "error_json",
  "resolution_json",
  "actor",
  "reason",
  "next_check_at",
  "checks",
  "alert_pending",
  "maybe_committed",
  "last_execution_at",
  "first_execution_at",
  "created_at",
  "updated_at",
  "completed_at",
  "expires_at",
] as const satisfies readonly (keyof Row)[];

/**
 * How many keys a store remembers having seen held, at least (see `Store.claim`): a retry usually
 * comes within minutes, and this bounds the memory (at most twice as many keys, about 150 bytes
 * each).
 */
const KNOWN_KEYS = 10_000;

/**
 * The keys seen most recently, the last `size` at least and twice as many at most, in two
 * generations: a key is added to the young one, and when it is full the old one is dropped and
 * the young one becomes old. A key found in the young generation costs one lookup, no write: an
 * exact least-recently-seen order (a Set's delete and add on every hit) cost a SQLite replay
 * about 5 % (issue 16).
 */
class RecentKeys {
  private young = new Set<string>();
  private old = new Set<string>();

  constructor(private readonly size: number) {}

  /** Whether `key` was seen among the recent ones; seen again now if so. */
  has(key: string): boolean {
    if (this.young.has(key)) return true;
    if (!this.old.has(key)) return false;
    this.add(key);
    return true;
  }

  /** Seen now. */
  add(key: string): void {
    if (this.young.has(key)) return;
    this.young.add(key);
    if (this.young.size < this.size) return;
    this.old = this.young;
    this.young = new Set();
  }
}

/** The columns of a claimed row that the database fills in (from its clock). */
const CLOCK_COLUMNS = [
  "lease_expires_at",
  "last_execution_at",
  "first_execution_at",
  "created_at",
  "updated_at",
] as const;

/**
 * What answers a duplicate of a settled operation (`replayOf`), and the action and args hash it
 * is checked against: the first of the peek's columns. A claim that reads first asks for these,
 * and for the peek only when the row is not settled (measured by hand on Postgres: 90 µs against 98-144 µs for
 * the peek, most of it pg reading each column of the answer).
 */
const OUTCOME_COLUMNS = [
  "id",
  "action",
  "status",
  "attempt",
  "args_hash",
  "result_json",
  "error_json",
  "resolution_json",
  "completed_at",
] as const;

/**
 * What a duplicate call reads: the outcome to replay, and everything a decision about an unsettled
 * row needs (policy.ts `Snapshot`), in one statement. Not the args: whether they are stored is
 * enough to decide, and a takeover returns them with the row it took.
 */
const PEEK_COLUMNS = [
  ...OUTCOME_COLUMNS,
  "reason",
  "lease_expires_at",
  "next_check_at",
  "checks",
  "maybe_committed",
  // When the last attempt's request ended (or may have): the daemon measures an unknown outcome's
  // age from it (policy.ts `pastEscalation`). One integer more: the peek's cost stays its own.
  "last_execution_at",
  // When the key was first sent: the provider's key retention, so the replay window, counts from it.
  "first_execution_at",
  "created_at",
] as const;

/** The peek's select list, in order (its rows may come back as arrays). */
const PEEK_NAMES = [...PEEK_COLUMNS, "has_args", "look_first", "db_now"] as const;

/** A settled operation as a duplicate reads it (see OUTCOME_COLUMNS). */
export type Outcome = Pick<Row, (typeof OUTCOME_COLUMNS)[number]> & { status: "succeeded" | "failed" };

/** Each outcome column's position in the read's select list (OUTCOME_COLUMNS). */
const AT = Object.fromEntries(OUTCOME_COLUMNS.map((name, i) => [name, i])) as Record<
  (typeof OUTCOME_COLUMNS)[number],
  number
>;

/**
 * The outcome read's row as an object: as the driver gave it, or from an array (in select-list
 * order) as one object literal. `rowObject`'s loop adds the fields one by one under names read
 * from a list: about 0.2 µs of a 6.5 µs SQLite replay (issue 16).
 */
function outcomeRow(row: unknown): Pick<Row, (typeof OUTCOME_COLUMNS)[number]> {
  if (!Array.isArray(row)) return row as Pick<Row, (typeof OUTCOME_COLUMNS)[number]>;
  return {
    id: row[AT.id],
    action: row[AT.action],
    status: row[AT.status],
    attempt: row[AT.attempt],
    args_hash: row[AT.args_hash],
    result_json: row[AT.result_json],
    error_json: row[AT.error_json],
    resolution_json: row[AT.resolution_json],
    completed_at: row[AT.completed_at],
  };
}

/**
 * Postgres claim-or-peek's select list, in order: whether the claim was granted, the times a fresh
 * claim's row takes from the database's clock, and for a key already held the rest of its peek in
 * one text column (`PACKED_PEEK`, a JSON array; null on a fresh claim, which needs none of it). A
 * fresh claim, the common case, was answered 22 columns, which pg describes, and reads the
 * description of, on every statement: by hand, that claim cost 1.3-1.4x the client CPU of this one
 * and about twice its time at 16 in flight on the local PostgreSQL 15 (issue 16).
 */
const CLAIM_OR_PEEK_NAMES = ["fresh", ...CLOCK_COLUMNS, "db_now", "peek"] as const;

/** The peek's columns besides the clock's (CLOCK_COLUMNS), packed in claim-or-peek's `peek`, in order. */
const PACKED_PEEK = [
  ...OUTCOME_COLUMNS,
  "reason",
  "next_check_at",
  "checks",
  "maybe_committed",
] as const satisfies readonly (typeof PEEK_COLUMNS)[number][];

/** The snapshot a duplicate call decides on (see `peek`), with the database time it was read at. */
export type Peek = Pick<Row, (typeof PEEK_COLUMNS)[number] | "look_first"> & { has_args: number; db_now: number };

/** Action types in one tenant (the daemon's claim filters). */
export interface TenantActions {
  readonly tenant: string;
  readonly actions: readonly string[];
}

/** Where an operation is: every write names all three (tenant scope, the unique key, the id). */
export interface Address {
  readonly tenant: string;
  readonly key: string;
  readonly id: string;
}

/**
 * A fresh claim's row: what we inserted (`insertRunning`) and what the database's clock filled
 * in, as one object literal. Not spreads (`{ ...inserted, ...clock, look_first, db_now }`, as it
 * was): in Node 20's V8 a literal that adds fields after spreading a large object costs
 * microseconds, not nanoseconds (measured alone: 4-15 µs, 50-80 µs with a second spread), and
 * this one was a tenth of a grouped call's CPU on SQLite (issue 16).
 */
function claimedRow(
  c: NewClaim,
  clock: Pick<Row, (typeof CLOCK_COLUMNS)[number]>,
  dbNow: number,
): Row & { db_now: number } {
  return {
    id: c.id,
    tenant_id: c.tenant,
    key: c.key,
    key_label: c.keyLabel,
    action: c.action,
    args_hash: c.argsHash,
    args_json: c.argsJson,
    status: "running",
    attempt: 1,
    lease_owner: c.owner,
    provider_reference: null,
    result_json: null,
    error_json: null,
    resolution_json: null,
    actor: c.actor,
    reason: "claimed",
    next_check_at: null,
    checks: 0,
    // Given args are executed right after the claim; lazy ones only once generated and stored.
    alert_pending: 0,
    maybe_committed: c.argsHash === null ? 0 : 1,
    completed_at: null,
    expires_at: null,
    lease_expires_at: clock.lease_expires_at,
    last_execution_at: clock.last_execution_at,
    first_execution_at: clock.first_execution_at,
    created_at: clock.created_at,
    updated_at: clock.updated_at,
    look_first: null,
    db_now: dbNow,
  };
}

/** An audit event as one JSON text, shaped as the trigger's (migration 0003); the database adds its time. */
function eventJson(
  row: Pick<Row, "status" | "provider_reference">,
  e: { to: Status; attempt: number; actor: string | null; reason: string; evidence?: string | undefined },
): string {
  return JSON.stringify({
    from: row.status,
    to: e.to,
    attempt: e.attempt,
    actor: e.actor,
    reason: storable(e.reason),
    ref: row.provider_reference,
    // Only a person's decision carries it: every other event keeps the trigger's shape.
    ...(e.evidence !== undefined && { evidence: storable(e.evidence) }),
  });
}

/** Half of a UTF-16 surrogate pair without its other half: no character, with no UTF-8 form. */
const LONE_SURROGATE = /[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/g;

/**
 * A reason as both databases store it, U+FFFD in place of what they cannot. It may carry a
 * provider's words (an error's message), and a reason cut to a length may end inside a pair.
 * Postgres refuses U+0000 in text and jsonb (22021), and a lone surrogate's JSON escape in jsonb
 * (22P02): the refused write read as an outage, retried for a lease, and left the row whose effect
 * happened running (helper-116). SQLite stored U+FFFD for a lone surrogate: the row then read
 * otherwise than written, and a lost answer's own write was taken for another's (helper-120).
 */
export function storable(reason: string): string {
  return reason.replaceAll("\0", "\uFFFD").replace(LONE_SURROGATE, "\uFFFD");
}

/** `look_first` as read: 1, or null (a pool we did not configure may read a SMALLINT otherwise). */
function lookFirstOf(value: unknown): 1 | null {
  return value === null || value === undefined || Number(value) !== 1 ? null : 1;
}

/**
 * The peek claim-or-peek read of a key already held: the clock's columns as read, the rest from
 * its JSON array (`PACKED_PEEK`, then has_args and look_first). JSON gives the integers as
 * numbers, as the pool's parsers do (BIGINT times included: below 2^53), and the text columns as
 * stored. The fields in the order `peek` gives them.
 */
function packedPeek(
  clock: Pick<Row, "lease_expires_at" | "last_execution_at" | "first_execution_at" | "created_at">,
  json: string,
  dbNow: number,
): Peek | undefined {
  const p = JSON.parse(json) as unknown[];
  // Never so from the statement that asked for it; the caller then reads the row on its own.
  if (!Array.isArray(p) || p.length !== PACKED_PEEK.length + 2) return undefined;
  return {
    id: p[0] as string,
    action: p[1] as string,
    status: p[2] as Status,
    attempt: p[3] as number,
    args_hash: p[4] as string | null,
    result_json: p[5] as string | null,
    error_json: p[6] as string | null,
    resolution_json: p[7] as string | null,
    completed_at: p[8] as number | null,
    reason: p[9] as string | null,
    lease_expires_at: clock.lease_expires_at,
    next_check_at: p[10] as number | null,
    checks: p[11] as number,
    maybe_committed: p[12] as number,
    last_execution_at: clock.last_execution_at,
    first_execution_at: clock.first_execution_at,
    created_at: clock.created_at,
    has_args: Number(p[13]),
    look_first: lookFirstOf(p[14]),
    db_now: dbNow,
  };
}

/**
 * Time-ordered ids: listing by id follows creation order. Within one process they strictly
 * increase, also within a millisecond (a sequence number follows the time); across processes
 * they are ordered to the millisecond, then by chance.
 */
let lastMs = 0;
let seq = 0;
function newOperationId(): string {
  const now = Date.now();
  seq = now > lastMs ? 0 : seq + 1;
  lastMs = Math.max(now, lastMs);
  const time = lastMs.toString(36).padStart(9, "0");
  const random = randomUUID(); // 12 hex digits of it: the 8 before its first dash and the 4 after
  return `op_${time}${seq.toString(36).padStart(4, "0")}${random.slice(0, 8)}${random.slice(9, 13)}`;
}

export class Store {
  private readonly hot: QueryCache<IdemDatabase>;

  /**
   * `groupsCommits`: the connection is the ledger's own SQLite connection with group commit
   * (sqlite-driver.ts), whose writes wait for shared commits (see `claim`).
   */
  constructor(
    readonly db: Kysely<IdemDatabase>,
    readonly dialect: DialectName,
    private readonly clock?: () => number,
    direct?: DirectExecutor,
    private readonly groupsCommits = false,
  ) {
    this.hot = new QueryCache(db, clock === undefined, direct, () => this.closed);
    this.local = clock ?? (() => performance.now());
  }

  /**
   * The local clock that lease deadlines are measured on: monotonic, or the test clock, so a test
   * that moves the database's time moves the deadlines with it.
   */
  readonly local: () => number;

  /** The database's clock as an SQL expression (or the injected test clock). */
  now(): RawBuilder<number> {
    if (this.clock) return sql<number>`${sql.lit(Math.round(this.clock()))}`;
    return this.dialect === "postgres"
      ? sql<number>`(extract(epoch from statement_timestamp()) * 1000)::bigint`
      : sql<number>`cast(unixepoch('subsec') * 1000 as integer)`;
  }

  /** This store's claims in flight (see `claim`). */
  private claiming = 0;

  /**
   * Keys this store has seen held by a row (see `claim`). By the key alone: it only chooses which
   * statement asks first, and every statement names the tenant, so a key seen in another tenant
   * (a hand-made key) costs that tenant a read first, never a wrong answer. Joining the tenant in
   * made a new string to hash on every replay.
   */
  private readonly known = new RecentKeys(KNOWN_KEYS);

  /**
   * Whether a change of status writes its audit event in its own statement: once migration 0010
   * is applied (the trigger then skips a statement that did). A ledger opened with `migrate:
   * false` before it leaves the events to the trigger until `admin.migrate()` applies it; written
   * by both, each move would be recorded twice.
   */
  movesWriteEvents = true;

  /**
   * Whether the ledger holds `look_first` (migration 0012): a ledger opened with `migrate: false`
   * before it reads NULL in its place and writes none, until `admin.migrate()` applies it. No
   * person's retry can have set it there (`admin.retry` refuses to reopen a row that may have
   * committed without it), and a process of the release before 0012 refuses a ledger past it.
   */
  looksFirst = true;

  /**
   * Whether the ledger holds `rerun_attempt` (migration 0013): a ledger opened with `migrate:
   * false` before it reads NULL in its place and writes none, until `admin.migrate()` applies it
   * (a late answer there is told of a rerun as before 0013: not at all).
   */
  marksReruns = true;

  /**
   * Set by the ledger's close as it stops waiting for the calls in flight and ends the connection
   * (`markClosed`): a statement of a call still in flight fails then, and is said as the close it
   * met (`LedgerUnavailableError.closed`), not as an outage of the database to be retried.
   */
  closed = false;

  /** The leases held now (lease.ts), told when the close stops waiting (`markClosed`). */
  private readonly closeListeners = new Set<() => void>();

  /**
   * Tells `listener` once the close stops waiting for the calls in flight (`markClosed`), at once
   * if it did already; answers what removes it.
   */
  whenClosed(listener: () => void): () => void {
    if (this.closed) {
      listener();
      return () => {};
    }
    this.closeListeners.add(listener);
    return () => this.closeListeners.delete(listener);
  }

  /**
   * The close stopped waiting for the calls in flight: from now on their statements meet the
   * close (`closed`), and the actions still running hear it on their `op.signal` at once (lease.ts),
   * not when their leases would have run out: no heartbeat renews those leases any more, and an
   * action that honours its signal must not send a request after the ledger said it closed.
   */
  markClosed(): void {
    this.closed = true;
    const listeners = [...this.closeListeners];
    this.closeListeners.clear();
    // Each on its own: one that throws must not leave the actions after it running unaborted, nor
    // the close (which destroys the connection right after) unfinished. Nothing here can handle
    // its error: the call it belongs to ends on its own statements, which meet the close.
    for (const listener of listeners) {
      try {
        listener();
      } catch {}
    }
  }

  /**
   * What a call still in flight meets once the ledger closed (`closed`): its statements, and its
   * action's `op.signal` (lease.ts), said as the close.
   */
  closedError(operationId: string | undefined, cause?: unknown): LedgerUnavailableError {
    return new LedgerUnavailableError(
      "the ledger was closed while this call was in flight (its close stopped waiting for it): its outcome is not recorded and its lease is no longer renewed; the operation stays as the call's last write left it (running under that lease while its request was out), settled by the replay policy once the lease ends",
      operationId,
      { ...(cause !== undefined && { cause }), closed: true },
    );
  }

  /** `look_first` for a select list, or NULL in its place before migration 0012 (`looksFirst`). */
  lookFirst(): AliasedRawBuilder<number | null, "look_first"> {
    return (this.looksFirst ? sql<number | null>`look_first` : sql<number | null>`null`).as("look_first");
  }

  /**
   * Claims a key: inserts a running row for it (attempt 1, our lease), or returns a peek at the
   * row that already holds it, with the database time to judge its lease.
   *
   * A key this store has seen held by a row (at least the last KNOWN_KEYS it claimed or found) is a
   * retry: it is read first, and a duplicate costs one plain read (on Postgres, a replay in 0.9x of
   * a raw SELECT's time where the claim statement took 0.7x, measured by hand). The read is the
   * database's answer, not a cache: a row pruned meanwhile reads as absent, and the key is claimed.
   *
   * Any other key on Postgres is inserted first, so a fresh key costs one round trip. On SQLite,
   * where a read costs microseconds, a claim reads first, so a duplicate alone never takes the
   * write lock. But with group commit, while other claims are in flight, the insert goes first: it
   * waits for the next shared commit like theirs, and a fresh key (the common case under load)
   * saves the read (64 in flight: 3-18 % more calls per second). A duplicate among them reads the
   * row once its insert did nothing, or failed: a write lock held elsewhere past the busy timeout
   * must not fail a call a read answers.
   */
  async claim(
    row: Omit<NewClaim, "id">,
  ): Promise<{ fresh: true; row: Row & { db_now: number } } | { fresh: false; row: Peek | Outcome } | undefined> {
    // Nothing is sent once the close stopped waiting: said as a claim not written, not as the
    // close's word on a call in flight (`closedError`), of an operation this call never had.
    if (this.closed) throw claimNotWritten();
    const known = this.known.has(row.key); // kept while in flight: duplicates of it at once read first too
    const insertFirst = !known && (this.dialect === "postgres" || (this.groupsCommits && this.claiming > 0));
    this.claiming += 1;
    try {
      const out = await this.claimRow(row, insertFirst);
      if (out) this.known.add(row.key);
      return out;
    } finally {
      this.claiming -= 1;
    }
  }

  /**
   * A retry of a settled operation, answered at once: the outcome of the row holding a key this
   * store has seen held (see `claim`), if the database answers the read without waiting (SQLite's
   * direct executor, no lock met) and the row is settled. Otherwise undefined, nothing changed:
   * `claim` reads (or claims) as ever, and says how the database failed if it did. No promise is
   * made on the way: a replay's awaits cost more than the JavaScript it runs (issue 16).
   */
  settledNow(tenant: string, key: string): Outcome | undefined {
    if (!this.known.has(key)) return undefined; // and seen again now
    let rows: unknown[] | undefined;
    try {
      rows = this.hot.runNow<unknown>("outcome", { tenant, key }, true)?.rows;
    } catch {
      return undefined; // claim reads again and reports it
    }
    if (rows?.[0] === undefined) return undefined;
    const row = outcomeRow(rows[0]);
    if (row.status !== "succeeded" && row.status !== "failed") return undefined;
    return row as Outcome;
  }

  private async claimRow(
    row: Omit<NewClaim, "id">,
    insertFirst: boolean,
  ): Promise<{ fresh: true; row: Row & { db_now: number } } | { fresh: false; row: Peek | Outcome } | undefined> {
    if (!insertFirst) {
      const existing = await this.outcomeOrPeek(row.tenant, row.key);
      if (existing) return { fresh: false, row: existing };
    }
    // Field by field, not `{ ...row, id, retentionMs }`: a field added after a spread costs
    // microseconds in Node 20's V8 (see claimedRow).
    const claim: NewClaim = {
      id: newOperationId(),
      tenant: row.tenant,
      key: row.key,
      keyLabel: row.keyLabel,
      action: row.action,
      argsHash: row.argsHash,
      argsJson: row.argsJson,
      owner: row.owner,
      leaseMs: row.leaseMs,
      actor: row.actor,
      retentionMs: row.retentionMs ?? KEEP,
    };
    const slotted = (v: (name: string) => any) =>
      Object.fromEntries(Object.keys(claim).map((k) => [k, v(k)])) as NewClaim;
    if (this.dialect === "postgres") return await this.claimOrPeek(claim, slotted);
    let inserted: (Pick<Row, (typeof CLOCK_COLUMNS)[number]> & { db_now: number }) | undefined;
    try {
      if (this.closed) throw claimNotWritten(); // closed since the read: the insert is not sent
      // Only what the database computed comes back (its clock); the rest is what we inserted.
      const { rows } = await this.guard(
        undefined,
        this.hot.run(
          "claim",
          (v) => this.insertRunning(slotted(v)).returning(CLOCK_COLUMNS).returning(this.now().as("db_now")),
          claim as unknown as Record<string, unknown>,
          false,
          true, // refused, not committed, if it still waits as the close stops waiting (SQLite)
        ),
      );
      inserted = rows[0];
    } catch (error) {
      // Refused at the close, unsent or still waiting (sqlite-driver.ts `close`): said so. A peek
      // now would meet the close too, and say it as the close's word on a call in flight.
      if (error instanceof LedgerUnavailableError && error.unclaimed) throw error;
      // Not granted (nothing of ours was committed): a duplicate is still answered by its row.
      const existing = insertFirst ? await this.peek(row.tenant, row.key) : undefined;
      if (existing) return { fresh: false, row: existing };
      throw error;
    }
    if (inserted) return { fresh: true, row: claimedRow(claim, inserted, Number(inserted.db_now)) };
    const existing = await this.peek(row.tenant, row.key);
    return existing && { fresh: false, row: existing };
  }

  /**
   * Postgres: the claim and, when the key is taken, the peek at its row in one round trip (a
   * duplicate, the common case of a retrying agent, costs one statement, not two). Since migration
   * 0005 no trigger runs for the insert that finds the key taken, so that is one unique-index
   * probe. The peek reads the statement's snapshot: a row a racer committed after it began is not
   * in it, and then (rarely) the peek is read again on its own.
   *
   * Measured and dropped: peeking first, in a statement of its own (fresh claims paid the extra
   * round trip, 10-30%), and reading the row first in a CTE, inserting only when absent (replays
   * 0.25x to 0.31-0.38x of a raw SELECT, but fresh claims 30-60% slower with commits not
   * waiting for fsync: every claim then reads the key, and a connection that planned that read
   * on a new, empty table walks the tenant's rows through (tenant_id, id); see plans.test.ts).
   */
  private async claimOrPeek(
    claim: NewClaim,
    slotted: (v: (name: string) => any) => NewClaim,
  ): Promise<{ fresh: true; row: Row & { db_now: number } } | { fresh: false; row: Peek } | undefined> {
    type Out = Pick<Row, (typeof CLOCK_COLUMNS)[number]> & { fresh: number; db_now: number; peek: string | null };
    const { rows } = await this.guard(
      undefined,
      this.hot.run<Out>(
        `claim-or-peek:${this.looksFirst}`,
        (v) => {
          const now = this.now();
          // The rest of the peek, as one JSON array (see CLAIM_OR_PEEK_NAMES), read by `packedPeek`.
          const packed = sql<string>`cast(json_build_array(${sql.join(PACKED_PEEK.map((c) => sql.ref(c)))}, (case when args_json is null then 0 else 1 end), ${this.looksFirst ? sql`look_first` : sql`null`}) as text)`;
          const inserted = this.insertRunning(slotted(v)).returning(CLOCK_COLUMNS).returning(now.as("db_now"));
          return this.db
            .with("ins", () => inserted)
            .selectFrom("ins")
            .select([
              sql<number>`1`.as("fresh"),
              ...CLOCK_COLUMNS.map((c) => `ins.${c}` as const),
              "ins.db_now",
              sql<string | null>`cast(null as text)`.as("peek"), // a fresh claim: what we inserted
            ])
            .unionAll(
              this.db
                .selectFrom("idem_operations")
                .select([sql<number>`0`.as("fresh"), ...CLOCK_COLUMNS, now.as("db_now"), packed.as("peek")])
                .where("tenant_id", "=", v("tenant"))
                .where("key", "=", v("key"))
                .where(sql<boolean>`not exists (select 1 from ins)`) as any,
            ) as any;
        },
        claim as unknown as Record<string, unknown>,
        true,
        true, // cancelled on the server if it still waits for a lock as the close ends the pool
      ),
      true,
    );
    const out = rows[0] === undefined ? undefined : rowObject<Out>(CLAIM_OR_PEEK_NAMES, rows[0]);
    const dbNow = Number(out?.db_now);
    // Only what the database computed comes back for a fresh claim (its clock); the rest is what we inserted.
    if (out?.fresh === 1) return { fresh: true, row: claimedRow(claim, out, dbNow) };
    const held = out?.peek == null ? undefined : packedPeek(out, out.peek, dbNow);
    if (held) return { fresh: false, row: held };
    const existing = await this.peek(claim.tenant, claim.key);
    return existing && { fresh: false, row: existing };
  }

  /** The claim's insert. What is the same for every claim is written as literals: the statement
   * is sent for every call, duplicates included, and binds only what varies. */
  private insertRunning(row: NewClaim) {
    const now = this.now();
    const NULL = sql.lit(null);
    return this.db
      .insertInto("idem_operations")
      .values({
        id: row.id,
        tenant_id: row.tenant,
        key: row.key,
        key_label: row.keyLabel,
        action: row.action,
        args_hash: row.argsHash,
        args_json: row.argsJson,
        lease_owner: row.owner,
        actor: row.actor,
        status: RUNNING,
        attempt: sql.lit(1),
        provider_reference: NULL,
        result_json: NULL,
        error_json: NULL,
        resolution_json: NULL,
        reason: sql.lit("claimed"),
        next_check_at: NULL,
        checks: sql.lit(0),
        alert_pending: sql.lit(0),
        completed_at: NULL,
        expires_at: NULL,
        // From the bound args hash, not from claimedRow's: this statement is compiled once with slots for its values.
        maybe_committed: sql<number>`case when cast(${row.argsHash} as text) is null then 0 else 1 end`,
        lease_expires_at: sql<number>`${now} + ${row.leaseMs}`,
        last_execution_at: now,
        // The key's first send (a claim with lazy args sends later: an earlier time, the safe side).
        first_execution_at: now,
        created_at: now,
        updated_at: now,
        // The first audit event, in the claim itself (migration 0005); the UPDATE trigger adds the rest.
        history: this.firstEvent(row.actor, now) as any,
        retention_ms: row.retentionMs,
      })
      .onConflict((oc) => oc.columns(["tenant_id", "key"]).doNothing());
  }

  /** The history of a new claim: its one event, shaped as the trigger shapes the others (0003). */
  private firstEvent(actor: string | null, now: RawBuilder<number>) {
    return this.dialect === "postgres"
      ? sql`jsonb_build_array(jsonb_build_object('from', null, 'to', 'running', 'attempt', 1, 'actor', cast(${actor} as text), 'reason', 'claimed', 'ref', null, 'at', ${now}))`
      : sql`json_array(json_object('from', null, 'to', 'running', 'attempt', 1, 'actor', ${actor}, 'reason', 'claimed', 'ref', null, 'at', ${now}))`;
  }

  /**
   * What a duplicate call needs to know about the row holding a key, with the database time to
   * judge its lease. Only these columns: materialising the whole row costs three times the read.
   */
  async peek(tenant: string, key: string): Promise<Peek | undefined> {
    const { rows } = await this.guard(
      undefined,
      this.hot.run(
        `peek:${this.looksFirst}`,
        (v) =>
          this.db
            .selectFrom("idem_operations")
            .select(PEEK_COLUMNS)
            .select(sql<number>`(case when args_json is null then 0 else 1 end)`.as("has_args"))
            .select(this.lookFirst())
            .select(this.now().as("db_now"))
            .where("tenant_id", "=", v("tenant"))
            .where("key", "=", v("key")),
        { tenant, key },
        true,
      ),
    );
    if (rows[0] === undefined) return undefined;
    // A row of its own (from an array, or the driver's): set in place, copying it costs a replay more.
    const row = rowObject<Peek>(PEEK_NAMES, rows[0]);
    row.has_args = Number(row.has_args);
    row.look_first = lookFirstOf(row.look_first);
    row.db_now = Number(row.db_now);
    return row;
  }

  /** A settled operation's outcome, or the peek at an unsettled one (two reads, then), or nothing. */
  private async outcomeOrPeek(tenant: string, key: string): Promise<Peek | Outcome | undefined> {
    const { rows } = await this.guard(
      undefined,
      this.hot.run(
        "outcome",
        (v) =>
          this.db
            .selectFrom("idem_operations")
            .select(OUTCOME_COLUMNS)
            .where("tenant_id", "=", v("tenant"))
            .where("key", "=", v("key")),
        { tenant, key },
        true,
      ),
    );
    if (rows[0] === undefined) return undefined;
    const row = outcomeRow(rows[0]);
    if (row.status === "succeeded" || row.status === "failed") return row as Outcome;
    return this.peek(tenant, key); // not settled: everything a decision needs, read again
  }

  async findById(
    tenant: string,
    id: string,
  ): Promise<(Row & { db_now: number; rerun_attempt: number | null }) | undefined> {
    const row = await this.guard(
      id,
      this.db
        .selectFrom("idem_operations")
        .select(ROW_COLUMNS)
        .select(this.lookFirst())
        .select((this.marksReruns ? sql<number | null>`rerun_attempt` : sql<number | null>`null`).as("rerun_attempt"))
        .select(this.now().as("db_now"))
        .where("tenant_id", "=", tenant)
        .where("id", "=", id)
        .executeTakeFirst(),
    );
    return (
      row && {
        ...row,
        look_first: lookFirstOf(row.look_first),
        rerun_attempt: row.rerun_attempt === null ? null : Number(row.rerun_attempt),
        db_now: Number(row.db_now),
      }
    );
  }

  /**
   * Takes the operation over for a new attempt: status running, attempt + 1, our lease. Succeeds
   * for one caller only, and only if the row is still as the decision saw it: `from`'s status at
   * `from`'s attempt, that status one a takeover may start from (running with an expired lease by
   * the database clock, unknown, pending), never a re-read row's. `execute`: this attempt will
   * send the request, so from now on it may have committed. `before`: a replay with the key, which
   * must start before then (the provider's retention, counted from `from`'s first send), and only
   * while that first send is as read. A takeover that executes a `pending` row marks it a rerun
   * (`rerun_attempt`, 0013); `replaces` is the mark it replaces (`rerunMark`, read first), written
   * on only while unchanged and returned as `rerun_before`: a rerun that ends having sent nothing
   * puts it back (`TransitionPatch.rerunBefore`). Undefined on any other takeover, and before 0013.
   */
  async takeOver(
    at: Address,
    from: Pick<Row, "status" | "attempt" | "first_execution_at">,
    to: {
      owner: string;
      leaseMs: number;
      actor: string | null;
      reason: string;
      execute: boolean;
      before?: number | undefined;
      replaces?: { rerun_attempt: number | null } | undefined;
    },
  ): Promise<(Row & { db_now: number }) | undefined> {
    const now = this.now();
    let q = this.db
      .updateTable("idem_operations")
      .set({
        status: "running",
        attempt: from.attempt + 1,
        lease_owner: to.owner,
        lease_expires_at: sql<number>`${now} + ${to.leaseMs}`,
        actor: to.actor,
        reason: storable(to.reason),
        next_check_at: null,
        updated_at: now,
        // Lazy args not generated yet (no args hash): nothing can be sent until they are stored.
        ...(to.execute
          ? {
              // It runs now: a person's reopening is answered (looked up first, or needing no look).
              ...(this.looksFirst && { look_first: null }),
              // Run again from known not done: its request may be an effect of its own (0013).
              ...(this.marksReruns && {
                rerun_attempt: sql<
                  number | null
                >`case when status = 'pending' then ${from.attempt + 1} else rerun_attempt end`,
              }),
              last_execution_at: now,
              maybe_committed: sql<number>`case when args_hash is null then maybe_committed else 1 end`,
              // The key's first send. Known not done (pending, or a dead attempt that never sent):
              // no effect exists whose key the provider could be holding for us, so an effect can
              // only come from a request from now on, and its key's retention starts no earlier.
              // May have committed (a replay): the first send counted so far (creation on a row
              // from before migration 0009: earlier, the safe side), whatever this attempt sends.
              // So may a person's reopening of one (look_first): their word is no proof that the
              // provider forgot a key the earlier attempt sent.
              first_execution_at: this.looksFirst
                ? sql<number>`case when maybe_committed = 1 or look_first = 1 then coalesce(first_execution_at, created_at) else ${now} end`
                : sql<number>`case when maybe_committed = 1 then coalesce(first_execution_at, created_at) else ${now} end`,
            }
          : from.status === "running" && {
              // A dead worker may have been sending until its lease ran out: every later check
              // counts its windows from then (the lease itself is replaced here).
              last_execution_at: sql<number>`case when lease_expires_at > coalesce(last_execution_at, created_at) then lease_expires_at else coalesce(last_execution_at, created_at) end`,
            }),
      })
      .where("tenant_id", "=", at.tenant)
      .where("key", "=", at.key)
      .where("id", "=", at.id)
      .where("status", "=", from.status)
      .where("status", "in", TAKEOVER_FROM)
      .where("attempt", "=", from.attempt)
      .where((eb) => eb.or([eb("status", "<>", "running"), eb("lease_expires_at", "<=", now)]));
    // A replay's window (the provider's key retention) is checked at the write, by the database
    // clock, on the first send it was counted from: an earlier attempt's late end may have moved it
    // back since the snapshot (`recordEvent`), and then the row is decided on again.
    // Written on only while the mark read is still there: it is the one this takeover replaces.
    const before = to.execute && from.status === "pending" && this.marksReruns ? to.replaces?.rerun_attempt : undefined;
    if (before !== undefined)
      q = before === null ? q.where("rerun_attempt", "is", null) : q.where("rerun_attempt", "=", before);
    if (to.before !== undefined) {
      q = q.where(now, "<", to.before);
      q =
        from.first_execution_at === null
          ? q.where("first_execution_at", "is", null)
          : q.where("first_execution_at", "=", from.first_execution_at);
    }
    const row = await this.guard(
      at.id,
      q.returning(ROW_COLUMNS).returning(this.lookFirst()).returning(now.as("db_now")).executeTakeFirst(),
    );
    return (
      row && {
        ...row,
        look_first: lookFirstOf(row.look_first),
        db_now: Number(row.db_now),
        ...(before !== undefined && { rerun_before: before }),
      }
    );
  }

  /**
   * The rerun mark (`rerun_attempt`, 0013) that a takeover running `from`, a `pending` row, again
   * replaces (`takeOver`'s `replaces`). Read first, and kept in memory only, so that a rerun that
   * sent nothing puts it back: as it ends, or given back when its takeover's answer was lost
   * (`giveBack`). A process killed before then leaves its own mark (a late answer hears of a
   * possible second effect, never of none). Undefined when the row changed since `from` was read;
   * no mark before 0013 (nothing is marked there).
   */
  async rerunMark(
    at: Address,
    from: Pick<Row, "status" | "attempt">,
  ): Promise<{ rerun_attempt: number | null } | undefined> {
    if (!this.marksReruns) return { rerun_attempt: null };
    const row = await this.guard(
      at.id,
      this.db
        .selectFrom("idem_operations")
        .select(sql<number | null>`rerun_attempt`.as("rerun_attempt"))
        .where("tenant_id", "=", at.tenant)
        .where("key", "=", at.key)
        .where("id", "=", at.id)
        .where("status", "=", from.status)
        .where("attempt", "=", from.attempt)
        .executeTakeFirst(),
    );
    return row && { rerun_attempt: row.rerun_attempt === null ? null : Number(row.rerun_attempt) };
  }

  /**
   * A running attempt whose lease expired before it executed (its lazy args were never stored):
   * known not done, so back to `pending` for a caller that has the args. Conditioned like a takeover.
   */
  async release(at: Address, from: Pick<Row, "attempt">, actor: string | null, reason: string): Promise<boolean> {
    const now = this.now();
    const res = await this.guard(
      at.id,
      this.db
        .updateTable("idem_operations")
        .set({
          status: "pending",
          lease_owner: null,
          lease_expires_at: null,
          next_check_at: null,
          actor,
          reason: storable(reason),
          updated_at: now,
        })
        .where("tenant_id", "=", at.tenant)
        .where("key", "=", at.key)
        .where("id", "=", at.id)
        .where("status", "=", "running")
        .where("attempt", "=", from.attempt)
        .where("maybe_committed", "=", 0)
        .where("lease_expires_at", "<=", now)
        .executeTakeFirst(),
    );
    return Number(res.numUpdatedRows) === 1;
  }

  /**
   * Gives back a row our claim or takeover may have committed though its answer was lost: this
   * call sent nothing under it. `owner` is the call's own (unique per call) and `attempt` the one
   * it would have held, so only a row that statement wrote matches. It goes back to what the call
   * found (a fresh claim: pending), due for the daemon at once.
   *
   * Unless an earlier attempt's late end was recorded while the row was held (fenced): that moves
   * `last_execution_at` past the takeover's `updated_at` (an executing takeover wrote them equal;
   * one that does not execute left it before). The earlier request may have committed, so a row
   * found `pending` (known not done) goes back `unknown`, to be looked up, never sent again.
   * A rerun (a takeover that ran a `pending` row again) puts back the mark it replaced
   * (`rerunBefore`): it sent nothing, as one that ends so puts it back (`TransitionPatch`).
   */
  async giveBack(
    at: Pick<Address, "tenant" | "key">,
    owner: string,
    attempt: number,
    to: {
      status: "pending" | "unknown";
      maybeCommitted: 0 | 1;
      executed: boolean;
      actor: string | null;
      reason: string;
      rerunBefore?: number | null | undefined;
    },
  ): Promise<boolean> {
    const now = this.now();
    const lateEnd = to.executed ? sql`last_execution_at > updated_at` : sql`last_execution_at >= updated_at`;
    const res = await this.guard(
      undefined,
      this.db
        .updateTable("idem_operations")
        .set({
          status:
            to.status === "pending" ? sql<Status>`case when ${lateEnd} then 'unknown' else 'pending' end` : to.status,
          maybe_committed:
            to.status === "pending"
              ? sql<number>`case when ${lateEnd} then 1 else ${to.maybeCommitted} end`
              : to.maybeCommitted,
          // Unknown after all: the row's checks were tries of work known not done, none of this outcome.
          ...(to.status === "pending" && { checks: sql<number>`case when ${lateEnd} then 0 else checks end` }),
          // And reconciled as such: a person's retry (look_first) is no longer what it waits on.
          ...(to.status === "pending" &&
            this.looksFirst && { look_first: sql<number | null>`case when ${lateEnd} then null else look_first end` }),
          ...(to.rerunBefore !== undefined &&
            this.marksReruns && {
              rerun_attempt: sql<
                number | null
              >`case when rerun_attempt = ${attempt} then ${to.rerunBefore} else rerun_attempt end`,
            }),
          lease_owner: null,
          lease_expires_at: null,
          next_check_at: now,
          actor: to.actor,
          reason: storable(to.reason),
          updated_at: now,
        })
        .where("tenant_id", "=", at.tenant)
        .where("key", "=", at.key)
        .where("status", "=", "running")
        .where("attempt", "=", attempt)
        .where("lease_owner", "=", owner)
        .executeTakeFirst(),
    );
    return Number(res.numUpdatedRows) === 1;
  }

  /** Extends the lease; false when the lease was lost (another attempt took over). */
  async heartbeat(row: Row, leaseMs: number): Promise<boolean> {
    const now = this.now();
    const res = await this.guard(
      row.id,
      this.db
        .updateTable("idem_operations")
        .set({ lease_expires_at: sql<number>`${now} + ${leaseMs}` })
        .where("tenant_id", "=", row.tenant_id)
        .where("key", "=", row.key)
        .where("id", "=", row.id)
        .where("status", "=", "running")
        .where("attempt", "=", row.attempt)
        .executeTakeFirst(),
    );
    return Number(res.numUpdatedRows) === 1;
  }

  /** Sets fields on our running attempt without a transition (args, provider reference). */
  async patchRunning(
    row: Row,
    patch: Partial<Pick<Row, "args_hash" | "args_json" | "provider_reference">>,
  ): Promise<boolean> {
    const res = await this.guard(
      row.id,
      this.db
        .updateTable("idem_operations")
        // Args are stored right before the first execution: from here on it may have committed.
        // Not a transition: updated_at stays the attempt's start (stuck() measures from it).
        .set({ ...patch, ...(patch.args_json !== undefined && { maybe_committed: 1 }) })
        .where("tenant_id", "=", row.tenant_id)
        .where("key", "=", row.key)
        .where("id", "=", row.id)
        .where("status", "=", "running")
        .where("attempt", "=", row.attempt)
        .executeTakeFirst(),
    );
    return Number(res.numUpdatedRows) === 1;
  }

  /**
   * Moves the row from `row.status` at `row.attempt` to `to`. Returns the new row, or undefined
   * when another attempt or a person changed it first (the fence).
   */
  async transition(row: Row, to: Status, patch: TransitionPatch): Promise<Row | undefined> {
    const moved = (await this.update(row, to, patch, true)).rows[0] as Row | undefined;
    return moved && { ...moved, look_first: lookFirstOf(moved.look_first) };
  }

  /** `transition` for the runner, which needs to know only that it won: nothing read back. */
  async move(
    row: Row,
    to: Status,
    patch: TransitionPatch,
  ): Promise<Pick<Row, "id" | "attempt" | "status"> | undefined> {
    const res = await this.update(row, to, patch, false);
    return Number(res.numAffectedRows) === 1 ? { id: row.id, attempt: row.attempt, status: to } : undefined;
  }

  private async update(row: Row, to: Status, patch: TransitionPatch, returning: boolean) {
    const done = patch.completed === true;
    const keepLease = to === "running";
    // Every move writes its own audit event: a change of status as the trigger would (migration
    // 0010), one that keeps it (a proof or an alert added to a row a person is deciding) as
    // `recordEvent` does.
    const self = row.status === to;
    const inline = this.movesWriteEvents;
    const values: Record<string, unknown> = {
      // pending is "known not done" (the database refuses maybe_committed = 1 there); unknown is
      // "may have committed": the store sets the flag so no caller can forget it.
      maybe: to === "pending" ? 0 : to === "unknown" ? 1 : undefined,
      id: row.id,
      tenant: row.tenant_id,
      key: row.key,
      from: row.status,
      attempt: row.attempt,
      to,
      actor: patch.actor,
      reason: storable(patch.reason),
      lease_owner: keepLease ? row.lease_owner : null,
      lease_expires_at: keepLease ? row.lease_expires_at : null,
      result_json: patch.result_json,
      error_json: patch.error_json,
      provider_reference: patch.provider_reference,
      resolution_json: patch.resolution_json,
      checkAfterMs: patch.checkAfterMs == null ? null : Math.round(patch.checkAfterMs),
      checks: patch.checks,
      retentionMs: patch.retentionMs,
      alert: patch.alert ? 1 : 0,
      seenUpdatedAt: patch.unchangedSince?.updatedAt,
      seenChecks: patch.unchangedSince?.checks,
      seenExecution: patch.noExecutionSince,
      firstSentAt: patch.firstSentAt,
      lookFirst: patch.lookFirst === undefined ? undefined : patch.lookFirst ? 1 : null,
      evidence: patch.evidence === undefined ? undefined : storable(patch.evidence),
      rerunBefore: patch.rerunBefore,
      event: self
        ? eventJson(row, {
            to,
            attempt: row.attempt,
            actor: patch.actor,
            reason: patch.reason,
            evidence: patch.evidence,
          })
        : undefined,
    };
    // The SET list depends on which fields the patch carries; each shape compiles once.
    const has = (k: keyof TransitionPatch) => patch[k] !== undefined;
    const unmarks = has("rerunBefore") && this.marksReruns;
    const shape =
      `transition:${["result_json", "error_json", "provider_reference", "resolution_json", "checkAfterMs", "checks", "alert", "firstSentAt", "lookFirst"].filter((k) => has(k as keyof TransitionPatch)).join(",")}` +
      `:${done}:${patch.checkAfterMs === null}:${patch.executionEnded === true}:${returning}:${has("unchangedSince")}:${patch.reopened === true}` +
      `:${patch.noExecutionSince === undefined ? "" : patch.noExecutionSince === null ? "null" : "at"}:${self}:${inline}:${has("evidence")}:${this.looksFirst}:${unmarks}`;
    return this.guard(
      row.id,
      this.hot.run(
        `${shape}:${to}`,
        (v) => {
          const now = this.now();
          // One expression for the column and the event's time: a test clock is read once.
          const updatedAt = this.later("updated_at");
          const q = this.db
            .updateTable("idem_operations")
            .set({
              status: v("to"),
              actor: v("actor"),
              reason: v("reason"),
              // Strictly increasing, also within a millisecond: it is the version a person's
              // decision (`seen`) and an alert's acknowledgement name, so two transitions must
              // never share it (measured: no cost a guarded call shows, see the changeset).
              updated_at: updatedAt,
              lease_owner: v("lease_owner"),
              lease_expires_at: v("lease_expires_at"),
              ...(has("result_json") && { result_json: v("result_json") }),
              ...(has("error_json") && { error_json: v("error_json") }),
              ...(has("provider_reference") && { provider_reference: v("provider_reference") }),
              ...(has("resolution_json") && { resolution_json: v("resolution_json") }),
              ...(has("checkAfterMs") && {
                next_check_at: patch.checkAfterMs === null ? null : sql<number>`${now} + ${v("checkAfterMs")}`,
              }),
              ...(has("checks") && { checks: v("checks") }),
              ...(has("alert") && { alert_pending: v("alert") }),
              ...(done && { completed_at: now }),
              ...(patch.reopened && { completed_at: null, expires_at: null, resolution_json: null }),
              // The claim's retention, or for a row claimed before 0007 the completer's (null: kept).
              ...(done && {
                expires_at: sql<number>`case when retention_ms is null then ${now} + ${v("retentionMs")} when retention_ms < 0 then null else ${now} + retention_ms end`,
              }),
              ...(patch.executionEnded && { last_execution_at: this.later("last_execution_at") }),
              ...(patch.executionEnded && has("firstSentAt") && { first_execution_at: this.earlier(v("firstSentAt")) }),
              ...((to === "pending" || to === "unknown") && { maybe_committed: v("maybe") }),
              // A person's retry no lookup has answered yet (look_first), sent to a person again
              // (its looks escalated): it may still have committed, so a retry of it looks first again.
              ...(to === "needs_review" &&
                this.looksFirst && {
                  maybe_committed: sql<number>`case when look_first = 1 then 1 else maybe_committed end`,
                }),
              // A rerun that sent nothing gives back the mark its takeover replaced (0013), only its own.
              ...(unmarks && {
                rerun_attempt: sql<
                  number | null
                >`case when rerun_attempt = attempt then ${v("rerunBefore")} else rerun_attempt end`,
              }),
              ...(this.looksFirst &&
                (has("lookFirst")
                  ? { look_first: v("lookFirst") }
                  : to !== "pending" && to !== "running" && { look_first: null })),
              // Its audit event, in this statement (migration 0010: the trigger writes none then).
              ...(self
                ? this.appended(v("event"))
                : inline &&
                  this.appendEvent(this.transitionEvent(v, has("provider_reference"), has("evidence"), updatedAt))),
            })
            .where("tenant_id", "=", v("tenant"))
            .where("key", "=", v("key"))
            .where("id", "=", v("id"))
            .where("status", "=", v("from"))
            .where("attempt", "=", v("attempt"));
          const seen = has("unchangedSince")
            ? q.where("updated_at", "=", v("seenUpdatedAt")).where("checks", "=", v("seenChecks"))
            : q;
          const fenced =
            patch.noExecutionSince === undefined
              ? seen
              : patch.noExecutionSince === null
                ? seen.where("last_execution_at", "is", null)
                : seen.where("last_execution_at", "=", v("seenExecution"));
          return returning ? fenced.returning(ROW_COLUMNS).returning(this.lookFirst()) : fenced;
        },
        values,
      ),
    );
  }

  /**
   * Appends an event that did not change the row (a fenced-off completion) to its history. Returns
   * the row's version after it (`updated_at`, which an ended execution moves), or undefined when
   * the row was not as `unchanged` asked.
   */
  async recordEvent(
    row: Row,
    e: {
      attempt: number;
      actor: string | null;
      reason: string;
      to: Status;
      executionEnded?: boolean;
      /** With `executionEnded`: when the ended attempt counted its key's first send from (see `TransitionPatch.firstSentAt`). */
      firstSentAt?: number;
      /** Only if the row is still as `row` was read (status, attempt, updated_at): undefined otherwise. */
      unchanged?: boolean;
    },
  ): Promise<{ updatedAt: number } | undefined> {
    const json = eventJson(row, e);
    const res = await this.guard(
      row.id,
      this.db
        .updateTable("idem_operations")
        .set({
          ...this.appended(json),
          // A fenced attempt's late answer: its request was out until now, so a lookup that read
          // the provider before it proves nothing (reconcile's move to pending is conditioned on it),
          // nor does a person's view of a row no one holds (their decision's `seen` compares
          // updated_at, so it moves even within the same millisecond). A running row's updated_at
          // stays its attempt's start (stuck() reads it).
          // Both move even within the same millisecond (a write conditioned on them must see it).
          ...(e.executionEnded && {
            last_execution_at: this.later("last_execution_at"),
            updated_at: sql<number>`case when status = 'running' then updated_at else ${this.later("updated_at")} end`,
            ...(e.firstSentAt !== undefined && { first_execution_at: this.earlier(e.firstSentAt) }),
          }),
        })
        .where("tenant_id", "=", row.tenant_id)
        .where("key", "=", row.key)
        .where("id", "=", row.id)
        .$if(e.unchanged === true, (q) =>
          q
            .where("status", "=", row.status)
            .where("attempt", "=", row.attempt)
            .where("updated_at", "=", row.updated_at),
        )
        .returning("updated_at")
        .executeTakeFirst(),
    );
    return res && { updatedAt: Number(res.updated_at) };
  }

  /** The earlier of the row's first send (its creation on a row from before migration 0009) and `at`. */
  private earlier(at: unknown): RawBuilder<number> {
    return this.dialect === "postgres"
      ? sql<number>`least(coalesce(first_execution_at, created_at), cast(${at} as bigint))`
      : sql<number>`min(coalesce(first_execution_at, created_at), ${at})`;
  }

  /** The database time, or just after `column`'s value when that is not earlier: a time that strictly increases. */
  private later(column: "updated_at" | "last_execution_at"): RawBuilder<number> {
    const greatest = sql.raw(this.dialect === "postgres" ? "greatest" : "max");
    return sql<number>`${greatest}(${this.now()}, coalesce(${sql.ref(column)}, 0) + 1)`;
  }

  /**
   * SET fields appending one event (`json`, see `eventJson`) to the history at the database time,
   * capped as the trigger's appends are (migration 0003): the first events stay, the middle ones
   * are counted. One JSON parameter: Postgres cannot type loose parameters of jsonb_build_object.
   */
  private appended(json: unknown) {
    return this.appendEvent(
      this.dialect === "postgres"
        ? sql`cast(${json} as jsonb) || jsonb_build_object('at', ${this.now()})`
        : sql`json_set(${json}, '$.at', ${this.now()})`,
    );
  }

  /**
   * A change of status's audit event as the trigger writes it (migrations 0003 and 0010), for
   * `update`'s SET list, where a column names its value before the statement: the status it
   * leaves, and what the statement writes (status, actor, reason, the reference if it sets one,
   * and the `updated_at` it sets, the same expression in the same statement, so the same time).
   */
  private transitionEvent(
    v: (name: string) => any,
    setsReference: boolean,
    withEvidence: boolean,
    updatedAt: RawBuilder<number>,
  ): RawBuilder<unknown> {
    const ref = setsReference ? v("provider_reference") : sql.ref("provider_reference");
    // A person's evidence (a retry's) after the trigger's fields; any other event has none.
    const evidence = withEvidence
      ? this.dialect === "postgres"
        ? sql`, 'evidence', cast(${v("evidence")} as text)`
        : sql`, 'evidence', ${v("evidence")}`
      : sql``;
    return this.dialect === "postgres"
      ? sql`jsonb_build_object('from', status, 'to', cast(${v("to")} as text), 'attempt', attempt, 'actor', cast(${v("actor")} as text), 'reason', cast(${v("reason")} as text), 'ref', cast(${ref} as text), 'at', ${updatedAt}${evidence})`
      : sql`json_object('from', status, 'to', ${v("to")}, 'attempt', attempt, 'actor', ${v("actor")}, 'reason', ${v("reason")}, 'ref', ${ref}, 'at', ${updatedAt}${evidence})`;
  }

  /** SET fields appending the event `event` (a JSON object) to the history, capped as the trigger's appends are (0003). */
  private appendEvent(event: RawBuilder<unknown>) {
    const full =
      this.dialect === "postgres"
        ? sql<boolean>`jsonb_array_length(history) >= ${HISTORY.cap}`
        : sql<boolean>`json_array_length(history) >= ${HISTORY.cap}`;
    const history =
      this.dialect === "postgres"
        ? sql`(case when ${full} then history - ${sql.lit(HISTORY.head)} else history end) || jsonb_build_array(${event})`
        : sql`json_insert(case when ${full} then json_remove(history, '$[${sql.lit(HISTORY.head)}]') else history end, '$[#]', ${event})`;
    return {
      history: history as any,
      history_elided: sql`history_elided + (case when ${full} then 1 else 0 end)` as any,
    };
  }

  /** The operation's audit events, oldest first (`seq` from 1, counting the events elided from the middle). */
  async events(tenant: string, operationId: string): Promise<(HistoryEvent & { seq: number })[]> {
    const row = await this.guard(
      operationId,
      this.db
        .selectFrom("idem_operations")
        .select(["history", "history_elided"])
        .where("tenant_id", "=", tenant)
        .where("id", "=", operationId)
        .executeTakeFirst(),
    );
    if (!row) return [];
    const history = typeof row.history === "string" ? (JSON.parse(row.history) as HistoryEvent[]) : row.history;
    const elided = Number(row.history_elided);
    return history.map((e, i) => ({ ...e, seq: i < HISTORY.head ? i + 1 : i + 1 + elided }));
  }

  /** See Ledger.claimDue. Two statements, one per partial index, so each scan stays on its index. */
  async claimDue(
    limit: number,
    claimMs: number,
    filters: { readonly except?: TenantActions | undefined; readonly reserved?: TenantActions | undefined } = {},
  ): Promise<Pick<Row, "id" | "tenant_id" | "status" | "action" | "next_check_at">[]> {
    const now = this.now();
    const { except, reserved } = filters;
    const claim = async (scan: (q: any) => any, indexOrder: "lease_expires_at" | "next_check_at", max = limit) => {
      const where = (q: any) => {
        let out = scan(q);
        if (except)
          out = out.where((eb: any) =>
            eb.not(eb.and([eb("tenant_id", "=", except.tenant), eb("action", "in", except.actions)])),
          );
        if (reserved)
          out = out.where((eb: any) =>
            eb.not(eb.and([eb("tenant_id", "<>", reserved.tenant), eb("action", "in", reserved.actions)])),
          );
        return out;
      };
      // The candidates are chosen once, in a CTE: as an IN (subquery) Postgres may re-run the
      // LIMIT per row and claim them all.
      let due = where(this.db.selectFrom("idem_operations").select(["tenant_id", "key"]))
        .orderBy(indexOrder)
        .limit(max);
      if (this.dialect === "postgres") due = due.forUpdate().skipLocked();
      return where(this.db.with("due", () => due).updateTable("idem_operations"))
        .set({ next_check_at: sql<number>`${now} + ${claimMs}` })
        .where((eb: any) =>
          eb(eb.refTuple("tenant_id", "key"), "in", eb.selectFrom("due").select(["tenant_id", "key"])),
        )
        .returning(["id", "tenant_id", "status", "action", "next_check_at"])
        .execute() as Promise<Pick<Row, "id" | "tenant_id" | "status" | "action" | "next_check_at">[]>;
    };
    const expired = await this.guard(
      undefined,
      claim(
        (q) =>
          q
            .where("status", "=", RUNNING)
            .where("lease_expires_at", "<=", now)
            .where((eb: any) => eb.or([eb("next_check_at", "is", null), eb("next_check_at", "<=", now)])),
        "lease_expires_at",
      ),
    );
    // At most `limit` in all: the second scan gets what the first left.
    const left = limit - expired.length;
    if (left <= 0) return expired;
    const due = await this.guard(
      undefined,
      claim(
        // A pending row whose args are not stored is a caller's to run, never the daemon's: left
        // out (and out of the due index since migration 0011, whose terms these are).
        (q) =>
          q
            .where("status", "in", [UNKNOWN, PENDING])
            .where((eb: any) => eb.or([eb("status", "=", UNKNOWN), eb("args_json", "is not", null)]))
            .where("next_check_at", "<=", now),
        "next_check_at",
        left,
      ),
    );
    return [...expired, ...due];
  }

  /**
   * See LedgerDaemon.release: makes claimed rows due again now, each only while it still carries
   * the claim (its status and the `next_check_at` the claim set), so a row a worker, a person or
   * another daemon changed meanwhile keeps what they set. Returns how many were released.
   */
  async releaseClaims(
    claims: readonly { tenant: string; id: string; status: Status; claimedUntil: number }[],
  ): Promise<number> {
    // A chunk per statement keeps the parameters (four a row) far under both databases' limits.
    const size = 250;
    let released = 0;
    for (let i = 0; i < claims.length; i += size) {
      const chunk = claims.slice(i, i + size);
      const res = await this.guard(
        chunk.length === 1 ? chunk[0]!.id : undefined,
        this.db
          .updateTable("idem_operations")
          .set({ next_check_at: this.now() })
          .where((eb) =>
            eb.or(
              chunk.map((c) =>
                eb.and([
                  eb("tenant_id", "=", c.tenant),
                  eb("id", "=", c.id),
                  eb("status", "=", c.status),
                  eb("next_check_at", "=", c.claimedUntil),
                ]),
              ),
            ),
          )
          .executeTakeFirst(),
      );
      released += Number(res.numUpdatedRows);
    }
    return released;
  }

  async alertsDue(limit: number, after?: { updatedAt: number; id: string }): Promise<Row[]> {
    let q = this.db
      .selectFrom("idem_operations")
      .select(ROW_COLUMNS)
      .select(this.lookFirst())
      .where("alert_pending", "=", sql.lit(1))
      .orderBy("updated_at")
      .orderBy("id")
      .limit(limit);
    if (after)
      q = q.where((eb) =>
        eb.or([
          eb("updated_at", ">", after.updatedAt),
          eb.and([eb("updated_at", "=", after.updatedAt), eb("id", ">", after.id)]),
        ]),
      );
    return this.guard(undefined, q.execute());
  }

  async ackAlert(tenant: string, id: string, updatedAt: number): Promise<void> {
    await this.guard(
      id,
      this.db
        .updateTable("idem_operations")
        .set({ alert_pending: 0 })
        .where("id", "=", id)
        .where("tenant_id", "=", tenant)
        .where("updated_at", "=", updatedAt)
        .execute(),
    );
  }

  /**
   * Every read and write goes through here: a driver's error (unreachable,
   * full disk, a failed commit) becomes a typed `LedgerUnavailableError`, never a raw exception.
   * `claim`: the statement is a fresh claim (one unsent is said as `claimNotWritten`).
   */
  guard<T>(operationId: string | undefined, work: Promise<T>, claim = false): Promise<T> {
    // Not an async function: one promise a statement, not two (each a turn of the microtask queue).
    return work.then(undefined, (cause: unknown) => {
      // Once closed, an outage (a connection a failed commit abandoned, its reopen cut short by
      // the close) is the close: no retry is made through a closed ledger, and its caller hears why.
      if (this.closed && cause instanceof LedgerUnavailableError && !cause.closed)
        throw this.closedError(operationId, cause);
      if (cause instanceof IdemError) throw cause;
      // Postgres: a claim that waited for one of the pool's connections as it ended (never sent),
      // or that the end cancelled on the server (a statement refused commits nothing).
      if (this.closed)
        throw claim && (cause instanceof PoolEndedError || (cause as { code?: unknown }).code === "57014")
          ? claimNotWritten()
          : this.closedError(operationId, cause);
      throw new LedgerUnavailableError(
        `the ledger database failed: ${(cause as Error)?.message ?? String(cause)}`,
        operationId,
        { cause },
      );
    });
  }
}
