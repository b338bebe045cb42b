/**
 * Postgres plans a prepared statement once per connection. A new ledger's connections plan its
 * hot statements on an empty, unanalyzed table, where reading a tenant's rows (or the whole table)
 * to find one key looks as cheap as the primary key; kept, such a plan makes every duplicate call
 * cost more as the ledger grows (measured: 0.6 ms, then 2 ms, 2.3 ms and 4 ms per duplicate as a
 * tenant grew by 3,000 rows at a time), until autovacuum analyzes the table (which makes every
 * connection plan again). The pool also replaces connections after `connectionLifetimeMs`, so a
 * server whose autovacuum lags does not keep such plans either.
 */
import { describe, expect, it } from "vitest";
import { sql } from "kysely";
import { defineAction, type Ledger } from "@idem/core";
import { databaseOf } from "@idem/core/testing";
import { scaled } from "@idem/testkit";
import { ledgers, uniqueTenant } from "./support/ledgers.js";

const noop = defineAction({ type: "plans.noop", capabilities: {}, execute: async () => ({ ok: true }) });

/** The start of the statements that read a key's row: the claim (a new key), the peek (a key seen before). */
const CLAIM = 'with "ins" as (insert into "idem_operations"%';
const PEEK = 'select "id", "status", "attempt", "args_hash"%';

/** How this ledger's connection reads the row of `key` in the statement starting so, if it prepared it. */
async function claimScan(ledger: Ledger, tenant: string, key: string, statement = CLAIM): Promise<string | undefined> {
  const db = databaseOf(ledger);
  const { rows } = await sql<{ name: string; statement: string; types: string[] }>`
    select name, statement, parameter_types::text[] as types from pg_prepared_statements
    where statement like ${statement}`.execute(db);
  const prepared = rows[0];
  if (!prepared) return undefined;
  const t = Number(/"tenant_id" = \$(\d+)/.exec(prepared.statement)![1]);
  const k = Number(/"key" = \$(\d+)/.exec(prepared.statement)![1]);
  const args = prepared.types.map((type, i) =>
    i + 1 === t ? `'${tenant}'` : i + 1 === k ? `'${key}'` : `NULL::${type}`,
  );
  const plan = await sql
    .raw<{ "QUERY PLAN": string }>(`explain execute ${prepared.name}(${args.join(", ")})`)
    .execute(db);
  // The peek's read: the first scan of idem_operations in the plan (the insert's arbiter index is not a read).
  return plan.rows
    .map((r) => r["QUERY PLAN"])
    .find((line) => /Scan.* on idem_operations\b/.test(line))
    ?.trim();
}

describe("Postgres: statements planned on a small ledger", () => {
  const db = ledgers("postgres");

  it(
    "are planned again once the ledger has grown: a duplicate reads its key through the primary key",
    async () => {
      const tenant = uniqueTenant();
      // Autovacuum has not got to the table yet (a busy server): an ANALYZE would make every
      // connection plan again, and the test would show nothing.
      const setup = await db.open();
      await sql`alter table idem_operations set (autovacuum_enabled = false)`.execute(databaseOf(setup));
      const kept = await db.open({ poolSize: 1, connectionLifetimeMs: 0 });
      const renewed = await db.open({ poolSize: 1, connectionLifetimeMs: 300 });
      // Both plan the claim of a new key, and the read of a key seen before, on a near-empty
      // table (a sixth execution settles on a generic plan).
      for (let i = 0; i < 8; i++) {
        for (const ledger of [kept, renewed]) {
          await ledger.run(noop, { tenant, key: ["k", i], args: {} });
          await ledger.run(noop, { tenant, key: ["k", i], args: {} });
        }
      }
      const [op] = await kept.admin.list({ tenant });
      // The ledger grows: 20,000 operations for this tenant.
      await sql`insert into idem_operations (tenant_id, key, id, action, status, attempt, created_at, updated_at)
        select ${tenant}, 'grown-' || g, 'op_grown_' || g, 'plans.noop', 'succeeded', 1, 0, 0
        from generate_series(1, 20000) g`.execute(databaseOf(kept));

      // A connection kept for ever keeps the plan it made on the empty table.
      await kept.run(noop, { tenant, key: ["k", 0], args: {} });
      const stale = await claimScan(kept, tenant, op!.key);
      expect(stale).toBeDefined();
      expect(stale).not.toMatch(/using idem_operations_pkey/);

      // A renewed one plans again on the grown table.
      const until = Date.now() + scaled(30_000);
      let scans: (string | undefined)[] = [];
      let round = 0;
      while (!scans.every((s) => s?.includes("using idem_operations_pkey"))) {
        if (Date.now() > until) throw new Error(`still planned as: ${scans.join("; ")}`);
        round += 1;
        for (let i = 0; i < 8; i++) {
          await renewed.run(noop, { tenant, key: ["again", round, i], args: {} });
          await renewed.run(noop, { tenant, key: ["again", round, i], args: {} });
        }
        scans = [await claimScan(renewed, tenant, op!.key), await claimScan(renewed, tenant, op!.key, PEEK)];
      }
      for (const scan of scans) expect(scan).toMatch(/Index Scan using idem_operations_pkey on idem_operations/);
    },
    scaled(60_000),
  );
});
