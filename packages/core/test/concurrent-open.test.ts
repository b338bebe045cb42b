/**
 * Many agents starting together open one new SQLite file at once, each migrating on open: every
 * open succeeds and the schema is migrated once. kysely's Migrator takes no lock on SQLite, so
 * without one of our own the opens interleaved their CREATE TABLEs ("table idem_operations
 * already exists", "no such table: idem_events").
 */
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import Database from "better-sqlite3";
import { sql } from "kysely";
import { afterEach, describe, expect, it } from "vitest";
import { LedgerConfigError, openLedger, type Ledger } from "@idem/core";
import { databaseOf } from "@idem/core/testing";
import { kill9, scaled, startChild, tempDir, type Child } from "@idem/testkit";
import { MIGRATION_NAMES } from "../src/migrations/index.js";
import { TestProvider } from "./support/provider.js";

const OPENER = fileURLToPath(new URL("./children/opener.ts", import.meta.url));

/** Each migration listed once, in order, and a guarded run that executes once and replays. */
async function expectMigratedOnce(ledger: Ledger): Promise<void> {
  const { rows } = await sql<{ name: string }>`select name from idem_migration order by name`.execute(
    databaseOf(ledger),
  );
  expect(rows.map((r) => r.name)).toEqual(MIGRATION_NAMES);
  const p = new TestProvider();
  const send = p.action("mail.send", {});
  const input = { tenant: "t", key: ["after-open"], args: { to: "a@example.com" } };
  expect(await ledger.run(send, input)).toMatchObject({ status: "succeeded", replayed: false });
  expect(await ledger.run(send, input)).toMatchObject({ status: "succeeded", replayed: true });
  expect(p.effects).toHaveLength(1);
}

describe("concurrent opens of a new SQLite file", () => {
  const opened: Ledger[] = [];
  const children: Child[] = [];
  afterEach(async () => {
    await Promise.all(
      children.splice(0).map((c) => (c.proc.exitCode === null && c.proc.signalCode === null ? kill9(c) : undefined)),
    );
    for (const l of opened.splice(0)) await l.close();
  });

  it("in one process: 8 opens at once, 10 new files, all open and migrate once", async () => {
    for (let round = 0; round < 10; round++) {
      const url = `sqlite:${join(tempDir(), "ledger.db")}`;
      const outcomes = await Promise.allSettled(Array.from({ length: 8 }, () => openLedger(url)));
      for (const o of outcomes) if (o.status === "fulfilled") opened.push(o.value);
      expect(
        outcomes.filter((o) => o.status === "rejected").map((o) => String((o as PromiseRejectedResult).reason)),
      ).toEqual([]);
      await expectMigratedOnce(opened.at(-1)!);
      for (const l of opened.splice(0)) await l.close();
    }
  });

  it(
    "across processes: 16 agents open one new file at once, all exit 0 and it is migrated once",
    async () => {
      const url = `sqlite:${join(tempDir(), "ledger.db")}`;
      children.push(...Array.from({ length: 16 }, () => startChild(OPENER, [], { LEDGER_URL: url })));
      await Promise.all(children.map((c) => c.waitFor(/^ready$/, 90_000)));
      for (const c of children) c.send("go");
      const exits = await Promise.all(children.map((c) => c.exited));
      const failed = exits
        .filter((e) => e.code !== 0)
        .map(
          (e) => `exit ${e.code ?? e.signal}: ${e.stderr.split("\n").find((l) => /^\w*Error\b/.test(l)) ?? e.stderr}`,
        );
      expect(failed).toEqual([]);
      expect(children.every((c) => c.lines.includes("opened"))).toBe(true);
      const ledger = await openLedger(url, { migrate: false });
      opened.push(ledger);
      await expectMigratedOnce(ledger);
    },
    scaled(120_000),
  );

  /**
   * The first open of a new file converts it to WAL under its write lock; an open meanwhile got
   * SQLITE_BUSY at once, without the busy timeout (measured: 1 in about 4,000 opens by 64
   * processes). Held here by a plain connection in rollback mode, as the converting one holds it.
   */
  describe("while another connection holds the write lock of a file still in rollback mode", () => {
    it("the open waits for it", async () => {
      const path = join(tempDir(), "ledger.db");
      const holder = new Database(path);
      holder.exec("begin immediate; create table other (x)");
      // The holder finishes its write a while later; the open must wait for it rather than fail.
      let committed = false;
      const timer = setTimeout(() => {
        holder.exec("commit");
        committed = true;
      }, 300);
      try {
        const ledger = await openLedger(`sqlite:${path}`);
        opened.push(ledger);
        expect(committed).toBe(true);
        await expectMigratedOnce(ledger);
      } finally {
        clearTimeout(timer);
        holder.close();
      }
    });

    it("and fails with LedgerConfigError once the busy timeout is spent", async () => {
      const path = join(tempDir(), "ledger.db");
      const holder = new Database(path);
      try {
        holder.exec("begin immediate; create table other (x)");
        const started = performance.now();
        const error = await openLedger(`sqlite:${path}`, { busyTimeoutMs: 500 }).catch((e: unknown) => e);
        expect(error).toBeInstanceOf(LedgerConfigError);
        expect((error as Error).message).toMatch(/database is locked/);
        expect(performance.now() - started).toBeGreaterThanOrEqual(450);
      } finally {
        holder.close();
      }
    });
  });
});
