/**
 * How a migration that gave up waiting says so (Postgres only: SQLite's migration waits on its
 * write lock, for the busy timeout, like any writer): typed, with the wait it gave up on, the
 * bound and the option that sets it, so a program that names that option otherwise (the `idem`
 * command's flags) can say its own; and, for a statement without an answer, what ended it rather
 * than the failure of the lock release that followed on the ended connection.
 */
import { describe, expect, it } from "vitest";
import { MigrationWaitError, openLedger } from "@idem/core";
import { databaseOf } from "@idem/core/testing";
import { freshDatabase, scaled } from "@idem/testkit";

/** kysely's migration lock (an advisory lock on Postgres), as another process migrating holds it. */
const MIGRATION_LOCK = "3853314791062309107";

/** The causes an error wraps, outermost first. */
function causes(error: unknown): unknown[] {
  const out: unknown[] = [];
  for (let e = error; e instanceof Error && out.length < 10; e = e.cause) out.push(e);
  return out;
}

describe("a Postgres migration that gave up waiting", { timeout: scaled(120_000) }, () => {
  it("for the tables' locks: MigrationWaitError naming migrationLockPatienceMs and its bound, unreachable", async () => {
    const url = await freshDatabase("postgres");
    const ledger = await openLedger(url);
    const db = databaseOf(ledger);
    // One migration behind (0013 adds a column to idem_operations), and a report reading the table.
    await db
      .deleteFrom("idem_migration" as never)
      .where("name" as never, "=", "0013-rerun-attempt" as never)
      .execute();
    await db.schema.alterTable("idem_operations").dropColumn("rerun_attempt").execute();
    await ledger.close();
    const pg = (await import("pg")).default;
    const reader = new pg.Client({ connectionString: url });
    await reader.connect();
    try {
      await reader.query("begin");
      await reader.query("select count(*) from idem_operations");
      const error = await openLedger(url, { migrationLockPatienceMs: 1_000 }).catch((e: unknown) => e);
      expect(error).toBeInstanceOf(MigrationWaitError);
      expect(error).toMatchObject({
        code: "LEDGER_CONFIG",
        unreachable: true,
        waitedFor: "locks",
        limitMs: 1_000,
        option: "migrationLockPatienceMs",
        message: expect.stringMatching(
          /the migration's locks were not free within 1000 ms \(migrationLockPatienceMs\)/,
        ),
      });
    } finally {
      await reader.end();
    }
  });

  it("for a statement's answer: MigrationWaitError naming migrationTimeoutMs, with the read timeout as its cause, not the lock release's 'not queryable'", async () => {
    const url = await freshDatabase("postgres");
    const pg = (await import("pg")).default;
    const holder = new pg.Client({ connectionString: url });
    await holder.connect();
    try {
      await holder.query(`select pg_advisory_lock(${MIGRATION_LOCK})`); // another process migrating
      const error = await openLedger(url, { migrationTimeoutMs: 2_000 }).catch((e: unknown) => e);
      expect(error).toBeInstanceOf(MigrationWaitError);
      expect(error).toMatchObject({
        unreachable: true,
        waitedFor: "answer",
        limitMs: 2_000,
        option: "migrationTimeoutMs",
        message: expect.stringMatching(/a migration statement had no answer within 2000 ms \(migrationTimeoutMs\)/),
      });
      expect((error as Error).message).not.toMatch(/not queryable/);
      expect(causes(error).map((e) => (e as Error).message)).toContain("Query read timeout");
    } finally {
      await holder.end();
    }
  });
});
