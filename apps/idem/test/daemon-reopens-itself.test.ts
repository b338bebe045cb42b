/**
 * The daemon (in this process, `Daemon.run`) on a SQLite ledger whose connection a group commit
 * abandoned under the daemon's own beat: SQLite could neither commit nor roll back that commit, so
 * the ledger closed its connection and opens it again at its next statement (`reopensItself`).
 * That is an outage that passes, not a file to open anew (daemon-reopen.test.ts): the tick fails,
 * the daemon says once that the ledger is unavailable, /healthz and idem_ledger_up say so, and the
 * next tick opens the connection again, settles the work due and says the ledger is back. Exiting
 * on it (as on a replaced file) took a daemon down for a fault that had already passed.
 *
 * The faults are SQLite's, as in core's sqlite-reopen.test.ts: the COMMIT's is real (a deferred
 * foreign key, switched on through `@idem/core/testing`'s `databaseOf`, the ledger's own
 * connection, refused at COMMIT leaves the transaction open); the ROLLBACK's is injected at
 * better-sqlite3's `exec` (an SQLITE_IOERR), as in-WAL SQLite gives up no ROLLBACK error we can
 * provoke. The beat shares that commit because group commit puts a turn's writes in one (its
 * contract, group-commit.ts). SQLite only: a Postgres ledger has no group commit.
 */
import { afterEach, describe, expect, it } from "vitest";
import { createRequire } from "node:module";
import { Writable } from "node:stream";
import { pino } from "pino";
import { defineAction, openLedger } from "@idem/core";
import { databaseOf } from "@idem/core/testing";
import { Daemon, DaemonMetrics, alertActions, parseConfig } from "@idem/cli";
import { freshDatabase, scaled, within } from "@idem/testkit";

/** better-sqlite3 (the module the ledger opens its file with, one per process): what is replaced of it. */
const Database = createRequire(import.meta.url)("better-sqlite3") as {
  prototype: { exec(this: unknown, source: string): unknown };
  SqliteError: new (message: string, code: string) => Error;
};
const exec = Database.prototype.exec;

const cleanups: (() => Promise<void>)[] = [];
afterEach(async () => {
  Database.prototype.exec = exec;
  for (const c of cleanups.splice(0).reverse()) await c();
});

/** The next ROLLBACK of any connection of this process fails (the ledger's is the only one to run it). */
function refuseNextRollback(): { readonly refused: () => number } {
  let refused = 0;
  Database.prototype.exec = function (this: unknown, source: string) {
    if (refused === 0 && /^\s*rollback\b/i.test(source)) {
      refused += 1;
      throw new Database.SqliteError("disk I/O error (test)", "SQLITE_IOERR");
    }
    return exec.call(this, source);
  };
  return { refused: () => refused };
}

interface Line {
  readonly level: number;
  readonly msg: string;
  readonly err?: { readonly message: string; readonly reopen?: boolean; readonly reopensItself?: boolean };
}

/** A logger keeping its lines; `said(msg)` resolves with the first line of that message, `onLine` sees each as it is written. */
function watchedLog(onLine: (line: Line) => void) {
  const lines: Line[] = [];
  const waiting: { msg: string; resolve: (line: Line) => void }[] = [];
  const log = pino(
    { level: "info" },
    new Writable({
      write(chunk, _encoding, done) {
        for (const text of String(chunk).split("\n").filter(Boolean)) {
          const line = JSON.parse(text) as Line;
          lines.push(line);
          onLine(line);
          for (const w of waiting.filter((x) => x.msg === line.msg)) w.resolve(line);
        }
        done();
      },
    }),
  );
  const said = (msg: string) =>
    new Promise<Line>((resolve) => {
      const seen = lines.find((l) => l.msg === msg);
      if (seen) resolve(seen);
      else waiting.push({ msg, resolve });
    });
  return { log, lines, said };
}

/** A raw statement through the ledger's own connection (kysely is core's, not this package's). */
function raw(db: ReturnType<typeof databaseOf>, text: string) {
  const query = { sql: text, parameters: [], query: { kind: "RawNode" } };
  return db.executeQuery(query as unknown as Parameters<typeof db.executeQuery>[0]);
}

const UNAVAILABLE = "the ledger database is unavailable; retrying every interval";
const BACK = "the ledger database is reachable again";

/** Its first request's answer is lost (unknown); a lookup finds the effect. */
const answerLost = defineAction<{ to: string }, { id: string }>({
  type: "mail.answer-lost",
  capabilities: { lookup: true },
  execute: async () => {
    throw new Error("socket hang up");
  },
  classify: () => ({ kind: "ambiguous", reason: "the answer was lost" }),
  reconcile: async (args) => ({ found: true, receipt: { id: `m-${args.to}` } }),
});

describe("the daemon on a SQLite ledger whose connection a group commit abandoned (the ledger opens it again)", () => {
  it(
    "fails that tick as an outage, said once, /healthz 503; the next tick opens the connection again, settles what is due, and /healthz is up",
    async () => {
      const url = await freshDatabase("sqlite");
      // Far longer than this process needs to read /healthz between the two ticks.
      const config = parseConfig({ ledger: url, alerts: { log: true }, daemon: { intervalMs: scaled(3_000) } });
      // The metrics the daemon reports to, served as `idem daemon` serves them (set below).
      let metrics: DaemonMetrics | undefined;
      let port = 0;
      const readHealth = async () => {
        const res = await fetch(`http://127.0.0.1:${port}/healthz`);
        return { status: res.status, body: (await res.json()) as Record<string, unknown> };
      };
      const upNow = async () => (await metrics!.ledgerUp.get()).values[0]?.value;
      let atOutage: { up: Promise<number | undefined>; healthz: ReturnType<typeof readHealth> } | undefined;
      const { log, lines, said } = watchedLog((line) => {
        // Read as the outage is said, before the next tick can end it: the gauge's collect runs
        // now (prom-client calls it at once), /healthz answers long before the interval ends.
        if (line.msg === UNAVAILABLE) atOutage = { up: upNow(), healthz: readHealth() };
      });
      const ledger = await openLedger(url, {
        actions: [...alertActions(config, log), answerLost],
        budget: { attempts: 1, baseDelayMs: 10 },
      });
      cleanups.push(() => ledger.close());
      metrics = new DaemonMetrics(ledger, config.daemon.intervalMs);
      port = await metrics.listen(0, "127.0.0.1");
      cleanups.push(() => metrics!.close());

      // Work due for the daemon: an outcome unknown, which its lookup settles.
      const lost = await ledger.run(answerLost, { tenant: "t", key: ["lost"], args: { to: "a@example.com" } });
      expect(lost).toMatchObject({ status: "pending_verification", state: "unknown" });

      // A commit that holds a write refused at COMMIT (a deferred foreign key, on this connection only).
      const db = databaseOf(ledger);
      for (const statement of [
        "PRAGMA foreign_keys = ON",
        "CREATE TABLE refuse_parent (id TEXT PRIMARY KEY)",
        "CREATE TABLE refuse_child (ref TEXT REFERENCES refuse_parent (id) DEFERRABLE INITIALLY DEFERRED)",
        "CREATE TABLE scratch (v TEXT)",
      ])
        await raw(db, statement);
      // Three writes of one turn: the first commits alone, the others share the next commit. After
      // a commit of several, even a turn's first write waits for the next commit: so the refused
      // write and the daemon's beat, both of the next turn, share one, whichever comes first.
      await Promise.all(["1", "2", "3"].map((v) => raw(db, `insert into scratch values (${v})`)));
      const rollback = refuseNextRollback();
      const refusedWrite = raw(db, "insert into refuse_child values ('none')").then(
        () => "written",
        (error: unknown) => error,
      );
      const daemon = new Daemon(ledger, config, log, metrics, "d-reopens-itself");
      const run = daemon.run().then(
        () => "ended" as const,
        (error: unknown) => error,
      );
      cleanups.push(async () => {
        daemon.stop();
        await run;
      });
      const ended = run.then((out) => {
        throw new Error(`run() ended during the test: ${String(out)}`);
      });
      ended.catch(() => {}); // the test's own stop ends it too, once nothing waits on it

      // The commit of the beat and the refused write: neither committed nor rolled back, abandoned.
      expect(await within(scaled(10_000), "the refused write", refusedWrite)).toMatchObject({
        reopen: true,
        reopensItself: true,
        message: expect.stringMatching(/^SQLite could neither commit nor roll back a group commit/),
      });
      expect(rollback.refused()).toBe(1);
      // The daemon's tick met it: an outage, said once, not an exit.
      const outage = await within(scaled(10_000), "the outage said", Promise.race([said(UNAVAILABLE), ended]));
      expect(outage.err).toMatchObject({
        reopen: true,
        reopensItself: true,
        message: expect.stringMatching(/the ledger opens it again for its next statement/),
      });
      const during = await within(scaled(10_000), "/healthz during the outage", atOutage!.healthz);
      expect(during).toMatchObject({
        status: 503,
        body: { ok: false, ledger: "unavailable", error: expect.stringMatching(/^SQLite could neither commit/) },
      });
      expect(await atOutage!.up).toBe(0);

      // The next tick opens the connection again and settles what is due.
      await within(scaled(20_000), "the ledger back", Promise.race([said(BACK), ended]));
      expect((await ledger.get({ tenant: "t", id: lost.operationId })).operation).toMatchObject({
        status: "succeeded",
        result: { id: "m-a@example.com" },
      });
      expect(lines).toContainEqual(expect.objectContaining({ msg: "settled", operationId: lost.operationId }));
      expect(await readHealth()).toMatchObject({ status: 200, body: { ok: true, ledger: "up" } });
      expect(await upNow()).toBe(1);
      expect(lines.filter((l) => l.msg === UNAVAILABLE)).toHaveLength(1);
      expect(lines.filter((l) => l.level >= 60)).toEqual([]);
    },
    scaled(60_000),
  );
});
