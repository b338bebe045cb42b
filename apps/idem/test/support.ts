/**
 * Helpers for the daemon and CLI suites: a webhook receiver, a small SMTP server, polling, a daemon's completed ticks,
 * the CLI as a child process, a daemon alerting through a captured log.
 */
import { createServer, type Server } from "node:http";
import { spawn } from "node:child_process";
import { createRequire } from "node:module";
import { fileURLToPath, pathToFileURL } from "node:url";
import { createServer as createTcpServer, type AddressInfo, type Socket } from "node:net";
import { Writable } from "node:stream";
import { onTestFinished } from "vitest";
import { pino, type Logger } from "pino";
import { defineAction, openLedger, type Action, type Ledger } from "@idem/core";
import { openTestLedger, type TestLedgerOptions } from "@idem/core/testing";
import type { Daemon } from "@idem/cli";
import { freshDatabase, pgProxy, scaled, type TestDialect } from "@idem/testkit";

export const CLI = fileURLToPath(new URL("../src/bin.ts", import.meta.url));
export const CONFIG = fileURLToPath(new URL("./fixtures/daemon.config.ts", import.meta.url));
export const WORKER = fileURLToPath(new URL("./fixtures/worker.ts", import.meta.url));
/** tsx's loader by its path: `--import tsx` is resolved from the child's working directory, which may be a temp dir. */
const TSX = pathToFileURL(createRequire(import.meta.url).resolve("tsx")).href;

/** better-sqlite3 (the CLI's SQLite driver): a second connection to hold a ledger's locks. */
export const Database = createRequire(import.meta.url)("better-sqlite3") as new (
  path: string,
  options: { timeout: number },
) => { exec(sql: string): void; close(): void };

/**
 * A migrated ledger that no one can open until `release()`: SQLite's file locked by another
 * connection (exclusive locking mode, a write begun: a reader waits too), Postgres behind a proxy
 * that forwards nothing (the connect waits). Either open fails on its own after 10 s.
 */
export async function unopenable(dialect: TestDialect): Promise<{ url: string; release: () => Promise<void> }> {
  const url = await freshDatabase(dialect);
  await (await openLedger(url)).close(); // migrated: only idem migrate (and daemon --migrate) migrates
  if (dialect === "sqlite") {
    const other = new Database(url.slice("sqlite:".length), { timeout: 0 });
    other.exec("PRAGMA locking_mode = EXCLUSIVE; BEGIN IMMEDIATE; CREATE TABLE held (x)");
    return {
      url,
      release: async () => {
        other.exec("ROLLBACK");
        other.close();
      },
    };
  }
  const proxy = await pgProxy(new URL(url), () => {});
  return {
    url: proxy.url,
    release: async () => {
      proxy.down();
      await proxy.close();
    },
  };
}

/** A logger that keeps every line it writes, parsed (`Line`: the fields a test reads of them). */
export function capturedLog<Line = { level: number; msg: string }>(): { log: Logger; lines: Line[] } {
  const lines: Line[] = [];
  const log = pino(
    { level: "info" },
    new Writable({
      write(chunk, _encoding, done) {
        for (const line of String(chunk).split("\n").filter(Boolean)) lines.push(JSON.parse(line) as Line);
        done();
      },
    }),
  );
  return { log, lines };
}

/** An action whose answer is always lost and that nothing can look up: each run of it ends in review, alerted. */
export const lostAnswer = defineAction<{ note: string }, { id: string }>({
  type: "review.neither",
  capabilities: {},
  execute: async () => {
    throw new Error("socket hang up");
  },
});

/** A log-sink alert line: the fields the daemon's alert tests read of it. */
export interface AlertLine {
  readonly msg: string;
  readonly alert?: { readonly kind: string; readonly operationId: string; readonly status: string };
}

/**
 * The setup of the daemon's alert tests: a ledger on a fresh `dialect` database with `actions` and
 * the alert actions of a config that alerts through the log sink only, that log captured, a tenant
 * of the test's own, and a daemon named `name` over the ledger that the test ticks itself
 * (`daemon.tick()`). `said(id)`: the alerts said so far about one operation. `heldClock`: the
 * ledger's clock is the test's, moved by `advance(ms)`, with 30 s leases; else it is the
 * database's. The other options are the ledger's (a budget, a result size). The ledger is closed
 * when the test ends.
 */
export async function alertingDaemon(
  dialect: TestDialect,
  name: string,
  actions: readonly Action<any, any>[],
  options: Omit<TestLedgerOptions, "actions" | "clock" | "leaseMs" | "poolSize"> & { heldClock?: boolean } = {},
): Promise<{
  ledger: Ledger;
  daemon: Daemon;
  tenant: string;
  lines: AlertLine[];
  said(operationId: string): AlertLine[];
  advance(ms: number): void;
}> {
  // Imported here, not above: most files that use these helpers spawn the CLI and never load it.
  const { Daemon, DaemonMetrics, alertActions, parseConfig } = await import("@idem/cli");
  const { heldClock, ...ledgerOptions } = options;
  const url = await freshDatabase(dialect);
  const { log, lines } = capturedLog<AlertLine>();
  const config = parseConfig({ ledger: url, alerts: { log: true }, daemon: { intervalMs: 50 } });
  let now = Date.now();
  const ledger = await openTestLedger(url, {
    poolSize: 2,
    ...(heldClock && { clock: () => now, leaseMs: 30_000 }),
    ...ledgerOptions,
    actions: [...alertActions(config, log), ...actions],
  });
  onTestFinished(() => ledger.close().catch(() => {}));
  return {
    ledger,
    daemon: new Daemon(ledger, config, log, new DaemonMetrics(ledger, 1_000), name),
    tenant: `${name}-${Math.random().toString(36).slice(2, 8)}`,
    lines,
    said: (operationId) => lines.filter((l) => l.alert?.operationId === operationId),
    advance: (ms) => {
      if (!heldClock) throw new Error("advance: this ledger runs on the database's clock (heldClock: true)");
      now += ms;
    },
  };
}

/** A promise held until `open()`: a provider's request that is out until the test lets it land. */
export function gate(): { readonly passed: Promise<void>; open(): void } {
  let open: () => void = () => {};
  const passed = new Promise<void>((r) => (open = r));
  return { passed, open: () => open() };
}

/** A local webhook receiver that keeps every alert it is sent. */
export async function webhookReceiver(): Promise<{
  url: string;
  alerts: Record<string, unknown>[];
  close(): Promise<void>;
}> {
  const alerts: Record<string, unknown>[] = [];
  const server: Server = createServer((req, res) => {
    let body = "";
    req.on("data", (c) => (body += c));
    req.on("end", () => {
      alerts.push(JSON.parse(body) as Record<string, unknown>);
      res.writeHead(200).end("ok");
    });
  });
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}/hook`,
    alerts,
    close: () => new Promise((r) => server.close(() => r())),
  };
}

/** Polls `check` until it returns true; `baseMs` is for a quiet 4-core machine, scaled to this one. */
export async function until(
  check: () => boolean | Promise<boolean>,
  baseMs = 30_000,
  what = "condition",
): Promise<void> {
  const timeoutMs = scaled(baseMs);
  const deadline = Date.now() + timeoutMs;
  while (!(await check())) {
    if (Date.now() > deadline) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

/** Ticks the daemon serving /metrics on `port` has completed (`idem_daemon_ticks_total`); undefined while it does not answer. */
async function ticksOf(port: number): Promise<number | undefined> {
  const res = await fetch(`http://127.0.0.1:${port}/metrics`).catch(() => undefined);
  const text = res?.ok ? await res.text() : "";
  const m = /^idem_daemon_ticks_total (\d+)$/m.exec(text);
  return m ? Number(m[1]) : undefined;
}

/**
 * Resolves once the daemon serving /metrics on `port` has completed `n` more ticks than when
 * called: the first may have begun before the call, the rest began after it, so whatever those
 * ticks would do again (a second alert) they have had the chance to do, however loaded the
 * machine. What "no second alert" waits for, rather than a fixed time.
 */
export async function moreTicks(port: number, n = 3, baseMs = 60_000): Promise<void> {
  let from: number | undefined;
  await until(
    async () => {
      from = await ticksOf(port);
      return from !== undefined;
    },
    baseMs,
    `the daemon's /metrics on ${port}`,
  );
  const after = from! + n;
  await until(async () => ((await ticksOf(port)) ?? 0) >= after, baseMs, `${n} more ticks of the daemon on ${port}`);
}

/**
 * Runs `idem …` to completion. `noInput`: its stdin is at its end from the start (`idem mcp`
 * serves until then, so it ends too). `cwd`: its working directory (where a default config or
 * ledger would be looked for), else this process's.
 */
export function idem(
  args: string[],
  env: Record<string, string> = {},
  options: { noInput?: boolean; cwd?: string } = {},
): Promise<{ code: number | null; stdout: string; stderr: string }> {
  return new Promise((resolve) => {
    const p = spawn(process.execPath, ["--conditions=idem-source", "--import", TSX, CLI, ...args], {
      env: { ...process.env, ...env },
      ...(options.cwd !== undefined && { cwd: options.cwd }),
    });
    if (options.noInput) p.stdin.end();
    let stdout = "";
    let stderr = "";
    p.stdout.on("data", (d) => (stdout += d));
    p.stderr.on("data", (d) => (stderr += d));
    p.on("exit", (code) => resolve({ code, stdout, stderr }));
  });
}

/**
 * Where a test SMTP server refuses (and with what reply), or where it trickles (writes a
 * continuation line every 100 ms, never the last one); `undefined`: it takes the message. At RCPT
 * with `only`: just those addresses are refused (an unknown mailbox), the others taken.
 */
export type Refusal =
  | { at: "greeting" | "MAIL" | "RCPT" | "DATA"; reply: string }
  | { at: "RCPT"; reply: string; only: readonly string[] }
  | { at: "greeting" | "DATA"; trickle: true };

/**
 * A small SMTP server: `refuse()` is asked on each connection; it keeps each message it took
 * (`taken`), and the recipients it accepted for it (`takenFor`, in the same order).
 * `port`: where it listens (a sink's server coming back where it was down), else any free one.
 */
export async function smtpServer(refuse: () => Refusal | undefined = () => undefined, port = 0) {
  const taken: string[] = [];
  const takenFor: string[][] = [];
  let connections = 0;
  const sockets = new Set<Socket>();
  const server = createTcpServer((socket) => {
    connections += 1;
    sockets.add(socket);
    socket.on("close", () => sockets.delete(socket));
    socket.on("error", () => {});
    const r = refuse();
    const trickle = (code: number) => {
      const timer = setInterval(() => socket.write(`${code}-still working\r\n`), 100);
      socket.on("close", () => clearInterval(timer));
    };
    const reply = r && "reply" in r ? r.reply : undefined;
    if (r?.at === "greeting" && reply === undefined) return trickle(220);
    if (r?.at === "greeting") return void socket.end(`${reply}\r\n`);
    socket.write("220 test ESMTP\r\n");
    let buffered = "";
    let inData = false;
    let message = "";
    let to: string[] = [];
    socket.on("data", (d) => {
      buffered += d.toString();
      for (let i = buffered.indexOf("\r\n"); i >= 0; i = buffered.indexOf("\r\n")) {
        const line = buffered.slice(0, i);
        buffered = buffered.slice(i + 2);
        if (inData) {
          if (line !== ".") {
            message += `${line}\n`;
            continue;
          }
          inData = false;
          if (r?.at === "DATA" && reply === undefined) trickle(250);
          else if (r?.at === "DATA") socket.write(`${reply}\r\n`);
          else {
            taken.push(message);
            takenFor.push(to);
            socket.write("250 OK queued\r\n");
          }
          continue;
        }
        const command = line.slice(0, 4).toUpperCase();
        if (command === "EHLO" || command === "HELO") socket.write("250-test\r\n250 8BITMIME\r\n");
        else if (command === "MAIL") {
          to = [];
          socket.write(r?.at === "MAIL" ? `${r.reply}\r\n` : "250 OK\r\n");
        } else if (command === "RCPT") {
          const address = /<([^>]*)>/.exec(line)?.[1] ?? "";
          if (r?.at === "RCPT" && (!("only" in r) || r.only.includes(address))) socket.write(`${r.reply}\r\n`);
          else {
            to.push(address);
            socket.write("250 OK\r\n");
          }
        } else if (command === "DATA") {
          inData = true;
          message = "";
          socket.write("354 go ahead\r\n");
        } else if (command === "QUIT") socket.end("221 bye\r\n");
        else socket.write("250 OK\r\n");
      }
    });
  });
  await new Promise<void>((r) => server.listen(port, "127.0.0.1", r));
  return {
    port: (server.address() as AddressInfo).port,
    taken,
    takenFor,
    connections: () => connections,
    close: () =>
      new Promise<void>((r) => {
        for (const s of sockets) s.destroy();
        server.close(() => r());
      }),
  };
}

/**
 * A child's `NODE_OPTIONS` flag: a module resolve hook that finds no `nodemailer` while the file
 * `missing` exists, as when it is not installed (the package itself, and our code, as they are).
 */
export function withoutNodemailerWhile(missing: string): string {
  const hooks = `import { existsSync } from "node:fs";
export async function resolve(specifier, context, next) {
  if (specifier === "nodemailer" && existsSync(${JSON.stringify(missing)}))
    throw Object.assign(new Error("Cannot find package 'nodemailer' imported from " + context.parentURL), { code: "ERR_MODULE_NOT_FOUND" });
  return next(specifier, context);
}`;
  const register = `import { register } from "node:module"; register(${JSON.stringify(`data:text/javascript,${encodeURIComponent(hooks)}`)});`;
  return `--import=data:text/javascript,${encodeURIComponent(register)}`;
}
