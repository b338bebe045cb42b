/**
 * The kysely driver of a SQLite ledger: better-sqlite3, with the writes of concurrent callers in
 * group commits (group-commit.ts). kysely's own SQLite driver runs one query at a time behind a
 * mutex, so two callers' writes could never share a commit; here a query waits only while
 * another connection of this driver holds a transaction (a migration), since on one SQLite
 * connection a transaction is everyone's. Locks held by other connections are waited for without
 * blocking the process (sqlite-busy.ts).
 *
 * A group commit that could be neither committed nor rolled back closes its connection
 * (group-commit.ts `abandon`); the ledger then opens its file again by itself, as its first open
 * did (`SqliteConnection`), so that one failed commit (a disk full for a moment) does not leave
 * every later call refused until the application closes and opens the ledger again.
 */
import {
  CompiledQuery,
  SqliteAdapter,
  SqliteIntrospector,
  SqliteQueryCompiler,
  type DatabaseConnection,
  type Dialect,
  type Driver,
  type QueryResult,
} from "kysely";
import { closeSync, fstatSync, openSync, readlinkSync, realpathSync, rmSync, statSync, type Stats } from "node:fs";
import type { Database, Statement } from "better-sqlite3";
import { claimNotWritten, LedgerUnavailableError } from "./errors.js";
import { GroupCommit } from "./group-commit.js";
import { isBusy, LockWaits } from "./sqlite-busy.js";
import type { DirectExecutor } from "./query-cache.js";

/**
 * Prepares a statement (kept prepared: see statementCache). `asArrays`: a read of the direct
 * executor that answers its rows as arrays, prepared apart (see statementCache).
 */
type Prepare = (text: string, asArrays?: boolean) => Statement;

/**
 * Throws (a `LedgerUnavailableError` marked `reopen`) when the ledger's file is no longer the one
 * it opened (see `fileCheck`); `close` gives back what the check holds, once the connection is closed.
 */
type FileCheck = (() => void) & { close?: () => void; readonly file?: Stats };

/** A connection to the ledger's file as the ledger opens it: its pragmas set, its file check made. */
export interface OpenedSqlite {
  readonly database: Database;
  readonly checkFile: FileCheck;
}

/**
 * Opens the ledger's connection again (open.ts), as its first open did: the same pragmas, a file
 * check of its own, and the file the first open opened, or a `LedgerUnavailableError` marked
 * `reopen` (the file was replaced or deleted since: never written again).
 */
export type Reopen = () => Promise<OpenedSqlite>;

/**
 * The ledger's own SQLite dialect says whether it groups commits, so that a ledger opened on it
 * (the tests open theirs so) claims as on a connection it opened itself (Store.claim).
 */
export interface LedgerSqliteDialect extends Dialect {
  readonly groupsCommits: boolean;
}

function sqliteDialect(sqlite: SqliteConnection): LedgerSqliteDialect {
  return {
    createAdapter: () => new SqliteAdapter(),
    createDriver: () => new GroupedSqliteDriver(sqlite),
    createIntrospector: (db) => new SqliteIntrospector(db),
    createQueryCompiler: () => new SqliteQueryCompiler(),
    groupsCommits: sqlite.groupCommit,
  };
}

/** One connection to the file and what is bound to it: its prepared statements, group commit, lock waits and file check. */
interface Bound {
  readonly database: Database;
  readonly prepare: Prepare;
  readonly group: GroupCommit | undefined;
  readonly waits: LockWaits;
  readonly checkFile: FileCheck;
}

/**
 * The ledger's connection to its SQLite file, opened again after a group commit abandoned it.
 *
 * A group commit that could be neither committed nor rolled back closes its connection
 * (group-commit.ts `abandon`). The statements bound to that connection then (the writes of that
 * commit, and those waiting for a commit or a lock) are refused with its `abandoned` error, marked
 * `reopen`: none of them was committed, and none may pass on a connection that is gone. The next
 * statement opens the file again (`reopen`: the first open's pragmas and file check, and the file
 * the first open opened), with a statement cache, group commit and lock waits of its own; the
 * statements that arrive meanwhile wait for that one open. A reopen that fails (the disk still
 * failing, the file locked by another process) refuses them with a `LedgerUnavailableError` that
 * may pass, and the next statement tries again (one try for the statements of a moment: no
 * loop). A file replaced or deleted since the first open is refused for good, as the file check
 * refuses it. Pragmas a user set through the ledger's kysely instance are the old connection's.
 * Without `reopen` (a connection the ledger did not open: testing.ts, `:memory:`, whose new
 * connection would be an empty database) every statement since is refused with the abandon.
 */
class SqliteConnection {
  private bound: Bound;
  /** Connections closed under statements that may still be waiting on them (drained and closed at `close`). */
  private readonly retired = new Set<Bound>();
  private reopening: Promise<Bound> | undefined;
  /** The file was replaced or deleted since the first open: it is never opened again. */
  private refused: LedgerUnavailableError | undefined;
  /**
   * Set as the ledger closes: nothing is opened again, and a fresh claim still waiting is refused
   * with it (`close`).
   */
  private closing: LedgerUnavailableError | undefined;

  constructor(
    first: OpenedSqlite,
    readonly groupCommit: boolean,
    private readonly busyTimeoutMs: number,
    private readonly reopen?: Reopen,
  ) {
    this.bound = this.bind(first);
  }

  /** The connection as it is, for a statement inside its transaction and for `releaseConnection`. */
  get current(): Bound {
    return this.bound;
  }

  /**
   * The connection for a new statement if it is open, or undefined when it must be opened again
   * first (`use`, which may wait). Throws what refuses every statement: the abandon where the
   * connection cannot be opened again, or a replaced file.
   */
  now(): Bound | undefined {
    const abandoned = this.bound.group?.abandoned;
    if (!abandoned) return this.bound;
    if (!this.reopen || this.closing) throw abandoned;
    if (this.refused) throw this.refused;
    return undefined;
  }

  /** The connection for a new statement, opened again first when a group commit abandoned it. */
  use(): Bound | Promise<Bound> {
    const now = this.now();
    if (now) return now;
    if (!this.reopening) {
      const reopening = this.open().finally(() => {
        this.reopening = undefined;
      });
      this.reopening = reopening;
    }
    return this.reopening;
  }

  /**
   * Closes the connection, and those closed under statements still waiting (once those are answered).
   * Statements still waiting for their commit or for a lock get their answer, not a closed
   * connection (each within its busy timeout): they record what a call did or learned, or a
   * person's decision. But a fresh claim still waiting (the direct executor's `claim`) is refused
   * at its next try, nothing of it run (its caller told so, and that calling again is safe:
   * `claimNotWritten`): committed after the close, it was a row running under a lease nobody
   * renews, of a call the close could not name (its claim had no answer yet).
   */
  async close(): Promise<void> {
    this.closing = claimNotWritten();
    // An open under way ends first: it closes what it opened, seeing the close.
    await this.reopening?.catch(() => {});
    const all = [this.bound, ...this.retired];
    await Promise.all(all.flatMap((b) => [b.group?.drain(), b.waits.drain()]));
    for (const b of all) {
      b.database.close();
      b.checkFile.close?.();
    }
  }

  private bind({ database, checkFile }: OpenedSqlite): Bound {
    database.pragma("busy_timeout = 0");
    const group = this.groupCommit
      ? new GroupCommit(database, this.busyTimeoutMs, checkFile, this.reopen !== undefined, () => this.closing)
      : undefined;
    const waits = new LockWaits(
      database,
      this.busyTimeoutMs,
      () => group?.abandoned,
      () => this.closing,
    );
    return { database, prepare: statementCache(database), group, waits, checkFile };
  }

  private async open(): Promise<Bound> {
    let opened: OpenedSqlite;
    try {
      opened = await this.reopen!();
    } catch (cause) {
      if (cause instanceof LedgerUnavailableError && cause.reopen) {
        this.refused = cause;
        throw cause;
      }
      throw new LedgerUnavailableError(
        `the ledger's SQLite connection, closed when a group commit could be neither committed nor rolled back, could not be opened again: ${(cause as Error)?.message ?? String(cause)} (the next statement tries again)`,
        undefined,
        { cause },
      );
    }
    if (this.closing) {
      opened.database.close();
      opened.checkFile.close?.();
      throw new Error("the ledger was closed while its SQLite connection was being opened again");
    }
    const old = this.bound;
    this.bound = this.bind(opened);
    this.retire(old);
    return this.bound;
  }

  /** The abandoned connection: closed (its group commit closed it) once its statements are answered. */
  private retire(old: Bound): void {
    this.retired.add(old);
    void Promise.all([old.group?.drain(), old.waits.drain()]).then(() => {
      if (!this.retired.delete(old)) return; // `close` has it
      try {
        // Closed by its group commit, unless a statement was mid-step then (none is streamed).
        old.database.close();
      } catch {
        this.retired.add(old); // `close` tries again
        return;
      }
      old.checkFile.close?.();
    });
  }
}

/** Runs a write as better-sqlite3 answers it; `all()` for one with RETURNING (see sqliteConnection). */
function runWrite(stmt: Statement, parameters: readonly unknown[]): QueryResult<unknown> {
  if (stmt.reader) return { rows: stmt.all(parameters) };
  const { changes, lastInsertRowid } = stmt.run(parameters);
  return { rows: [], numAffectedRows: BigInt(changes), insertId: BigInt(lastInsertRowid) };
}

const TRANSACTION_CONTROL = /^\s*(begin|commit|end|rollback|savepoint|release)\b/i;

class GroupedSqliteDriver implements Driver {
  /** The connection whose transaction is open, and when it ends. */
  private owner: DatabaseConnection | undefined;
  private ended: Promise<void> = Promise.resolve();
  private end: () => void = () => {};

  constructor(private readonly sqlite: SqliteConnection) {}

  async init(): Promise<void> {}

  async acquireConnection(): Promise<DatabaseConnection> {
    const connection: DatabaseConnection = {
      executeQuery: async <R>(query: CompiledQuery) => {
        while (this.owner !== undefined && this.owner !== connection) await this.ended;
        return this.execute(connection, query) as QueryResult<R> | Promise<QueryResult<R>>;
      },
      // biome-ignore lint/correctness/useYield: the ledger streams nothing; say so instead of half-doing it
      streamQuery: async function* () {
        throw new Error("the SQLite ledger driver does not stream queries");
      },
    };
    return connection;
  }

  private execute(
    connection: DatabaseConnection,
    query: CompiledQuery,
  ): QueryResult<unknown> | Promise<QueryResult<unknown>> {
    // A group commit closed the connection (a transaction it could not end): opened again first,
    // or refused saying why, not "not open".
    const bound = this.sqlite.use();
    return bound instanceof Promise
      ? bound.then((b) => this.executeOn(b, connection, query))
      : this.executeOn(bound, connection, query);
  }

  private executeOn(
    b: Bound,
    connection: DatabaseConnection,
    query: CompiledQuery,
  ): QueryResult<unknown> | Promise<QueryResult<unknown>> {
    // Inside its transaction a statement runs at once: it holds the lock (BEGIN IMMEDIATE), and
    // one that met a lock could not simply run again, the transaction would fail.
    if (this.owner === connection) return this.run(b, connection, b.prepare(query.sql), query.parameters);
    // Preparing may meet a lock too (the schema read while another connection recovers the log).
    const stmt = b.waits.run(() => b.prepare(query.sql));
    return stmt instanceof Promise
      ? stmt.then((s) => this.outside(b, connection, s, query.parameters))
      : this.outside(b, connection, stmt, query.parameters);
  }

  /** A statement outside any transaction: reads and writes wait for locks, writes share commits. */
  private outside(
    b: Bound,
    connection: DatabaseConnection,
    stmt: Statement,
    parameters: readonly unknown[],
  ): QueryResult<unknown> | Promise<QueryResult<unknown>> {
    if (stmt.reader && stmt.readonly) return b.waits.run(() => ({ rows: stmt.all(parameters) }));
    // Transaction control is not a write to share a commit with (BEGIN IMMEDIATE is not
    // "readonly" to SQLite); a BEGIN waits for the lock like any write.
    if (stmt.readonly || TRANSACTION_CONTROL.test(stmt.source))
      return b.waits.run(() => this.run(b, connection, stmt, parameters));
    if (!b.group)
      return b.waits.run(() => {
        b.checkFile();
        return this.run(b, connection, stmt, parameters);
      });
    return b.group.write(() => runWrite(stmt, parameters)); // the group checks the file
  }

  private run(
    b: Bound,
    connection: DatabaseConnection,
    stmt: Statement,
    parameters: readonly unknown[],
  ): QueryResult<unknown> {
    try {
      return stmt.reader && stmt.readonly ? { rows: stmt.all(parameters) } : runWrite(stmt, parameters);
    } finally {
      this.track(b.database, connection);
    }
  }

  /** After a statement of `connection`: did it open or end the transaction? */
  private track(database: Database, connection: DatabaseConnection): void {
    if (database.inTransaction && this.owner === undefined) {
      this.owner = connection;
      this.ended = new Promise((resolve) => (this.end = resolve));
    } else if (!database.inTransaction && this.owner === connection) {
      this.owner = undefined;
      this.end();
    }
  }

  /** Immediate: the transaction waits for the write lock at its BEGIN, where waiting is safe. */
  async beginTransaction(connection: DatabaseConnection): Promise<void> {
    await connection.executeQuery(CompiledQuery.raw("begin immediate"));
  }

  async commitTransaction(connection: DatabaseConnection): Promise<void> {
    await connection.executeQuery(CompiledQuery.raw("commit"));
  }

  async rollbackTransaction(connection: DatabaseConnection): Promise<void> {
    await connection.executeQuery(CompiledQuery.raw("rollback"));
  }

  async releaseConnection(connection: DatabaseConnection): Promise<void> {
    // Given back with its transaction over, however it ended: the others may go on.
    if (this.owner === connection && !this.sqlite.current.database.inTransaction) {
      this.owner = undefined;
      this.end();
    }
  }

  async destroy(): Promise<void> {
    await this.sqlite.close();
  }
}

/**
 * kysely prepares every query anew; preparing an INSERT that fires the audit trigger costs more
 * than running it. The ledger issues a handful of distinct statements, so keep them prepared.
 * Every statement runs to its end synchronously (nothing is streamed), so a cached statement is
 * never in use twice.
 *
 * A read asked for as arrays (the direct executor's hot reads) has a statement of its own that
 * always answers arrays: kysely, which may run the same text (in a migration's transaction), wants
 * objects, and switching a shared statement to arrays and back cost two calls into the driver a
 * replay. A write asked for as arrays answers objects, as before (see sqliteConnection).
 */
function statementCache(database: Database): Prepare {
  const objects = new Map<string, Statement>();
  const arrays = new Map<string, Statement>();
  return (text, asArrays = false) => {
    const cache = asArrays ? arrays : objects;
    let stmt = cache.get(text);
    if (!stmt) {
      stmt = database.prepare(text);
      if (asArrays && stmt.reader && stmt.readonly) stmt.raw(true);
      if (cache.size >= 500) cache.delete(cache.keys().next().value!); // queries with inlined values stay bounded
      cache.set(text, stmt);
    }
    return stmt;
  };
}

/**
 * The ledger's SQLite connection as kysely sees it, and the direct executor of its hot
 * statements, sharing one statement cache and one group commit (`groupCommit: false`: none).
 * The connection's busy timeout (by default the one it was opened with) becomes the driver's:
 * SQLite's own waits block the thread (sqlite-busy.ts). `reopen`: how the connection is opened
 * again after a group commit abandoned it (`SqliteConnection`); without it, it is not.
 */
export function sqliteConnection(
  database: Database,
  options: { groupCommit?: boolean; busyTimeoutMs?: number; checkFile?: FileCheck; reopen?: Reopen } = {},
): { dialect: LedgerSqliteDialect; direct: DirectExecutor } {
  const busyTimeoutMs = options.busyTimeoutMs ?? (database.pragma("busy_timeout", { simple: true }) as number);
  const sqlite = new SqliteConnection(
    { database, checkFile: options.checkFile ?? (() => {}) },
    options.groupCommit !== false,
    busyTimeoutMs,
    options.reopen,
  );
  const direct: DirectExecutor = (text, parameters, asArrays, atOnce, claim) => {
    // A connection a group commit closed is opened again on kysely's way (the driver), which may wait.
    const b = sqlite.now();
    if (b === undefined) return undefined;
    const { database, prepare, waits, group, checkFile } = b;
    // Inside a transaction kysely holds (migrations), a statement waits its turn through kysely.
    if (database.inTransaction) return undefined;
    let stmt: Statement;
    try {
      stmt = prepare(text, asArrays);
    } catch (error) {
      if (isBusy(error)) return undefined; // kysely's way waits for the lock
      throw error;
    }
    // Hot statements address one row by a unique key (see QueryCache): get() skips the array.
    // Only for reads: get() stops at the first row, and for a write with RETURNING the commit
    // happens after it, so a failed commit (SQLITE_FULL, SQLITE_IOERR) was swallowed and a claim
    // that was rolled back looked granted. all() steps to the end and throws what the commit threw.
    if (stmt.reader && stmt.readonly) {
      const read = () => {
        const row = stmt.get(parameters); // an array where asked for (prepared so)
        return { rows: row === undefined ? [] : [row] };
      };
      if (!atOnce) return waits.run(read);
      try {
        return read();
      } catch (error) {
        if (isBusy(error)) return undefined; // a lock met: nothing read, nothing left waiting
        throw error;
      }
    }
    if (atOnce) return undefined; // a write answers after its commit
    if (group) return group.write(() => runWrite(stmt, parameters), claim); // the group checks the file
    return waits.run(() => {
      checkFile();
      return runWrite(stmt, parameters);
    }, claim);
  };
  return { dialect: sqliteDialect(sqlite), direct };
}

/**
 * A check, before each write outside a migration, that the paths still name the files this
 * connection writes: the ledger's file, its log (`-wal`) and the log's index (`-shm`). SQLite keeps
 * writing into a file deleted (or renamed over) under an open connection, and says nothing:
 * - the file: a claim acknowledged there is in no ledger the next process opens at that path,
 *   which claims the key again and repeats the effect;
 * - the log: every commit since lives in a file no other process sees, and a crash loses it;
 * - the index: a process that opens the ledger since makes a new one, with its own locks, and the
 *   two no longer see each other's writes: both may claim a key.
 * The file is taken as the connection opened it; the log and its index as they were once it had
 * read (the open reads, which makes both), or, where they did not exist yet, as first seen. They
 * are next to the file a symbolic link names, as SQLite puts them. One `stat` a file a commit (a
 * group commit's writes share them; microseconds, against a commit's fsync); a write refused by
 * it wrote nothing.
 *
 * On Linux the check asks no file's times. Asking them (any `stat`) makes the kernel give the
 * file's next write a fine-grained time (multigrain timestamps), so that write changes the inode
 * too and its fsync commits the filesystem's journal. SQLite overwrites its log in place, fsyncing
 * each commit: a stat of the log before each write made each write about 40 us slower, a sixth of
 * a guarded call (issue 16; a C loop of 4 KiB overwrites and fsyncs took 98 us each, 140 us with
 * a statx of the times before each, 100 us with one of the inode only). So the check holds an
 * O_PATH descriptor of each file (it opens nothing for reading or writing, and closing it drops
 * none of the POSIX locks SQLite holds on the file and its index, as closing any other descriptor
 * of them would) and asks the kernel the name each has now (`/proc/self/fd`): its path while it is
 * there, another once it is renamed, "(deleted)" once it is deleted or renamed over. A name that
 * differs is checked by `stat`, which says which it was. Elsewhere, or for a file whose name does
 * not read back as its path (a symbolic link: the path may be pointed elsewhere), it is `stat`.
 */
export function fileCheck(path: string, first?: Stats): FileCheck {
  const opened = statSync(path); // first: a file gone already fails the open
  // A connection opened again (SqliteConnection) must have opened the file the first open did.
  if (first && !sameFile(opened, first)) throw notTheFile("SQLite file", path, opened);
  const real = realpathSync(path);
  const files: { path: string; what: string; seen: Stats | undefined; named?: Named | undefined }[] = [
    { path, what: "SQLite file", seen: opened },
    { path: `${real}-wal`, what: "SQLite log", seen: statSync(`${real}-wal`, { throwIfNoEntry: false }) },
    { path: `${real}-shm`, what: "SQLite log's index", seen: statSync(`${real}-shm`, { throwIfNoEntry: false }) },
  ];
  for (const f of files) if (f.seen) f.named = named(f.path, f.seen);
  const check: FileCheck = () => {
    for (const f of files) {
      if (f.named?.same()) continue;
      const now = statSync(f.path, { throwIfNoEntry: false });
      if (f.seen === undefined)
        f.seen = now; // not made yet when the ledger opened
      else if (!sameFile(now, f.seen)) throw notTheFile(f.what, f.path, now);
    }
  };
  check.close = () => {
    for (const f of files) f.named?.close();
  };
  return Object.assign(check, { file: opened });
}

/** Whether `now` is the file `seen` was (a path's stat; undefined: no file there). */
export function sameFile(now: Stats | undefined, seen: Stats): boolean {
  return now !== undefined && now.ino === seen.ino && now.dev === seen.dev;
}

/**
 * The file at `path` is not the one the ledger opened. Typed, so that every caller (Store.guard
 * passes an IdemError on) can tell it from an outage that may pass: this ledger never writes to
 * its path again, nor opens it again by itself.
 */
export function notTheFile(what: string, path: string, now: Stats | undefined): LedgerUnavailableError {
  return new LedgerUnavailableError(
    `the ${what} ${path} was ${now ? "replaced" : "deleted"} since the ledger opened it: nothing is written to a file no other process would open (close the ledger and open it again)`,
    undefined,
    { reopen: true },
  );
}

/** Linux's O_PATH, which fs.constants lacks (the same on these architectures). */
const O_PATH = process.platform === "linux" && ["x64", "arm64"].includes(process.arch) ? 0o10000000 : undefined;

interface Named {
  /** Whether the file is still named by its path (false: ask `stat`). */
  same(): boolean;
  close(): void;
}

/**
 * An O_PATH descriptor of the file at `path`, if it is the file `seen` there and the kernel reads
 * its name back as `path`; otherwise none, and the file is checked by `stat`.
 */
function named(path: string, seen: Stats): Named | undefined {
  if (O_PATH === undefined) return undefined;
  let fd: number | undefined;
  try {
    fd = openSync(path, O_PATH);
    const link = `/proc/self/fd/${fd}`;
    const now = fstatSync(fd);
    if (now.ino !== seen.ino || now.dev !== seen.dev || readlinkSync(link) !== path) throw new Error("not the same");
    const held = fd;
    let open = true;
    return {
      same: () => {
        try {
          return open && readlinkSync(link) === path;
        } catch {
          return false;
        }
      },
      close: () => {
        if (open) closeSync(held);
        open = false;
      },
    };
  } catch {
    if (fd !== undefined) closeSync(fd);
    return undefined;
  }
}

/**
 * Removes a SQLite file that a failed open made (and its -wal and -shm), while it holds no table
 * and no other connection has it open; best effort. Another process may have opened the same new
 * path since this open made it, and be migrating it. An empty file has no connection in WAL mode
 * yet (turning it to WAL writes its header first). One with a header is checked under an
 * exclusive lock taken without waiting (exclusive locking mode): a connection in WAL mode holds a
 * shared lock on the file for as long as it is open, so the lock proves there is none, and the
 * file is removed under it. A process that opened the path just before, with no statement yet (no
 * lock), is refused by its own file check: the file is gone when its open ends.
 */
export function removeMade(Database: typeof import("better-sqlite3"), path: string): void {
  let check: import("better-sqlite3").Database | undefined;
  try {
    if (statSync(path).size > 0) {
      check = new Database(path, { timeout: 0, fileMustExist: true });
      check.pragma("locking_mode = EXCLUSIVE");
      check.exec("begin exclusive");
      const tables = check.prepare("select count(*) as n from sqlite_master").get() as { n: number };
      if (tables.n !== 0) return; // a ledger: another process migrated it meanwhile
    }
    for (const suffix of ["-wal", "-shm", ""]) rmSync(path + suffix, { force: true });
  } catch {
    // Gone already, held by another connection (SQLITE_BUSY), or not ours to remove: the open's
    // own error is the one to report.
  } finally {
    check?.close();
  }
}
