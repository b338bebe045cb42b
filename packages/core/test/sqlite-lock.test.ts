/**
 * A SQLite ledger waiting for another connection's write lock (another process committing, a
 * prune, a migration) keeps its process running: SQLite's own busy handler slept the thread, so
 * timers, sockets and heartbeats stood still for up to the busy timeout (src/sqlite-busy.ts).
 */
import { join } from "node:path";
import Database from "better-sqlite3";
import { sql } from "kysely";
import { afterEach, describe, expect, it } from "vitest";
import { LedgerConfigError, LedgerUnavailableError, openLedger, type Ledger } from "@idem/core";
import { databaseOf, openTestLedger } from "@idem/core/testing";
import { scaled, tempDir } from "@idem/testkit";
import { TestProvider } from "./support/provider.js";

const opened: Ledger[] = [];
const locks: Database.Database[] = [];
afterEach(async () => {
  for (const other of locks.splice(0)) other.close(); // rolls its transaction back
  for (const l of opened.splice(0)) await l.close();
});

/** A ledger on a new file, and another connection holding the file's write lock. */
async function lockedLedger(options: { groupCommit: boolean; busyTimeoutMs: number }) {
  const path = join(tempDir(), "ledger.db");
  const ledger = await openTestLedger(`sqlite:${path}`, options);
  opened.push(ledger);
  const other = new Database(path, { timeout: 0 });
  locks.push(other);
  other.exec("BEGIN IMMEDIATE");
  return { ledger, path, release: () => other.exec("ROLLBACK") };
}

/** How late a timer of `ms` fires: the time the process could not run. */
async function lateness(ms: number): Promise<number> {
  const started = performance.now();
  await new Promise((resolve) => setTimeout(resolve, ms));
  return performance.now() - started - ms;
}

describe("SQLite: waiting for another connection's write lock", () => {
  for (const groupCommit of [true, false]) {
    it(`the process runs meanwhile, and the writes go on once the lock is free (groupCommit: ${groupCommit})`, async () => {
      const { ledger, release } = await lockedLedger({ groupCommit, busyTimeoutMs: 10_000 });
      const p = new TestProvider();
      const call = (k: string) => ledger.run(p.action("mail", {}), { tenant: "t", key: [k], args: { to: k } });
      const alone = call("alone");
      const late = await lateness(10);
      const together = Array.from({ length: 8 }, (_, i) => call(`k${i}`));
      // Held across many pauses (they double up to 50 ms): the claims wait, nothing was executed.
      const later = await lateness(300);
      expect(p.effects).toHaveLength(0);
      release();
      const out = await Promise.all([alone, ...together]);
      expect(out.map((o) => o.status)).toEqual(Array(9).fill("succeeded"));
      expect(p.effects).toHaveLength(9);
      expect((await ledger.admin.list({ tenant: "t" })).map((r) => r.status)).toEqual(Array(9).fill("succeeded"));
      // Blocked, the timers fired after the busy timeout (10 s); a loaded machine is late by far less.
      expect(Math.max(late, later)).toBeLessThan(Math.min(scaled(2_000), 5_000));
    });

    it(`a write that waited its busy timeout fails, typed, and nothing was executed (groupCommit: ${groupCommit})`, async () => {
      const busyTimeoutMs = 300;
      const { ledger } = await lockedLedger({ groupCommit, busyTimeoutMs });
      const p = new TestProvider();
      const started = performance.now();
      const out = await Promise.all(
        Array.from({ length: 4 }, (_, i) =>
          ledger.run(p.action("mail", {}), { tenant: "t", key: [`k${i}`], args: { to: "x" } }).catch((e: unknown) => e),
        ),
      );
      expect(performance.now() - started).toBeGreaterThanOrEqual(busyTimeoutMs);
      for (const o of out) expect(o).toBeInstanceOf(LedgerUnavailableError);
      expect(p.effects).toHaveLength(0);
    });

    it(`close waits for the writes waiting for the lock: they commit once it is free (groupCommit: ${groupCommit})`, async () => {
      const { ledger, path, release } = await lockedLedger({ groupCommit, busyTimeoutMs: 10_000 });
      const p = new TestProvider();
      const calls = Array.from({ length: 4 }, (_, i) =>
        ledger.run(p.action("mail", {}), { tenant: "t", key: [`k${i}`], args: { to: "x" } }).catch((e: unknown) => e),
      );
      await lateness(50); // the claims met the lock
      const closing = ledger.close();
      await lateness(100);
      release();
      await closing;
      opened.splice(opened.indexOf(ledger), 1);
      await Promise.all(calls); // their completions found the ledger closed; their claims did not
      const after = await openLedger(`sqlite:${path}`);
      opened.push(after);
      expect(await after.admin.list({ tenant: "t" })).toHaveLength(4);
    });
  }

  for (const groupCommit of [false, true])
    it(`a write waiting for the lock does not run inside a transaction this process opened meanwhile (groupCommit ${groupCommit})`, async () => {
      // A migration (admin.migrate) holds the connection; without group commit each write waits
      // alone, with it the writes wait in its queue, which holds them back while it lasts.
      const { ledger, release } = await lockedLedger({ groupCommit, busyTimeoutMs: 10_000 });
      const p = new TestProvider();
      const call = ledger.run(p.action("mail", {}), { tenant: "t", key: ["k"], args: { to: "x" } });
      await lateness(50);
      release();
      // Opened before the waiting claim tries again (its pause is a timer; this is microtasks).
      const transaction = databaseOf(ledger)
        .connection()
        .execute(async (conn) => {
          await sql`begin immediate`.execute(conn);
          await lateness(200);
          await sql`rollback`.execute(conn);
        });
      expect(await call).toMatchObject({ status: "succeeded" });
      await transaction;
      expect((await ledger.admin.list({ tenant: "t" })).map((r) => r.status)).toEqual(["succeeded"]);
      expect(p.effects).toHaveLength(1);
    });

  it("refuses a busy timeout that is not a whole number of ms", async () => {
    for (const busyTimeoutMs of [-1, 1.5, Number.NaN, "100" as unknown as number])
      await expect(openLedger(`sqlite:${join(tempDir(), "x.db")}`, { busyTimeoutMs })).rejects.toThrow(
        LedgerConfigError,
      );
  });
});
