/**
 * What a SQLite ledger keeps of its file: durable commits in WAL mode (the promise of every
 * acknowledged claim), and the files it opened. SQLite keeps writing into a file deleted or
 * renamed over under an open connection, and says nothing; a claim acknowledged there is in no
 * ledger another process opens at that path, which would claim the key again and repeat the effect.
 * The same holds of the log (-wal: a crash loses what was written there) and of its index (-shm:
 * a process that opens the ledger since makes a new one, and the two no longer see each other).
 */
import { execFileSync } from "node:child_process";
import { existsSync, renameSync, rmSync } from "node:fs";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { sql } from "kysely";
import { afterEach, describe, expect, it } from "vitest";
import { LedgerUnavailableError, openLedger, type Ledger } from "@idem/core";
import { databaseOf, openTestLedger } from "@idem/core/testing";
import { scaled, startChild, tempDir } from "@idem/testkit";
import { effectLines, fileAction } from "./support/file-provider.js";
import { TestProvider } from "./support/provider.js";

const WORKER = fileURLToPath(new URL("./children/worker.ts", import.meta.url));

const opened: Ledger[] = [];
afterEach(async () => {
  for (const l of opened.splice(0)) await l.close();
});
const open = async (path: string, options: { groupCommit?: boolean; durable?: boolean } = {}) => {
  const ledger = await openTestLedger(`sqlite:${path}`, options);
  opened.push(ledger);
  return ledger;
};
const removeLedger = (path: string) => {
  for (const suffix of ["", "-wal", "-shm"]) rmSync(path + suffix, { force: true });
};

describe("a SQLite ledger's file", () => {
  it("is written with durable commits in WAL mode (synchronous FULL; NORMAL only when durable is false)", async () => {
    const pragma = async (ledger: Ledger, name: string) =>
      Object.values((await sql.raw(`pragma ${name}`).execute(databaseOf(ledger))).rows[0] as object)[0];
    const durable = await open(join(tempDir(), "a.db"));
    const fast = await open(join(tempDir(), "b.db"), { durable: false });
    expect(await pragma(durable, "journal_mode")).toBe("wal");
    expect(await pragma(durable, "synchronous")).toBe(2); // FULL
    expect(await pragma(fast, "synchronous")).toBe(1); // NORMAL
  });

  for (const groupCommit of [true, false]) {
    it(`deleted, then made anew by another process, under an open ledger: no claim is acknowledged in the lost file, the key is done once (groupCommit ${groupCommit})`, async () => {
      const path = join(tempDir(), "ledger.db");
      const first = await open(path, { groupCommit });
      const p = new TestProvider();
      const mail = p.action("mail", {});
      await first.run(mail, { tenant: "t", key: ["k1"], args: { to: "x" } });
      removeLedger(path); // an operator's "reset", a volume cleaned up
      const lost = first.run(mail, { tenant: "t", key: ["k2"], args: { to: "x" } });
      await expect(lost).rejects.toThrow(LedgerUnavailableError);
      await expect(lost).rejects.toThrow(/was deleted since the ledger opened it/);
      // Not an outage that passes: this ledger must be opened again (the daemon exits for it).
      await expect(lost).rejects.toMatchObject({ reopen: true });
      // Another process opens the path: a new, empty ledger, where k2 is fresh.
      const second = await open(path, { groupCommit });
      expect(await second.run(mail, { tenant: "t", key: ["k2"], args: { to: "x" } })).toMatchObject({
        status: "succeeded",
        replayed: false,
      });
      // The first ledger, on the file it opened, still writes nothing: the path names another file now.
      const replaced = first.run(mail, { tenant: "t", key: ["k3"], args: { to: "x" } });
      await expect(replaced).rejects.toThrow(/was replaced since the ledger opened it/);
      await expect(replaced).rejects.toMatchObject({ reopen: true });
      expect(p.effects).toHaveLength(2); // k1 once, k2 once
      expect(new Set(p.effects.map((e) => e.key)).size).toBe(2);
    });
  }

  // Its completion met the lost file, and the write was retried with backoff (`durably`) as if an
  // outage could pass: a caller holding the effect's receipt waited seconds for nothing (helper-119).
  it("deleted while an action runs: its receipt reaches the caller at once, not after a lease of retries", async () => {
    const path = join(tempDir(), "ledger.db");
    const ledger = await openTestLedger(`sqlite:${path}`, { leaseMs: 600_000 });
    opened.push(ledger);
    const p = new TestProvider();
    const mail = p.action("mail", {});
    let release: () => void = () => {};
    p.gate = new Promise<void>((r) => (release = r));
    const call = ledger.run(mail, { tenant: "t", key: ["k"], args: { to: "x" } }).catch((e: unknown) => e);
    await p.called();
    removeLedger(path); // the effect is under way as the file goes
    const released = performance.now();
    release();
    const out = await call;
    // Before: 8 retries with backoff, 6-9 s, for a write that could never pass.
    expect(performance.now() - released).toBeLessThan(3_000);
    expect(out).toMatchObject({ name: "CompletionNotRecordedError", receipt: expect.anything() });
    expect((out as Error).cause).toMatchObject({ reopen: true });
    expect(p.effects).toHaveLength(1);
  });

  for (const groupCommit of [true, false]) {
    it(`its log (-wal) deleted under an open ledger: no claim is acknowledged into the lost log, and what was acknowledged before is kept once it closes (groupCommit ${groupCommit})`, async () => {
      const path = join(tempDir(), "ledger.db");
      const first = await open(path, { groupCommit });
      const p = new TestProvider();
      const mail = p.action("mail", {});
      await first.run(mail, { tenant: "t", key: ["k1"], args: { to: "x" } });
      expect(existsSync(`${path}-wal`)).toBe(true);
      rmSync(`${path}-wal`); // an operator's cleanup of "stale" -wal files
      // Before: acknowledged, in a log no other process sees and a crash loses; the next process
      // claimed k2 again and repeated its effect.
      const lost = first.run(mail, { tenant: "t", key: ["k2"], args: { to: "x" } });
      await expect(lost).rejects.toThrow(LedgerUnavailableError);
      await expect(lost).rejects.toThrow(/SQLite log .*-wal was deleted since the ledger opened it/);
      // Reopened, as the error says: closing writes the log it holds into the file.
      await first.close();
      const second = await open(path, { groupCommit });
      expect(await second.run(mail, { tenant: "t", key: ["k1"], args: { to: "x" } })).toMatchObject({
        status: "succeeded",
        replayed: true,
      });
      expect(await second.run(mail, { tenant: "t", key: ["k2"], args: { to: "x" } })).toMatchObject({
        status: "succeeded",
        replayed: false,
      });
      expect(p.effects).toHaveLength(2); // k1 once, k2 once
      expect(new Set(p.effects.map((e) => e.key)).size).toBe(2);
    });
  }

  it(
    "its log's index (-shm) deleted under an open ledger: this process and one that opens the ledger since do not both perform a key",
    async () => {
      const dir = tempDir();
      const path = join(dir, "ledger.db");
      const file = join(dir, "effects");
      const first = await open(path);
      const action = fileAction("neither", file);
      await first.run(action, { tenant: "t", key: ["k1"], args: { note: "x" } });
      expect(existsSync(`${path}-shm`)).toBe(true);
      rmSync(`${path}-shm`); // an operator's cleanup of "stale" -shm files
      // Another process opens the ledger now: it makes a new -shm, and takes its locks there.
      const other = startChild(WORKER, [], {
        ...{ LEDGER_URL: `sqlite:${path}`, TENANT: "t", KEY: "k2", EFFECT_FILE: file },
        ...{ KIND: "neither", LEASE_MS: "5000", MODE: "race" },
      });
      try {
        await other.waitFor(/^ready$/, 60_000);
        other.send("go");
        expect(await other.waitFor(/^result /)).toMatch(/"status":"succeeded"/);
        // Before: this process, on the index it opened, saw no claim of k2 and performed it again.
        await expect(first.run(action, { tenant: "t", key: ["k2"], args: { note: "x" } })).rejects.toThrow(
          /SQLite log's index .*-shm was replaced since the ledger opened it/,
        );
      } finally {
        other.proc.kill("SIGKILL"); // it exits by itself once done; killed if the test failed before
        await other.exited;
      }
      expect(effectLines(file)).toHaveLength(2); // k1 once, k2 once
    },
    scaled(60_000),
  );

  it("its log (-wal) renamed aside under an open ledger: refused, not written into the renamed log", async () => {
    const path = join(tempDir(), "ledger.db");
    const ledger = await open(path);
    const p = new TestProvider();
    await ledger.run(p.action("mail", {}), { tenant: "t", key: ["k1"], args: { to: "x" } });
    renameSync(`${path}-wal`, `${path}-wal.old`);
    await expect(ledger.run(p.action("mail", {}), { tenant: "t", key: ["k2"], args: { to: "x" } })).rejects.toThrow(
      /SQLite log .*-wal was deleted since the ledger opened it/,
    );
    expect(p.effects).toHaveLength(1);
  });

  it("open twice in one process, one closed: the other keeps its locks, which tell other processes it is open", async () => {
    // SQLite's locks are POSIX locks: closing any descriptor of a file drops every lock the
    // process holds on it. The file check holds descriptors of the file and its index; closed
    // with a ledger, they must not take the locks of another ledger still open on the same file
    // (its shared lock says the file is in use; without it another process takes the file for
    // unused: removeMade deletes it, and SQLite rebuilds the log's index under the open ledger).
    const path = join(tempDir(), "ledger.db");
    const kept = await open(path);
    const closed = await openLedger(`sqlite:${path}`);
    await closed.close();
    const probe = [
      'const db = new (require("better-sqlite3"))(process.argv[1], { timeout: 0 });',
      'db.pragma("locking_mode = EXCLUSIVE");',
      'try { db.exec("begin exclusive"); console.log("locked"); } catch (e) { console.log(e.code); }',
    ].join("\n");
    const out = execFileSync(process.execPath, ["-e", probe, path], {
      cwd: fileURLToPath(new URL("..", import.meta.url)),
      encoding: "utf8",
    });
    expect(out.trim()).toBe("SQLITE_BUSY");
    const p = new TestProvider();
    expect(await kept.run(p.action("mail", {}), { tenant: "t", key: ["k1"], args: { to: "x" } })).toMatchObject({
      status: "succeeded",
    });
  });

  it("renamed over by another file (a backup put back): refused, not written into the old one", async () => {
    const dir = tempDir();
    const path = join(dir, "ledger.db");
    const ledger = await open(path);
    const p = new TestProvider();
    await ledger.run(p.action("mail", {}), { tenant: "t", key: ["k1"], args: { to: "x" } });
    const backup = await openLedger(`sqlite:${join(dir, "backup.db")}`);
    await backup.close();
    renameSync(join(dir, "backup.db"), path);
    await expect(ledger.run(p.action("mail", {}), { tenant: "t", key: ["k2"], args: { to: "x" } })).rejects.toThrow(
      /was replaced since the ledger opened it/,
    );
    expect(p.effects).toHaveLength(1);
  });
});
