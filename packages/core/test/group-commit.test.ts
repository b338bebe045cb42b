/**
 * SQLite group commit (src/group-commit.ts): concurrent callers' claims and completions share
 * commits, and a write that fails in a shared commit fails alone. Commits are counted in the
 * file itself: the commit frames of the write-ahead log (checkpoints held off meanwhile), so the
 * count does not come from the code under test.
 */
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, afterEach, describe, expect, it, vi } from "vitest";
import { sql } from "kysely";
import {
  CompletionNotRecordedError,
  defineAction,
  LedgerUnavailableError,
  type ActionDefinition,
  type Ledger,
  type LookupContract,
} from "@idem/core";
import Database from "better-sqlite3";
import { databaseOf, openTestLedger, sqliteLedgerDialect, type TestLedgerOptions } from "@idem/core/testing";
import { scaled, within } from "@idem/testkit";
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

/** A claim whose args hold "refuse-me" passes its statement, and its commit is refused (a deferred foreign key). */
const REFUSE_AT_COMMIT = [
  "PRAGMA foreign_keys = ON",
  "CREATE TABLE refuse_parent (id TEXT PRIMARY KEY)",
  "CREATE TABLE refuse_child (ref TEXT REFERENCES refuse_parent (id) DEFERRABLE INITIALLY DEFERRED)",
  `CREATE TRIGGER refuse_one AFTER INSERT ON idem_operations WHEN NEW.args_json LIKE '%refuse-me%' BEGIN INSERT INTO refuse_child VALUES ('none'); END`,
];

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
    COMMIT: REFUSE_AT_COMMIT,
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

/**
 * Group commit on rows that already exist: retries of pending and unknown operations take them
 * over in shared commits, and their completions share commits too. A write of one caller that
 * fails there (its statement refused, the whole transaction rolled back, or the commit refused)
 * must fail that caller alone and leave its row as it was: no other caller's takeover or
 * completion undone behind an answer, none acknowledged that the file does not hold.
 */
describe("SQLite group commit on existing rows", () => {
  const TENANT = "t";
  const KEYS = Array.from({ length: 12 }, (_, i) => `k${i}`);
  /** Half of the keys end pending (503 before the send), half unknown (a timeout after it committed). */
  const UNKNOWN = new Set(KEYS.filter((_, i) => i % 2 === 1));

  /** A ledger whose KEYS are left pending or unknown by a first call each; the action dedupes on the key. */
  async function leftUnsettled(options: TestLedgerOptions = {}) {
    const p = new TestProvider();
    const { ledger, commits, path } = await open(options);
    const action = p.action("charge", { dedupe: { retentionMs: 86_400_000 } });
    const run = (k: string, budget?: { attempts: number }) =>
      ledger.run(action, { tenant: TENANT, key: [k], args: { to: k }, ...(budget && { budget }) });
    for (const k of KEYS) {
      p.faults.push(
        UNKNOWN.has(k)
          ? { when: "after", cls: { kind: "ambiguous", reason: "timeout after the body" } }
          : { when: "before", cls: { kind: "transient", reason: "503 before execution" } },
      );
      expect(await run(k, { attempts: 1 })).toMatchObject({ status: "pending_verification" });
    }
    // The unknown ones due for their check now, as once their first backoff has passed.
    await sql`UPDATE idem_operations SET next_check_at = 0 WHERE status = 'unknown'`.execute(databaseOf(ledger));
    const rows = await ledger.admin.list({ tenant: TENANT });
    const idOf = (k: string) => rows.find((r) => r.keyLabel === JSON.stringify([k]))!.id;
    return { p, ledger, commits, path, run, idOf };
  }

  // As for claims above: the statement refused alone (ABORT), the whole transaction rolled back
  // (ROLLBACK), or the statement passing and the COMMIT refused (a deferred foreign key).
  const refusing = (when: string): Record<string, string[]> => ({
    ABORT: [
      `CREATE TRIGGER refuse_one BEFORE UPDATE ON idem_operations WHEN ${when} BEGIN SELECT RAISE(ABORT, 'disk I/O error (test)'); END`,
    ],
    ROLLBACK: [
      `CREATE TRIGGER refuse_one BEFORE UPDATE ON idem_operations WHEN ${when} BEGIN SELECT RAISE(ROLLBACK, 'disk I/O error (test)'); END`,
    ],
    COMMIT: [
      "PRAGMA foreign_keys = ON",
      "CREATE TABLE refuse_parent (id TEXT PRIMARY KEY)",
      "CREATE TABLE refuse_child (ref TEXT REFERENCES refuse_parent (id) DEFERRABLE INITIALLY DEFERRED)",
      `CREATE TRIGGER refuse_one AFTER UPDATE ON idem_operations WHEN ${when} BEGIN INSERT INTO refuse_child VALUES ('none'); END`,
    ],
  });

  for (const how of ["ABORT", "ROLLBACK", "COMMIT"])
    it(`a takeover refused inside a shared commit fails alone (at ${how}): the other retries take over, send once and are answered as the file says`, async () => {
      const { p, ledger, commits, run, idOf } = await leftUnsettled();
      const refused = "k4"; // a pending one: its takeover would send a first request
      const id = idOf(refused);
      for (const statement of refusing(`OLD.id = '${id}' AND NEW.status = 'running'`)[how]!)
        await sql.raw(statement).execute(databaseOf(ledger));
      const effectsBefore = p.effects.length;
      const before = commits();
      const out = await Promise.all(KEYS.map((k) => run(k).catch((e: unknown) => e)));
      // The takeovers and completions shared commits (two writes a retry).
      expect(commits() - before).toBeLessThan(2 * KEYS.length - 2);
      expect(out[KEYS.indexOf(refused)]).toBeInstanceOf(LedgerUnavailableError);
      const rows = await ledger.admin.list({ tenant: TENANT });
      for (const [i, k] of KEYS.entries()) {
        const row = rows.find((r) => r.id === idOf(k))!;
        if (k === refused) {
          // Left as it was: known not done, nothing sent under it.
          expect(row).toMatchObject({ status: "pending", attempt: 1 });
          continue;
        }
        const told = out[i] as { status: string; receipt?: { id: string } };
        expect(told.status, k).toBe("succeeded");
        // What each caller was told is what the file holds, and each key took effect once.
        expect(row).toMatchObject({ status: "succeeded", attempt: 2, result: { id: told.receipt!.id } });
        expect(p.effectsFor(row.key)).toHaveLength(1);
        expect(p.effectsFor(row.key)[0]!.id).toBe(told.receipt!.id);
      }
      expect(p.effectsFor(rows.find((r) => r.id === id)!.key)).toHaveLength(0);
      // Pending keys sent now; the unknown ones had theirs before and were deduped.
      expect(p.effects.length - effectsBefore).toBe(KEYS.length - UNKNOWN.size - 1);
    });

  for (const how of ["ABORT", "ROLLBACK", "COMMIT"])
    it(`a completion refused inside a shared commit fails alone (at ${how}): the caller is told it is not recorded, the others' receipts are in the file`, async () => {
      // A short lease: the refused completion is retried for up to one before the caller hears.
      const { p, ledger, commits, run, idOf } = await leftUnsettled({ leaseMs: scaled(1_000) });
      const refused = "k5"; // an unknown one: its replay is deduped onto the first effect
      const id = idOf(refused);
      for (const statement of refusing(`OLD.id = '${id}' AND NEW.status = 'succeeded'`)[how]!)
        await sql.raw(statement).execute(databaseOf(ledger));
      const before = commits();
      const out = await Promise.all(KEYS.map((k) => run(k).catch((e: unknown) => e)));
      expect(commits() - before).toBeLessThan(2 * KEYS.length);
      expect(out[KEYS.indexOf(refused)]).toBeInstanceOf(CompletionNotRecordedError);
      const rows = await ledger.admin.list({ tenant: TENANT });
      for (const [i, k] of KEYS.entries()) {
        const row = rows.find((r) => r.id === idOf(k))!;
        if (k === refused) {
          // Still held by the attempt that could not record its receipt: never settled without it.
          expect(row).toMatchObject({ status: "running", attempt: 2 });
          continue;
        }
        const told = out[i] as { status: string; receipt?: { id: string } };
        expect(told.status, k).toBe("succeeded");
        expect(row).toMatchObject({ status: "succeeded", attempt: 2, result: { id: told.receipt!.id } });
        expect(p.effectsFor(row.key)).toHaveLength(1);
      }
    });
});

describe("SQLite group commit: close while retries of existing rows wait for the write lock", () => {
  for (const groupCommit of [true, false])
    it(`their takeovers commit once the lock is free, nothing is sent, and each row is known not done again (groupCommit ${groupCommit})`, async () => {
      const path = newFile();
      let takeovers = 0;
      let allIssued: () => void = () => {};
      const issued = new Promise<void>((r) => (allIssued = r));
      const KEYS = ["a", "b", "c", "d"];
      const dialect = hooked(await dialectFor("sqlite", `sqlite:${path}`, { groupCommit }), {
        query(q, run) {
          const answer = run();
          if (/^update "idem_operations"/.test(q.sql) && /"status" in \(/.test(q.sql) && ++takeovers === KEYS.length)
            allIssued();
          return answer;
        },
      });
      const ledger = await openTestLedger(dialect, { busyTimeoutMs: scaled(10_000) });
      opened.push(ledger);
      const p = new TestProvider();
      const action = p.action("mail", {}); // neither dedupes nor can be looked up: a row left running would go to a person
      const run = (k: string, budget?: { attempts: number }) =>
        ledger.run(action, { tenant: "t", key: [k], args: { to: k }, ...(budget && { budget }) });
      for (const k of KEYS) {
        p.faults.push({ when: "before", cls: { kind: "transient", reason: "503 before execution" } });
        expect(await run(k, { attempts: 1 })).toMatchObject({ status: "pending_verification", state: "pending" });
      }
      const other = new Database(path, { timeout: 0 });
      let closing: Promise<unknown> | undefined;
      let out: unknown[];
      try {
        other.exec("BEGIN IMMEDIATE");
        const calls = KEYS.map((k) => run(k).catch((e: unknown) => e));
        await issued; // each read its row pending and waits for the lock to take it over
        closing = ledger.close();
        other.exec("ROLLBACK");
        out = await Promise.all(calls);
      } finally {
        if (other.inTransaction) other.exec("ROLLBACK");
        other.close();
        await closing;
      }
      opened.splice(opened.indexOf(ledger), 1);
      expect(p.effects).toHaveLength(0);
      const after = await openTestLedger(`sqlite:${path}`);
      opened.push(after);
      const rows = await after.admin.list({ tenant: "t" });
      // Taken over (attempt 2, once the lock was free), not sent since the ledger was closing, and
      // put back as known not done: not left running as "may have committed", which an action
      // that cannot be looked up would send to a person with no effect anywhere.
      expect(rows.map((r) => [r.status, r.attempt])).toEqual(KEYS.map(() => ["pending", 2]));
      for (const o of out!) expect(o).toMatchObject({ status: "pending_verification", state: "pending", attempt: 2 });
    });
});

/**
 * A takeover of a row whose lease ran out and the late completion of the attempt that held it,
 * in one shared commit, in either order: each statement sees the one before it, as if they had
 * committed one after the other, so exactly one of them is written, the other finds the row
 * moved, and what each caller is told agrees with the file.
 */
describe("SQLite group commit: a takeover and a completion of one row in one commit", () => {
  const KINDS = {
    dedupe: { dedupe: { retentionMs: 86_400_000 } },
    lookup: { lookup: true },
    neither: {},
  } as const;
  for (const [kind, capabilities] of Object.entries(KINDS))
    for (const first of ["completion", "takeover"] as const)
      it(`provider that can ${kind === "neither" ? "neither dedupe nor be looked up" : kind}, the ${first} first: one effect, one outcome, every answer true`, async () => {
        const path = newFile();
        let now = Date.now();
        const clock = () => now;
        const held: { what: "completion" | "takeover"; go: () => void }[] = [];
        /** What each held statement changed, and the log's commits once both were answered. */
        const wrote: Record<string, number> = {};
        let commitsAfterBoth = 0;
        let bothHeld: () => void = () => {};
        const heldTogether = new Promise<void>((r) => (bothHeld = r));
        let armed = false;
        const dialect = hooked(await dialectFor("sqlite", `sqlite:${path}`), {
          query(q, run) {
            const update = /^update "idem_operations"/.test(q.sql);
            const what =
              update && q.parameters.includes("succeeded")
                ? "completion"
                : update && /"status" in \(/.test(q.sql)
                  ? "takeover"
                  : undefined;
            if (!armed || what === undefined || held.some((h) => h.what === what)) return run();
            return new Promise((resolve, reject) => {
              const go = () =>
                run().then((r) => {
                  wrote[what] = Number(r.numAffectedRows ?? r.rows.length);
                  if (Object.keys(wrote).length === 2) commitsAfterBoth = commitFrames(`${path}-wal`);
                  resolve(r);
                }, reject);
              held.push({ what, go });
              if (held.length === 2) bothHeld();
            });
          },
        });
        const ledger = await openTestLedger(dialect, { clock, leaseMs: 30_000, budget: { attempts: 1 } });
        opened.push(ledger);
        await sql`PRAGMA wal_autocheckpoint = 0`.execute(databaseOf(ledger));
        const effects: string[] = [];
        let entered: () => void = () => {};
        const sent = new Promise<void>((r) => (entered = r));
        let answer: () => void = () => {};
        const answered = new Promise<void>((r) => (answer = r));
        const action = defineAction<{ to: string }, { id: string }>({
          type: `mail.${kind}`,
          capabilities,
          execute: async (_args, op) => {
            const earlier = kind === "dedupe" && effects.includes(op.key);
            if (!earlier) effects.push(op.key);
            entered();
            await answered;
            return { id: `obj_${op.key.slice(0, 8)}` };
          },
          classify: (e) => ({ kind: "ambiguous", reason: String(e) }),
          ...(kind === "lookup" && {
            reconcile: async (_args, op) =>
              effects.includes(op.key)
                ? { found: true, receipt: { id: `obj_${op.key.slice(0, 8)}` } }
                : { found: false, proof: "absent", reason: "not at the provider" },
          }),
        } as ActionDefinition<{ to: string }, { id: string }> & LookupContract<{ to: string }, { id: string }>);
        const call = () => ledger.run(action, { tenant: "t", key: ["one"], args: { to: "a" } });

        // Attempt 1 sends; its lease runs out by the database clock while its answer is on its way.
        const a = call();
        await sent;
        now += 31_000;
        armed = true;
        const b = call(); // takes the row over: a lookup, a replay with the key, or a person
        answer(); // attempt 1's completion
        await heldTogether;
        // Another connection holds the write lock while both are issued: they wait, then share a commit.
        const other = new Database(path, { timeout: 0 });
        const before = commitFrames(`${path}-wal`);
        try {
          other.exec("BEGIN IMMEDIATE");
          const order =
            first === "completion" ? (["completion", "takeover"] as const) : (["takeover", "completion"] as const);
          for (const what of order) held.find((h) => h.what === what)!.go();
        } finally {
          other.exec("ROLLBACK");
          other.close();
        }
        const [told, ...more] = [await a, await b];
        // Both in one commit, and the first one issued is the one written.
        expect(commitsAfterBoth - before).toBe(1);
        expect(wrote).toEqual(first === "completion" ? { completion: 1, takeover: 0 } : { completion: 0, takeover: 1 });
        const [row] = await ledger.admin.list({ tenant: "t" });
        const { events } = await ledger.get({ tenant: "t", id: row!.id });
        const history = events.map((e) => `${e.from}->${e.to}@${e.attempt}: ${e.reason}`);
        // One effect at the provider, and never a guessed success.
        expect(effects).toHaveLength(1);
        const receipt = { id: `obj_${row!.key.slice(0, 8)}` };
        for (const out of [told, ...more]) {
          if (out.status === "succeeded") expect(out.receipt).toEqual(receipt);
          else expect(out.status).toBe("pending_verification");
        }
        // The effect's receipt is the outcome (a person or the daemon need not guess).
        expect(row, JSON.stringify(history)).toMatchObject({ status: "succeeded", result: receipt });
        // Attempt 1 was told its own receipt: its effect happened, and the ledger holds it.
        expect(told).toMatchObject({ status: "succeeded", receipt });
      });
});

/**
 * A shared commit whose COMMIT fails and whose ROLLBACK fails too, the connection still open and
 * its transaction still open. The COMMIT's failure is real: a deferred foreign key refused at
 * COMMIT leaves the transaction open, as SQLITE_BUSY does. The ROLLBACK's is injected at
 * better-sqlite3's `exec` (an SQLITE_IOERR): in WAL mode SQLite's ROLLBACK writes nothing and
 * gives up no error we can provoke, yet the group commit must not trust that it never fails.
 */
describe("SQLite group commit: a COMMIT and then its ROLLBACK fail", () => {
  it("every write of that commit is refused, nothing is left waiting, later calls are told to reopen, the write lock is given up, and close() ends", async () => {
    const path = newFile();
    const database = new Database(path, { timeout: scaled(10_000) });
    database.pragma("journal_mode = WAL");
    const exec = database.exec.bind(database);
    let refuseRollback = false;
    let refused = 0;
    database.exec = (source: string) => {
      if (refuseRollback && /^\s*rollback\b/i.test(source)) {
        refused += 1;
        throw new Database.SqliteError("disk I/O error (test)", "SQLITE_IOERR");
      }
      return exec(source);
    };
    const ledger = await openTestLedger(sqliteLedgerDialect(database), { busyTimeoutMs: scaled(2_000) });
    const bound = scaled(5_000);
    try {
      for (const statement of REFUSE_AT_COMMIT) await sql.raw(statement).execute(databaseOf(ledger));
      const p = new TestProvider();
      const call = (k: string, to = k) =>
        ledger.run(p.action("mail", {}), { tenant: "t", key: [k], args: { to } }).catch((e: unknown) => e);
      refuseRollback = true;
      // They share a commit, refused at COMMIT (any claim that committed before it was done alone).
      const KEYS = Array.from({ length: 8 }, (_, i) => `k${i}`);
      const out = await within(
        bound,
        "the calls of a commit that could not be rolled back",
        Promise.all(KEYS.map((k, i) => call(k, i === 5 ? "refuse-me" : k))),
      );
      expect(refused).toBe(1);
      const answers = out.map((o) =>
        o instanceof LedgerUnavailableError
          ? `unavailable${o.reopen ? " (reopen)" : ""}`
          : o instanceof CompletionNotRecordedError
            ? "not recorded"
            : (o as { status?: string }).status,
      );
      // Those in the refused commit are told so, and that the ledger must be reopened; a claim
      // committed before it, whose completion came after, is told its receipt is not recorded.
      for (const answer of answers) expect(["unavailable (reopen)", "succeeded", "not recorded"]).toContain(answer);
      expect(answers[5]).toBe("unavailable (reopen)");
      expect(answers.filter((a) => a === "unavailable (reopen)").length).toBeGreaterThan(1);
      // Later calls, reads and writes, are told the same at once.
      const later = await within(bound, "a call after", call("later"));
      expect(later).toBeInstanceOf(LedgerUnavailableError);
      expect(later).toMatchObject({ reopen: true });
      await expect(within(bound, "a read after", ledger.admin.list({ tenant: "t" }))).rejects.toMatchObject({
        code: "LEDGER_UNAVAILABLE",
        reopen: true,
      });
      // The transaction does not hold the file's write lock: another connection takes it.
      const other = new Database(path, { timeout: 0 });
      try {
        other.exec("BEGIN IMMEDIATE");
        other.exec("ROLLBACK");
      } finally {
        other.close();
      }
      await within(bound, "close()", ledger.close());
      // What the file holds is what callers were told, and only a claim that committed was sent.
      const after = await openTestLedger(`sqlite:${path}`);
      opened.push(after);
      const rows = await after.admin.list({ tenant: "t" });
      const told = KEYS.flatMap((k, i) =>
        answers[i] === "succeeded" ? [[k, "succeeded"]] : answers[i] === "not recorded" ? [[k, "running"]] : [],
      );
      expect(rows.map((r) => [JSON.parse(r.keyLabel!)[0], r.status]).sort()).toEqual(told.sort());
      expect(p.effects.map((e) => (e.args as { to: string }).to).sort()).toEqual(told.map(([k]) => k).sort());
    } finally {
      // Unstuck whatever waits on the connection (it is closed by then once the ledger has coped).
      refuseRollback = false;
      if (database.open) database.close();
      await within(bound, "close() once the connection is closed", ledger.close()).catch(() => {});
    }
  });
  it("a statement waiting for another connection's write lock when the connection is closed is refused at once, told to reopen as the commit's writes are", async () => {
    const path = newFile();
    const database = new Database(path, { timeout: scaled(10_000) });
    database.pragma("journal_mode = WAL");
    let other: Database.Database | undefined;
    let refuseRollback = false;
    const exec = database.exec.bind(database);
    database.exec = (source: string) => {
      // The group's own BEGIN: the other connection gives up the write lock just before, so the
      // group commit takes it while the statement below still waits for it.
      if (/^\s*begin immediate\b/i.test(source) && other?.inTransaction) other.exec("ROLLBACK");
      if (refuseRollback && /^\s*rollback\b/i.test(source))
        throw new Database.SqliteError("disk I/O error (test)", "SQLITE_IOERR");
      return exec(source);
    };
    // Each try of a BEGIN IMMEDIATE on the ledger's connection (kysely's: its statements are prepared).
    let begins = 0;
    const prepare = database.prepare.bind(database);
    database.prepare = ((source: string) => {
      const stmt = prepare(source);
      if (!/^\s*begin immediate\b/i.test(source)) return stmt;
      const run = stmt.run.bind(stmt);
      return Object.assign(stmt, {
        run: (...a: unknown[]) => {
          begins += 1;
          return run(...(a as []));
        },
      });
    }) as typeof database.prepare;
    const ledger = await openTestLedger(sqliteLedgerDialect(database), { busyTimeoutMs: scaled(10_000) });
    const bound = scaled(5_000);
    try {
      for (const statement of REFUSE_AT_COMMIT) await sql.raw(statement).execute(databaseOf(ledger));
      other = new Database(path, { timeout: 0 });
      other.exec("BEGIN IMMEDIATE");
      // A transaction's BEGIN on the ledger's connection (a migration's, `admin.migrate()`) waits
      // for the lock without blocking the process, tried again after pauses (sqlite-busy.ts).
      const waiting = databaseOf(ledger)
        .connection()
        .execute((conn) => sql`begin immediate`.execute(conn))
        .then(
          () => "began",
          (e: unknown) => e,
        );
      await vi.waitFor(() => expect(begins).toBeGreaterThan(1), { timeout: bound, interval: 5 });
      const p = new TestProvider();
      refuseRollback = true;
      const out = await within(
        bound,
        "the calls of a commit that could not be rolled back",
        Promise.all(
          ["a", "b", "c"].map((k, i) =>
            ledger
              .run(p.action("mail", {}), { tenant: "t", key: [k], args: { to: i === 1 ? "refuse-me" : k } })
              .catch((e: unknown) => e),
          ),
        ),
      );
      const closedBy = out[1];
      expect(closedBy).toBeInstanceOf(LedgerUnavailableError);
      expect(closedBy).toMatchObject({ reopen: true, message: expect.stringMatching(/^SQLite could neither commit/) });
      const triedBefore = begins;
      const waited = await within(bound, "the statement waiting for the lock", waiting);
      // Before: better-sqlite3's "The database connection is not open", which the ledger's callers
      // heard as an outage to retry (LedgerUnavailableError without reopen).
      expect(waited).toBe(closedBy);
      expect(begins).toBe(triedBefore); // refused before it was tried again on the closed connection
      expect(p.effects).toHaveLength(0);
    } finally {
      refuseRollback = false;
      other?.close();
      if (database.open) database.close();
      await within(bound, "close() once the connection is closed", ledger.close()).catch(() => {});
    }
  });
});
