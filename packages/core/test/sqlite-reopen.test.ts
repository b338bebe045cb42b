/**
 * A SQLite ledger opens its connection again by itself after a group commit had to close it (its
 * COMMIT failed, then its ROLLBACK, the transaction still open: src/group-commit.ts `abandon`):
 * the writes of that commit are refused and not in the file, later calls work once the file is
 * usable, a file replaced meanwhile is never written, and a reopen that fails is said and tried
 * again. SQLite only: Postgres's pool replaces a broken client by itself, and has no group commit.
 *
 * The COMMIT's failure is real (a deferred foreign key refused at COMMIT leaves the transaction
 * open); the ROLLBACK's is injected at better-sqlite3's `exec` (an SQLITE_IOERR), as in
 * group-commit.test.ts: in WAL mode SQLite's ROLLBACK gives up no error we can provoke.
 */
import { existsSync, mkdtempSync, readFileSync, renameSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import { sql } from "kysely";
import { defineAction, LedgerUnavailableError, type Ledger } from "@idem/core";
import Database from "better-sqlite3";
import { databaseOf, openTestLedger } from "@idem/core/testing";
import { scaled, within } from "@idem/testkit";

const dir = mkdtempSync(join(tmpdir(), "idem-reopen-"));
const opened: Ledger[] = [];
let files = 0;
const newFile = () => join(dir, `ledger-${++files}.db`);

/** ROLLBACK on any connection of this process fails while set (the ledger's is the only one to run it). */
let refuseRollback = false;
let refused = 0;
const exec = Database.prototype.exec;
beforeEach(() => {
  refuseRollback = false;
  refused = 0;
  Database.prototype.exec = function (this: Database.Database, source: string) {
    if (refuseRollback && /^\s*rollback\b/i.test(source)) {
      refused += 1;
      throw new Database.SqliteError("disk I/O error (test)", "SQLITE_IOERR");
    }
    return exec.call(this, source);
  };
});
afterEach(async () => {
  Database.prototype.exec = exec;
  for (const l of opened.splice(0)) await l.close();
});
afterAll(() => rmSync(dir, { recursive: true, force: true }));

/** A claim whose args hold "refuse-me" passes its statement, and its commit is refused (a deferred foreign key). */
const REFUSE_AT_COMMIT = [
  "PRAGMA foreign_keys = ON",
  "CREATE TABLE refuse_parent (id TEXT PRIMARY KEY)",
  "CREATE TABLE refuse_child (ref TEXT REFERENCES refuse_parent (id) DEFERRABLE INITIALLY DEFERRED)",
  `CREATE TRIGGER refuse_one AFTER INSERT ON idem_operations WHEN NEW.args_json LIKE '%refuse-me%' BEGIN INSERT INTO refuse_child VALUES ('none'); END`,
];

const bound = scaled(10_000);

/** Sent mail, as the provider saw it: one entry per effect. */
function mailer() {
  const sent: string[] = [];
  const action = defineAction<{ to: string }, { id: string }>({
    type: "mail.send",
    capabilities: {},
    execute: async (args) => {
      sent.push(args.to);
      return { id: `msg_${args.to}` };
    },
    classify: () => ({ kind: "permanent", reason: "test" }),
  });
  return { sent, action };
}

/** What a call was told, in a word. */
function said(out: unknown): string {
  if (out instanceof LedgerUnavailableError) return `unavailable${out.reopen ? " (reopen)" : ""}`;
  if (out instanceof Error) return out.name;
  return (out as { status: string }).status;
}

/**
 * A ledger on a file of its own whose next group commit is abandoned: eight concurrent calls share
 * it, the sixth refused at COMMIT, the ROLLBACK failing after it. Returns what each was told.
 */
async function abandoned(options: { busyTimeoutMs?: number } = {}) {
  const path = newFile();
  const ledger = await openTestLedger(`sqlite:${path}`, { busyTimeoutMs: scaled(2_000), ...options });
  opened.push(ledger);
  for (const statement of REFUSE_AT_COMMIT) await sql.raw(statement).execute(databaseOf(ledger));
  const mail = mailer();
  const call = (k: string, to = k) =>
    ledger.run(mail.action, { tenant: "t", key: [k], args: { to } }).catch((e: unknown) => e);
  refuseRollback = true;
  const KEYS = Array.from({ length: 8 }, (_, i) => `k${i}`);
  const out = await within(
    bound,
    "the calls of a commit that could not be rolled back",
    Promise.all(KEYS.map((k, i) => call(k, i === 5 ? "refuse-me" : k))),
  );
  refuseRollback = false;
  expect(refused).toBe(1);
  const answers = out.map(said);
  expect(answers[5]).toBe("unavailable (reopen)");
  expect(out[5]).toMatchObject({ reopensItself: true, message: expect.stringMatching(/^SQLite could neither commit/) });
  return { path, ledger, mail, call, KEYS, answers };
}

const FULL = 2;
const NORMAL = 1;

/** The pragmas the ledger's open sets, as its connection has them now. */
async function pragmasOf(ledger: Ledger) {
  const { rows } = await sql<{ journal_mode: string; synchronous: number; busy_timeout: number }>`select
    (select journal_mode from pragma_journal_mode) as journal_mode,
    (select synchronous from pragma_synchronous) as synchronous,
    (select timeout from pragma_busy_timeout) as busy_timeout`.execute(databaseOf(ledger));
  return rows[0];
}

/** Whether a connection can hold `path` alone (none other has it open: in WAL mode each holds a shared lock). */
function heldByNone(path: string): boolean {
  const check = new Database(path, { timeout: 0, fileMustExist: true });
  try {
    check.pragma("locking_mode = EXCLUSIVE");
    check.exec("BEGIN EXCLUSIVE");
    check.exec("ROLLBACK");
    return true;
  } catch (error) {
    if ((error as { code?: string }).code?.startsWith("SQLITE_BUSY")) return false;
    throw error;
  } finally {
    check.close();
  }
}

/**
 * A ledger on a file of its own whose connection a group commit abandoned with no call in flight:
 * writes of the test's own to a table of its own, the last refused at COMMIT, the ROLLBACK failing
 * after it. Nothing of the ledger's runs until the test's next call.
 */
async function abandonedQuietly(options: { busyTimeoutMs?: number; durable?: boolean } = {}) {
  const path = newFile();
  const ledger = await openTestLedger(`sqlite:${path}`, { busyTimeoutMs: scaled(2_000), ...options });
  opened.push(ledger);
  const db = databaseOf(ledger);
  for (const statement of [...REFUSE_AT_COMMIT, "CREATE TABLE scratch (v TEXT)"]) await sql.raw(statement).execute(db);
  refuseRollback = true;
  // The first write of the turn may commit at once, alone; the others share the next commit.
  const out = await within(
    bound,
    "writes of a commit that could not be rolled back",
    Promise.all(
      [
        sql`insert into scratch values ('first')`,
        sql`insert into scratch values ('shared')`,
        sql`insert into refuse_child values ('none')`,
      ].map((q) =>
        q.execute(db).then(
          () => "written",
          (e: unknown) => e,
        ),
      ),
    ),
  );
  refuseRollback = false;
  expect(refused).toBe(1);
  for (const e of out.slice(1))
    expect(e).toMatchObject({ reopen: true, message: expect.stringMatching(/^SQLite could neither commit/) });
  const mail = mailer();
  const call = (k: string) =>
    ledger.run(mail.action, { tenant: "t", key: [k], args: { to: k } }).catch((e: unknown) => e);
  return { path, ledger, mail, call, first: out[0] };
}

describe("SQLite: the connection a group commit abandoned is opened again", () => {
  it("a later call on the same ledger succeeds and is durable, the abandoned commit's writes are not in the file, and close() closes the new connection", async () => {
    const { path, ledger, mail, call, KEYS, answers } = await abandoned();
    // Before: every statement since was refused, told to reopen the ledger.
    const later = await within(bound, "a call after", call("later"));
    expect(said(later)).toBe("succeeded");
    expect(later).toMatchObject({ status: "succeeded", receipt: { id: "msg_later" } });
    // Reads too, and the first open's pragmas hold on the new connection.
    const rows = await within(bound, "a read after", ledger.admin.list({ tenant: "t" }));
    expect(rows.map((r) => JSON.parse(r.keyLabel!)[0])).toContain("later");
    expect(await pragmasOf(ledger)).toEqual({ journal_mode: "wal", synchronous: FULL, busy_timeout: 0 });
    await within(bound, "close()", ledger.close());
    // Closed: neither the abandoned connection nor the new one holds the file.
    expect(heldByNone(path)).toBe(true);
    // What the file holds is what callers were told: the later call, and no write of the
    // abandoned commit.
    const after = await openTestLedger(`sqlite:${path}`);
    opened.push(after);
    const stored = await after.admin.list({ tenant: "t" });
    const told = [
      ...KEYS.flatMap((k, i) =>
        answers[i] === "succeeded"
          ? [[k, "succeeded"]]
          : answers[i] === "CompletionNotRecordedError"
            ? [[k, "running"]]
            : [],
      ),
      ["later", "succeeded"],
    ];
    for (const answer of answers)
      expect(["unavailable (reopen)", "succeeded", "CompletionNotRecordedError"]).toContain(answer);
    expect(stored.map((r) => [JSON.parse(r.keyLabel!)[0], r.status]).sort()).toEqual(told.sort());
    expect(stored.find((r) => JSON.parse(r.keyLabel!)[0] === "k5")).toBeUndefined();
    expect(mail.sent.sort()).toEqual(told.map(([k]) => k).sort());
  });

  it("completions caught in the abandoned commit are written again on the new connection: every caller whose effect happened is told succeeded", async () => {
    // The completions' shared commit is the one abandoned (refused at COMMIT by the completion of
    // "refuse-me", then its ROLLBACK failing). None of it was committed, so writing them again is
    // safe; before, each caller was told CompletionNotRecordedError and its row left running for
    // the replay policy, though the ledger would take the write again at once.
    const path = newFile();
    const ledger = await openTestLedger(`sqlite:${path}`, { busyTimeoutMs: scaled(2_000) });
    opened.push(ledger);
    const db = databaseOf(ledger);
    for (const statement of [
      ...REFUSE_AT_COMMIT.slice(0, 3),
      `CREATE TRIGGER refuse_done AFTER UPDATE ON idem_operations WHEN NEW.status = 'succeeded' AND NEW.args_json LIKE '%refuse-me%' BEGIN INSERT INTO refuse_child VALUES ('none'); END`,
    ])
      await sql.raw(statement).execute(db);
    const mail = mailer();
    const KEYS = Array.from({ length: 8 }, (_, i) => `k${i}`);
    refuseRollback = true;
    let out: unknown[];
    try {
      out = await within(
        bound,
        "calls whose completions' commit could not be rolled back",
        Promise.all(
          KEYS.map((k, i) =>
            ledger
              .run(mail.action, { tenant: "t", key: [k], args: { to: i === 5 ? "refuse-me" : k } })
              .catch((e: unknown) => e),
          ),
        ),
      );
    } finally {
      refuseRollback = false;
    }
    // The completions' shared commit at least. A retry of "refuse-me"'s completion that lands in
    // one commit with another caller's retry has that commit abandoned too (measured: 2 in 4 of 14
    // runs), and that caller's completion is written again once more: the outcomes below hold.
    expect(refused).toBeGreaterThanOrEqual(1);
    // "refuse-me"'s completion is refused again at its own commit on the new connection (the
    // constraint holds there too): its caller holds the receipt, its row is left running.
    const told = KEYS.map((_, i) => (i === 5 ? "CompletionNotRecordedError" : "succeeded"));
    expect(out.map(said)).toEqual(told);
    const after = await openTestLedger(`sqlite:${path}`);
    opened.push(after);
    const stored = await after.admin.list({ tenant: "t" });
    const byKey = Object.fromEntries(stored.map((r) => [JSON.parse(r.keyLabel!)[0], r.status]));
    expect(KEYS.map((k) => byKey[k])).toEqual(KEYS.map((_, i) => (i === 5 ? "running" : "succeeded")));
    expect(mail.sent).toHaveLength(8);
  });

  it("a file replaced under the ledger since is never written: the reopen refuses it, for good", async () => {
    // No call in flight: the reopen is the next call's, after the file was replaced.
    const { path, call } = await abandonedQuietly();
    // Another ledger's file renamed over the path (a backup restored, a ledger made anew).
    const other = newFile();
    const made = await openTestLedger(`sqlite:${other}`);
    await made.close();
    const before = readFileSync(other);
    renameSync(other, path);
    for (const suffix of ["-wal", "-shm"]) rmSync(path + suffix, { force: true });
    for (const what of ["a call after", "another call after"]) {
      const out = await within(bound, what, call("later"));
      expect(out).toBeInstanceOf(LedgerUnavailableError);
      expect(out).toMatchObject({
        reopen: true,
        reopensItself: false,
        message: expect.stringMatching(/replaced since the ledger opened it/),
      });
    }
    expect(existsSync(`${path}-wal`)).toBe(false);
    expect(readFileSync(path).equals(before)).toBe(true);
  });

  it("a file deleted under the ledger since is not made anew: the reopen refuses it, for good", async () => {
    const { path, call } = await abandonedQuietly();
    for (const suffix of ["", "-wal", "-shm"]) rmSync(path + suffix, { force: true });
    for (const what of ["a call after", "another call after"]) {
      const out = await within(bound, what, call("later"));
      expect(out).toMatchObject({
        reopen: true,
        reopensItself: false,
        message: expect.stringMatching(/deleted since the ledger opened it/),
      });
    }
    expect(existsSync(path)).toBe(false);
  });

  it("a reopen that fails is refused with a typed error that may pass, and a later call opens the file once it is usable", async () => {
    // Not durable: the reopen must set `synchronous` as the open did, not leave SQLite's default.
    const { path, ledger, call, first } = await abandonedQuietly({ busyTimeoutMs: scaled(200), durable: false });
    // Another process holds the file alone (exclusive locking mode): opening it cannot read it.
    const blocker = new Database(path, { timeout: 0 });
    blocker.pragma("locking_mode = EXCLUSIVE");
    blocker.exec("BEGIN EXCLUSIVE");
    let out: unknown;
    try {
      out = await within(bound, "a call while the file is held", call("later"));
    } finally {
      blocker.close();
    }
    expect(out).toBeInstanceOf(LedgerUnavailableError);
    expect(out).toMatchObject({
      reopen: false,
      closed: false,
      message: expect.stringMatching(/could not be opened again/),
    });
    expect((out as Error).message).toMatch(/database is locked/);
    const again = await within(bound, "a call once the file is free", call("later"));
    expect(said(again)).toBe("succeeded");
    expect(await pragmasOf(ledger)).toEqual({ journal_mode: "wal", synchronous: NORMAL, busy_timeout: 0 });
    // The abandoned commit's write is not in the file; the one committed alone before it is.
    const scratch = await sql<{ v: string }>`select v from scratch`.execute(databaseOf(ledger));
    expect(scratch.rows.map((r) => r.v)).toEqual(first === "written" ? ["first"] : []);
    await within(bound, "close()", ledger.close());
    expect(heldByNone(path)).toBe(true);
  });

  it("close() while the reopen waits for the file: close ends once the reopen gave up, and leaves no connection open", async () => {
    const { path, ledger, call } = await abandonedQuietly({ busyTimeoutMs: scaled(1_000) });
    const blocker = new Database(path, { timeout: 0 });
    blocker.pragma("locking_mode = EXCLUSIVE");
    blocker.exec("BEGIN EXCLUSIVE");
    // The reopen's WAL switch waits for the lock, tried again after pauses: count its tries.
    let tries = 0;
    const pragma = Database.prototype.pragma;
    Database.prototype.pragma = function (this: Database.Database, source: string, options?: never) {
      if (/journal_mode\s*=\s*wal/i.test(source)) tries += 1;
      return pragma.call(this, source, options);
    } as typeof pragma;
    let pending: Promise<unknown>;
    try {
      pending = call("later");
      await vi.waitFor(() => expect(tries).toBeGreaterThan(1), { timeout: bound, interval: 5 });
      // Not waiting for the call: the connection closes while its reopen is under way.
      await within(bound, "close()", ledger.close({ waitMs: 0 }));
    } finally {
      Database.prototype.pragma = pragma;
      blocker.close();
    }
    const out = await within(bound, "the call", pending);
    expect(out).toBeInstanceOf(LedgerUnavailableError);
    expect(heldByNone(path)).toBe(true);
  });
});

/**
 * A call whose action is still out when close() stops waiting, on a connection a group commit
 * abandoned meanwhile (no statement since, so not opened again yet). Its receipt arrives after the
 * close: the caller must hear the close (`closed`), at once, as on a connection not abandoned.
 */
async function inFlightAtClose(abandon: boolean) {
  const path = newFile();
  const ledger = await openTestLedger(`sqlite:${path}`, { busyTimeoutMs: scaled(2_000) });
  opened.push(ledger);
  const db = databaseOf(ledger);
  for (const statement of [...REFUSE_AT_COMMIT, "CREATE TABLE scratch (v TEXT)"]) await sql.raw(statement).execute(db);
  let out!: () => void;
  const sent = new Promise<void>((r) => (out = r));
  let release!: () => void;
  const gate = new Promise<void>((r) => (release = r));
  const action = defineAction<{ to: string }, { id: string }>({
    type: "mail.send",
    capabilities: {},
    execute: async (args) => {
      out();
      await gate; // ignores its signal: the receipt comes after the close
      return { id: `msg_${args.to}` };
    },
    classify: () => ({ kind: "ambiguous", reason: "test" }),
  });
  const call = ledger.run(action, { tenant: "t", key: ["in-flight"], args: { to: "x" } }).catch((e: unknown) => e);
  await sent;
  if (abandon) {
    refuseRollback = true;
    try {
      await within(
        bound,
        "writes of a commit that could not be rolled back",
        Promise.all(
          [
            sql`insert into scratch values ('first')`,
            sql`insert into scratch values ('shared')`,
            sql`insert into refuse_child values ('none')`,
          ].map((q) => q.execute(db).catch((e: unknown) => e)),
        ),
      );
    } finally {
      refuseRollback = false;
    }
    expect(refused).toBe(1);
  }
  const closed = await within(bound, "close()", ledger.close({ waitMs: 0 }));
  expect(closed?.inFlight).toHaveLength(1);
  const started = performance.now();
  release();
  const told = await within(scaled(30_000), "the call in flight", call);
  return { told, tookMs: performance.now() - started };
}

describe("SQLite: a close while the connection is abandoned", () => {
  it("control: a call in flight at close, its receipt after it, on a connection not abandoned, hears the close at once", async () => {
    const { told, tookMs } = await inFlightAtClose(false);
    expect(told).toMatchObject({ name: "CompletionNotRecordedError" });
    expect((told as Error).cause).toMatchObject({ closed: true });
    expect(tookMs).toBeLessThan(scaled(1_000));
  });

  it("a call in flight at close, its receipt after it, on a connection abandoned before the close, hears the close at once (not the abandon, retried for up to a lease)", async () => {
    const { told, tookMs } = await inFlightAtClose(true);
    expect(told).toMatchObject({ name: "CompletionNotRecordedError" });
    // What it hears is the close, not "the ledger opens it again for its next statement".
    expect((told as Error).cause).toMatchObject({ closed: true });
    expect(tookMs).toBeLessThan(scaled(1_000));
  });

  it("close() while the reopen waits for the file: the call that waited for it hears the close (closed), not an outage that 'the next statement tries again'", async () => {
    const { path, ledger, call } = await abandonedQuietly({ busyTimeoutMs: scaled(1_000) });
    const blocker = new Database(path, { timeout: 0 });
    blocker.pragma("locking_mode = EXCLUSIVE");
    blocker.exec("BEGIN EXCLUSIVE");
    let tries = 0;
    const pragma = Database.prototype.pragma;
    Database.prototype.pragma = function (this: Database.Database, source: string, options?: never) {
      if (/journal_mode\s*=\s*wal/i.test(source)) tries += 1;
      return pragma.call(this, source, options);
    } as typeof pragma;
    let pending: Promise<unknown>;
    try {
      pending = call("later");
      await vi.waitFor(() => expect(tries).toBeGreaterThan(1), { timeout: bound, interval: 5 });
      await within(bound, "close()", ledger.close({ waitMs: 0 }));
    } finally {
      Database.prototype.pragma = pragma;
      blocker.close();
    }
    const out = await within(bound, "the call", pending);
    expect(out).toBeInstanceOf(LedgerUnavailableError);
    expect(out).toMatchObject({ closed: true });
    expect((out as Error).message).not.toMatch(/the next statement tries again/);
  });
});

describe("SQLite: statements that meet an abandoned connection together", () => {
  it("share one reopen, and close() leaves no connection open", async () => {
    const { path, ledger, call } = await abandonedQuietly();
    let opens = 0;
    const pragma = Database.prototype.pragma;
    Database.prototype.pragma = function (this: Database.Database, source: string, options?: never) {
      if (/journal_mode\s*=\s*wal/i.test(source)) opens += 1;
      return pragma.call(this, source, options);
    } as typeof pragma;
    let out: unknown[];
    try {
      out = await within(bound, "calls after", Promise.all(["a", "b", "c", "d", "e"].map((k) => call(k))));
    } finally {
      Database.prototype.pragma = pragma;
    }
    expect(out.map(said)).toEqual(["succeeded", "succeeded", "succeeded", "succeeded", "succeeded"]);
    expect(opens).toBe(1);
    await within(bound, "close()", ledger.close());
    expect(heldByNone(path)).toBe(true);
  });
});
