/**
 * A Postgres that stops answering, in this process: on a private server the test freezes
 * (SIGSTOP of the postmaster and every backend: connections are accepted by the kernel, nothing
 * answers), restarts, or ends a session. Every call ends in bounded time with a typed error,
 * nothing is sent twice, the process never dies of a socket error (nor of a certificate file
 * missing while the pool replaces a connection), and the ledger works again once the server is back.
 */
import { execFileSync } from "node:child_process";
import { chmodSync, chownSync, copyFileSync, existsSync, mkdtempSync, renameSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import {
  CompletionNotRecordedError,
  LedgerConfigError,
  LedgerUnavailableError,
  openLedger,
  type Ledger,
  type LedgerOptions,
} from "@idem/core";
import { databaseOf } from "@idem/core/testing";
import { fileURLToPath } from "node:url";
import { sql } from "kysely";
import pg from "pg";
import { scaled, startChild, startPgServer, type PgServer } from "@idem/testkit";
import { endsConnection } from "../src/open.js";
import { uniqueTenant } from "./support/ledgers.js";
import { TestProvider } from "./support/provider.js";

/** Short timeouts so a frozen server costs seconds: the client gives up 5 s after the statement timeout. */
const FAST: LedgerOptions = { connectTimeoutMs: 1_000, statementTimeoutMs: 1_000, lockTimeoutMs: 1_000, poolSize: 4 };
/** kysely's migration lock on Postgres (a session advisory lock). */
const MIGRATION_LOCK = "3853314791062309107";
const BOUND_MS = 20_000; // read timeout (6 s) + connect timeout + scheduling on a loaded machine

async function timed<T>(p: Promise<T>): Promise<{ value?: T; error?: unknown; ms: number }> {
  const t0 = performance.now();
  try {
    return { value: await p, ms: performance.now() - t0 };
  } catch (error) {
    return { error, ms: performance.now() - t0 };
  }
}

async function until(check: () => Promise<boolean>, timeoutMs: number, what: string): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!(await check())) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

describe("a Postgres that freezes or restarts under the ledger", () => {
  let server: PgServer;
  let url = "";
  const opened: Ledger[] = [];
  const open = async (options: LedgerOptions = {}) => {
    const l = await openLedger(url, { ...FAST, ...options });
    opened.push(l);
    return l;
  };

  beforeAll(async () => {
    server = await startPgServer();
    url = await server.database();
  }, scaled(180_000));
  afterAll(async () => {
    await server?.thaw().catch(() => {});
    for (const l of opened) await l.close().catch(() => {});
    await server?.close();
  }, scaled(120_000));

  it("a frozen server at open: LedgerConfigError within the connect timeout", async () => {
    await (await open()).close(); // migrated before the freeze
    await server.freeze();
    try {
      const { error, ms } = await timed(openLedger(url, { ...FAST, migrate: false }));
      expect(error).toBeInstanceOf(LedgerConfigError);
      expect((error as Error).message).toMatch(/no answer within 1000 ms/);
      expect(ms).toBeLessThan(BOUND_MS);
    } finally {
      await server.thaw();
    }
  });

  it(
    "a server frozen between calls: each call, and a crowd of them, fails typed and bounded; nothing sent; works after the thaw",
    async () => {
      const provider = new TestProvider();
      const mail = provider.action("mail", { lookup: true });
      const ledger = await open({ actions: [mail], leaseMs: 3_000 });
      const tenant = uniqueTenant();
      expect((await ledger.run(mail, { tenant, key: ["warm"], args: { to: "a" } })).status).toBe("succeeded");

      await server.freeze();
      let calls: Awaited<ReturnType<typeof timed>>[];
      try {
        // More calls than the pool has clients: the waiting ones give up after the connect timeout.
        calls = await Promise.all(
          Array.from({ length: 10 }, (_, i) =>
            timed(ledger.run(mail, { tenant, key: [`frozen-${i}`], args: { to: "a" } })),
          ),
        );
        const listed = await timed(ledger.admin.list({ tenant }));
        expect(listed.error).toBeInstanceOf(LedgerUnavailableError);
      } finally {
        await server.thaw();
      }
      for (const c of calls) {
        expect(c.error, String(c.value && JSON.stringify(c.value))).toBeInstanceOf(LedgerUnavailableError);
        expect(c.ms).toBeLessThan(BOUND_MS);
      }
      expect(provider.effects.map((e) => e.key)).toHaveLength(1); // only the warm-up

      // The same keys again after the thaw: each performed exactly once. A claim the frozen backend
      // ran after the thaw is a running row whose caller had given up: it is taken over once its
      // lease ends (waitMs covers it), not executed a second time alongside.
      for (let i = 0; i < 10; i++) {
        const out = await ledger.run(mail, { tenant, key: [`frozen-${i}`], args: { to: "a" }, waitMs: 30_000 });
        expect(out.status).toBe("succeeded");
      }
      expect(provider.effects).toHaveLength(11);
      expect(new Set(provider.effects.map((e) => e.key)).size).toBe(11);
    },
    scaled(120_000),
  );

  it(
    "a server frozen while the effect runs: the completion fails typed with the receipt; the row is settled once by lookup after the thaw",
    async () => {
      const provider = new TestProvider();
      const mail = provider.action("mail", { lookup: true });
      const ledger = await open({ actions: [mail], leaseMs: 4_000 });
      const tenant = uniqueTenant();
      let release!: () => void;
      provider.gate = new Promise<void>((r) => (release = r));
      const call = timed(ledger.run(mail, { tenant, key: ["mid"], args: { to: "a" } }));
      await provider.called(1);
      await server.freeze();
      release(); // the effect happens now; recording it cannot
      const { error, ms } = await call;
      await server.thaw();
      expect(error).toBeInstanceOf(CompletionNotRecordedError);
      expect((error as CompletionNotRecordedError).receipt).toEqual({ id: provider.effects[0]!.id });
      expect(ms).toBeLessThan(BOUND_MS + 4_000);
      expect(provider.effects).toHaveLength(1);

      // The row stays running until its lease ends; then settling finds the effect instead of redoing it.
      const [row] = await ledger.admin.list({ tenant });
      await until(
        async () => {
          const out = await ledger.daemon.settle({ tenant, id: row!.id, actor: "test" });
          return out.status === "succeeded";
        },
        30_000,
        "the row to be settled by lookup",
      );
      expect(provider.effects).toHaveLength(1);
      const { operation, events } = await ledger.get({ tenant, id: row!.id });
      expect(operation.result).toEqual({ id: provider.effects[0]!.id });
      expect(events.map((e) => e.to)).toContain("succeeded");
    },
    scaled(120_000),
  );

  it(
    "an immediate restart while calls hold connections: the process survives, calls fail typed, then work",
    async () => {
      const provider = new TestProvider();
      const mail = provider.action("mail", { lookup: true });
      const ledger = await open({ actions: [mail], leaseMs: 4_000 });
      const tenant = uniqueTenant();
      let release!: () => void;
      provider.gate = new Promise<void>((r) => (release = r));
      // Checked-out clients at the moment the server goes: their socket errors must not be uncaught.
      const held = Array.from({ length: 3 }, (_, i) =>
        timed(ledger.run(mail, { tenant, key: [`held-${i}`], args: { to: "a" } })),
      );
      await provider.called(3);
      const busy = timed(
        databaseOf(ledger)
          .selectFrom("idem_operations")
          .select((eb) => eb.fn<number>("pg_sleep", [eb.val(3)]).as("s"))
          .limit(1)
          .execute(),
      );
      await server.restart("immediate");
      release();
      const results = await Promise.all(held);
      expect((await busy).error).toBeDefined();
      // Each held call either recorded its effect (the pool reconnected) or says it could not.
      for (const r of results) {
        if (r.error) expect(r.error).toBeInstanceOf(CompletionNotRecordedError);
        else expect((r.value as { status: string }).status).toBe("succeeded");
      }
      expect(provider.effects).toHaveLength(3);
      const after = await ledger.run(mail, { tenant, key: ["after"], args: { to: "a" } });
      expect(after.status).toBe("succeeded");
    },
    scaled(120_000),
  );

  const CLOSER = fileURLToPath(new URL("./children/closer.ts", import.meta.url));
  /** A process that closed its ledger (with the server frozen meanwhile or not): its exit code, or "still running". */
  async function closedProcessExits(frozen: boolean) {
    const child = startChild(CLOSER, [], { LEDGER_URL: url });
    await child.waitFor(/^ready$/, 60_000);
    if (frozen) await server.freeze();
    try {
      child.send("close");
      await child.waitFor(/^closed/);
      let timer: NodeJS.Timeout | undefined;
      const late = new Promise<"still running">((r) => (timer = setTimeout(() => r("still running"), 15_000)));
      const exit = await Promise.race([child.exited.then((e) => e.code), late]);
      clearTimeout(timer);
      return { exit, lines: child.lines.join(" | ") };
    } finally {
      if (frozen) await server.thaw();
    }
  }

  it(
    "a process that closed its ledger exits on its own, also when the server froze before the close",
    async () => {
      expect(await closedProcessExits(false)).toMatchObject({ exit: 0 });
      // Before: close() returned, and the pg socket (half-closed, waiting for a frozen server's
      // goodbye) held the process for ever (idem daemon on SIGTERM, every CLI command).
      const { exit, lines } = await closedProcessExits(true);
      expect(exit, lines).toBe(0);
    },
    scaled(120_000),
  );

  it(
    "one connection whose backend stops answering: a call queued behind it gets a new connection, not the dead one",
    async () => {
      const ledger = await open({ connectTimeoutMs: 15_000, poolSize: 1 });
      const { rows } = await sql<{ pid: number }>`select pg_backend_pid() as pid`.execute(databaseOf(ledger));
      const stopped = rows[0]!.pid;
      process.kill(stopped, "SIGSTOP"); // this one backend hangs; the server itself answers
      try {
        const first = timed(ledger.status({ tenant: "t", id: "op_a" })); // on the hung backend
        const second = timed(ledger.status({ tenant: "t", id: "op_b" })); // queued for the pool's one client
        const [a, b] = await Promise.all([first, second]);
        expect(a.error).toBeInstanceOf(LedgerUnavailableError); // the client's read timeout
        // Before: LedgerUnavailableError "Connection terminated unexpectedly": the pool handed it the dead one.
        expect((b.error as Error).name).toBe("OperationNotFoundError");
      } finally {
        process.kill(stopped, "SIGCONT");
      }
    },
    scaled(60_000),
  );

  it(
    "one connection that the server ends (pg_terminate_backend): the call on it fails typed, a call queued behind it gets a new connection",
    async () => {
      const slow = { connectTimeoutMs: 15_000, statementTimeoutMs: 15_000, lockTimeoutMs: 15_000 };
      const ledger = await open({ ...slow, poolSize: 1 });
      const admin = new pg.Client({ connectionString: url });
      admin.on("error", () => {});
      await admin.connect();
      try {
        await admin.query("begin");
        await admin.query("lock table idem_operations in access exclusive mode");
        const first = timed(ledger.status({ tenant: "t", id: "op_a" })); // waits on the lock
        const second = timed(ledger.status({ tenant: "t", id: "op_b" })); // queued for the pool's one client
        let waiting: number | undefined;
        await until(
          async () => {
            const { rows } = await admin.query<{ pid: number }>(
              "select pid from pg_stat_activity where datname = current_database() and pid <> pg_backend_pid() and wait_event_type = 'Lock'",
            );
            waiting = rows[0]?.pid;
            return waiting !== undefined;
          },
          scaled(30_000),
          "the call to wait on the lock",
        );
        // An operator, idle_session_timeout, a pooler or a failover tool ends that session; the server stays up.
        await admin.query("select pg_terminate_backend($1)", [waiting]);
        await admin.query("rollback");
        const [a, b] = await Promise.all([first, second]);
        expect(a.error).toBeInstanceOf(LedgerUnavailableError); // FATAL 57P01
        // Before: LedgerUnavailableError "Connection terminated unexpectedly": the pool handed it the
        // ended connection (the FATAL's query gave it back before pg saw the socket close).
        expect((b.error as Error).name).toBe("OperationNotFoundError");
      } finally {
        await admin.end().catch(() => {});
      }
    },
    scaled(60_000),
  );

  it(
    "a migration whose backend stops answering: the open fails typed and unreachable after migrationTimeoutMs, not never",
    async () => {
      const fresh = await server.database(); // not migrated yet
      const holder = new pg.Client({ connectionString: fresh });
      holder.on("error", () => {});
      await holder.connect();
      // kysely's migration lock, held so the migrating backend can be found before it runs.
      await holder.query(`select pg_advisory_lock(${MIGRATION_LOCK})`);
      const opening = timed(openLedger(fresh, { ...FAST, migrationTimeoutMs: 3_000 }));
      const dbName = new URL(fresh).pathname.slice(1);
      let stopped: number | undefined;
      await until(
        async () => {
          const { rows } = await holder.query<{ pid: number }>(
            "select pid from pg_stat_activity where datname = $1 and pid <> pg_backend_pid() and query like '%pg_advisory_lock%'",
            [dbName],
          );
          stopped = rows[0]?.pid;
          return stopped !== undefined;
        },
        scaled(30_000),
        "the migrating backend",
      );
      process.kill(stopped!, "SIGSTOP"); // that one backend hangs; the server answers the rest
      try {
        await holder.query(`select pg_advisory_unlock(${MIGRATION_LOCK})`);
        // Before: still pending after 90 s (no read timeout on the migration's connection).
        const { error, ms } = await opening;
        expect(error).toBeInstanceOf(LedgerConfigError);
        expect(error).toMatchObject({ unreachable: true });
        expect(ms).toBeLessThan(3_000 + BOUND_MS);
      } finally {
        process.kill(stopped!, "SIGCONT");
        await holder.end().catch(() => {});
      }
    },
    scaled(120_000),
  );
});

describe("a Postgres ledger over TLS whose CA file is rotated", () => {
  const ONE_CONNECTION = fileURLToPath(new URL("./children/one-connection.ts", import.meta.url));
  let server: PgServer;
  let url = "";
  let dir = "";

  beforeAll(async () => {
    server = await startPgServer();
    dir = mkdtempSync(join(tmpdir(), "idem-tls-"));
    chmodSync(dir, 0o755); // the server (user postgres) reads its certificate here
    execFileSync(
      "openssl",
      ["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=127.0.0.1"]
        .concat(["-addext", "subjectAltName=IP:127.0.0.1"])
        .concat(["-keyout", join(dir, "server.key"), "-out", join(dir, "server.crt")]),
      { stdio: "pipe" },
    );
    chmodSync(join(dir, "server.key"), 0o600);
    chmodSync(join(dir, "server.crt"), 0o644);
    if (process.getuid?.() === 0) {
      const id = (flag: string) => Number(execFileSync("id", [flag, "postgres"]).toString().trim());
      chownSync(join(dir, "server.key"), id("-u"), id("-g"));
    }
    copyFileSync(join(dir, "server.crt"), join(dir, "ca.pem")); // self-signed: its own CA
    const admin = new pg.Client({ connectionString: server.url });
    await admin.connect();
    try {
      await admin.query(`alter system set ssl_cert_file = '${join(dir, "server.crt")}'`);
      await admin.query(`alter system set ssl_key_file = '${join(dir, "server.key")}'`);
      await admin.query("alter system set ssl = on");
      await admin.query("select pg_reload_conf()");
    } finally {
      await admin.end();
    }
    const db = new URL(await server.database());
    db.searchParams.set("sslmode", "verify-full");
    db.searchParams.set("sslrootcert", join(dir, "ca.pem"));
    url = db.toString();
    await (await openLedger(url)).close(); // migrated, over TLS
  }, scaled(180_000));
  afterAll(async () => {
    await server?.close();
    if (dir) rmSync(dir, { recursive: true, force: true });
  }, scaled(120_000));

  it(
    "a connection dropped while a call waits for it, the CA file away meanwhile: the process survives, the waiting call gets a new connection",
    async () => {
      const child = startChild(ONE_CONNECTION, [], { LEDGER_URL: url, STATEMENT_MS: "1000" });
      let stopped: number | undefined;
      try {
        await child.waitFor(/^ready$/, 60_000);
        child.send("pid");
        stopped = Number((await child.waitFor(/^pid /)).slice("pid ".length));
        process.kill(stopped, "SIGSTOP"); // the ledger's one connection: its backend hangs
        // The CA file is being replaced (a rotation, a remounted secret): not there for now.
        renameSync(join(dir, "ca.pem"), join(dir, "ca.pem.old"));
        // The first read waits on the hung backend until the client's read timeout (1 s + 5 s) drops
        // its connection; the second waits in the pool's queue, and the pool opens a connection for
        // it from that socket's callback. Before: pg read the CA file again there, its ENOENT was
        // an uncaught exception, and the process died.
        child.send("go");
        const line = await Promise.race([
          child.waitFor(/^alive$/, 60_000).then(() => "alive"),
          child.exited.then((e) => `exited ${e.code ?? e.signal}: ${e.stderr.split("\n").slice(0, 8).join(" | ")}`),
        ]);
        expect(line).toBe("alive");
        const ended = child.lines.filter((l) => l.startsWith("ended "));
        expect(ended[0]).toMatch(/^ended LedgerUnavailableError: .*Query read timeout/);
        // The CA read at open verifies the new connection: the server answers (op_b is no operation).
        expect(ended[1]).toMatch(/^ended OperationNotFoundError: /);
      } finally {
        if (stopped !== undefined) process.kill(stopped, "SIGCONT");
        if (existsSync(join(dir, "ca.pem.old"))) renameSync(join(dir, "ca.pem.old"), join(dir, "ca.pem"));
        child.proc.kill("SIGKILL");
        await child.exited;
      }
    },
    scaled(120_000),
  );
});

describe("which errors end a connection (the pool must not hand it on)", () => {
  it("a read timeout, a FATAL in any language, a session's end by SQLSTATE, a closed socket; not a statement's error", () => {
    expect(endsConnection(new Error("Query read timeout"))).toBe(true);
    expect(endsConnection({ message: "terminating connection due to administrator command", severity: "FATAL" })).toBe(
      true,
    );
    // lc_messages translates the severity; the SQLSTATE says it all the same.
    expect(endsConnection({ message: "…", severity: "ВАЖНО", code: "57P01" })).toBe(true);
    expect(endsConnection({ message: "…", code: "57P05" })).toBe(true); // idle_session_timeout
    expect(endsConnection({ message: "…", code: "25P03" })).toBe(true); // idle_in_transaction_session_timeout
    expect(endsConnection({ message: "…", code: "08006" })).toBe(true);
    expect(endsConnection(new Error("Connection terminated unexpectedly"))).toBe(true);
    expect(
      endsConnection({ message: "canceling statement due to statement timeout", severity: "ERROR", code: "57014" }),
    ).toBe(false);
    expect(
      endsConnection({ message: "canceling statement due to lock timeout", severity: "ERROR", code: "55P03" }),
    ).toBe(false);
    expect(endsConnection({ message: "duplicate key value", severity: "ERROR", code: "23505" })).toBe(false);
    expect(endsConnection(undefined)).toBe(false);
  });
});
