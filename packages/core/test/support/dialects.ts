/**
 * A ledger's kysely dialect with a hook around each statement and after each connection is given
 * back: tests use it to hold a statement's answer (a slow network) or to perturb the order of
 * callers' steps. kysely's own driver still runs every statement.
 */
import {
  PostgresDialect,
  type CompiledQuery,
  type DatabaseConnection,
  type Dialect,
  type Driver,
  type QueryResult,
} from "kysely";
import { sqliteLedgerDialect } from "@idem/core/testing";
import { scaled, type TestDialect } from "@idem/testkit";

export interface Hooks {
  /** Runs a statement: call `run` to execute it; what this returns is the answer the ledger gets. */
  query?(q: CompiledQuery, run: () => Promise<QueryResult<unknown>>): Promise<QueryResult<unknown>>;
  /** After a connection is given back, with the last statement it ran. */
  released?(last: CompiledQuery | undefined): Promise<void>;
}

/** The test database's dialect (SQLite: the ledger's own driver, WAL, `synchronous` and `groupCommit` as given; Postgres: a pool of `max`). */
export async function dialectFor(
  dialect: TestDialect,
  url: string,
  {
    synchronous = "FULL",
    max = 8,
    groupCommit = true,
  }: { synchronous?: "OFF" | "FULL"; max?: number; groupCommit?: boolean } = {},
): Promise<Dialect> {
  if (dialect === "sqlite") {
    const { default: Database } = await import("better-sqlite3");
    const database = new Database(url.slice("sqlite:".length), { timeout: scaled(10_000) });
    database.pragma("journal_mode = WAL");
    database.pragma(`synchronous = ${synchronous}`);
    return sqliteLedgerDialect(database, groupCommit); // as the ledger opens its own: group commit included
  }
  const { default: pg } = await import("pg");
  const pool = new pg.Pool({ connectionString: url, max });
  // As the ledger's own pool: a client whose server went away (a test stops it on purpose)
  // reports it as an 'error' event, and the query in flight or the next one fails with it.
  // Unheard, it is an uncaught exception. The pool hears an idle client's; a checked-out
  // client's (a statement in flight, a transaction open) only the client itself can.
  pool.on("error", () => {});
  pool.on("connect", (client) => client.on("error", () => {}));
  return new PostgresDialect({ pool });
}

/** `dialect` with `hooks` around its statements. */
export function hooked(dialect: Dialect, hooks: Hooks): Dialect {
  const inner = new WeakMap<DatabaseConnection, DatabaseConnection>();
  const last = new WeakMap<DatabaseConnection, CompiledQuery>();
  return {
    // The ledger's own SQLite dialect says whether it groups commits (Store.claim reads it).
    ...("groupsCommits" in dialect && { groupsCommits: dialect.groupsCommits }),
    createAdapter: () => dialect.createAdapter(),
    createIntrospector: (db) => dialect.createIntrospector(db),
    createQueryCompiler: () => dialect.createQueryCompiler(),
    createDriver: (): Driver => {
      const d = dialect.createDriver();
      return {
        init: () => d.init(),
        destroy: () => d.destroy(),
        async acquireConnection() {
          const c = await d.acquireConnection();
          const wrapper: DatabaseConnection = {
            executeQuery<R>(q: CompiledQuery) {
              last.set(wrapper, q);
              const run = () => c.executeQuery<R>(q);
              return (hooks.query ? hooks.query(q, run) : run()) as Promise<QueryResult<R>>;
            },
            streamQuery: (q, chunkSize) => c.streamQuery(q, chunkSize),
          };
          inner.set(wrapper, c);
          return wrapper;
        },
        beginTransaction: (c, settings) => d.beginTransaction(inner.get(c)!, settings),
        commitTransaction: (c) => d.commitTransaction(inner.get(c)!),
        rollbackTransaction: (c) => d.rollbackTransaction(inner.get(c)!),
        async releaseConnection(c) {
          await d.releaseConnection(inner.get(c)!);
          await hooks.released?.(last.get(c));
        },
      };
    },
  };
}

/** A statement that claims a key: the insert (on Postgres inside the claim-or-peek statement). */
export const isClaim = (q: CompiledQuery): boolean => /insert into "idem_operations"/.test(q.sql);
