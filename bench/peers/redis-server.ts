/**
 * A durable Redis of the benchmark's own: a redis-server child on a free port of 127.0.0.1, with
 * every write fsynced to its append-only file before the reply (`appendfsync always`), no RDB
 * snapshots, its files in a temporary directory. The machine's shared Redis is never touched.
 * The child is killed at teardown, and on process exit as a last resort.
 */
import { type ChildProcess, spawn } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { Teardown } from "./teardown.js";

export interface RedisServer {
  readonly url: string;
  readonly version: string;
}

/** A port nothing listens on right now (the kernel's pick for port 0). */
function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const probe = createServer();
    probe.once("error", reject);
    probe.listen(0, "127.0.0.1", () => {
      const address = probe.address();
      probe.close(() =>
        typeof address === "object" && address ? resolve(address.port) : reject(new Error("no port")),
      );
    });
  });
}

export async function startRedis(teardown: Teardown): Promise<RedisServer> {
  const dir = mkdtempSync(join(tmpdir(), "idem-peers-redis-"));
  const remove = () => rmSync(dir, { recursive: true, force: true });
  teardown.add("removing Redis's directory", remove);
  const port = await freePort();
  const child: ChildProcess = spawn(
    "redis-server",
    [
      "--port",
      String(port),
      "--bind",
      "127.0.0.1",
      "--appendonly",
      "yes",
      "--appendfsync",
      "always",
      "--save",
      "",
      "--dir",
      dir,
      "--daemonize",
      "no",
    ],
    { stdio: ["ignore", "pipe", "pipe"] },
  );
  const killNow = () => {
    if (child.exitCode === null && child.signalCode === null) child.kill("SIGKILL");
  };
  const onExit = () => {
    killNow();
    remove();
  };
  process.on("exit", onExit);
  teardown.add(`stopping redis-server (pid ${child.pid})`, async () => {
    process.off("exit", onExit);
    if (child.exitCode !== null || child.signalCode !== null) return;
    const exited = new Promise((resolve) => child.once("exit", resolve));
    child.kill("SIGTERM");
    const timer = setTimeout(killNow, 5000);
    await exited;
    clearTimeout(timer);
  });
  let output = "";
  const version = await new Promise<string>((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`redis-server not ready after 10 s: ${output}`)), 10_000);
    const onData = (chunk: Buffer) => {
      output += chunk.toString();
      if (output.includes("Ready to accept connections")) {
        clearTimeout(timer);
        resolve(/Redis version=([\d.]+)/.exec(output)?.[1] ?? "unknown");
      }
    };
    child.stdout!.on("data", onData);
    child.stderr!.on("data", onData);
    child.once("error", (e) => {
      clearTimeout(timer);
      reject(new Error(`cannot start redis-server: ${e.message}`, { cause: e }));
    });
    child.once("exit", (code, signal) => {
      clearTimeout(timer);
      reject(new Error(`redis-server exited (${signal ?? code}) before it was ready: ${output}`));
    });
  });
  return { url: `redis://127.0.0.1:${port}`, version };
}
