/**
 * An alert sink that is down for a while (a webhook answering 500) against the real daemon: its
 * deliveries back off (it was asked every tick, each failure a log line, for as long as the
 * outage lasted), the log says once that it fails and once that it is back, and the alert, due
 * all along, is delivered once when the sink takes it again.
 */
import { afterEach, describe, expect, it } from "vitest";
import { createServer } from "node:http";
import type { AddressInfo } from "node:net";
import { openLedger } from "@idem/core";
import { DIALECTS, freePort, freshDatabase, scaled, startChild, tempDir } from "@idem/testkit";
import { fileAction } from "./fixtures/file-actions.js";
import { CLI, CONFIG, moreTicks, until } from "./support.js";

let n = 0;
const tenant = () => `sb${++n}-${Math.random().toString(36).slice(2, 7)}`;

const cleanups: (() => Promise<unknown>)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c().catch(() => {});
});

/** A webhook receiver answering 500 until `recover()`, then 200; it counts every request and what it answered. */
async function failingReceiver() {
  const answered: number[] = [];
  let status = 500;
  const server = createServer((req, res) => {
    req.resume();
    req.on("end", () => {
      answered.push(status);
      res.writeHead(status).end();
    });
  });
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}/hook`,
    answered,
    recover: () => (status = 200),
    close: () => new Promise<void>((r) => server.close(() => r())),
  };
}

/** The daemon's JSON log lines (the fixture's config logs alerts too: its log sink always works). */
const logLines = (lines: readonly string[]) =>
  lines.filter((l) => l.startsWith("{")).map((l) => JSON.parse(l) as { level: number; msg: string });

for (const dialect of DIALECTS) {
  describe(`an alert sink that is down, ${dialect}`, () => {
    it(
      "is tried with backoff, not every tick; the log says once that it fails and once that it is back; the alert is delivered once when it returns",
      async () => {
        const url = await freshDatabase(dialect);
        const dir = tempDir();
        const ledger = await openLedger(url);
        cleanups.push(() => ledger.close());
        const lost = {
          ...fileAction("neither", dir),
          execute: async () => {
            throw new Error("socket hang up");
          },
        };
        const parked = await ledger.run(lost, { tenant: tenant(), key: ["r"], args: { note: "x" } });
        expect(parked).toMatchObject({ state: "needs_review" });
        const hook = await failingReceiver();
        cleanups.push(hook.close);
        const metrics = await freePort();
        const daemon = startChild(CLI, ["--config", CONFIG, "daemon", "--name", "d-backoff"], {
          LEDGER_URL: url,
          EFFECT_DIR: dir,
          WEBHOOK_URL: hook.url,
          METRICS_PORT: String(metrics),
        });
        const stillDue = async () =>
          (await ledger.daemon.alertsDue({ limit: 1_000 })).some((a) => a.id === parked.operationId);

        await until(() => hook.answered.length >= 1, 60_000, "the first delivery");
        const before = hook.answered.length;
        const ticks = 20;
        await moreTicks(metrics, ticks);
        const duringOutage = hook.answered.length - before;
        const failing = () =>
          logLines(daemon.lines).filter((l) => l.msg.startsWith("alert delivery to webhook did not succeed"));
        // Before: one request a tick (20 in 20 ticks), each a log line.
        expect(
          { requestsUnderHalfTheTicks: duringOutage < ticks / 2, saidFailing: failing().length },
          `${duringOutage} requests in ${ticks} ticks`,
        ).toEqual({
          requestsUnderHalfTheTicks: true,
          saidFailing: 1,
        });
        expect(await stillDue()).toBe(true);

        hook.recover();
        await until(async () => !(await stillDue()), 60_000, "the alert to be delivered and acknowledged");
        await moreTicks(metrics, 3);
        expect(hook.answered.filter((s) => s === 200)).toHaveLength(1);
        const back = logLines(daemon.lines).filter((l) => l.msg.startsWith("alert sink webhook takes alerts again"));
        expect(back).toHaveLength(1);
        expect(failing()).toHaveLength(1);

        daemon.proc.kill("SIGTERM");
        const { code, stderr } = await daemon.exited;
        expect(code, stderr).toBe(0);
      },
      scaled(180_000),
    );
  });
}
