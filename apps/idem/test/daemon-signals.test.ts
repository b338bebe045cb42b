/**
 * A signal that comes while the daemon (a real process) is stopping, on SQLite and Postgres, with
 * a request in flight (a provider that answers some seconds after its effect). Before, the stop's
 * handlers were `once`: any second signal met Node's default and killed it at once, the request
 * the stop was finishing abandoned, whoever sent it (a script runner forwarding a single Ctrl-C, a
 * script sending SIGTERM again). Now a repeated SIGTERM is said and the stop goes on; a second
 * Ctrl-C (SIGINT) exits at once, saying so; one repeated at once is the same signal delivered twice.
 */
import { afterAll, describe, expect, it } from "vitest";
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { openLedger } from "@idem/core";
import { DIALECTS, freshDatabase, freePort, scaled, startChild, tempDir, type Child } from "@idem/testkit";
import { REPEAT_SIGNAL_MS } from "../src/stop-signals.js";
import { fileAction, lines } from "./fixtures/file-actions.js";
import { CLI, CONFIG, until } from "./support.js";

for (const dialect of DIALECTS) {
  describe(`a signal while the daemon stops, on ${dialect}`, () => {
    const children: Child[] = [];
    afterAll(async () => {
      for (const c of children) {
        c.proc.kill("SIGKILL"); // ended already, unless a test failed before
        await c.exited;
      }
    });

    /**
     * A daemon whose run of a due operation is in flight: its effect written, the answer `delayMs`
     * away, or (`"on answer()"`) given when the test calls `answer()`.
     */
    async function inFlight(delayMs: number | "on answer()", args: string[] = []) {
      const url = await freshDatabase(dialect);
      const dir = tempDir();
      const tenant = "signals";
      const agent = await openLedger(url, { budget: { attempts: 1 } });
      let id: string;
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
        id = (out as { operationId: string }).operationId;
      } finally {
        await agent.close();
      }
      const daemon = startChild(CLI, ["--config", CONFIG, "daemon", "--name", `d-signals-${dialect}`, ...args], {
        LEDGER_URL: url,
        EFFECT_DIR: dir,
        WEBHOOK_URL: "http://127.0.0.1:9/hook",
        METRICS_PORT: String(await freePort()),
        ...(delayMs === "on answer()" ? { EXECUTE_GATE: join(dir, "answer") } : { EXECUTE_DELAY_MS: String(delayMs) }),
      });
      children.push(daemon);
      await until(() => lines(join(dir, "effects")).length >= 1, 60_000, "the daemon's run to be in flight");
      const statusOf = async () => {
        const l = await openLedger(url, { migrate: false });
        try {
          return (await l.get({ tenant, id })).operation.status;
        } finally {
          await l.close();
        }
      };
      /** Sends `signal`, waits for the stop to be said, then until a repeat is no longer the same signal. */
      const stopWith = async (signal: NodeJS.Signals) => {
        daemon.proc.kill(signal);
        await daemon.waitFor(/stopping: finishing the work in flight/, scaled(30_000));
        const said = performance.now();
        await until(() => performance.now() - said > REPEAT_SIGNAL_MS, 10_000, "the repeat window to pass");
      };
      /** The provider answers the request in flight (`"on answer()"`). */
      const answer = () => writeFileSync(join(dir, "answer"), "");
      return { daemon, statusOf, stopWith, answer };
    }

    // The loop, and one pass (--once): before, a pass heard no repeat at all (only the loop did).
    for (const [mode, args] of [
      ["the loop", []],
      ["one pass (--once)", ["--once"]],
    ] as const)
      it(
        `${mode}: a second SIGTERM is said and the stop goes on: the request in flight is recorded, exit 0`,
        async () => {
          const { daemon, statusOf, stopWith, answer } = await inFlight("on answer()", [...args]);
          await stopWith("SIGTERM");
          daemon.proc.kill("SIGTERM");
          // Before: killed by the second SIGTERM (Node's default), the operation left running.
          const first = await Promise.race([
            daemon.waitFor(/already stopping \(SIGTERM again\)/, scaled(30_000)).then(() => "said"),
            daemon.exited.then((e) => `exited ${e.code ?? e.signal}`),
          ]);
          expect(first).toBe("said");
          answer(); // only now: the request is still in flight when the second SIGTERM comes
          const { code, stderr } = await daemon.exited;
          expect(code, stderr).toBe(0);
          expect(await statusOf()).toBe("succeeded");
        },
        scaled(120_000),
      );

    it(
      "Ctrl-C delivered twice at once (a script runner forwarding it) stops gracefully; Ctrl-C again exits at once (130), saying so",
      async () => {
        const { daemon, statusOf, stopWith } = await inFlight(120_000);
        // The terminal's SIGINT and the one a script runner forwards, back to back.
        daemon.proc.kill("SIGINT");
        await stopWith("SIGINT");
        // Still stopping: a SIGTERM now is heard, not Node's default.
        daemon.proc.kill("SIGTERM");
        const still = await Promise.race([
          daemon.waitFor(/already stopping \(SIGTERM again\)/, scaled(30_000)).then(() => "stopping"),
          daemon.exited.then((e) => `exited ${e.code ?? e.signal}`),
        ]);
        expect(still).toBe("stopping");
        const pressed = performance.now();
        daemon.proc.kill("SIGINT");
        const { code } = await daemon.exited;
        expect(code).toBe(130);
        expect(performance.now() - pressed).toBeLessThan(scaled(10_000)); // not the stop's 20 s bound
        expect(daemon.lines.join("\n")).toMatch(/interrupted again while stopping: exiting at once/);
        expect(await statusOf()).toBe("running"); // left to its lease
      },
      scaled(120_000),
    );
  });
}
