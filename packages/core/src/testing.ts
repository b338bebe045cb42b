/**
 * Test-only access to a ledger's internals, reachable as `@idem/core/testing` under the
 * workspace's `idem-source` condition only: published builds neither contain nor export it.
 */
import type { Dialect, Kysely } from "kysely";
import { contextOf, open, type Ledger, type LedgerOptions } from "./ledger.js";
import type { IdemDatabase } from "./schema.js";
import { sqliteConnection } from "./sqlite-driver.js";

export interface TestLedgerOptions extends LedgerOptions {
  /** A clock (ms since epoch) replacing the database's, so a test can move time (leases, windows). */
  readonly clock?: () => number;
}

/** `openLedger` with an optional test clock. */
export function openTestLedger(target: string | Dialect, options: TestLedgerOptions = {}): Promise<Ledger> {
  const { clock, ...rest } = options;
  return open(target, rest, clock);
}

/** The ledger's own kysely instance (its connection: SQLite pragmas, triggers for fault tests). */
export function databaseOf(ledger: Ledger): Kysely<IdemDatabase> {
  return contextOf(ledger).db;
}

/**
 * A kysely dialect on a better-sqlite3 database as the ledger opens its own (statement cache,
 * group commit), for tests that put hooks around a ledger's statements. A connection the ledger
 * did not open is not opened again after a group commit abandoned it (sqlite-driver.ts
 * `SqliteConnection`): every statement since is refused.
 */
export function sqliteLedgerDialect(database: import("better-sqlite3").Database, groupCommit = true): Dialect {
  return sqliteConnection(database, { groupCommit }).dialect;
}
