/**
 * The operators' and the daemon's reads over many operations (list, stuck, stats, activity) and
 * retention (prune): kept apart from store.ts, whose statements touch one operation each.
 */
import { sql } from "kysely";
import type { Status } from "./schema.js";
import { ROW_COLUMNS, RUNNING, type Row, type Store } from "./store.js";

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
};

export class Reports {
  constructor(private readonly store: Store) {}

  async list(f: ListFilter): Promise<Row[]> {
    let q = this.store.db.selectFrom("idem_operations").select(ROW_COLUMNS);
    if (typeof f.tenant === "string") q = q.where("tenant_id", "=", f.tenant);
    else if (f.tenant !== undefined) q = q.where("tenant_id", "in", [...f.tenant]);
    if (f.status !== undefined) {
      const statuses = typeof f.status === "string" ? [f.status] : [...f.status];
      q = q.where("status", "in", statuses);
    }
    if (f.action !== undefined) q = q.where("action", "=", f.action);
    if (f.olderThanMs !== undefined)
      q = q.where("created_at", "<=", sql<number>`${this.store.now()} - ${f.olderThanMs}`);
    if (f.before !== undefined) q = q.where("id", "<", f.before);
    // (tenant_id, id) is an index: one tenant's newest first without a sort
    return this.store.guard(
      undefined,
      q
        .orderBy("id", "desc")
        .limit(f.limit ?? 100)
        .execute(),
    );
  }

  /** Running rows older than `olderThanMs` in their attempt, with their age by the database clock. */
  async stuck(olderThanMs: number, limit: number): Promise<(Row & { age_ms: number })[]> {
    const rows = await this.store.guard(
      undefined,
      this.store.db
        .selectFrom("idem_operations")
        .select(ROW_COLUMNS)
        .select(sql<number>`${this.store.now()} - updated_at`.as("age_ms"))
        .where("status", "=", RUNNING)
        .where("updated_at", "<=", sql<number>`${this.store.now()} - ${olderThanMs}`)
        .orderBy("updated_at")
        .limit(limit)
        .execute(),
    );
    return rows.map((r) => ({ ...r, age_ms: Number(r.age_ms) }));
  }

  async stats(tenant?: string): Promise<{ tenant: string; action: string; status: Status; count: number }[]> {
    let q = this.store.db
      .selectFrom("idem_operations")
      .select(["tenant_id as tenant", "action", "status", (eb) => eb.fn.countAll<number>().as("count")])
      .groupBy(["tenant_id", "action", "status"]);
    if (tenant !== undefined) q = q.where("tenant_id", "=", tenant);
    return (await this.store.guard(undefined, q.execute())).map((r) => ({ ...r, count: Number(r.count) }));
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

  /** Deletes this tenant's completed operations (their history with them) whose retention passed. */
  async prune(tenant: string, limit: number): Promise<number> {
    const doomed = this.store.db
      .selectFrom("idem_operations")
      .select("id")
      .where("tenant_id", "=", tenant)
      .where("expires_at", "<=", this.store.now())
      .where("status", "in", ["succeeded", "failed"])
      .limit(limit);
    const res = await this.store.guard(
      undefined,
      this.store.db
        .deleteFrom("idem_operations")
        .where("id", "in", doomed)
        .where("tenant_id", "=", tenant)
        .executeTakeFirst(),
    );
    return Number(res.numDeletedRows);
  }
}
