/**
 * The daemon's scans cost in proportion to the rows it must act on, not to the ledger's size
 * (pnpm bench:daemon). Side by side in one run: a ledger of 1,000 completed operations and one of
 * 1,000,000, each with the same 100 actionable rows (unknown and due, needs_review awaiting an
 * alert, running past the stuck threshold). Reported: the time of one daemon scan (claimDue,
 * alertsDue, stuck) on each, and their ratio (1.0x means independent of the ledger's size).
 * SQLite file, and Postgres (DATABASE_URL or an embedded server).
 */
import { chmodSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { sql } from "kysely";
import { openLedger, type Ledger } from "@idem/core";
import { databaseOf } from "@idem/core/testing";
import { benchPostgres } from "./postgres.js";

const BIG = Number(process.env.BENCH_ROWS ?? 1_000_000);
const SMALL = 1_000;
const ACTIONABLE = 100;
const dir = mkdtempSync(join(tmpdir(), "idem-bench-"));
chmodSync(dir, 0o777);

/** Fills the ledger with `n` succeeded rows and 100 actionable ones, in bulk SQL. */
async function fill(ledger: Ledger, dialect: "sqlite" | "postgres", n: number): Promise<void> {
  const db = databaseOf(ledger);
  const now = Date.now();
  const cols = `id, tenant_id, key, key_label, action, args_hash, args_json, status, attempt, lease_owner, lease_expires_at, provider_reference, result_json, error_json, actor, reason, next_check_at, checks, alert_pending, created_at, updated_at, completed_at, expires_at`;
  const done = (i: string) =>
    `'op_' || ${i}, 't' || (${i} % 50), 'k' || ${i}, null, 'bench.noop', 'h', null, 'succeeded', 1, null, null, null, '{}', null, null, 'done', null, 0, 0, ${now - 7_200_000}, ${now - 7_200_000}, ${now - 7_200_000}, ${now + 86_400_000}`;
  // No audit trigger runs for inserts since migration 0005; on Postgres the update trigger is off for the fill.
  if (dialect === "postgres") {
    await sql.raw(`ALTER TABLE idem_operations DISABLE TRIGGER USER`).execute(db);
    await sql
      .raw(`INSERT INTO idem_operations (${cols}) SELECT ${done("g")} FROM generate_series(1, ${n}) g`)
      .execute(db);
    await sql.raw(`ALTER TABLE idem_operations ENABLE TRIGGER USER`).execute(db);
    await sql.raw(`ANALYZE idem_operations`).execute(db);
  } else {
    await sql
      .raw(
        `WITH RECURSIVE g(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM g WHERE x < ${n}) INSERT INTO idem_operations (${cols}) SELECT ${done("x")} FROM g`,
      )
      .execute(db);
    await sql.raw(`ANALYZE`).execute(db);
  }
  const kinds = ["unknown", "needs_review", "running"] as const;
  for (let i = 0; i < ACTIONABLE; i++) {
    const status = kinds[i % 3]!;
    await sql
      .raw(
        `INSERT INTO idem_operations (${cols}) VALUES ('act_${i}', 't1', 'a${i}', null, 'bench.noop', 'h', null, '${status}', 1, ${status === "running" ? "'w'" : "null"}, ${status === "running" ? now + 3_600_000 : "null"}, null, null, null, null, 'r', ${status === "unknown" ? now - 1000 : "null"}, 0, ${status === "needs_review" ? 1 : 0}, ${now - 3_600_000}, ${now - 3_600_000}, null, null)`,
      )
      .execute(db);
  }
}

/** Median time of one read-only daemon scan (claimDue is measured with a claim of 0 ms so rows stay due). */
async function scanMs(ledger: Ledger): Promise<number> {
  const times: number[] = [];
  for (let r = 0; r < 15; r++) {
    const t0 = process.hrtime.bigint();
    await ledger.daemon.claimDue({ limit: 200, claimMs: 0 });
    await ledger.daemon.alertsDue({ limit: 200 });
    await ledger.daemon.stuck({ olderThanMs: 60_000, limit: 200 });
    times.push(Number(process.hrtime.bigint() - t0) / 1e6);
  }
  return times.sort((a, b) => a - b)[7]!;
}

const rows: string[] = [];
try {
  const pg = await benchPostgres(dir);
  try {
    for (const dialect of ["sqlite", "postgres"] as const) {
      const result: number[] = [];
      for (const n of [SMALL, BIG]) {
        const url = dialect === "sqlite" ? `sqlite:${join(dir, `scan-${n}.db`)}` : await pg.database(`idem_scan_${n}`);
        // A million-row INSERT … SELECT takes longer than the default 30 s statement timeout.
        const ledger = await openLedger(url, { durable: false, statementTimeoutMs: 600_000 });
        const t0 = Date.now();
        await fill(ledger, dialect, n);
        console.log(`${dialect}: filled ${n} + ${ACTIONABLE} rows in ${Date.now() - t0} ms`);
        result.push(await scanMs(ledger));
        await ledger.close();
      }
      rows.push(
        `| ${dialect} | ${result[0]!.toFixed(2)} ms | ${result[1]!.toFixed(2)} ms | ${(result[1]! / result[0]!).toFixed(2)}x |`,
      );
    }
  } finally {
    await pg.stop();
  }
} finally {
  rmSync(dir, { recursive: true, force: true });
}
console.log(
  `\n| ledger | scan, ${SMALL} rows + ${ACTIONABLE} actionable | scan, ${BIG} rows + ${ACTIONABLE} actionable | ratio |\n|---|---|---|---|`,
);
for (const r of rows) console.log(r);
