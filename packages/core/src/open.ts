/**
 * Turns a ledger URL (or a kysely Dialect) into a configured kysely instance.
 *
 * Supported: `sqlite:PATH` / `sqlite::memory:` (better-sqlite3; WAL; durable commits unless told
 * otherwise; a busy timeout so concurrent processes queue instead of failing) and
 * `postgres://…` / `postgresql://…` (a pg Pool; BIGINT read as numbers, which holds for
 * millisecond times and counters). Drivers are loaded only when their URL is used: they are
 * optional peer dependencies, and a missing one is a LedgerConfigError naming the package to install.
 */
import { accessSync, constants, existsSync, statSync, type Stats } from "node:fs";
import { createRequire } from "node:module";
import { resolve as resolvePath } from "node:path";
import {
  Kysely,
  Migrator,
  PostgresAdapter,
  SqliteAdapter,
  sql,
  type Dialect,
  type KyselyPlugin,
  type PluginTransformQueryArgs,
  type PluginTransformResultArgs,
  type QueryResult,
  type RootOperationNode,
  type UnknownRow,
} from "kysely";
import pRetry from "p-retry";
import { NOT_SENT_CODES } from "./action.js";
import { sha256 } from "./canonical.js";
import { endingPool } from "./ending-pool.js";
import { LedgerConfigError, MigrationWaitError } from "./errors.js";
import { patiently } from "./sqlite-busy.js";
import {
  fileCheck,
  notTheFile,
  removeMade,
  sameFile,
  sqliteConnection,
  type LedgerSqliteDialect,
  type OpenedSqlite,
} from "./sqlite-driver.js";
import type { DirectExecutor } from "./query-cache.js";
import { MIGRATION_NAMES, migrationProvider, type DialectName } from "./migrations/index.js";
import type { IdemDatabase } from "./schema.js";

export interface ConnectionOptions {
  /**
   * SQLite: create the file when it does not exist. Default true; false refuses a path with no
   * ledger (a typo in an operator's command must not create and migrate an empty ledger).
   */
  readonly create?: boolean;
  /** SQLite: fsync at every commit (`synchronous=FULL`). Default true; false trades the last commits on power loss for speed. */
  readonly durable?: boolean;
  /**
   * SQLite: the writes of concurrent callers in this process that are ready in the same turn of
   * the event loop share one commit (one fsync), acknowledged only once it returned. Default true;
   * false commits each write on its own.
   */
  readonly groupCommit?: boolean;
  /**
   * SQLite: how long a statement waits for another connection's lock (without blocking the
   * process: it tries again after pauses of up to 50 ms). Default 10 s.
   */
  readonly busyTimeoutMs?: number;
  /** Postgres: pool size. Default 10. */
  readonly poolSize?: number;
  /**
   * Postgres: run the ledger's hot statements as named prepared statements (parsed and planned
   * once per connection). Default true; set false behind PgBouncer in transaction mode before
   * 1.21, which cannot keep a prepared statement on a server connection.
   */
  readonly preparedStatements?: boolean;
  /**
   * Postgres: how long opening a connection may take (TCP, TLS, authentication) before it fails.
   * Default 10 s, or the URL's `connect_timeout` (seconds, as in libpq). At most 2147483647 ms
   * (about 24.8 days, the longest a Node timer waits): a longer one is refused at open. 0 (libpq's
   * `connect_timeout=0`, "wait for ever") is refused at open too: a connect to a frozen server
   * would hold every call for ever.
   */
  readonly connectTimeoutMs?: number;
  /**
   * Postgres: the longest a statement may run (the server's `statement_timeout`). The client also
   * gives up waiting 5 s after it, so a frozen or silently gone server fails a call instead of
   * hanging it. Default 30 s, or the URL's `statement_timeout` (ms); 0 waits forever. At most
   * 2147483647 ms (about 24.8 days, Postgres's own maximum); at or near it, the client waits
   * 2147483647 ms too (the longest a Node timer waits), not 5 s more.
   */
  readonly statementTimeoutMs?: number;
  /**
   * Postgres: the longest the client waits for one migration statement at open. A migration may
   * rewrite a large table, so the server's statement timeout does not apply to it; this bound is
   * what ends an open whose migrating server stopped answering (a frozen backend or host). Default
   * 10 min; 0 waits for ever. At most 2147483647 ms (about 24.8 days).
   */
  readonly migrationTimeoutMs?: number;
  /**
   * Postgres: how long a migration keeps trying for the locks of the ledger's tables (held by a
   * long transaction: a report, a dump) before the open or `admin.migrate()` fails, unreachable
   * (worth trying again). Each wait is short (500 ms), so the ledger's statements queued behind the
   * migration go first between tries. Default 60 s; 0 tries once; at most 2147483647 ms (about
   * 24.8 days). The migration lock of another process migrating is waited for in one statement
   * (kysely's, for up to an hour), so within `migrationTimeoutMs`.
   */
  readonly migrationLockPatienceMs?: number;
  /**
   * Postgres: the longest a statement waits for a row lock (`lock_timeout`). Default 10 s, or the
   * URL's `lock_timeout` (ms). At most 2147483647 ms (about 24.8 days, Postgres's own maximum).
   */
  readonly lockTimeoutMs?: number;
  /**
   * Postgres: how long a pooled connection lives before it is replaced (when next idle). Default
   * 60 s; 0 keeps connections for ever; at most 2147483647 ms (about 24.8 days). A connection
   * plans each prepared statement once: one planned while the ledger was small (a new ledger,
   * before its table was analyzed) may read a tenant's rows, or the whole table, to find one key,
   * and would go on doing so as the ledger grows. A new connection plans them again, with the
   * table's current statistics.
   */
  readonly connectionLifetimeMs?: number;
}

export interface Connection {
  readonly db: Kysely<IdemDatabase>;
  readonly dialect: DialectName;
  /** The driver itself, for the hot statements; absent when opened from a kysely Dialect. */
  readonly direct?: DirectExecutor;
  /** SQLite writes wait for shared commits (group commit: sqlite-driver.ts). */
  readonly groupsCommits?: boolean;
  /**
   * SQLite, when this open made the file: removes it again (see `removeMade`), for an open that
   * fails after connecting (its migrations). Call it once the connection is closed.
   */
  readonly removeMade?: () => void;
}

export async function connect(target: string | Dialect, opts: ConnectionOptions): Promise<Connection> {
  const patience = opts.migrationLockPatienceMs ?? MIGRATION_PATIENCE_MS;
  if (!Number.isInteger(patience) || patience < 0 || patience > MAX_TIMER_MS)
    throw new LedgerConfigError(
      `migrationLockPatienceMs must be a whole number of ms from 0 to ${MAX_TIMER_MS} (got ${String(opts.migrationLockPatienceMs)})`,
    );
  const connection = await connectTo(target, opts);
  opened.set(connection.db, { dialect: connection.dialect, migrationLockPatienceMs: patience });
  return connection;
}

/**
 * What `connect` knew of each ledger's database, by the Kysely instance it made: read by the
 * schema's functions (`schemaStatus`, `migrate`), which `admin` calls with that instance alone.
 */
const opened = new WeakMap<Kysely<IdemDatabase>, { dialect: DialectName; migrationLockPatienceMs: number }>();

async function connectTo(target: string | Dialect, opts: ConnectionOptions): Promise<Connection> {
  if (typeof target !== "string") {
    const adapter = target.createAdapter();
    const dialect: DialectName | undefined =
      adapter instanceof PostgresAdapter ? "postgres" : adapter instanceof SqliteAdapter ? "sqlite" : undefined;
    if (!dialect) throw new LedgerConfigError("only SQLite and Postgres kysely dialects are supported");
    // A pool we did not configure reads BIGINT (times in ms) as strings: make them numbers.
    return {
      db: new Kysely<IdemDatabase>({ dialect: target, plugins: dialect === "postgres" ? [new TimesAsNumbers()] : [] }),
      dialect,
      groupsCommits: (target as Partial<LedgerSqliteDialect>).groupsCommits === true,
    };
  }
  if (target.startsWith("sqlite:"))
    return { ...(await openSqlite(target.slice("sqlite:".length), opts)), dialect: "sqlite" };
  if (/^postgres(ql)?:\/\//.test(target)) return { ...(await openPostgres(target, opts)), dialect: "postgres" };
  throw new LedgerConfigError(`unsupported ledger URL "${redactUrl(target)}": use sqlite:PATH or postgres://…`);
}

async function openSqlite(
  path: string,
  opts: ConnectionOptions,
): Promise<{ db: Kysely<IdemDatabase>; direct: DirectExecutor; groupsCommits: boolean; removeMade?: () => void }> {
  if (path === "") throw new LedgerConfigError("sqlite: URL needs a path, e.g. sqlite:./idem.db or sqlite::memory:");
  const { default: Database } = await driver("better-sqlite3", () => import("better-sqlite3"));
  const busyTimeoutMs = opts.busyTimeoutMs ?? 10_000;
  if (!Number.isInteger(busyTimeoutMs) || busyTimeoutMs < 0)
    throw new LedgerConfigError(`busyTimeoutMs must be a whole number of ms ≥ 0 (got ${String(opts.busyTimeoutMs)})`);
  const mustExist = opts.create === false && path !== ":memory:";
  // The file this open makes, if it makes one: a failed open takes it away again (see below).
  const existed = path === ":memory:" || existsSync(path);
  if (mustExist && !existed)
    throw new LedgerConfigError(
      `no SQLite ledger at ${path}: nothing was created (check the path; \`idem migrate\` creates a ledger)`,
    );
  let first: OpenedSqlite;
  try {
    first = await openSqliteFile(Database, path, { mustExist, busyTimeoutMs, durable: opts.durable !== false });
  } catch (cause) {
    // The file this open made (a full disk), empty or with only its header, is not left behind:
    // an open with `create: false` would take it for a ledger that needs migrations.
    if (!existed) removeMade(Database, path);
    throw new LedgerConfigError(`cannot open SQLite ledger at ${path}: ${(cause as Error).message}`, {
      cause,
      unreachable: isUnreachable(cause),
    });
  }
  // After a group commit abandoned the connection (sqlite-driver.ts `SqliteConnection`): the
  // same open, of the file this one opened, at its path as resolved now (whatever the process's
  // directory later), never another file.
  const file = first.checkFile.file;
  const absolute = resolvePath(path);
  const reopen =
    file &&
    (async () => {
      const now = statSync(absolute, { throwIfNoEntry: false });
      if (!sameFile(now, file)) throw notTheFile("SQLite file", absolute, now);
      return openSqliteFile(Database, absolute, {
        mustExist: true,
        busyTimeoutMs,
        durable: opts.durable !== false,
        first: file,
      });
    });
  const { dialect, direct } = sqliteConnection(first.database, {
    groupCommit: opts.groupCommit !== false,
    busyTimeoutMs,
    checkFile: first.checkFile,
    ...(reopen && { reopen }),
  });
  return {
    db: new Kysely<IdemDatabase>({ dialect }),
    direct,
    groupsCommits: dialect.groupsCommits,
    ...(!existed && { removeMade: () => removeMade(Database, path) }),
  };
}

/**
 * Opens the ledger's SQLite file and sets its pragmas, at the ledger's open and when it opens its
 * connection again (`first`: the file the first open opened, which must be the one opened). The
 * connection is closed again when any step fails.
 */
async function openSqliteFile(
  Database: typeof import("better-sqlite3"),
  path: string,
  o: { mustExist: boolean; busyTimeoutMs: number; durable: boolean; first?: Stats },
): Promise<OpenedSqlite> {
  let database: import("better-sqlite3").Database | undefined;
  try {
    // No busy handler: SQLite's blocks the thread; locks are waited for as sqlite-busy.ts says.
    database = new Database(path, { timeout: 0, fileMustExist: o.mustExist });
    // Turning the file to WAL takes its exclusive lock: it waits for readers, and for another
    // process converting a new file (about once in 4,000 opens by 64 processes at once).
    await patiently(() => database!.pragma("journal_mode = WAL"), o.busyTimeoutMs);
    // WAL with NORMAL may lose the last commits on power loss; FULL fsyncs every commit.
    database.pragma(`synchronous = ${o.durable ? "FULL" : "NORMAL"}`);
    if (path === ":memory:") return { database, checkFile: () => {} };
    // SQLite opens a file it may not write read-only, silently (and the WAL switch passes while
    // another process holds the ledger open): every write would then fail as "unavailable".
    accessSync(path, constants.W_OK);
    // A first read opens the log and its index (-wal, -shm), making them on a new file, so that
    // fileCheck notes the ones this connection writes.
    await patiently(() => database!.prepare("select count(*) from sqlite_master").get(), o.busyTimeoutMs);
    // The path as opened, whatever the process's directory later (see fileCheck); a file gone
    // already (deleted by another process since the constructor) is an open that failed.
    return { database, checkFile: fileCheck(resolvePath(path), o.first) };
  } catch (cause) {
    // The file is open once the constructor returned: a failed pragma (not a database, read-only
    // mount, full disk) must not keep its descriptor, or the mount stays busy.
    database?.close();
    throw cause;
  }
}

/**
 * Loads a database driver. They are optional peer dependencies (a Postgres user need not compile
 * better-sqlite3), so the one a URL asks for may be missing: say which package to install. A
 * driver that is there but fails to load (a native build for another Node) keeps its own error.
 */
async function driver<M>(name: "better-sqlite3" | "pg", load: () => Promise<M>): Promise<M> {
  try {
    return await load();
  } catch (cause) {
    const missing =
      (cause as { code?: unknown }).code === "ERR_MODULE_NOT_FOUND" &&
      String((cause as Error).message).includes(`'${name}'`);
    if (missing)
      throw new LedgerConfigError(
        `a ${name === "pg" ? "postgres://" : "sqlite:"} ledger needs the ${name} package, which is not installed: npm install ${name}`,
        { cause },
      );
    throw cause;
  }
}

async function openPostgres(
  url: string,
  opts: ConnectionOptions,
): Promise<{ db: Kysely<IdemDatabase>; direct?: DirectExecutor }> {
  const { default: pg } = await driver("pg", () => import("pg"));
  const { PostgresDialect } = await import("kysely");
  const t = timeouts(url, opts);
  const config = {
    Client: ledgerClient(pg.Client, connectionConfig(url)),
    // Waiting for a free client and opening a new one are both bounded by it (pg-pool).
    connectionTimeoutMillis: t.connectMs,
    // Server side: a statement or a lock wait past its time fails with a clear error.
    statement_timeout: t.statementMs,
    lock_timeout: t.lockMs,
    // A failover without a RST: the kernel probes the idle connection and fails it.
    keepAlive: true,
    // Statements planned on a small table must not be kept as the table grows (connectionLifetimeMs).
    maxLifetimeSeconds: t.lifetimeMs / 1000,
    keepAliveInitialDelayMillis: 10_000,
    types: {
      // INT8 (times in ms, counters) as numbers rather than strings; safe below 2^53.
      getTypeParser: ((oid: number, format?: string) =>
        oid === 20
          ? (v: string) => Number(v)
          : pg.types.getTypeParser(oid, format as "text")) as typeof pg.types.getTypeParser,
    },
  };
  // Its end answers the calls still waiting for a connection at once, not at their connect
  // timeout, and cancels the claims still running on the server, on a connection of its own.
  const cancel = async (pids: number[]) => {
    const client = new config.Client({ ...config, ...(t.statementMs > 0 && { query_timeout: t.readMs }) });
    try {
      await client.connect();
      await client.query("select pg_cancel_backend(pid) from unnest($1::int[]) as pid", [pids]);
    } finally {
      await client.end().catch(() => {});
    }
  };
  const pool = new (endingPool(pg.Pool, cancel))({
    ...config,
    max: opts.poolSize ?? 10,
    // Client side: a frozen or silently gone server (no RST) never answers; give up after the server would have.
    ...(t.statementMs > 0 && { query_timeout: t.readMs }),
  });
  // An idle client that errors (server restart) must not crash the process; the next query reconnects.
  pool.on("error", () => {});
  const db = new Kysely<IdemDatabase>({ dialect: new PostgresDialect({ pool }) });
  // Migrations run on a connection of their own with a client-side read timeout of their own (see migrate).
  migrationConnections.set(db, {
    timeoutMs: t.migrationMs,
    open: () => {
      const one = new pg.Pool({ ...config, max: 1, ...(t.migrationMs > 0 && { query_timeout: t.migrationMs }) });
      one.on("error", () => {});
      return new Kysely<IdemDatabase>({ dialect: new PostgresDialect({ pool: one }) });
    },
  });
  try {
    await sql`select 1`.execute(db);
  } catch (cause) {
    await db.destroy();
    // Only the client's own timers mean no answer: a server's refusal may name a timeout setting
    // too (an invalid `-c statement_timeout=…` in the URL's options), and is an answer.
    const timedOut = clientTimeout(cause);
    const why =
      timedOut === "connect"
        ? `no answer within ${t.connectMs} ms (connectTimeoutMs, or connect_timeout in the URL)`
        : timedOut === "read"
          ? `no answer to a statement within ${t.readMs} ms (statementTimeoutMs, or statement_timeout in the URL, and 5 s)`
          : (cause as Error).message;
    throw new LedgerConfigError(`cannot connect to Postgres ledger ${redactUrl(url)}: ${why}`, {
      cause,
      unreachable: isUnreachable(cause),
    });
  }
  if (opts.preparedStatements === false) return { db };
  // A name per statement text: pg parses a named statement once per connection, then only binds.
  const names = new Map<string, string>();
  // No async function and no spreads on the way: each hop and copy of a statement that runs twice
  // a guarded call is client CPU the server's answer waits behind at 16 in flight (issue 16).
  const send = (
    text: string,
    parameters: readonly unknown[],
    asArrays?: boolean,
    claim?: boolean,
  ): Promise<QueryResult<any>> => {
    let name = names.get(text);
    if (name === undefined) {
      name = `idem_${sha256(text).slice(0, 24)}`;
      names.set(text, name);
    }
    const query = { name, text, values: parameters as unknown[], rowMode: asArrays ? "array" : undefined } as {
      name: string;
      text: string;
      values: unknown[];
    };
    // A claim is cancelled if it still runs (waits for a lock) as the close ends the pool.
    return (claim ? pool.claim(query) : pool.query(query)).then(answerOf);
  };
  // Never at once: every answer is a round trip away (see DirectExecutor).
  const direct: DirectExecutor = (text, parameters, asArrays, atOnce, claim) =>
    atOnce ? undefined : send(text, parameters, asArrays, claim);
  return { db, direct };
}

/** A pg answer as kysely's QueryResult: its rows, and for a write the rows it changed. */
function answerOf(res: { rows: any[]; rowCount: number | null }): QueryResult<any> {
  return res.rowCount === null ? { rows: res.rows } : { rows: res.rows, numAffectedRows: BigInt(res.rowCount) };
}

/**
 * Whether a failed connect means the server did not answer, or could not take us now (refused,
 * unresolvable, timed out, starting up or shutting down; out of connections, memory or disk:
 * class 53), rather than that it answered no (a wrong password, no such database): the first may
 * pass, the second is configuration.
 */
const NOT_ANSWERING = new Set([
  ...["ECONNRESET", "ETIMEDOUT", "EHOSTUNREACH", "ENETUNREACH", "57P01", "57P02", "57P03"],
  ...["55P03", "57014"], // a lock or statement timeout: busy now, not misconfigured
]);
function isUnreachable(cause: unknown): boolean {
  const e = (cause ?? {}) as { code?: unknown; syscall?: unknown };
  const code = e.code;
  if (typeof code === "string" && SQLITE_PASSING.test(code)) return true;
  // A server on a Unix socket (`?host=/run/postgresql`) that is stopped or not started yet has
  // removed its socket file: the connect finds no file, as TCP finds no listener. A file missing
  // anywhere else (a certificate the URL names: syscall "open") is configuration.
  if (code === "ENOENT") return e.syscall === "connect";
  if (typeof code === "string") return NOT_SENT_CODES.has(code) || NOT_ANSWERING.has(code) || code.startsWith("53");
  return /timeout|Connection terminated|not queryable/i.test(String((cause as Error | undefined)?.message));
}

/** SQLite's answers that may pass: a full disk, an I/O error, a lock held elsewhere. */
const SQLITE_PASSING = /^SQLITE_(FULL|IOERR|BUSY|LOCKED)/;

/**
 * Which of the client's own timers ended a call, if one did (pg 8, pg-pool 3): opening a
 * connection (`connectionTimeoutMillis`: the client's "timeout expired", the pool's two) or
 * waiting for a statement's answer (`query_timeout`). Only these mean that no answer came; the
 * server's errors (a statement it cancelled, 57014; a setting it refused) are answers.
 */
function clientTimeout(cause: unknown): "connect" | "read" | undefined {
  const message = (cause as Error | undefined)?.message;
  if (message === "Query read timeout") return "read";
  if (
    message === "timeout expired" ||
    message === "timeout exceeded when trying to connect" ||
    message === "Connection terminated due to connection timeout"
  )
    return "connect";
  return undefined;
}

/**
 * The longest a Node timer waits, ms (about 24.8 days): a longer one fires at once (after 1 ms,
 * with a TimeoutOverflowWarning). Postgres's `statement_timeout` and `lock_timeout` stop there too.
 */
const MAX_TIMER_MS = 2 ** 31 - 1;

/** The Postgres timeouts: an option wins, then the URL's parameter (as pg and libpq read it), then the default. */
function timeouts(
  url: string,
  opts: ConnectionOptions,
): {
  connectMs: number;
  statementMs: number;
  /** The client's wait for a statement's answer: 5 s after the server's own limit, within a timer's. */
  readMs: number;
  lockMs: number;
  migrationMs: number;
  lifetimeMs: number;
} {
  const params = urlParams(url);
  const pick = (
    given: number | undefined,
    param: string | undefined,
    scale: number,
    fallback: number,
    what: string,
  ): number => {
    const n = given ?? (param === undefined ? fallback : Number(param) * scale);
    if (!Number.isFinite(n) || n < 0)
      throw new LedgerConfigError(`${what} must be a number of ms ≥ 0 (got ${given ?? param})`);
    // Every one is a client timer (or the server's limit, where Postgres stops at the same value):
    // a longer one would fire at once, failing every call as if the server had not answered.
    if (Math.round(n) > MAX_TIMER_MS)
      throw new LedgerConfigError(
        `${what} must be at most ${MAX_TIMER_MS} ms, about 24.8 days (got ${given ?? `${param}${scale === 1 ? "" : " s"}`})`,
      );
    return Math.round(n);
  };
  const statementMs = pick(
    opts.statementTimeoutMs,
    params.get("statement_timeout") ?? undefined,
    1,
    30_000,
    "statementTimeoutMs / statement_timeout",
  );
  const connectMs = pick(
    opts.connectTimeoutMs,
    params.get("connect_timeout") ?? undefined,
    1000,
    10_000,
    "connectTimeoutMs / connect_timeout",
  );
  // libpq reads connect_timeout=0 as "wait for ever"; it was read here as the default (10 s),
  // silently. Waiting for ever is not to be had: a connect to a frozen server (it takes the TCP
  // connection and never answers) would hold every call waiting for a connection, for ever.
  if (connectMs === 0)
    throw new LedgerConfigError(
      `${opts.connectTimeoutMs === undefined ? "connect_timeout=0 (to libpq: wait for ever)" : "connectTimeoutMs 0"} is refused: a ledger never waits for ever for a connection, which a frozen server would make it do; give a time (connect_timeout in seconds, connectTimeoutMs in ms), or none for 10 s`,
    );
  return {
    connectMs,
    statementMs,
    readMs: Math.min(statementMs + 5_000, MAX_TIMER_MS),
    lockMs: pick(
      opts.lockTimeoutMs,
      params.get("lock_timeout") ?? undefined,
      1,
      10_000,
      "lockTimeoutMs / lock_timeout",
    ),
    migrationMs: pick(opts.migrationTimeoutMs, undefined, 1, 600_000, "migrationTimeoutMs"),
    lifetimeMs: pick(opts.connectionLifetimeMs, undefined, 1, 60_000, "connectionLifetimeMs"),
  };
}

function urlParams(url: string): URLSearchParams {
  const q = url.indexOf("?");
  return new URLSearchParams(q < 0 ? "" : url.slice(q + 1));
}

/** The subset of pg-connection-string that the ledger uses. */
interface ConnectionStringParser {
  /** The URL as pg's client config; reads the files that `sslrootcert`, `sslcert` and `sslkey` name. */
  parse(url: string): Record<string, unknown>;
}

/**
 * The URL, read once, as pg would read it. Given the URL itself, pg parses it again in every new
 * Client's constructor, reading the certificate files it names each time; and pg-pool makes
 * clients from socket callbacks (a connection dropped while a call waits for one), where a file
 * briefly missing (a certificate being rotated, a secret remounted) was an uncaught exception that
 * took the process down. Read here, a missing file fails the open (configuration, not an outage),
 * and certificates rotated on disk are read by the ledger's next open, not by its new connections.
 * The parser is pg's own dependency, loaded from where pg is, so the URL means what it meant to pg.
 */
function connectionConfig(url: string): Record<string, unknown> {
  const fromPg = createRequire(createRequire(import.meta.url).resolve("pg"));
  const parser = fromPg("pg-connection-string") as ConnectionStringParser;
  try {
    return parser.parse(url);
  } catch (cause) {
    throw new LedgerConfigError(`cannot use Postgres ledger ${redactUrl(url)}: ${(cause as Error).message}`, {
      cause,
      unreachable: isUnreachable(cause),
    });
  }
}

/**
 * pg's Client, made safe to hold while the server restarts or freezes:
 * - a socket error while a query is in flight fails that query, and pg also emits it as an 'error'
 *   event on the client; pg-pool listens only while the client is idle, so a checked-out client's
 *   error was an uncaught exception that took the process down;
 * - a query that failed with the connection's end (`endsConnection`) fails on a connection the
 *   pool would hand to the next caller: the query's callback gives it back before pg has seen the
 *   socket close. It is destroyed, and marked so at once, so the pool drops it;
 * - ending an idle client half-closes its socket and waits for the server's reply: a frozen server
 *   never sends it, and the socket held the process open for ever after `close()`. It gets a
 *   moment, then is destroyed.
 */
function ledgerClient(
  Base: typeof import("pg").Client,
  connection: Record<string, unknown>,
): typeof import("pg").Client {
  return class LedgerClient extends Base {
    constructor(config?: ConstructorParameters<typeof Base>[0]) {
      // The URL's settings win over the pool's, as when pg parsed the URL itself. Each client gets
      // its own copy of the TLS settings: pg changes them (it hides the key).
      const ssl = connection.ssl;
      super({
        ...(config as object),
        ...connection,
        ...(typeof ssl === "object" && ssl !== null && { ssl: { ...ssl } }),
      });
      this.on("error", () => {}); // the query in flight already failed with it
    }

    /** The failure that ended this connection (`endsConnection`), if one did. */
    private endedBy: Error | undefined;

    override query(...args: unknown[]): any {
      // A query sent after the end fails with pg's "not queryable", which says nothing of why:
      // it gets what ended the connection as its cause (a `finally` that queries, such as kysely's
      // release of its migration lock, reports its own failure in place of the first one).
      const ended = this.endedBy;
      const drop = (err: unknown) => {
        if (ended && err instanceof Error && err !== ended && err.cause === undefined) err.cause = ended;
        if (!endsConnection(err)) return;
        this.endedBy ??= err as Error;
        (this as unknown as { _queryable: boolean })._queryable = false; // pg-pool's release reads it
        socketOf(this).destroy();
      };
      const last = args.length - 1;
      const callback = args[last];
      if (typeof callback === "function") {
        args[last] = (err: unknown, res: unknown) => {
          drop(err);
          callback(err, res);
        };
        return (Base.prototype.query as (...a: unknown[]) => unknown).apply(this, args);
      }
      const result = (Base.prototype.query as (...a: unknown[]) => unknown).apply(this, args);
      return result instanceof Promise
        ? result.catch((err: unknown) => {
            drop(err);
            throw err;
          })
        : result;
    }

    override end(...args: unknown[]): any {
      const socket = socketOf(this);
      setTimeout(() => socket.destroy(), END_GRACE_MS).unref();
      return (Base.prototype.end as (...a: unknown[]) => unknown).apply(this, args);
    }
  } as typeof import("pg").Client;
}

/**
 * Whether a query's error means its connection can take no more queries:
 * - "Query read timeout" (pg's client-side `query_timeout`): the server may still answer, into
 *   the next caller's query, or never (frozen, or gone without a RST);
 * - a FATAL or PANIC from the server: it ends the session as it sends it (pg_terminate_backend,
 *   a shutdown, idle_session_timeout); and the SQLSTATEs of such endings, whatever the severity's
 *   language (`lc_messages`): 57P01-57P05 (a shutdown, a crash, the database dropped, an idle
 *   session timed out), 25P03 (idle in a transaction for too long), class 08 (the connection);
 * - "Connection terminated…": pg saw the socket end while the query waited.
 */
export function endsConnection(err: unknown): boolean {
  const e = (err ?? {}) as { message?: unknown; severity?: unknown; code?: unknown };
  if (e.message === "Query read timeout") return true;
  if (e.severity === "FATAL" || e.severity === "PANIC") return true;
  if (typeof e.code === "string" && (/^(57P|08)/.test(e.code) || e.code === "25P03")) return true;
  return typeof e.message === "string" && e.message.startsWith("Connection terminated");
}

/** How long a closing connection waits for the server's goodbye before its socket is destroyed. */
const END_GRACE_MS = 1_000;

function socketOf(client: object): { destroy(): void } {
  return (client as { connection: { stream: { destroy(): void } } }).connection.stream;
}

/**
 * Applies pending migrations; a no-op (one cheap query) when the schema is current. It checks
 * again itself (under the lock on SQLite): another process may have migrated meanwhile.
 */
export async function migrate(db: Kysely<IdemDatabase>, dialect: DialectName): Promise<string[]> {
  if (await isCurrent(db)) return [];
  if (dialect === "postgres") {
    // A migration may rewrite a large table: not a stuck statement. One connection, without the
    // server's statement timeout, and where the ledger opened the pool (a connection of its own)
    // with the client's read timeout of migrations (migrationTimeoutMs), not the statements'. Its lock waits are short, and tried again: a migration queued for a
    // table behind a long reader (a report, pg_dump) would queue every worker's statement behind
    // it. A second process waits for the first's migration lock in one statement (kysely sets
    // that statement's lock_timeout to an hour), so within migrationTimeoutMs, not by these tries.
    const migrating = migrationConnections.get(db);
    const own = migrating?.open();
    const patience = opened.get(db)?.migrationLockPatienceMs ?? MIGRATION_PATIENCE_MS;
    try {
      return await (own ?? db).connection().execute(async (conn) => {
        await sql`set statement_timeout = 0`.execute(conn);
        await sql.raw(`set lock_timeout = ${MIGRATION_LOCK_WAIT_MS}`).execute(conn);
        try {
          // Between tries the statements that waited behind ours go first.
          return await pRetry(() => migrateToLatest(conn, dialect), {
            retries: Number.POSITIVE_INFINITY,
            minTimeout: 50,
            maxTimeout: 1_000,
            randomize: true,
            maxRetryTime: patience,
            shouldRetry: ({ error }) => lockNotFree(error),
          }).catch((error: unknown) => {
            if (!lockNotFree(error)) throw error;
            throw new MigrationWaitError("locks", patience, { cause: error });
          });
        } finally {
          // Best effort: on a connection that broke, the first error is the one to report.
          await sql`reset statement_timeout`.execute(conn).catch(() => {});
          await sql`reset lock_timeout`.execute(conn).catch(() => {});
        }
      });
    } catch (error) {
      // A statement past the read timeout ends its connection, and kysely's release of its
      // migration lock then fails on it ("not queryable"): that failure is what reaches here, with
      // the read timeout as its cause (ledgerClient). Another end (the server's) is no timeout.
      if (migrating && migrating.timeoutMs > 0 && causesOf(error).some((e) => clientTimeout(e) === "read"))
        throw new MigrationWaitError("answer", migrating.timeoutMs, { cause: error });
      throw schemaError("ledger migration failed", error);
    } finally {
      await own?.destroy();
    }
  }
  return migrateSqlite(db);
}

/** An error and the causes it wraps, outermost first (at most a few: a cycle ends it). */
function causesOf(error: unknown): unknown[] {
  const out: unknown[] = [];
  for (let e: unknown = error; e !== undefined && e !== null && out.length < 8; e = (e as { cause?: unknown }).cause)
    out.push(e);
  return out;
}

/** A migration's statement that gave up waiting for a lock (`lock_timeout`, 55P03). */
const lockNotFree = (error: unknown) => (error as { cause?: { code?: unknown } }).cause?.code === "55P03";

/** A migration's wait for one lock, before it lets the statements queued behind it through. */
const MIGRATION_LOCK_WAIT_MS = 500;
/** How long a migration keeps trying for its locks by default (`migrationLockPatienceMs`); then the open fails, unreachable. */
const MIGRATION_PATIENCE_MS = 60_000;

/** Kysely instances on a connection of their own for migrations, for pools this module opened. */
const migrationConnections = new WeakMap<
  Kysely<IdemDatabase>,
  { readonly open: () => Kysely<IdemDatabase>; readonly timeoutMs: number }
>();

/** A failure to read or change the schema, typed: `unreachable` when it may pass (a restart, a lock, a full disk). */
function schemaError(what: string, error: unknown): LedgerConfigError {
  if (error instanceof LedgerConfigError) return error;
  return new LedgerConfigError(`${what}: ${(error as Error)?.message ?? String(error)}`, {
    cause: error,
    unreachable: isUnreachable(error),
  });
}

/**
 * kysely's Migrator takes no lock on SQLite (it assumes a single connection), so processes opening
 * a new file together interleaved their CREATE TABLEs. SQLite's write lock is the lock: BEGIN
 * IMMEDIATE waits for it on the busy timeout like any writer (without blocking the process, so
 * two ledgers of one process may open one file together), then the schema is checked again,
 * since another process may have migrated it meanwhile. The Migrator runs inside that transaction
 * (it opens none of its own on SQLite; disableTransactions says so), so the pending migrations
 * also commit as one: a crash or a failed statement leaves none half applied.
 */
function migrateSqlite(db: Kysely<IdemDatabase>): Promise<string[]> {
  return db.connection().execute(async (conn) => {
    try {
      await sql`begin immediate`.execute(conn);
      const applied = (await isCurrent(conn))
        ? []
        : await migrateToLatest(conn, "sqlite", { disableTransactions: true });
      await sql`commit`.execute(conn);
      return applied;
    } catch (error) {
      // The first error is the one to report; if the rollback fails too, closing the connection
      // (openLedger does on a failed migration) rolls back.
      await sql`rollback`.execute(conn).catch(() => {});
      throw schemaError("ledger migration failed", error);
    }
  });
}

async function migrateToLatest(
  db: Kysely<IdemDatabase>,
  dialect: DialectName,
  opts: { disableTransactions?: boolean } = {},
): Promise<string[]> {
  // kysely looks for its tables in every schema unless told which: beside a ledger in another
  // schema of the database, it took that one's for this one's and failed on its lock row ("relation
  // idem_migration_lock does not exist"), so a second ledger (search_path in the URL) could never
  // be migrated. This ledger's are where the migrations create its tables: the current schema.
  const schema =
    dialect === "postgres"
      ? (await sql<{ schema: string | null }>`select current_schema() as schema`.execute(db)).rows[0]?.schema
      : undefined;
  const migrator = new Migrator({
    db,
    provider: migrationProvider(dialect),
    migrationTableName: "idem_migration",
    migrationLockTableName: "idem_migration_lock",
    ...(schema && { migrationTableSchema: schema }),
    ...opts,
  });
  const { error, results } = await migrator.migrateToLatest();
  if (error) throw schemaError("ledger migration failed", error);
  return (results ?? []).filter((r) => r.status === "Success").map((r) => r.migrationName);
}

/**
 * The ledger's schema against this release: migrations it still needs, and migrations it has that
 * this release does not know (a newer idem migrated it: this one must not write to it).
 */
export async function schemaStatus(
  db: Kysely<IdemDatabase>,
  dialect: DialectName | undefined = opened.get(db)?.dialect,
): Promise<{ pending: string[]; unknown: string[] }> {
  let applied: string[] = [];
  try {
    // On Postgres, the migration table of the ledger's own schema, where its migrations run
    // (migrateToLatest): named bare, it was the first of the search path's, so a schema not
    // migrated yet before public (search_path=b,public) was read by public's, as up to date.
    const schema =
      dialect === "postgres"
        ? (await sql<{ schema: string | null }>`select current_schema() as schema`.execute(db)).rows[0]?.schema
        : undefined;
    const table = schema ? sql.id(schema, "idem_migration") : sql.id("idem_migration");
    if (dialect !== "postgres" || schema)
      applied = (await sql<{ name: string }>`select name from ${table}`.execute(db)).rows.map((r) => r.name);
    // No schema of the search path exists: nothing applied (the migrations will say why they cannot run).
  } catch (error) {
    // No migration table: nothing applied yet. Any other failure (a lock, a restart, a damaged
    // file) says nothing about the schema, and must not read as "run the migrations".
    const e = error as { code?: unknown; message?: unknown };
    const noTable = e?.code === "42P01" || /no such table: idem_migration/.test(String(e?.message));
    if (!noTable) throw schemaError("cannot read the ledger's schema version", error);
  }
  return {
    pending: MIGRATION_NAMES.filter((n) => !applied.includes(n)),
    unknown: applied.filter((n) => !MIGRATION_NAMES.includes(n)),
  };
}

async function isCurrent(db: Kysely<IdemDatabase>): Promise<boolean> {
  return (await schemaStatus(db)).pending.length === 0;
}

/** The ledger's BIGINT columns, read as numbers whatever the pool's type parsers. */
class TimesAsNumbers implements KyselyPlugin {
  private static readonly COLUMNS = new Set([
    "lease_expires_at",
    "next_check_at",
    "last_execution_at",
    "first_execution_at",
    "created_at",
    "updated_at",
    "completed_at",
    "expires_at",
    "db_now",
  ]);

  transformQuery(args: PluginTransformQueryArgs): RootOperationNode {
    return args.node;
  }

  async transformResult(args: PluginTransformResultArgs): Promise<QueryResult<UnknownRow>> {
    for (const row of args.result.rows) {
      for (const k of Object.keys(row))
        if (TimesAsNumbers.COLUMNS.has(k) && typeof row[k] === "string") row[k] = Number(row[k]);
    }
    return args.result;
  }
}

/** A URL without its password, for messages and logs. */
export function redactUrl(url: string): string {
  // Any scheme, and a password holding "/", "@", "?" or "#" that no URL parser reads as one:
  // everything from the user's ":" to the last "@" before the query goes (or, when the password
  // itself holds "?" or "#", to the last "@" at all: masking too much is the safe mistake); then
  // the parameters named like secrets.
  const user = /^([a-z][\w+.-]*:\/\/[^:/?#@]*):[^?#]*@/i;
  return url
    .replace(user.test(url) ? user : /^([a-z][\w+.-]*:\/\/[^:/?#@]*):.*@/i, "$1:***@")
    .replace(/([?&][^=&#]*(?:pass|secret|token|key)[^=&#]*=)[^&#]*/gi, "$1***");
}
