/**
 * A stop whose work ends while the late answer of a request it cut off is still out, on SQLite and
 * Postgres: the daemon's run of a provider that answers long after its effect is cut off at the
 * claim's end (unknown, recorded), and the ledger's close waits for that late answer, to record
 * it, for what is left of `daemon.stopTimeoutMs`, not a lease. Before, the close waited up to a
 * lease (longer than the stop's bound) and the bound's exit cut it: "closing the ledger did not
 * finish", the ledger never closed and nothing named the operation whose answer was lost. Now the
 * ledger closes within the bound and the log names it; still exit 1 (the stop was not clean).
 * A `--once` pass nobody stopped, whose close waits a lease for such an answer, says its pass
 * ended (not a stop's words) and names the operation, in the log and on exit; and its process
 * exits within a bound of that, though the request is still out (before, it stayed alive until the
 * provider answered: a cron job hung that long). A pass that failed before its ledger opened (no
 * SQLite ledger at the path: a config error, 2; a Postgres that refuses connections: 1), held open
 * by a client its config made, says it did not run when it exits (before: "after its ledger
 * closed", a ledger never opened).
 */
import { describe, expect, it } from "vitest";
import { join } from "node:path";
import { openLedger } from "@idem/core";
import { DIALECTS, freePort, freshDatabase, scaled, startChild, tempDir } from "@idem/testkit";
import { fileAction, lines } from "./fixtures/file-actions.js";
import { CLI, CONFIG, until } from "./support.js";

for (const dialect of DIALECTS) {
  describe(`a stop with a late answer still out, on ${dialect}`, () => {
    it(
      "closes the ledger within the stop's bound and names the operation whose late answer was not awaited (exit 1)",
      async () => {
        const url = await freshDatabase(dialect);
        const dir = tempDir();
        const tenant = "stop-close";
        // Known not done (a 503 before the provider executed): the daemon runs it.
        const id = await pendingIn(url, dir, tenant);
        // The run's answer comes 120 s after its effect; the claim (2 s) cuts the wait for it off,
        // and the close waits for it: up to a lease (60 s) before, past the stop's bound (10 s).
        const daemon = startChild(CLI, ["--config", CONFIG, "daemon", "--name", `d-stop-close-${dialect}`], {
          LEDGER_URL: url,
          EFFECT_DIR: dir,
          ALERTS: "log",
          METRICS_PORT: String(await freePort()),
          EXECUTE_DELAY_MS: "120000",
          CLAIM_MS: "2000",
          LEASE_MS: "60000",
          STOP_TIMEOUT_MS: "10000",
        });
        try {
          await until(() => lines(join(dir, "effects")).length >= 1, 60_000, "the daemon's run to be in flight");
          daemon.proc.kill("SIGTERM");
          await daemon.waitFor(/"msg":"daemon stopped"/, 30_000); // the work ended
          const { code, stderr } = await daemon.exited;
          const said = daemon.lines.join("\n");
          expect(said).not.toMatch(/the work in flight did not end|closing the ledger did not finish/);
          const unawaited = daemon.lines
            .filter((l) => l.startsWith("{"))
            .map((l) => JSON.parse(l) as { level: number; msg: string; lateAnswers?: unknown })
            .filter((l) => l.lateAnswers !== undefined);
          expect(unawaited).toEqual([
            expect.objectContaining({
              level: 50,
              lateAnswers: [{ tenant, id }],
              msg: expect.stringMatching(/the ledger closed without the late answer of 1 request\(s\) cut off \(op_/),
            }),
          ]);
          expect(code, stderr).toBe(1);
          const ledger = await openLedger(url, { migrate: false });
          try {
            // Cut off and recorded (unknown, which nothing can check: a person's); its late answer is not.
            expect((await ledger.get({ tenant, id })).operation.status).toBe("needs_review");
          } finally {
            await ledger.close();
          }
        } finally {
          daemon.proc.kill("SIGKILL");
          await daemon.exited;
        }
      },
      scaled(120_000),
    );

    it(
      "daemon --once: a pass whose late answer was not recorded before its exit says the pass ended and names the operation, no stop (exit 1)",
      async () => {
        const url = await freshDatabase(dialect);
        const dir = tempDir();
        const tenant = "once-close";
        const id = await pendingIn(url, dir, tenant);
        // No stop: the pass's run is cut off at the claim's end (2 s, unknown, recorded), the
        // pass ends, and the close waits a lease (3 s) for the answer that comes 15 s after the
        // effect (the fixture's timer holds the process open till then: it exits without it).
        const once = startChild(CLI, ["--config", CONFIG, "daemon", "--once", "--name", `d-once-close-${dialect}`], {
          LEDGER_URL: url,
          EFFECT_DIR: dir,
          ALERTS: "log",
          EXECUTE_DELAY_MS: "15000",
          CLAIM_MS: "2000",
          LEASE_MS: "3000",
        });
        try {
          const { code, stderr } = await once.exited;
          expect(lines(join(dir, "effects"))).toHaveLength(1);
          const unawaited = once.lines
            .filter((l) => l.startsWith("{"))
            .map((l) => JSON.parse(l) as { level: number; msg: string; lateAnswers?: unknown })
            .filter((l) => l.lateAnswers !== undefined);
          // Before: "the ledger closed without the late answer of 1 request(s) cut off (op_…): a lease
          // ended the wait; …" and "idem: the daemon stopped without recording the late answers of 1
          // request(s) cut off; see the log": a stop's words, for a pass nobody stopped.
          expect(unawaited).toEqual([
            expect.objectContaining({
              level: 50,
              lateAnswers: [{ tenant, id }],
              msg: `the pass ended, but the late answer of 1 request(s) it cut off was not recorded (${id}): the ledger's close waited for it a lease (daemon.leaseMs), and exits with the pass; each operation stays as its cut-off left it (unknown, checked again, or with a person) where its answer would have settled it`,
            }),
            expect.objectContaining({
              level: 40,
              lateAnswers: [{ tenant, id }],
              msg: expect.stringMatching(
                /held by the request\(s\) whose late answers were not recorded \(op_.*not waiting for/,
              ),
            }),
          ]);
          expect(stderr.trim()).toBe(
            `idem: the pass ended without recording the late answer of 1 request(s) it cut off (${id}); see the log`,
          );
          expect(once.lines.join("\n")).not.toMatch(/stop/i);
          expect(code, stderr).toBe(1);
          const ledger = await openLedger(url, { migrate: false });
          try {
            expect((await ledger.get({ tenant, id })).operation.status).toBe("needs_review");
          } finally {
            await ledger.close();
          }
        } finally {
          once.proc.kill("SIGKILL");
          await once.exited;
        }
      },
      scaled(120_000),
    );

    it(
      "daemon --once: a pass whose late answer never comes exits within a bound of its close, exit 1, the log flushed",
      async () => {
        const url = await freshDatabase(dialect);
        const dir = tempDir();
        const tenant = "once-never";
        const id = await pendingIn(url, dir, tenant);
        // The answer comes an hour after the effect (the fixture's timer holds the event loop open
        // till then, as a provider client's socket would): the pass's run is cut off at the claim's
        // end (2 s), the close waits a lease (3 s) and gives up on it. Before, the process stayed
        // alive until the answer came: a cron job hung for as long as the provider took.
        const once = startChild(CLI, ["--config", CONFIG, "daemon", "--once", "--name", `d-once-never-${dialect}`], {
          LEDGER_URL: url,
          EFFECT_DIR: dir,
          ALERTS: "log",
          EXECUTE_DELAY_MS: "3600000",
          CLAIM_MS: "2000",
          LEASE_MS: "3000",
        });
        try {
          await once.waitFor(
            /the pass ended, but the late answer of 1 request\(s\) it cut off was not recorded/,
            60_000,
          );
          const bound = scaled(10_000);
          const ended = await Promise.race([
            once.exited,
            new Promise<"still running">((r) => setTimeout(() => r("still running"), bound).unref()),
          ]);
          expect(ended, `the pass's process still running ${bound} ms after its close`).not.toBe("still running");
          const { code, stderr } = ended as Awaited<typeof once.exited>;
          expect(stderr.trim()).toBe(
            `idem: the pass ended without recording the late answer of 1 request(s) it cut off (${id}); see the log`,
          );
          expect(code, stderr).toBe(1);
          // Flushed before the exit: the line that says why it did not wait for the answer.
          expect(once.lines.join("\n")).toMatch(
            new RegExp(`"level":40,.*"lateAnswers":\\[\\{"tenant":"${tenant}","id":"${id}"\\}\\].*not waiting for`),
          );
          expect(once.lines.join("\n")).not.toMatch(/stop/i);
        } finally {
          once.proc.kill("SIGKILL");
          await once.exited;
        }
      },
      scaled(120_000),
    );

    it(
      "daemon --once: a pass that failed before its ledger opened, held open, says it did not run as it exits (not 'after its ledger closed')",
      async () => {
        // Nothing to open: a SQLite path with no ledger (a config error), a Postgres port nobody listens on.
        const [url, code, error] =
          dialect === "sqlite"
            ? ([`sqlite:${join(tempDir(), "none.db")}`, 2, /^idem: no SQLite ledger at /] as const)
            : ([
                `postgres://idem@127.0.0.1:${await freePort()}/idem`,
                1,
                /^idem: cannot connect to Postgres ledger .*ECONNREFUSED/,
              ] as const);
        const once = startChild(CLI, ["--config", CONFIG, "daemon", "--once", "--name", `d-once-unopened-${dialect}`], {
          LEDGER_URL: url,
          EFFECT_DIR: tempDir(),
          ALERTS: "log",
          HOLD_OPEN_MS: "3600000",
        });
        try {
          const bound = scaled(60_000); // the child's start-up (tsx) included
          const ended = await Promise.race([
            once.exited,
            new Promise<"still running">((r) => setTimeout(() => r("still running"), bound).unref()),
          ]);
          expect(ended, `the pass's process still running ${bound} ms after its start`).not.toBe("still running");
          const { code: exitCode, stderr } = ended as Awaited<typeof once.exited>;
          expect(stderr.trim()).toMatch(error);
          expect(stderr.trim().split("\n")).toHaveLength(1);
          expect(exitCode, stderr).toBe(code);
          const said = once.lines
            .filter((l) => l.startsWith("{"))
            .map((l) => JSON.parse(l) as { level: number; msg: string; onceExitMs?: number });
          expect(said.filter((l) => l.onceExitMs !== undefined)).toEqual([
            expect.objectContaining({
              level: 40,
              onceExitMs: 2000,
              msg: "the pass did not run: it failed before its ledger opened (the error says why), and its process was still open 2000 ms after: exiting",
            }),
          ]);
          expect(once.lines.join("\n")).not.toMatch(/ledger closed|the pass ended/);
        } finally {
          once.proc.kill("SIGKILL");
          await once.exited;
        }
      },
      scaled(120_000),
    );
  });
}

/** An operation known not done (a 503 before the provider executed), for the daemon to run: its id. */
async function pendingIn(url: string, dir: string, tenant: string): Promise<string> {
  const agent = await openLedger(url, { budget: { attempts: 1 } });
  try {
    const refused = {
      ...fileAction("neither", dir),
      execute: async () => {
        throw new Error("503 before the provider executed");
      },
      classify: () => ({ kind: "transient", reason: "503", retryAfterMs: 0 }) as const,
    };
    const out = await agent.run(refused, { tenant, key: ["k"], args: { note: "x" } });
    expect(out).toMatchObject({ state: "pending" });
    return (out as { operationId: string }).operationId;
  } finally {
    await agent.close();
  }
}
