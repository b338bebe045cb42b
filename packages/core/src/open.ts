/**
 * Turns a ledger URL (or a kysely Dialect) into a configured kysely instance.
 *
 * Supported: `sqlite:PATH` / `sqlite::memory:` (better-sqlite3; WAL; durable commits unless told
 * otherwise; a busy timeout so concurrent processes queue instead of failing) and
 * `postgres://…` / `postgresql://…` (a pg Pool; BIGINT read as numbers, which holds for
 * millisecond times and counters). Drivers are loaded only when their URL is used.
 */
import {
  Kysely, Migrator, PostgresAdapter, SqliteAdapter, sql, type Dialect, type KyselyPlugin, type PluginTransformQueryArgs,
  type PluginTransformResultArgs, type QueryResult, type RootOperationNode, type SqliteDatabase, type UnknownRow,
} from "kysely";
import { sha256 } from "./canonical.js";
import { LedgerConfigError } from "./errors.js";
import type { DirectExecutor } from "./query-cache.js";
import { MIGRATION_NAMES, migrationProvider, type DialectName } from "./migrations/index.js";
import type { IdemDatabase } from "./schema.js";

export interface ConnectionOptions {
  /** SQLite: fsync at every commit (`synchronous=FULL`). Default true; false trades the last commits on power loss for speed. */
  readonly durable?: boolean;
  /** SQLite: how long a writer waits for another process's lock. Default 10 s. */
  readonly busyTimeoutMs?: number;
  /** Postgres: pool size. Default 10. */
  readonly poolSize?: number;
  /**
   * Postgres: run the ledger's hot statements as named prepared statements (parsed and planned
   * once per connection). Default true; set false behind PgBouncer in transaction mode before
   * 1.21, which cannot keep a prepared statement on a server connection.
   */
  readonly preparedStatements?: boolean;
}

export interface Connection {
  readonly db: Kysely<IdemDatabase>;
  readonly dialect: DialectName;
  /** The driver itself, for the hot statements; absent when opened from a kysely Dialect. */
  readonly direct?: DirectExecutor;
}

export async function connect(target: string | Dialect, opts: ConnectionOptions): Promise<Connection> {
  if (typeof target !== "string") {
    const adapter = target.createAdapter();
    const dialect: DialectName | undefined =
      adapter instanceof PostgresAdapter ? "postgres" : adapter instanceof SqliteAdapter ? "sqlite" : undefined;
    if (!dialect) throw new LedgerConfigError("only SQLite and Postgres kysely dialects are supported");
    // A pool we did not configure reads BIGINT (times in ms) as strings: make them numbers.
    return { db: new Kysely<IdemDatabase>({ dialect: target, plugins: dialect === "postgres" ? [new TimesAsNumbers()] : [] }), dialect };
  }
  if (target.startsWith("sqlite:")) return { ...(await openSqlite(target.slice("sqlite:".length), opts)), dialect: "sqlite" };
  if (/^postgres(ql)?:\/\//.test(target)) return { ...(await openPostgres(target, opts)), dialect: "postgres" };
  throw new LedgerConfigError(`unsupported ledger URL "${redact(target)}": use sqlite:PATH or postgres://…`);
}

async function openSqlite(path: string, opts: ConnectionOptions): Promise<{ db: Kysely<IdemDatabase>; direct: DirectExecutor }> {
  if (path === "") throw new LedgerConfigError("sqlite: URL needs a path, e.g. sqlite:./idem.db or sqlite::memory:");
  const { default: Database } = await import("better-sqlite3");
  const { SqliteDialect } = await import("kysely");
  let database: import("better-sqlite3").Database;
  try {
    database = new Database(path, { timeout: opts.busyTimeoutMs ?? 10_000 });
    database.pragma("journal_mode = WAL");
    // WAL with NORMAL may lose the last commits on power loss; FULL fsyncs every commit.
    database.pragma(`synchronous = ${opts.durable === false ? "NORMAL" : "FULL"}`);
    database.pragma("foreign_keys = ON");
  } catch (cause) {
    throw new LedgerConfigError(`cannot open SQLite ledger at ${path}: ${(cause as Error).message}`, { cause });
  }
  const cached = withStatementCache(database);
  const direct: DirectExecutor = (text, parameters) => {
    // Inside a transaction kysely holds (migrations), a statement waits its turn through kysely.
    if (database.inTransaction) return undefined;
    const stmt = cached.prepare(text) as unknown as import("better-sqlite3").Statement;
    // Hot statements address one row by a unique key (see QueryCache): get() skips the array.
    // Only for reads: get() stops at the first row, and for a write with RETURNING the commit
    // happens after it, so a failed commit (SQLITE_FULL, SQLITE_IOERR) was swallowed and a claim
    // that was rolled back looked granted. all() steps to the end and throws what the commit threw.
    if (stmt.reader) {
      if (!stmt.readonly) return { rows: stmt.all(parameters) };
      const row = stmt.get(parameters);
      return { rows: row === undefined ? [] : [row] };
    }
    return { rows: [], numAffectedRows: BigInt(stmt.run(parameters).changes) };
  };
  return { db: new Kysely<IdemDatabase>({ dialect: new SqliteDialect({ database: cached }) }), direct };
}

/**
 * kysely prepares every query anew; preparing an INSERT that fires the audit trigger costs more
 * than running it. The ledger issues a handful of distinct statements, so keep them prepared.
 * kysely runs one query at a time on this connection, so a cached statement is never in use twice.
 */
function withStatementCache(database: import("better-sqlite3").Database): SqliteDatabase {
  const cache = new Map<string, ReturnType<SqliteDatabase["prepare"]>>();
  return {
    close: () => database.close(),
    prepare(text: string) {
      let stmt = cache.get(text);
      if (!stmt) {
        stmt = database.prepare(text) as unknown as ReturnType<SqliteDatabase["prepare"]>;
        if (cache.size >= 500) cache.delete(cache.keys().next().value!); // queries with inlined values stay bounded
        cache.set(text, stmt);
      }
      return stmt;
    },
  };
}

async function openPostgres(url: string, opts: ConnectionOptions): Promise<{ db: Kysely<IdemDatabase>; direct?: DirectExecutor }> {
  const { default: pg } = await import("pg");
  const { PostgresDialect } = await import("kysely");
  const pool = new pg.Pool({
    connectionString: url,
    max: opts.poolSize ?? 10,
    types: {
      // INT8 (times in ms, counters) as numbers rather than strings; safe below 2^53.
      getTypeParser: ((oid: number, format?: string) =>
        oid === 20 ? (v: string) => Number(v) : pg.types.getTypeParser(oid, format as "text")) as typeof pg.types.getTypeParser,
    },
  });
  // An idle client that errors (server restart) must not crash the process; the next query reconnects.
  pool.on("error", () => {});
  const db = new Kysely<IdemDatabase>({ dialect: new PostgresDialect({ pool }) });
  try {
    await sql`select 1`.execute(db);
  } catch (cause) {
    await db.destroy();
    throw new LedgerConfigError(`cannot connect to Postgres ledger ${redact(url)}: ${(cause as Error).message}`, { cause });
  }
  if (opts.preparedStatements === false) return { db };
  // A name per statement text: pg parses a named statement once per connection, then only binds.
  const names = new Map<string, string>();
  const direct: DirectExecutor = async (text, parameters) => {
    let name = names.get(text);
    if (name === undefined) names.set(text, (name = `idem_${sha256(text).slice(0, 24)}`));
    const res = await pool.query({ name, text, values: parameters as unknown[] });
    return { rows: res.rows, ...(res.rowCount !== null && { numAffectedRows: BigInt(res.rowCount) }) };
  };
  return { db, direct };
}

/** Applies pending migrations; a no-op (one cheap query) when the schema is current. */
export async function migrate(db: Kysely<IdemDatabase>, dialect: DialectName): Promise<string[]> {
  if (await isCurrent(db)) return [];
  const migrator = new Migrator({
    db,
    provider: migrationProvider(dialect),
    migrationTableName: "idem_migration",
    migrationLockTableName: "idem_migration_lock",
  });
  const { error, results } = await migrator.migrateToLatest();
  if (error) throw new LedgerConfigError(`ledger migration failed: ${(error as Error).message ?? error}`, { cause: error });
  return (results ?? []).filter((r) => r.status === "Success").map((r) => r.migrationName);
}

async function isCurrent(db: Kysely<IdemDatabase>): Promise<boolean> {
  try {
    const rows = await sql<{ name: string }>`select name from idem_migration`.execute(db);
    const applied = new Set(rows.rows.map((r) => r.name));
    return MIGRATION_NAMES.every((n) => applied.has(n));
  } catch {
    return false; // no migration table yet
  }
}

/** The ledger's BIGINT columns, read as numbers whatever the pool's type parsers. */
class TimesAsNumbers implements KyselyPlugin {
  private static readonly COLUMNS = new Set(["lease_expires_at", "next_check_at", "last_execution_at", "created_at", "updated_at", "completed_at", "expires_at", "db_now"]);

  transformQuery(args: PluginTransformQueryArgs): RootOperationNode {
    return args.node;
  }

  async transformResult(args: PluginTransformResultArgs): Promise<QueryResult<UnknownRow>> {
    for (const row of args.result.rows) {
      for (const k of Object.keys(row)) if (TimesAsNumbers.COLUMNS.has(k) && typeof row[k] === "string") row[k] = Number(row[k]);
    }
    return args.result;
  }
}

/** A URL without its password, for messages and logs. */
export function redact(url: string): string {
  return url.replace(/\/\/([^:/@]+):[^@]*@/, "//$1:***@");
}
