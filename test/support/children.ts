/**
 * Child processes for races and crashes: each runs a TypeScript script with the workspace
 * sources (condition idem-source, tsx), reports lines on stdout and can be SIGKILLed at a line
 * it prints (a named crash point).
 */
import { spawn, type ChildProcess } from "node:child_process";
import { createInterface } from "node:readline";
import { afterAll, afterEach, beforeEach } from "vitest";
import { scaled } from "./machine.js";

/**
 * Every child is killed when the test that started it ends (or, for children started in
 * beforeAll, when the file ends), passed or failed: a failing test must not leave workers behind.
 */
const inFile = new Set<ChildProcess>();
let inTest: Set<ChildProcess> | undefined;
const killAll = async (procs: Set<ChildProcess>) => {
  await Promise.all(
    [...procs].map((p) => {
      if (p.exitCode !== null || p.signalCode !== null) return undefined;
      p.kill("SIGKILL");
      return new Promise((r) => p.once("exit", r));
    }),
  );
  procs.clear();
};
beforeEach(() => {
  inTest = new Set();
});
afterEach(async () => {
  if (inTest) await killAll(inTest);
  inTest = undefined;
});
afterAll(() => killAll(inFile));
// A last resort if the worker exits without its hooks (a crash): synchronous, so it runs.
process.once("exit", () => {
  for (const p of inFile) if (p.exitCode === null && p.signalCode === null) p.kill("SIGKILL");
});

export interface Child {
  readonly proc: ChildProcess;
  readonly lines: string[];
  /** Resolves with the first line matching `pattern` (or rejects when the child exits first). */
  waitFor(pattern: RegExp, timeoutMs?: number): Promise<string>;
  /** Resolves when the child exits, with its code and signal. */
  readonly exited: Promise<{ code: number | null; signal: NodeJS.Signals | null; stderr: string }>;
  send(line: string): void;
}

export function startChild(script: string, args: string[] = [], env: Record<string, string> = {}): Child {
  const proc = spawn(process.execPath, ["--conditions=idem-source", "--import", "tsx", script, ...args], {
    env: { ...process.env, ...env },
    stdio: ["pipe", "pipe", "pipe"],
  });
  (inTest ?? inFile).add(proc);
  if (inTest) inFile.add(proc); // the exit hook sees every child
  const lines: string[] = [];
  const waiters: { pattern: RegExp; resolve: (l: string) => void }[] = [];
  let stderr = "";
  proc.stderr!.on("data", (d) => (stderr += String(d)));
  createInterface({ input: proc.stdout! }).on("line", (line) => {
    lines.push(line);
    for (const w of [...waiters]) {
      if (w.pattern.test(line)) {
        waiters.splice(waiters.indexOf(w), 1);
        w.resolve(line);
      }
    }
  });
  const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null; stderr: string }>((resolve) =>
    proc.on("exit", (code, signal) => resolve({ code, signal, stderr })),
  );
  return {
    proc,
    lines,
    exited,
    send: (line) => proc.stdin!.write(`${line}\n`),
    waitFor(pattern, baseMs = 30_000) {
      // The timeout is for a quiet 4-core machine; start-up under load takes longer.
      const timeoutMs = scaled(baseMs);
      const seen = lines.find((l) => pattern.test(l));
      if (seen) return Promise.resolve(seen);
      return new Promise((resolve, reject) => {
        const timer = setTimeout(
          () => reject(new Error(`child did not print ${pattern} in ${timeoutMs} ms; stderr:\n${stderr}`)),
          timeoutMs,
        );
        waiters.push({
          pattern,
          resolve: (l) => {
            clearTimeout(timer);
            resolve(l);
          },
        });
        exited.then(({ code, signal }) => {
          clearTimeout(timer);
          reject(new Error(`child exited (${code ?? signal}) before printing ${pattern}; stderr:\n${stderr}`));
        });
      });
    },
  };
}

/** SIGKILLs the child (no cleanup runs: the crash is real) and waits for it to be gone. */
export async function kill9(child: Child): Promise<void> {
  child.proc.kill("SIGKILL");
  const { signal } = await child.exited;
  if (signal !== "SIGKILL") throw new Error(`child ended with ${signal}, not SIGKILL`);
}
