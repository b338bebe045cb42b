/**
 * The operators' queries cost the same whatever the ledger's size (pnpm bench:operators; issue
 * 16). Side by side in one run: a ledger of 1,000 settled operations and one of 1,000,000 (50
 * tenants, bulk SQL), each with the same 100 unsettled rows (unknown, needs_review, running) of
 * tenant t1. Timed, median of 15: `admin.list` of needs_review (one tenant, a second page, every
 * tenant), `admin.prune` (nothing due; and 100 rows due, put back before each round),
 * `admin.stats`, the daemon's `idem_unsettled_operations` gauge (its collect, uncached), and for
 * reference one tenant's activity chart, which counts that tenant's rows of the last 24 h and so
 * grows with them. Reported: the time on each ledger and the ratio (1.0x: independent of the
 * size). SQLite file (no ANALYZE: the ledger runs none), and Postgres (DATABASE_URL or an
 * embedded server, after ANALYZE as autovacuum would).
 */
import { chmodSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { sql } from "kysely";
import { openLedger, type Ledger } from "@idem/core";
import { databaseOf } from "@idem/core/testing";
// The daemon's metrics, as `idem daemon` serves them (the app's public entry; the bench package does not depend on it).
import { DaemonMetrics } from "../apps/idem/src/index.js";
import { benchPostgres } from "./postgres.js";

const BIG = Number(process.env.BENCH_ROWS ?? 1_000_000);
const SMALL = 1_000;
const UNSETTLED = 100;
const ROUNDS = 15;
const dir = mkdtempSync(join(tmpdir(), "idem-bench-"));
chmodSync(dir, 0o777);

const COLS = `id, tenant_id, key, key_label, action, args_hash, args_json, status, attempt, lease_owner, lease_expires_at, provider_reference, result_json, error_json, actor, reason, next_check_at, checks, alert_pending, created_at, updated_at, completed_at, expires_at`;

/** Fills the ledger with `n` succeeded rows (retained for a day) and 100 unsettled ones, in bulk SQL. */
async function fill(ledger: Ledger, dialect: "sqlite" | "postgres", n: number): Promise<void> {
  const db = databaseOf(ledger);
  const now = Date.now();
  const done = (i: string) =>
    `'op_0' || ${i}, 't' || (${i} % 50), 'k' || ${i}, null, 'bench.noop', 'h', null, 'succeeded', 1, null, null, null, '{}', null, null, 'done', null, 0, 0, ${now - 7_200_000}, ${now - 7_200_000}, ${now - 7_200_000}, ${now + 86_400_000}`;
  if (dialect === "postgres") {
    await sql
      .raw(`INSERT INTO idem_operations (${COLS}) SELECT ${done("g")} FROM generate_series(1, ${n}) g`)
      .execute(db);
  } else {
    await sql
      .raw(
        `WITH RECURSIVE g(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM g WHERE x < ${n}) INSERT INTO idem_operations (${COLS}) SELECT ${done("x")} FROM g`,
      )
      .execute(db);
  }
  const kinds = ["unknown", "needs_review", "running"] as const;
  for (let i = 0; i < UNSETTLED; i++) {
    const status = kinds[i % 3]!;
    await sql
      .raw(
        `INSERT INTO idem_operations (${COLS}) VALUES ('op_1${String(i).padStart(4, "0")}', 't1', 'a${i}', null, 'bench.noop', 'h', null, '${status}', 1, ${status === "running" ? "'w'" : "null"}, ${status === "running" ? now + 3_600_000 : "null"}, null, null, null, null, 'r', ${status === "unknown" ? now + 3_600_000 : "null"}, 0, 0, ${now - 3_600_000}, ${now - 3_600_000}, null, null)`,
      )
      .execute(db);
  }
  if (dialect === "postgres") await sql.raw(`ANALYZE idem_operations`).execute(db);
}

/** 100 succeeded rows of tenant `tx` past their retention, for prune to delete. */
async function expired(ledger: Ledger, round: number): Promise<void> {
  const now = Date.now();
  const values = Array.from(
    { length: 100 },
    (_, i) =>
      `('op_2${round}_${i}', 'tx', 'x${round}_${i}', null, 'bench.noop', 'h', null, 'succeeded', 1, null, null, null, '{}', null, null, 'done', null, 0, 0, ${now - 7_200_000}, ${now - 7_200_000}, ${now - 7_200_000}, ${now - 3_600_000})`,
  );
  await sql.raw(`INSERT INTO idem_operations (${COLS}) VALUES ${values.join(", ")}`).execute(databaseOf(ledger));
}

/** The queries, each timed alone; `before` runs untimed before each round. */
function queries(ledger: Ledger) {
  const gauge = new DaemonMetrics(ledger, 1_000, { statsTtlMs: -1 }).registry; // never cached
  return [
    { name: "list needs_review, one tenant", run: () => ledger.admin.list({ tenant: "t1", status: "needs_review" }) },
    {
      name: "list needs_review, one tenant, 2nd page",
      run: () => ledger.admin.list({ tenant: "t1", status: "needs_review", limit: 10, before: "op_10050" }),
    },
    {
      name: "list needs_review, every tenant",
      run: () => ledger.admin.list({ allTenants: true, status: "needs_review" }),
    },
    {
      name: "list unknown + needs_review, one tenant",
      run: () => ledger.admin.list({ tenant: "t1", status: ["unknown", "needs_review"] }),
    },
    { name: "prune, nothing due", run: () => ledger.admin.prune({ tenant: "t1" }) },
    {
      name: "prune, 100 due",
      before: (round: number) => expired(ledger, round),
      run: async () => {
        if ((await ledger.admin.prune({ tenant: "tx" })) !== 100) throw new Error("prune did not delete the 100 due");
      },
    },
    { name: "stats", run: () => ledger.admin.stats() },
    { name: "stats, one tenant", run: () => ledger.admin.stats({ tenant: "t1" }) },
    { name: "metrics gauge (collect)", run: () => gauge.getSingleMetricAsString("idem_unsettled_operations") },
    { name: "activity, one tenant, 24 h (grows)", run: () => ledger.admin.activity({ tenant: "t1" }) },
  ];
}

/** Median time of each query on each ledger, rounds alternating between the ledgers (after two warm-up rounds). */
async function timeAll(small: Ledger, big: Ledger): Promise<{ name: string; small: number; big: number }[]> {
  const sides = [queries(small), queries(big)] as const;
  const median = (t: number[]) => t.sort((a, b) => a - b)[Math.floor(t.length / 2)]!;
  const out: { name: string; small: number; big: number }[] = [];
  for (let i = 0; i < sides[0].length; i++) {
    const times: [number[], number[]] = [[], []];
    for (let r = 0; r < ROUNDS + 2; r++) {
      for (const side of [0, 1] as const) {
        const q = sides[side][i]!;
        await q.before?.(r);
        const t0 = process.hrtime.bigint();
        await q.run();
        if (r >= 2) times[side].push(Number(process.hrtime.bigint() - t0) / 1e6);
      }
    }
    out.push({ name: sides[0][i]!.name, small: median(times[0]), big: median(times[1]) });
  }
  return out;
}

const table: string[] = [];
try {
  const pg = await benchPostgres(dir);
  try {
    for (const dialect of ["sqlite", "postgres"] as const) {
      const ledgers: Ledger[] = [];
      for (const n of [SMALL, BIG]) {
        const url =
          dialect === "sqlite" ? `sqlite:${join(dir, `ops-${n}.db`)}` : await pg.database(`idem_operators_${n}`);
        // A million-row INSERT … SELECT takes longer than the default 30 s statement timeout.
        const ledger = await openLedger(url, { durable: false, statementTimeoutMs: 600_000 });
        ledgers.push(ledger);
        const t0 = Date.now();
        await fill(ledger, dialect, n);
        console.log(`${dialect}: filled ${n} + ${UNSETTLED} rows in ${Date.now() - t0} ms`);
      }
      try {
        for (const r of await timeAll(ledgers[0]!, ledgers[1]!))
          table.push(
            `| ${dialect} | ${r.name} | ${r.small.toFixed(2)} ms | ${r.big.toFixed(2)} ms | ${(r.big / r.small).toFixed(2)}x |`,
          );
      } finally {
        for (const l of ledgers) await l.close();
      }
    }
  } finally {
    await pg.stop();
  }
} finally {
  rmSync(dir, { recursive: true, force: true });
}
console.log(
  `\n| ledger | query | ${SMALL} rows + ${UNSETTLED} unsettled | ${BIG} rows + ${UNSETTLED} unsettled | ratio |\n|---|---|---|---|---|`,
);
for (const r of table) console.log(r);
