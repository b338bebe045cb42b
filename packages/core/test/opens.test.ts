/**
 * Opening a ledger that cannot be opened: a clear `LedgerConfigError` in bounded time, and nothing
 * left behind. A file that is not a database, a Postgres that accepts connections and never answers
 * (a frozen server, a wrong port behind a proxy), with the timeout from the options or the URL;
 * timeouts up to the server's own maximum (a longer client timer would fire at once).
 * Descriptors are counted in /proc/self/fd: one leaked per failed open keeps a mount busy and,
 * for a process that retries, runs out.
 */
import { execFileSync } from "node:child_process";
import { existsSync, mkdtempSync, readdirSync, readlinkSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { createConnection, createServer, type Socket } from "node:net";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { Kysely, Migrator, PostgresDialect, sql } from "kysely";
import { LedgerConfigError, defineAction, openLedger, redactUrl, type LedgerOptions } from "@idem/core";
import { databaseOf } from "@idem/core/testing";
import { freshDatabase, pgProxy, scaled, tempDir } from "@idem/testkit";
import { migrationProvider } from "../src/migrations/index.js";
import { removeMade } from "../src/sqlite-driver.js";
import Database from "better-sqlite3";

const fds = () => readdirSync("/proc/self/fd");
const fdsOn = (path: string) =>
  fds().filter((fd) => {
    try {
      return readlinkSync(`/proc/self/fd/${fd}`).startsWith(path);
    } catch {
      return false;
    }
  });

function withUser(url: URL, user: string): string {
  const u = new URL(url);
  u.username = user;
  u.password = "pw";
  return u.toString();
}

const noop = defineAction({ type: "opens.noop", capabilities: {}, execute: async () => ({ ok: true }) });

async function refusal(p: Promise<unknown>): Promise<{ error: unknown; ms: number }> {
  const started = performance.now();
  try {
    await p;
  } catch (error) {
    return { error, ms: performance.now() - started };
  }
  throw new Error("expected the open to fail");
}

describe("a SQLite file that cannot be opened", () => {
  it("is refused with LedgerConfigError and keeps no descriptor, open after open", async () => {
    const dir = tempDir();
    const path = join(dir, "not-a-ledger.db");
    writeFileSync(path, Buffer.alloc(8192, "not a database, just bytes. "));
    for (let i = 0; i < 20; i++) {
      const { error } = await refusal(openLedger(`sqlite:${path}`));
      expect(error).toBeInstanceOf(LedgerConfigError);
      expect((error as Error).message).toMatch(/not a database/);
    }
    expect(fdsOn(path)).toEqual([]);
  });
});

/**
 * What a failed first open does with the file it made (removeMade): another process may have
 * opened the same new path meanwhile, and be about to migrate it, or have done so.
 */
describe("the SQLite file a failed first open made", () => {
  /** A file with a header and no table, as a first open leaves it once it turned it to WAL. */
  function headerOnly(): string {
    const path = join(tempDir(), "ledger.db");
    const maker = new Database(path);
    maker.pragma("journal_mode = WAL");
    maker.prepare("select count(*) from sqlite_master").get();
    maker.close();
    return path;
  }
  const files = (path: string) => ["", "-wal", "-shm"].filter((s) => existsSync(path + s)).map((s) => `ledger.db${s}`);

  it("is removed with its log and index when it holds no table and no other connection has it open", () => {
    const path = headerOnly();
    const other = new Database(path);
    other.pragma("journal_mode = WAL"); // another process's open, about to migrate: it holds the file
    other.prepare("select count(*) from sqlite_master").get();
    removeMade(Database, path);
    expect(files(path), "removed under another process's open").toContain("ledger.db");
    other.exec("create table idem_other (x)");
    other.close();
    removeMade(Database, path);
    expect(files(path), "removed once another process had made tables in it").toEqual(["ledger.db"]);
    const empty = headerOnly();
    removeMade(Database, empty);
    expect(files(empty)).toEqual([]);
  });
});

describe("a Postgres that accepts connections and never answers", () => {
  const held: Socket[] = [];
  let close: () => Promise<void> = async () => {};
  afterEach(async () => close());

  /** A listener that takes every connection and says nothing, like a frozen server. */
  async function silent(): Promise<number> {
    const server = createServer((s) => held.push(s));
    await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
    close = async () => {
      for (const s of held.splice(0)) s.destroy();
      await new Promise((r) => server.close(r));
    };
    return (server.address() as { port: number }).port;
  }

  it("gives up after connectTimeoutMs, with the password masked", async () => {
    const port = await silent();
    const { error, ms } = await refusal(
      openLedger(`postgres://idem:s3cret@127.0.0.1:${port}/ledger`, { connectTimeoutMs: 500 }),
    );
    expect(error).toBeInstanceOf(LedgerConfigError);
    expect((error as LedgerConfigError).unreachable).toBe(true); // worth trying again later
    expect((error as Error).message).toMatch(/no answer within 500 ms/);
    expect((error as Error).message).not.toMatch(/s3cret/);
    expect(held.length).toBeGreaterThan(0); // it did connect, and waited for an answer
    expect(ms).toBeGreaterThanOrEqual(450);
    expect(ms).toBeLessThan(10_000);
  });

  it("honours connect_timeout (seconds) from the URL, as libpq and pg users write it", async () => {
    const port = await silent();
    const { error, ms } = await refusal(openLedger(`postgres://idem:pw@127.0.0.1:${port}/ledger?connect_timeout=1`));
    expect(error).toBeInstanceOf(LedgerConfigError);
    expect((error as Error).message).toMatch(/no answer within 1000 ms/);
    expect(ms).toBeGreaterThanOrEqual(900);
    expect(ms).toBeLessThan(10_000);
  });

  it("says whether the server answered: refused is unreachable, no such database is not", async () => {
    const refused = await refusal(openLedger("postgres://idem:pw@127.0.0.1:1/ledger", { connectTimeoutMs: 2_000 }));
    expect(refused.error).toMatchObject({ unreachable: true });
    const url = new URL(await freshDatabase("postgres"));
    url.pathname = "/no_such_database_here";
    const answered = await refusal(openLedger(url.toString(), { connectTimeoutMs: 5_000 }));
    expect(answered.error).toBeInstanceOf(LedgerConfigError);
    expect(answered.error).toMatchObject({ unreachable: false });
  });

  it("a server whose Unix socket is not there (stopped, not started yet) is unreachable, and the same URL opens once it listens", async () => {
    const dir = tempDir(); // the socket's directory is there; the server that makes the socket is not
    const tcp = new URL(await freshDatabase("postgres"));
    const url = `postgres://${tcp.username}:${tcp.password}@/${tcp.pathname.slice(1)}?host=${encodeURIComponent(dir)}`;
    // Before: connect ENOENT read as a wrong config, and `idem daemon` exited 2 instead of waiting.
    const down = await refusal(openLedger(url, { connectTimeoutMs: 2_000 }));
    expect(down.error).toBeInstanceOf(LedgerConfigError);
    expect((down.error as Error).message).toMatch(/ENOENT/);
    expect(down.error).toMatchObject({ unreachable: true });
    // The server starts listening there (a socket that forwards to its TCP port).
    const socket = createServer((inbound) => {
      const outbound = createConnection({ host: tcp.hostname, port: Number(tcp.port) });
      inbound.pipe(outbound).pipe(inbound);
      inbound.on("error", () => outbound.destroy());
      outbound.on("error", () => inbound.destroy());
    });
    await new Promise<void>((r) => socket.listen(join(dir, ".s.PGSQL.5432"), r));
    try {
      await (await openLedger(url)).close();
    } finally {
      await new Promise((r) => socket.close(r));
    }
  });

  it("a certificate file the URL names that is not there: a wrong config, at open", async () => {
    const missing = join(tempDir(), "ca.pem");
    const url = `postgres://idem:pw@127.0.0.1:1/ledger?sslmode=verify-full&sslrootcert=${encodeURIComponent(missing)}`;
    const { error } = await refusal(openLedger(url, { connectTimeoutMs: 2_000 }));
    expect(error).toBeInstanceOf(LedgerConfigError);
    expect((error as Error).message).toMatch(/ENOENT.*ca\.pem/);
    expect(error).toMatchObject({ unreachable: false });
  });

  it("a server out of connections (53300) is unreachable for now, not a wrong config", async () => {
    const { default: pg } = await import("pg");
    const url = new URL(await freshDatabase("postgres"));
    const admin = new pg.Client({ connectionString: url.toString() });
    await admin.connect();
    const role = `idem_one_${process.pid}`;
    const holder = new pg.Client({ connectionString: withUser(url, role) });
    try {
      await admin.query(`create role ${role} login password 'pw' connection limit 1`);
      await holder.connect(); // the role's one connection, held
      const full = await refusal(openLedger(withUser(url, role), { connectTimeoutMs: 5_000 }));
      expect(full.error).toBeInstanceOf(LedgerConfigError);
      expect((full.error as Error).message).toMatch(/too many connections/);
      expect(full.error).toMatchObject({ unreachable: true }); // worth trying again once one is free
    } finally {
      await holder.end().catch(() => {});
      await admin.query(`drop role if exists ${role}`).catch(() => {});
      await admin.end();
    }
  });

  it("masks every form of the password in the URL it prints", () => {
    expect(redactUrl("postgres://u:s3cret@db:5432/idem")).toBe("postgres://u:***@db:5432/idem");
    // The parameters pg and libpq read, and a password holding an @ or a / (no URL parser reads those).
    expect(redactUrl("postgres://u@db/idem?password=s3cret&sslmode=require")).toBe(
      "postgres://u@db/idem?password=***&sslmode=require",
    );
    expect(redactUrl("postgresql://u:p@ss@db/idem")).toBe("postgresql://u:***@db/idem");
    expect(redactUrl("postgres://app:ab/cd@127.0.0.1:1/idem")).toBe("postgres://app:***@127.0.0.1:1/idem");
    expect(redactUrl("postgres://u@db/idem?sslpassword=k3y")).not.toContain("k3y");
    // A scheme the ledger refuses is printed in the refusal: masked too.
    expect(redactUrl("mysql://root:s3cret@db/x")).toBe("mysql://root:***@db/x");
    expect(redactUrl("postgres://u:p#ss@db/idem")).toBe("postgres://u:***@db/idem");
    expect(redactUrl("postgres://u:p?ss@db/idem")).toBe("postgres://u:***@db/idem");
    // An @ in the query of a URL with no password: nothing to mask, nothing masked.
    expect(redactUrl("postgres://u@db/idem?application_name=a@b")).toBe("postgres://u@db/idem?application_name=a@b");
    expect(redactUrl("sqlite:./idem.db")).toBe("sqlite:./idem.db");
  });

  it("leaves no socket behind after failed opens", async () => {
    const port = await silent();
    const before = fds().length;
    for (let i = 0; i < 5; i++)
      await refusal(openLedger(`postgres://idem:pw@127.0.0.1:${port}/ledger`, { connectTimeoutMs: 200 }));
    await close(); // the listener's own ends of the connections
    // The client ends close as the sockets are destroyed; give the event loop a turn to reap them.
    const deadline = Date.now() + 5_000;
    while (fds().length > before && Date.now() < deadline) await new Promise((r) => setImmediate(r));
    expect(fds().length).toBeLessThanOrEqual(before);
  });

  it("refuses a connect timeout of 0 (libpq: wait for ever), naming it, before connecting", async () => {
    const url = "postgres://idem:pw@127.0.0.1:1/ledger";
    // Before: read as the default (10 s), silently; here the connection refused (unreachable).
    for (const [target, options, what] of [
      [`${url}?connect_timeout=0`, {}, /connect_timeout=0 \(to libpq: wait for ever\) is refused/],
      [url, { connectTimeoutMs: 0 }, /connectTimeoutMs 0 is refused/],
    ] as const) {
      const { error } = await refusal(openLedger(target, options));
      expect(error).toBeInstanceOf(LedgerConfigError);
      expect(error).toMatchObject({ unreachable: false });
      expect((error as Error).message).toMatch(what);
    }
  });

  it("refuses timeouts that are not durations", async () => {
    await expect(openLedger("postgres://idem:pw@127.0.0.1:1/ledger?connect_timeout=soon")).rejects.toThrow(
      /connect_timeout/,
    );
    await expect(openLedger("postgres://idem:pw@127.0.0.1:1/ledger", { statementTimeoutMs: -1 })).rejects.toThrow(
      /statementTimeoutMs/,
    );
  });
});

describe('Postgres timeouts up to the server\'s own maximum (2147483647 ms, a common "never")', () => {
  // Node fires a timer of more than 2^31-1 ms after 1 ms (TimeoutOverflowWarning). The client's
  // read timeout, 5 s past statement_timeout, failed every statement that took over 1 ms as "no
  // answer within 10000 ms", unreachable, from a server that answered each one.
  const MAX = 2 ** 31 - 1;
  const overflows: string[] = [];
  const onWarning = (w: Error) => {
    if (w.name === "TimeoutOverflowWarning") overflows.push(w.message);
  };
  beforeEach(() => {
    overflows.length = 0;
    process.on("warning", onWarning);
  });
  afterEach(() => {
    process.off("warning", onWarning);
  });

  /** The database one network hop away: every chunk, each way, `ms` late (in order). */
  const hop = (ms: number) => (client: Socket, upstream: Socket) => {
    client.on("data", (d: Buffer) => setTimeout(() => upstream.write(d), ms));
    upstream.on("data", (d: Buffer) => setTimeout(() => client.write(d), ms));
  };

  it("statement_timeout at Postgres's maximum, as an option or in the URL: the ledger opens and works one hop away", async () => {
    const direct = new URL(await freshDatabase("postgres"));
    await (await openLedger(direct.toString())).close(); // migrated
    const proxy = await pgProxy(direct, hop(5));
    try {
      const inUrl = new URL(proxy.url);
      inUrl.searchParams.set("statement_timeout", String(MAX));
      const opens: [string, { statementTimeoutMs?: number }][] = [
        [proxy.url, { statementTimeoutMs: MAX }],
        [inUrl.toString(), {}],
      ];
      for (const [i, [url, options]] of opens.entries()) {
        const ledger = await openLedger(url, options);
        try {
          for (let k = 0; k < 3; k++)
            expect((await ledger.run(noop, { tenant: "t", key: [`k${i}.${k}`], args: {} })).status).toBe("succeeded");
          const shown = await sql<{ statement_timeout: string }>`show statement_timeout`.execute(databaseOf(ledger));
          expect(shown.rows[0]?.statement_timeout).toBe(`${MAX}ms`); // the server's, as given
        } finally {
          await ledger.close();
        }
      }
    } finally {
      await proxy.close();
    }
    expect(overflows).toEqual([]);
  });

  it("longer than a timer can wait: refused at open as a wrong config naming the setting, before connecting", async () => {
    const url = "postgres://idem:pw@127.0.0.1:1/ledger";
    const refused: [LedgerOptions, string, RegExp][] = [
      [{ statementTimeoutMs: MAX + 1 }, url, /statementTimeoutMs/],
      [{}, `${url}?statement_timeout=${MAX + 1}`, /statement_timeout/],
      [{ connectTimeoutMs: MAX + 1 }, url, /connectTimeoutMs/],
      [{}, `${url}?connect_timeout=${Math.ceil(MAX / 1000)}`, /connect_timeout/], // seconds, as in libpq
      [{ lockTimeoutMs: MAX + 1 }, url, /lockTimeoutMs/],
      [{ migrationTimeoutMs: MAX + 1 }, url, /migrationTimeoutMs/],
      [{ connectionLifetimeMs: MAX + 1 }, url, /connectionLifetimeMs/],
      // An attempt's deadline is a timer too: a month's lease ended every attempt as it began.
      [{ leaseMs: MAX + 1 }, url, /leaseMs/],
      [{ leaseMs: MAX + 1 }, "sqlite::memory:", /leaseMs/],
    ];
    for (const [options, target, what] of refused) {
      const { error } = await refusal(openLedger(target, options));
      expect(error, JSON.stringify(options)).toBeInstanceOf(LedgerConfigError);
      expect(error).toMatchObject({ unreachable: false });
      expect((error as Error).message).toMatch(what);
      expect((error as Error).message).toMatch(/at most 2147483647 ms/);
    }
    expect(overflows).toEqual([]);
  });

  it('the server refusing a timeout setting (options=-c statement_timeout=abc): its own words, not "no answer"', async () => {
    const url = new URL(await freshDatabase("postgres"));
    url.searchParams.set("options", "-c statement_timeout=abc");
    const { error } = await refusal(openLedger(url.toString(), { connectTimeoutMs: 5_000 }));
    expect(error).toBeInstanceOf(LedgerConfigError);
    expect((error as Error).message).toMatch(/invalid value for parameter "statement_timeout"/);
    expect((error as Error).message).not.toMatch(/no answer/);
    expect(error).toMatchObject({ unreachable: false }); // a wrong config: waiting would not help
  });
});

describe("a Postgres ledger whose schema another process holds", () => {
  /** kysely's migration lock on Postgres (a session advisory lock; kysely's PostgresAdapter). */
  const MIGRATION_LOCK = "3853314791062309107";
  /** A new database whose migration lock another session holds. */
  async function migrationLockHeld() {
    const { default: pg } = await import("pg");
    const url = await freshDatabase("postgres");
    const holder = new pg.Client({ connectionString: url });
    await holder.connect();
    await holder.query(`select pg_advisory_lock(${MIGRATION_LOCK})`);
    return { url, holder };
  }

  it("a migration waiting on another's lock past the client's read timeout opens once it is free", async () => {
    const { url, holder } = await migrationLockHeld();
    let release: NodeJS.Timeout | undefined;
    try {
      // Before: "Client has encountered a connection error and is not queryable", after 5.5 s.
      const opening = openLedger(url, { statementTimeoutMs: 500 });
      let ended = false; // the open ended early (failed: the lock is held): its error is awaited below
      opening.then(
        () => (ended = true),
        () => (ended = true),
      );
      // Held well past statementTimeoutMs + 5 s, the client's read timeout on the ledger's pool,
      // from when the open is seen waiting for the lock, however long it took to get there.
      const db = new URL(url).pathname.slice(1);
      const deadline = Date.now() + scaled(30_000);
      const waiting = async () =>
        (
          await holder.query(
            "select 1 from pg_stat_activity where datname = $1 and pid <> pg_backend_pid() and query like '%pg_advisory_lock%'",
            [db],
          )
        ).rowCount;
      while (!ended && !(await waiting())) {
        if (Date.now() > deadline) throw new Error("the open never waited for the migration lock");
        await new Promise((r) => setTimeout(r, 20));
      }
      release = setTimeout(() => void holder.query(`select pg_advisory_unlock(${MIGRATION_LOCK})`), 7_500);
      const ledger = await opening;
      expect(await ledger.admin.pendingMigrations()).toEqual([]);
      await ledger.close();
    } finally {
      clearTimeout(release);
      await holder.end();
    }
  });

  it("a migration whose connection is cut fails typed and unreachable (worth waiting for), not with pg's error", async () => {
    const { url, holder } = await migrationLockHeld();
    try {
      const opening = refusal(openLedger(url));
      // The migrating session waits for the lock: cut it, as a restart would.
      const db = new URL(url).pathname.slice(1);
      const deadline = Date.now() + 20_000;
      let cut = 0;
      while (cut === 0 && Date.now() < deadline) {
        const { rowCount } = await holder.query(
          "select pg_terminate_backend(pid) from pg_stat_activity where datname = $1 and pid <> pg_backend_pid() and query like '%pg_advisory_lock%'",
          [db],
        );
        cut = rowCount ?? 0;
        if (cut === 0) await new Promise((r) => setTimeout(r, 20));
      }
      const { error } = await opening;
      expect(error).toBeInstanceOf(LedgerConfigError);
      expect(error).toMatchObject({ unreachable: true });
    } finally {
      await holder.end();
    }
  });

  it("an upgrade's migration queued behind a long reader lets the running workers through, and opens once the reader is done", async () => {
    const { default: pg } = await import("pg");
    const url = await freshDatabase("postgres");
    // The ledger as the previous release left it: every migration but 0007 (an ALTER TABLE).
    const pool = new pg.Pool({ connectionString: url, max: 1 });
    const old = new Kysely<unknown>({ dialect: new PostgresDialect({ pool }) });
    try {
      const migrator = new Migrator({
        db: old,
        provider: migrationProvider("postgres"),
        migrationTableName: "idem_migration",
        migrationLockTableName: "idem_migration_lock",
      });
      expect((await migrator.migrateTo("0006-operator-indexes")).error).toBeUndefined();
    } finally {
      await old.destroy();
    }
    const fast = { connectTimeoutMs: 1_000, statementTimeoutMs: 2_000, lockTimeoutMs: 1_000, poolSize: 2 };
    const worker = await openLedger(url, { ...fast, migrate: false }); // a process of the previous release, working
    // This release's code stands in for the previous one's: a read of the table that names no
    // column the later migrations add (an operation's row has them since 0009).
    const ask = () =>
      worker.admin.stats({ tenant: "t" }).then(
        () => "read",
        (e: Error) => e.name,
      );
    // A report (pg_dump, a session idle in a transaction) that read the table: it holds its share lock.
    const reader = new pg.Client({ connectionString: url });
    reader.on("error", () => {});
    await reader.connect();
    let opening: Promise<unknown> | undefined;
    try {
      await reader.query("begin");
      await reader.query("select count(*) from idem_operations");
      opening = openLedger(url, fast).then(
        (l) => l,
        (e: unknown) => e,
      ); // the new release migrates on open
      const deadline = Date.now() + 30_000;
      for (;;) {
        const { rows } = await reader.query<{ n: number }>(
          "select count(*)::int as n from pg_locks l join pg_class c on c.oid = l.relation where c.relname = 'idem_operations' and not l.granted",
        );
        if (rows[0]!.n >= 1) break; // its ALTER TABLE waits for the lock
        if (Date.now() > deadline) throw new Error("the migration never waited on the table");
        await new Promise((r) => setTimeout(r, 20));
      }
      // Before: the ALTER waited without limit, every statement queued behind it, and the worker's
      // failed its lock timeout (LedgerUnavailableError) for as long as the reader read.
      for (let i = 0; i < 5; i++) expect(await ask()).toBe("read");
      await reader.query("commit");
      const opened = await opening;
      expect(opened).not.toBeInstanceOf(Error);
      const ledger = opened as Awaited<ReturnType<typeof openLedger>>;
      expect(await ledger.admin.pendingMigrations()).toEqual([]);
      await ledger.close();
    } finally {
      await reader.query("rollback").catch(() => {});
      await reader.end().catch(() => {});
      await opening;
      await worker.close();
    }
  });

  it("a schema that cannot be read now (its table locked) is an error that may pass, not every migration pending", async () => {
    const { default: pg } = await import("pg");
    const url = await freshDatabase("postgres");
    const ledger = await openLedger(url, { lockTimeoutMs: 300 });
    const holder = new pg.Client({ connectionString: url });
    await holder.connect();
    try {
      await holder.query("begin");
      await holder.query("lock table idem_migration in access exclusive mode");
      // Before: resolved with all six migrations, and the CLI said "run idem migrate first" (exit 2).
      const error = await ledger.admin.pendingMigrations().catch((e: unknown) => e);
      expect(error).toBeInstanceOf(LedgerConfigError);
      expect(error).toMatchObject({ unreachable: true });
      await holder.query("rollback");
      expect(await ledger.admin.pendingMigrations()).toEqual([]);
    } finally {
      await holder.end();
      await ledger.close();
    }
  });
});

/**
 * Real read-only and full filesystems (small tmpfs mounts): a failed open must leave the mount
 * free, i.e. `umount` succeeds. Mounting needs root; elsewhere these tests are skipped, saying why.
 */
const mountable = (() => {
  if (process.getuid?.() !== 0) return "mounting a tmpfs needs root";
  const probe = mkdtempSync(join(tmpdir(), "idem-mount-probe-"));
  try {
    execFileSync("mount", ["-t", "tmpfs", "-o", "size=64k", "tmpfs", probe], { stdio: "pipe" });
    execFileSync("umount", [probe], { stdio: "pipe" });
    return "";
  } catch (e) {
    return `cannot mount a tmpfs here: ${(e as Error).message.split("\n")[0]}`;
  } finally {
    rmSync(probe, { recursive: true, force: true });
  }
})();
if (mountable) console.warn(`skipping the read-only and full filesystem tests: ${mountable}`);

describe.skipIf(mountable !== "")("a SQLite ledger on a read-only or full filesystem", () => {
  const mounts: string[] = [];
  afterEach(() => {
    for (const m of mounts.splice(0)) {
      try {
        execFileSync("umount", ["-l", m], { stdio: "pipe" });
      } catch {
        /* already unmounted by the test */
      }
      rmSync(m, { recursive: true, force: true });
    }
  });
  function mount(size: string): string {
    const dir = mkdtempSync(join(tmpdir(), "idem-mount-"));
    execFileSync("mount", ["-t", "tmpfs", "-o", `size=${size}`, "tmpfs", dir]);
    mounts.push(dir);
    return dir;
  }
  /** Unmounting fails (EBUSY) while any descriptor on the mount is open. */
  const unmount = (dir: string) => execFileSync("umount", [dir], { stdio: "pipe" });

  it("read-only: refused with LedgerConfigError, and the mount is free", async () => {
    const dir = mount("1m");
    const path = join(dir, "ledger.db");
    await (await openLedger(`sqlite:${path}`)).close();
    execFileSync("mount", ["-o", "remount,ro", dir]);
    for (let i = 0; i < 3; i++) {
      const { error } = await refusal(openLedger(`sqlite:${path}`));
      expect(error).toBeInstanceOf(LedgerConfigError);
    }
    expect(fdsOn(dir)).toEqual([]);
    expect(() => unmount(dir)).not.toThrow();
  });

  it("read-only while another process holds the ledger open (its -wal and -shm there): refused at open too", async () => {
    const dir = mount("1m");
    const path = join(dir, "ledger.db");
    const writer = await openLedger(`sqlite:${path}`);
    const ro = mkdtempSync(join(tmpdir(), "idem-ro-view-"));
    try {
      expect((await writer.run(noop, { tenant: "t", key: ["a"], args: {} })).status).toBe("succeeded");
      execFileSync("mount", ["--bind", dir, ro]);
      mounts.push(ro);
      execFileSync("mount", ["-o", "remount,bind,ro", ro]);
      // Before: SQLite fell back to read-only, the WAL switch passed (the writer's files exist),
      // the open succeeded and every write failed as "unavailable" (a config error read as an outage).
      const { error } = await refusal(openLedger(`sqlite:${join(ro, "ledger.db")}`));
      expect(error).toBeInstanceOf(LedgerConfigError);
      expect((error as Error).message).toMatch(/EROFS/);
    } finally {
      await writer.close();
    }
  });

  it("full: refused with LedgerConfigError, and the mount is free", async () => {
    const dir = mount("256k");
    try {
      execFileSync("dd", ["if=/dev/zero", `of=${join(dir, "filler")}`, "bs=4k"], { stdio: "pipe" });
    } catch {
      /* dd stops with ENOSPC: the disk is full, as wanted */
    }
    for (let i = 0; i < 3; i++) {
      const { error } = await refusal(openLedger(`sqlite:${join(dir, "ledger.db")}`));
      expect(error).toBeInstanceOf(LedgerConfigError);
    }
    expect(fdsOn(dir)).toEqual([]);
    expect(() => unmount(dir)).not.toThrow();
  });

  it("full at a first open: leaves no empty file that an open with create: false would take for a ledger", async () => {
    const dir = mount("256k");
    try {
      execFileSync("dd", ["if=/dev/zero", `of=${join(dir, "filler")}`, "bs=4k"], { stdio: "pipe" });
    } catch {
      /* dd stops with ENOSPC: the disk is full, as wanted */
    }
    const path = join(dir, "ledger.db");
    expect((await refusal(openLedger(`sqlite:${path}`))).error).toBeInstanceOf(LedgerConfigError);
    // Before: better-sqlite3 had made a 0-byte ledger.db, and it stayed.
    expect(readdirSync(dir)).toEqual(["filler"]);
    rmSync(join(dir, "filler"));
    // An operator's command on that path (or a typo's): nothing was ever made there.
    const { error } = await refusal(openLedger(`sqlite:${path}`, { create: false, migrate: false }));
    expect(error).toBeInstanceOf(LedgerConfigError);
    expect((error as Error).message).toMatch(/no SQLite ledger at/);
  });

  it.each([
    [8 * 1024, "its first read (the log's index)", /^cannot open SQLite ledger at .*: disk I\/O error/],
    [64 * 1024, "its migrations", /^ledger migration failed: database or disk is full/],
  ])(
    "full after a first open wrote the file's header (%i bytes free: %s): create: false says there is no ledger, and makes none",
    async (free, _stage, why) => {
      const dir = mount("256k");
      // Space for the file's header and little else: a reserve made first, freed once the rest is full.
      writeFileSync(join(dir, "reserve"), Buffer.alloc(free));
      try {
        execFileSync("dd", ["if=/dev/zero", `of=${join(dir, "filler")}`, "bs=4k"], { stdio: "pipe" });
      } catch {
        /* dd stops with ENOSPC: the disk is full, as wanted */
      }
      rmSync(join(dir, "reserve"));
      const path = join(dir, "ledger.db");
      const failed = (await refusal(openLedger(`sqlite:${path}`))).error;
      expect(failed).toBeInstanceOf(LedgerConfigError);
      expect((failed as Error).message).toMatch(why);
      rmSync(join(dir, "filler"));
      // An operator's command on that path: no ledger was ever made there, none must be now.
      for (const migrate of [false, true]) {
        // Before: opened (a header, no table): `idem` said the ledger "needs migrations", and
        // with migrate: true the open made a ledger where create: false refuses to.
        const { error } = await refusal(openLedger(`sqlite:${path}`, { create: false, migrate }));
        expect(error, `first open: ${(failed as Error).message}`).toBeInstanceOf(LedgerConfigError);
        expect((error as Error).message).toMatch(/no SQLite ledger at/);
      }
      // The path still takes a ledger when one is asked for.
      const ledger = await openLedger(`sqlite:${path}`);
      expect((await ledger.run(noop, { tenant: "t", key: ["a"], args: {} })).status).toBe("succeeded");
      await ledger.close();
      expect(fdsOn(dir)).toEqual([]);
    },
  );

  it("full, with a ledger on it: refused as unreachable (a daemon waits for space), not as a wrong config", async () => {
    const dir = mount("2m");
    const path = join(dir, "ledger.db");
    await (await openLedger(`sqlite:${path}`)).close();
    try {
      execFileSync("dd", ["if=/dev/zero", `of=${join(dir, "filler")}`, "bs=4k"], { stdio: "pipe" });
    } catch {
      /* dd stops with ENOSPC: the disk is full, as wanted */
    }
    const { error } = await refusal(openLedger(`sqlite:${path}`));
    expect(error).toBeInstanceOf(LedgerConfigError);
    // Before: unreachable false, and `idem daemon` exited 2.
    expect(error).toMatchObject({ unreachable: true });
    expect(fdsOn(dir)).toEqual([]);
  });
});
