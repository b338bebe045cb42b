/**
 * SQLite group commit (src/group-commit.ts): concurrent callers' claims and completions share
 * commits, and a write that fails in a shared commit fails alone. Commits are counted in the
 * file itself: the commit frames of the write-ahead log (checkpoints held off meanwhile), so the
 * count does not come from the code under test.
 */
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, afterEach, describe, expect, it } from "vitest";
import { sql } from "kysely";
import { LedgerUnavailableError, type Ledger } from "@idem/core";
import Database from "better-sqlite3";
import { databaseOf, openTestLedger, type TestLedgerOptions } from "@idem/core/testing";
import { dialectFor, hooked } from "./support/dialects.js";
import { TestProvider } from "./support/provider.js";

const dir = mkdtempSync(join(tmpdir(), "idem-group-"));
const opened: Ledger[] = [];
afterEach(async () => {
  for (const l of opened.splice(0)) await l.close();
});
afterAll(() => rmSync(dir, { recursive: true, force: true }));

let files = 0;
const newFile = () => join(dir, `ledger-${++files}.db`);

/** A ledger on a file of its own, whose log is never checkpointed (so its frames stay countable). */
async function open(options: TestLedgerOptions = {}): Promise<{ ledger: Ledger; commits: () => number; path: string }> {
  const path = newFile();
  const ledger = await openTestLedger(`sqlite:${path}`, options);
  opened.push(ledger);
  await sql`PRAGMA wal_autocheckpoint = 0`.execute(databaseOf(ledger));
  return { ledger, commits: () => commitFrames(`${path}-wal`), path };
}

/** Commits in a write-ahead log: frames whose header carries the database size (sqlite.org/fileformat2.html#walformat). */
function commitFrames(wal: string): number {
  const log = readFileSync(wal);
  if (log.length < 32) return 0;
  const pageSize = log.readUInt32BE(8);
  const salts = [log.readUInt32BE(16), log.readUInt32BE(20)];
  let commits = 0;
  for (let at = 32; at + 24 + pageSize <= log.length; at += 24 + pageSize) {
    // Frames left from before the log restarted carry other salts.
    if (log.readUInt32BE(at + 8) !== salts[0] || log.readUInt32BE(at + 12) !== salts[1]) break;
    if (log.readUInt32BE(at + 4) !== 0) commits += 1;
  }
  return commits;
}

describe("SQLite group commit", () => {
  it("concurrent callers share commits; with groupCommit: false each write commits alone", async () => {
    const CALLERS = 32;
    for (const groupCommit of [true, false]) {
      const p = new TestProvider();
      const { ledger, commits } = await open({ groupCommit });
      const before = commits();
      const out = await Promise.all(
        Array.from({ length: CALLERS }, (_, i) =>
          ledger.run(p.action("mail", {}), { tenant: "t", key: [`k${i}`], args: { to: `a${i}` } }),
        ),
      );
      const made = commits() - before;
      expect(out.map((o) => o.status)).toEqual(Array(CALLERS).fill("succeeded"));
      expect(p.effects).toHaveLength(CALLERS);
      // Each call writes twice: its claim and its completion.
      if (groupCommit) expect(made).toBeLessThanOrEqual((2 * CALLERS) / 4);
      else expect(made).toBeGreaterThanOrEqual(2 * CALLERS);
      // What was answered is what the file holds.
      const rows = await ledger.admin.list({ tenant: "t" });
      expect(rows.map((r) => r.status)).toEqual(Array(CALLERS).fill("succeeded"));
    }
  });

  // ABORT: SQLite undoes the statement and keeps the transaction. ROLLBACK: it rolls the whole
  // transaction back, the claims before this one in the batch included. COMMIT: the statement
  // passes and the COMMIT fails (a deferred constraint here; in WAL mode a full disk shows there).
  const REFUSALS = {
    ABORT: [
      `CREATE TRIGGER refuse_one BEFORE INSERT ON idem_operations WHEN NEW.args_json LIKE '%refuse-me%' BEGIN SELECT RAISE(ABORT, 'disk I/O error (test)'); END`,
    ],
    ROLLBACK: [
      `CREATE TRIGGER refuse_one BEFORE INSERT ON idem_operations WHEN NEW.args_json LIKE '%refuse-me%' BEGIN SELECT RAISE(ROLLBACK, 'disk I/O error (test)'); END`,
    ],
    COMMIT: [
      "PRAGMA foreign_keys = ON",
      "CREATE TABLE refuse_parent (id TEXT PRIMARY KEY)",
      "CREATE TABLE refuse_child (ref TEXT REFERENCES refuse_parent (id) DEFERRABLE INITIALLY DEFERRED)",
      `CREATE TRIGGER refuse_one AFTER INSERT ON idem_operations WHEN NEW.args_json LIKE '%refuse-me%' BEGIN INSERT INTO refuse_child VALUES ('none'); END`,
    ],
  };
  for (const [how, statements] of Object.entries(REFUSALS))
    it(`a claim refused inside a shared commit fails alone (at ${how}): the others are claimed, done and answered`, async () => {
      const p = new TestProvider();
      const { ledger, commits } = await open();
      for (const statement of statements) await sql.raw(statement).execute(databaseOf(ledger));
      const before = commits();
      const out = await Promise.all(
        Array.from({ length: 12 }, (_, i) =>
          ledger
            .run(p.action("mail", {}), { tenant: "t", key: [`k${i}`], args: { to: i === 5 ? "refuse-me" : `a${i}` } })
            .catch((e: unknown) => e),
        ),
      );
      expect(commits() - before).toBeLessThan(24);
      expect(out[5]).toBeInstanceOf(LedgerUnavailableError);
      const others = out.filter((_, i) => i !== 5) as { status: string }[];
      expect(others.map((o) => o.status)).toEqual(Array(11).fill("succeeded"));
      expect(p.effects.map((e) => (e.args as { to: string }).to)).not.toContain("refuse-me");
      expect(p.effects).toHaveLength(11);
      const rows = await ledger.admin.list({ tenant: "t" });
      expect(rows.map((r) => r.status)).toEqual(Array(11).fill("succeeded"));
    });

  it("callers racing one key inside shared commits: one effect, one receipt for all", async () => {
    const p = new TestProvider();
    const { ledger, commits } = await open({ waitMs: 10_000 });
    const before = commits();
    const out = await Promise.all(
      Array.from({ length: 24 }, () =>
        ledger.run(p.action("mail", {}), { tenant: "t", key: ["one"], args: { to: "a" } }),
      ),
    );
    expect(p.effects).toHaveLength(1);
    expect(out.map((o) => o.status)).toEqual(Array(24).fill("succeeded"));
    expect(new Set(out.map((o) => JSON.stringify(o.status === "succeeded" && o.receipt)))).toEqual(
      new Set([JSON.stringify({ id: p.effects[0]!.id })]),
    );
    expect(commits() - before).toBeLessThanOrEqual(4);
  });

  it("a claim the file has no room for fails alone: the others in its commit are claimed and done", async () => {
    const p = new TestProvider();
    const { ledger, commits } = await open();
    const db = databaseOf(ledger);
    const { rows } = await sql<{ page_count: number }>`PRAGMA page_count`.execute(db);
    // Room for the small claims, not for 200 KB of args: that claim's statement fails with
    // SQLITE_FULL (SQLite may then roll back the whole transaction; the others run again).
    await sql.raw(`PRAGMA max_page_count = ${rows[0]!.page_count + 24}`).execute(db);
    const before = commits();
    const out = await Promise.all(
      Array.from({ length: 9 }, (_, i) =>
        ledger
          .run(p.action("mail", {}), {
            tenant: "t",
            key: [`k${i}`],
            args: { to: i === 4 ? "x".repeat(200_000) : `a${i}` },
          })
          .catch((e: unknown) => e),
      ),
    );
    const made = commits() - before;
    await sql.raw(`PRAGMA max_page_count = 1073741823`).execute(db);
    expect(out[4]).toBeInstanceOf(LedgerUnavailableError);
    const others = out.filter((_, i) => i !== 4) as { status: string }[];
    expect(others.map((o) => o.status)).toEqual(Array(8).fill("succeeded"));
    expect(p.effects.map((e) => (e.args as { to: string }).to).sort()).toEqual(
      ["a0", "a1", "a2", "a3", "a5", "a6", "a7", "a8"].sort(),
    );
    expect(made).toBeLessThan(16);
    const listed = await ledger.admin.list({ tenant: "t" });
    expect(listed.map((r) => r.status)).toEqual(Array(8).fill("succeeded"));
  });
  /** A ledger on a new file whose claims' inserts and key reads are counted; `boom` is refused. */
  /** A ledger counting its claims' reads and inserts; `path`: on another ledger's file (as another worker). */
  async function counted(groupCommit: boolean, path = newFile()) {
    const seen = { peeks: 0, inserts: 0 };
    const dialect = hooked(await dialectFor("sqlite", `sqlite:${path}`, { groupCommit }), {
      query(q, run) {
        if (/^insert into "idem_operations"/.test(q.sql)) {
          seen.inserts += 1;
          if (q.parameters.includes('["boom"]')) throw new Error("refused by the test");
        }
        if (/^select .* from "idem_operations" where "tenant_id" = \? and "key" = \?$/.test(q.sql)) seen.peeks += 1;
        return run();
      },
    });
    const ledger = await openTestLedger(dialect);
    opened.push(ledger);
    const p = new TestProvider();
    const call = (k: string) => ledger.run(p.action("mail", {}), { tenant: "t", key: [k], args: { to: k } });
    const reset = () => Object.assign(seen, { peeks: 0, inserts: 0 });
    return { seen, reset, call, p, path };
  }

  it("claims in flight together insert without reading first; a claim alone reads first, and a duplicate alone writes nothing", async () => {
    const { seen, reset, call, p, path } = await counted(true);
    const fresh = await Promise.all(Array.from({ length: 32 }, (_, i) => call(`k${i}`)));
    expect(fresh.map((o) => o.status)).toEqual(Array(32).fill("succeeded"));
    // Only the first, alone when it began, read its key before inserting.
    expect(seen).toEqual({ peeks: 1, inserts: 32 });

    reset();
    const again = await call("k3"); // alone: read, replayed, no write lock taken
    expect(again).toMatchObject({ status: "succeeded", replayed: true });
    expect(seen).toEqual({ peeks: 1, inserts: 0 });

    // Duplicates in flight together of keys this ledger has seen held: each reads first, and none
    // waits for a shared commit.
    reset();
    const dups = await Promise.all(Array.from({ length: 8 }, (_, i) => call(`k${i}`)));
    const receipts = fresh.slice(0, 8).map((o) => o.status === "succeeded" && o.receipt);
    expect(dups.map((o) => o.status === "succeeded" && o.replayed && o.receipt)).toEqual(receipts);
    expect(seen).toEqual({ peeks: 8, inserts: 0 });
    // Several retries of one of them at once: each reads first too.
    reset();
    const same = await Promise.all(Array.from({ length: 4 }, () => call("k5")));
    expect(same.map((o) => o.status === "succeeded" && o.replayed)).toEqual([true, true, true, true]);
    expect(seen).toEqual({ peeks: 4, inserts: 0 });
    // The same from another worker, which has not seen them: each insert does nothing, each then
    // reads the stored outcome.
    const other = await counted(true, path);
    const theirs = await Promise.all(Array.from({ length: 8 }, (_, i) => other.call(`k${i}`)));
    expect(theirs.map((o) => o.status === "succeeded" && o.replayed && o.receipt)).toEqual(receipts);
    expect(other.seen).toEqual({ peeks: 8, inserts: 7 });
    expect(p.effects).toHaveLength(32);
    expect(other.p.effects).toHaveLength(0);

    // A claim that fails among others (its insert refused, no row to read) fails alone, and
    // leaves no claim counted in flight: a new key alone afterwards reads first again.
    const mixed = await Promise.all(["m1", "boom", "m2"].map((k) => call(k).catch((e: unknown) => e)));
    expect(mixed[1]).toBeInstanceOf(LedgerUnavailableError);
    expect(mixed.filter((o) => (o as { status?: string }).status === "succeeded")).toHaveLength(2);
    reset();
    expect(await call("m3")).toMatchObject({ status: "succeeded", replayed: false });
    expect(seen).toEqual({ peeks: 1, inserts: 1 });
  });

  it("with groupCommit: false every claim reads first (a duplicate would wait for the write lock alone)", async () => {
    const { seen, call } = await counted(false);
    const fresh = await Promise.all(Array.from({ length: 16 }, (_, i) => call(`k${i}`)));
    expect(fresh.map((o) => o.status)).toEqual(Array(16).fill("succeeded"));
    expect(seen).toEqual({ peeks: 16, inserts: 16 });
  });

  it("duplicates in flight are answered from a read while another connection holds the write lock", async () => {
    const { ledger, path } = await open({ busyTimeoutMs: 200 });
    const p = new TestProvider();
    const call = (k: string) => ledger.run(p.action("mail", {}), { tenant: "t", key: [k], args: { to: k } });
    const first = await Promise.all(Array.from({ length: 8 }, (_, i) => call(`k${i}`)));
    const other = new Database(path, { timeout: 0 });
    other.exec("BEGIN IMMEDIATE");
    try {
      const out = await Promise.all(Array.from({ length: 8 }, (_, i) => call(`k${i}`).catch((e: unknown) => e)));
      expect(
        out.map((o) => (o as { status?: string }).status === "succeeded" && (o as { receipt: unknown }).receipt),
      ).toEqual(first.map((o) => o.status === "succeeded" && o.receipt));
    } finally {
      other.exec("ROLLBACK");
      other.close();
    }
    expect(p.effects).toHaveLength(8);
  });
});
