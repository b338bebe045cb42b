/**
 * Helpers for the daemon and CLI suites: a webhook receiver, polling, a daemon's completed ticks,
 * the CLI as a child process.
 */
import { createServer, type Server } from "node:http";
import { spawn } from "node:child_process";
import { createRequire } from "node:module";
import { fileURLToPath, pathToFileURL } from "node:url";
import type { AddressInfo } from "node:net";
import { Writable } from "node:stream";
import { pino, type Logger } from "pino";
import { scaled } from "@idem/testkit";

export const CLI = fileURLToPath(new URL("../src/bin.ts", import.meta.url));
export const CONFIG = fileURLToPath(new URL("./fixtures/daemon.config.ts", import.meta.url));
export const WORKER = fileURLToPath(new URL("./fixtures/worker.ts", import.meta.url));
/** tsx's loader by its path: `--import tsx` is resolved from the child's working directory, which may be a temp dir. */
const TSX = pathToFileURL(createRequire(import.meta.url).resolve("tsx")).href;

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
