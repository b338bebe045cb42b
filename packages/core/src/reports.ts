/**
 * The operators' and the daemon's reads over many operations (list, stuck, stats, activity) and
 * retention (prune): kept apart from store.ts, whose statements touch one operation each.
 *
 * Each read goes through an index that holds the rows it answers with, so it costs the same in a
 * ledger of a thousand operations and of a million (test/reports.test.ts checks the plans,
 * `pnpm bench:operators` the times): the unsettled and failed rows through the partial indexes
 * of migrations 0001 and 0006, a tenant's rows through (tenant_id, id), prune through
 * (tenant_id, expires_at). Not bounded so: a list filtered by action or age alone walks the
 * tenant's rows newest first; a list of every tenant's operations, without a status or of
 * succeeded ones, reads them all to sort by id (of failed ones: every failed row); the activity
 * chart counts the rows of its window.
 */
import { sql, type Expression, type SqlBool } from "kysely";
import { requireName, requireWhole } from "./keys.js";
import type { Status } from "./schema.js";
import { ROW_COLUMNS, RUNNING, type Row, type Store, type TenantActions } from "./store.js";

/** An operation not settled yet: what `admin.stats` counts. */
export type UnsettledStatus = "running" | "unknown" | "pending" | "needs_review";

/** One line of `admin.stats`: how many operations of this tenant and action are in this status now. */
export interface StatsRow {
  readonly tenant: string;
  readonly action: string;
  readonly status: UnsettledStatus;
  readonly count: number;
}

/** What `ledger.admin.stats` returns. */
export interface LedgerStats {
  /**
   * Exact counts of the operations not settled yet (running, unknown, pending, needs_review), by
   * tenant, action and status; a status with none has no line. Settled operations (succeeded,
   * failed) are not counted: counting them reads every one of them. Their rate is
   * `idem_runs_total` (the agents' `onResult` counters) and the console's activity chart.
   */
  readonly unsettled: readonly StatsRow[];
}

/** The statuses of `idem_operations_status` (migration 0006), in its order. */
const INDEXED = ["failed", "unknown", "pending", "needs_review"] as const satisfies readonly Status[];
/**
 * That index's condition, word for word: SQLite uses a partial index only when the query's WHERE
 * repeats it (a bound parameter, or `status = 'failed'` alone, does not count).
 */
const IN_STATUS_INDEX = sql<SqlBool>`status in (${sql.join(INDEXED.map((s) => sql.lit(s)))})`;

/**
 * The condition on status that reads its rows through an index: running rows through
 * `idem_operations_running`, failed, unknown, pending and needs_review through
 * `idem_operations_status`; succeeded (nearly every row) through none, since a tenant's newest
 * rows, read through (tenant_id, id), are nearly all succeeded.
 */
function statusIs(status: Status): Expression<SqlBool> {
  if (status === "running") return sql<SqlBool>`status = ${RUNNING}`;
  if ((INDEXED as readonly Status[]).includes(status))
    return sql<SqlBool>`status in (${sql.lit(status)}) and ${IN_STATUS_INDEX}`;
  return sql<SqlBool>`status = ${status}`;
}

/**
 * The tenant as a value rather than the column (`tenant_id || ''`), where no index on tenant_id
 * may serve: running rows are few (those in flight) and read through `idem_operations_running`,
 * while a tenant's rows through (tenant_id, …) are many. Without it SQLite, which keeps no
 * statistics here, walks the tenant's rows in id order to spare a sort of the running ones.
 */
const TENANT_VALUE = sql<string>`tenant_id || ''`;

/** Which operations `ledger.admin.list` returns: one tenant's, several tenants' (an operator's allowed set) or every tenant's. */
export type ListFilter = (
  | { readonly tenant: string | readonly string[]; readonly allTenants?: never }
  | { readonly allTenants: true; readonly tenant?: never }
) & {
  readonly status?: Status | readonly Status[];
  readonly action?: string;
  /** Only rows created at least this long ago. */
  readonly olderThanMs?: number;
  /** At most this many (default 100). */
  readonly limit?: number;
  /** Rows created before this operation id (keyset pagination, newest first: ids are time-ordered). */
  readonly before?: string;
  /**
   * Only rows at least one check (a lookup or a replay) has looked at: an unknown outcome that
   * its checks could not settle. Applied before `limit`, so newer rows not checked yet do not hide them.
   */
  readonly checked?: boolean;
};

/** Which running operations `ledger.daemon.stuck` (and `admin.readAtOnce`) returns: past `olderThanMs` in their attempt. */
export interface StuckFilter {
  readonly olderThanMs: number;
  /** At most this many (default 1,000), the longest running first. */
  readonly limit?: number;
  readonly tenants?: readonly string[];
  readonly action?: string;
  readonly exceptActions?: readonly string[];
  /**
   * Not these action types in this tenant (the daemon's own alert deliveries), left out before
   * the limit: many of them must not fill it and hide the runs it reads for.
   */
  readonly except?: TenantActions;
}

/** What `admin.readAtOnce` reads: lists and stuck runs, each answered apart, all in one statement. */
export interface ReadsAtOnce {
  readonly lists?: readonly ListFilter[];
  readonly stuck?: readonly StuckFilter[];
}

/** `rows` newest first (ids grow with time), the first `limit` of them. */
function newest(rows: Row[], limit: number): Row[] {
  return rows.sort((a, b) => (a.id < b.id ? 1 : a.id > b.id ? -1 : 0)).slice(0, limit);
}

/** Refuses a stuck read's filter (`ledger.daemon.stuck`, `admin.readAtOnce`) before any is sent. */
export function requireStuckFilter(f: StuckFilter): void {
  requireWhole(f.olderThanMs, "olderThanMs", 0);
  if (f.limit !== undefined) requireWhole(f.limit, "limit", 1);
  for (const t of f.tenants ?? []) requireName(t, "tenants");
  if (f.action !== undefined) requireName(f.action, "action");
  for (const a of f.exceptActions ?? []) requireName(a, "exceptActions");
  if (f.except) {
    requireName(f.except.tenant, "except.tenant");
    for (const a of f.except.actions) requireName(a, "except.actions");
  }
}

/** What narrows a stuck read besides its threshold and limit. */
type StuckOnly = {
  readonly tenants?: readonly string[] | undefined;
  readonly action?: string | undefined;
  readonly exceptActions?: readonly string[] | undefined;
  readonly except?: TenantActions | undefined;
};

export class Reports {
  constructor(private readonly store: Store) {}

  async list(f: ListFilter): Promise<Row[]> {
    const limit = f.limit ?? 100;
    const statuses = f.status === undefined ? [] : [...new Set(typeof f.status === "string" ? [f.status] : f.status)];
    if (f.status !== undefined && statuses.length === 0) return []; // no status asked for: none matches
    if (statuses.length <= 1) return this.store.guard(undefined, this.#listed(f, statuses[0], limit).execute());
    // One statement per status, each reading its own index range newest first, merged here: one
    // statement over several statuses sorts all of their rows, or walks the tenant's rows in id
    // order to skip the sort (SQLite's choice).
    const each = await this.store.guard(
      undefined,
      Promise.all(statuses.map((status) => this.#listed(f, status, limit).execute())),
    );
    // The statements read one after another: a row that changed status between them may be in
    // two of them. It is listed once.
    return newest([...new Map(each.flat().map((row) => [row.id, row])).values()], limit);
  }

  /**
   * Several lists and stuck reads answered by one statement: each the statement `list` or `stuck`
   * sends (per status for a list of several, each on its index, each with its limit), joined with
   * UNION ALL, so the database answers all of them from one snapshot. Read one after another, a
   * row that changed status between them was in two answers or in none (an unknown outcome
   * escalated to needs_review between the two reads of an operator's queue was in neither).
   * `lists[i]` answers `reads.lists[i]`, `stuck[j]` answers `reads.stuck[j]`.
   */
  async atOnce(reads: ReadsAtOnce): Promise<{ lists: Row[][]; stuck: (Row & { age_ms: number })[][] }> {
    const lists = reads.lists ?? [];
    const stucks = reads.stuck ?? [];
    // Each arm: its read's own statement as a subquery (so its ORDER BY and LIMIT stay its own),
    // tagged with which read it answers. A list's arms have no age (0).
    const arms: { read: number; query: any }[] = [];
    lists.forEach((f, read) => {
      if (Array.isArray(f.tenant) && f.tenant.length === 0) return; // no tenant: nothing
      const statuses =
        f.status === undefined ? [undefined] : [...new Set(typeof f.status === "string" ? [f.status] : f.status)];
      for (const status of statuses)
        arms.push({ read, query: this.#listed(f, status, f.limit ?? 100).select(sql<number>`0`.as("age_ms")) });
    });
    stucks.forEach((f, j) => {
      if (f.tenants?.length === 0) return;
      arms.push({ read: lists.length + j, query: this.#stuck(f.olderThanMs, f.limit ?? 1_000, f) });
    });
    const answers: Row[][] = [...lists, ...stucks].map(() => []);
    if (arms.length > 0) {
      const [first, ...rest] = arms.map(({ read, query }, i) =>
        this.store.db
          .selectFrom(query.as(`read_${i}`))
          .select([...ROW_COLUMNS, "look_first", "age_ms", sql<number>`${sql.lit(read)}`.as("read")] as any),
      );
      const union = rest.reduce((all: any, arm) => all.unionAll(arm), first);
      const rows = (await this.store.guard(undefined, union.execute())) as (Row & { age_ms: unknown; read: unknown })[];
      for (const { read, age_ms, ...row } of rows)
        answers[Number(read)]!.push({ ...row, age_ms: Number(age_ms) } as Row);
    }
    return {
      // A list of several statuses, merged as `list` merges them: newest first, its limit in all.
      lists: lists.map((f, i) =>
        newest(
          answers[i]!.map(({ age_ms, ...row }: Row & { age_ms?: number }) => row as Row),
          f.limit ?? 100,
        ),
      ),
      stuck: stucks.map((_, j) =>
        (answers[lists.length + j] as (Row & { age_ms: number })[]).sort(
          (a, b) => Number(a.updated_at) - Number(b.updated_at),
        ),
      ),
    };
  }

  #listed(f: ListFilter, status: Status | undefined, limit: number) {
    // The mark of a person's retry, an operator reads with the row (NULL before migration 0012).
    let q = this.store.db.selectFrom("idem_operations").select(ROW_COLUMNS).select(this.store.lookFirst());
    const tenant = status === "running" ? TENANT_VALUE : "tenant_id";
    if (typeof f.tenant === "string") q = q.where(tenant, "=", f.tenant);
    else if (f.tenant !== undefined) q = q.where(tenant, "in", [...f.tenant]);
    if (status !== undefined) q = q.where(statusIs(status));
    if (f.action !== undefined) q = q.where("action", "=", f.action);
    if (f.olderThanMs !== undefined)
      q = q.where("created_at", "<=", sql<number>`${this.store.now()} - ${f.olderThanMs}`);
    if (f.before !== undefined) q = q.where("id", "<", f.before);
    if (f.checked === true) q = q.where("checks", ">", 0);
    // (tenant_id, id) and (status, tenant_id, id) are indexes: one tenant's newest first without a sort
    return q.orderBy("id", "desc").limit(limit);
  }

  /** Running rows older than `olderThanMs` in their attempt, with their age by the database clock. */
  async stuck(olderThanMs: number, limit: number, only: StuckOnly = {}): Promise<(Row & { age_ms: number })[]> {
    const rows = await this.store.guard(undefined, this.#stuck(olderThanMs, limit, only).execute());
    return rows.map((r) => ({ ...r, age_ms: Number(r.age_ms) }));
  }

  /** How many running rows `stuck` would return with no limit (through the same index). */
  async countStuck(olderThanMs: number, only: StuckOnly = {}): Promise<number> {
    const q = this.#stuckRows(olderThanMs, only).select((eb) => eb.fn.countAll<number>().as("count"));
    const row = await this.store.guard(undefined, q.executeTakeFirst());
    return Number(row?.count ?? 0);
  }

  #stuck(olderThanMs: number, limit: number, only: StuckOnly) {
    return this.#stuckRows(olderThanMs, only)
      .select(ROW_COLUMNS)
      .select(this.store.lookFirst())
      .select(sql<number>`${this.store.now()} - updated_at`.as("age_ms"))
      .orderBy("updated_at")
      .limit(limit);
  }

  /** The running rows past `olderThanMs` that a stuck read chooses from, before its order and limit. */
  #stuckRows(olderThanMs: number, only: StuckOnly) {
    let q = this.store.db
      .selectFrom("idem_operations")
      .where("status", "=", RUNNING)
      .where("updated_at", "<=", sql<number>`${this.store.now()} - ${olderThanMs}`);
    // The tenant as a value, as a list of running rows names it: through (tenant_id, id) SQLite
    // walked every row of the tenants to find their few running ones.
    if (only.tenants) q = q.where(TENANT_VALUE, "in", only.tenants);
    if (only.action !== undefined) q = q.where("action", "=", only.action);
    if (only.exceptActions?.length) q = q.where("action", "not in", only.exceptActions);
    const except = only.except;
    if (except?.actions.length)
      q = q.where((eb) => eb.not(eb.and([eb("tenant_id", "=", except.tenant), eb("action", "in", except.actions)])));
    return q;
  }

  /**
   * The unsettled operations counted by tenant, action and status, in one statement (one
   * snapshot): running rows through `idem_operations_running`, the others through
   * `idem_operations_status`, each arm with its index's condition written out.
   */
  async stats(tenant?: string): Promise<LedgerStats> {
    const count = (status: Expression<SqlBool>, byTenant: typeof TENANT_VALUE | "tenant_id") => {
      let q = this.store.db
        .selectFrom("idem_operations")
        .select(["tenant_id as tenant", "action", "status", (eb) => eb.fn.countAll<number>().as("count")])
        .where(status)
        .groupBy(["tenant_id", "action", "status"]);
      if (tenant !== undefined) q = q.where(byTenant, "=", tenant);
      return q;
    };
    const waiting = sql<SqlBool>`status in (${sql.join(["unknown", "pending", "needs_review"].map((s) => sql.lit(s)))}) and ${IN_STATUS_INDEX}`;
    const rows = await this.store.guard(
      undefined,
      count(statusIs("running"), TENANT_VALUE).unionAll(count(waiting, "tenant_id")).execute(),
    );
    return {
      unsettled: rows.map((r) => ({
        tenant: r.tenant,
        action: r.action,
        status: r.status as UnsettledStatus,
        count: Number(r.count),
      })),
    };
  }

  /** Operations created per time bucket and status since `sinceMs` ago (database clock), for one tenant, several or all. */
  async activity(
    tenant: string | readonly string[] | undefined,
    sinceMs: number,
    bucketMs: number,
  ): Promise<{ at: number; status: Status; count: number }[]> {
    const bucket = sql<number>`(created_at / ${sql.lit(bucketMs)}) * ${sql.lit(bucketMs)}`;
    let q = this.store.db
      .selectFrom("idem_operations")
      .select([bucket.as("at"), "status", (eb) => eb.fn.countAll<number>().as("count")])
      .where("created_at", ">=", sql<number>`${this.store.now()} - ${sinceMs}`)
      .groupBy([bucket, "status"])
      .orderBy(bucket);
    if (typeof tenant === "string") q = q.where("tenant_id", "=", tenant);
    else if (tenant !== undefined) q = q.where("tenant_id", "in", [...tenant]);
    return (await this.store.guard(undefined, q.execute())).map((r) => ({
      at: Number(r.at),
      status: r.status,
      count: Number(r.count),
    }));
  }

  /**
   * Deletes this tenant's completed operations (their history with them) whose retention passed:
   * found through (tenant_id, expires_at), so the cost is the rows deleted, not the ledger.
   * The DELETE repeats the conditions: on Postgres a row changed while the statement waited for
   * its lock is checked again against the DELETE's own WHERE only, and a failed operation that an
   * operator sent back to pending meanwhile would otherwise be deleted, and so run again as new.
   * A row whose alert is still due (a failure a person must hear of, two effects) waits for the
   * daemon to deliver it: deleted first, the alert would never be sent.
   *
   * 0 means none is left to delete (a caller's loop stops there), so a statement that deleted none
   * is not taken for that: on Postgres a batch beside another prune of the tenant chooses the rows
   * the other is deleting, waits for them, and finds them gone, while the tenant's later ones
   * remain. It is sent again (a new snapshot) until it deletes some or none are left.
   */
  async prune(tenant: string, limit: number): Promise<number> {
    for (;;) {
      const deleted = await this.#prune(tenant, limit);
      if (deleted > 0) return deleted;
      const left = await this.store.guard(undefined, this.#expired(tenant).select("id").limit(1).execute());
      if (left.length === 0) return 0;
    }
  }

  /** The tenant's operations that prune may delete now, oldest expiry first. */
  #expired(tenant: string) {
    return this.store.db
      .selectFrom("idem_operations")
      .where("tenant_id", "=", tenant)
      .where("expires_at", "<=", this.store.now())
      .orderBy("expires_at")
      .where("status", "in", COMPLETED)
      .where("alert_pending", "=", 0);
  }

  async #prune(tenant: string, limit: number): Promise<number> {
    const res = await this.store.guard(
      undefined,
      this.store.db
        .deleteFrom("idem_operations")
        .where("id", "in", this.#expired(tenant).select("id").limit(limit))
        .where("tenant_id", "=", tenant)
        .where("expires_at", "<=", this.store.now())
        .where("status", "in", COMPLETED)
        .where("alert_pending", "=", 0)
        .executeTakeFirst(),
    );
    return Number(res.numDeletedRows);
  }
}

/** What prune deletes once expired: operations whose outcome is known and replayed. */
const COMPLETED = ["succeeded", "failed"] as const satisfies readonly Status[];
