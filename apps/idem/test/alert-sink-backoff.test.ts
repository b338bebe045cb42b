/**
 * An alert sink that is down for a while against the daemon: a webhook answering 500 (the real
 * daemon) and an SMTP server not listening (a daemon in process, on a clock the test moves). Its
 * deliveries back off (it was asked every tick, each failure a log line, for as long as the
 * outage lasted), the log says once that it fails, once at warn each other reason it fails for
 * meanwhile, and once that it is back; the delivery's stored reason does not promise the next
 * tick; and the alert, due all along, is delivered once when the sink takes it again.
 */
import { afterEach, describe, expect, it } from "vitest";
import { createServer } from "node:http";
import type { AddressInfo } from "node:net";
import { openLedger } from "@idem/core";
import { openTestLedger } from "@idem/core/testing";
import { Daemon, DaemonMetrics, alertActions, parseConfig } from "@idem/cli";
import { DIALECTS, freePort, freshDatabase, scaled, startChild, tempDir } from "@idem/testkit";
import { SINK_BACKOFF_MAX_MS } from "../src/sink-backoff.js";
import { fileAction } from "./fixtures/file-actions.js";
import { CLI, CONFIG, capturedLog, moreTicks, smtpServer, until } from "./support.js";

let n = 0;
const tenant = () => `sb${++n}-${Math.random().toString(36).slice(2, 7)}`;

const cleanups: (() => Promise<unknown>)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c().catch(() => {});
});

/** A webhook receiver answering 500 (or what `answer` sets) until `recover()`, then 200; it counts every request and what it answered. */
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
    answer: (failing: number) => (status = failing),
    recover: () => (status = 200),
    close: () => new Promise<void>((r) => server.close(() => r())),
  };
}

/** An action whose answer is always lost and that nothing can look up: its run ends in review, alerted. */
const lost = (dir: string) => ({
  ...fileAction("neither", dir),
  execute: async () => {
    throw new Error("socket hang up");
  },
});

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
        const parked = await ledger.run(lost(dir), { tenant: tenant(), key: ["r"], args: { note: "x" } });
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
        // What the delivery's row says of its next try is true under the backoff. Before: "tried again next tick".
        const [delivery] = await ledger.admin.list({ tenant: "idem-alerts" });
        expect(delivery?.reason).not.toMatch(/next tick/);
        expect(delivery?.reason).toMatch(/tried again after a backoff/);

        // The outage goes on for another reason (the receiver now says it is unavailable): said
        // once, at warn, with the new reason. Before: only at debug, the log still saying the first.
        hook.answer(503);
        const changed = () =>
          logLines(daemon.lines).filter((l) => l.msg.startsWith("alert sink webhook is still failing, now"));
        await until(() => changed().length >= 1, 60_000, "the new reason to be said");
        await until(() => hook.answered.filter((s) => s === 503).length >= 2, 60_000, "a second try answered 503");
        expect(changed()).toEqual([
          expect.objectContaining({
            level: 40,
            msg: expect.stringMatching(/receiver answered 503, nothing delivered/),
          }),
        ]);

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

    it(
      "an email sink whose SMTP server is down: the alert stays due, the sink is backed off, and the alert is delivered once when the server comes back",
      async () => {
        const url = await freshDatabase(dialect);
        let now = Date.now();
        const { log, lines } = capturedLog();
        const port = await freePort(); // nothing listens: the SMTP server is down
        const config = parseConfig({
          ledger: url,
          alerts: {
            log: false,
            email: { smtp: { host: "127.0.0.1", port }, from: "idem@example.test", to: ["ops@example.test"] },
          },
          daemon: { intervalMs: 50 },
        });
        const ledger = await openTestLedger(url, { clock: () => now, poolSize: 2, actions: alertActions(config, log) });
        cleanups.push(() => ledger.close());
        const parked = await ledger.run(lost(tempDir()), { tenant: tenant(), key: ["r"], args: { note: "x" } });
        expect(parked).toMatchObject({ state: "needs_review" });
        const daemon = new Daemon(ledger, config, log, new DaemonMetrics(ledger, 1_000), "d-smtp-down");
        const stillDue = async () =>
          (await ledger.daemon.alertsDue({ limit: 1_000 })).some((a) => a.id === parked.operationId);
        const delivery = async () => (await ledger.admin.list({ tenant: config.alerts.tenant }))[0];
        const said = (start: string) => lines.filter((l) => l.msg.startsWith(start));

        // Six ticks at one instant of the database clock: tried at the first (a blip: the next tick
        // tries again) and the second; then held back.
        const ticks = [];
        for (let i = 0; i < 6; i++) ticks.push(await daemon.tick());
        expect({
          ticks,
          delivery: await delivery(),
          stillDue: await stillDue(),
          saidFailing: said("alert delivery to email did not succeed").length,
        }).toEqual({
          ticks: Array(6).fill({ failed: 0, undelivered: 1 }),
          delivery: expect.objectContaining({
            status: "pending",
            attempt: 2,
            reason: expect.stringMatching(/SMTP server not reached, nothing sent: ESOCKET: connect ECONNREFUSED/),
          }),
          stillDue: true,
          saidFailing: 1,
        });

        // The server comes back where it was; once the backoff ends (at most its cap), the alert goes, once.
        const smtp = await smtpServer(undefined, port);
        cleanups.push(smtp.close);
        now += SINK_BACKOFF_MAX_MS;
        expect(await daemon.tick()).toEqual({ failed: 0, undelivered: 0 });
        for (let i = 0; i < 3; i++) expect(await daemon.tick()).toEqual({ failed: 0, undelivered: 0 });
        expect({
          sent: smtp.taken.length,
          about: smtp.taken[0],
          stillDue: await stillDue(),
          delivery: (await delivery())?.status,
          back: said("alert sink email takes alerts again").length,
        }).toEqual({
          sent: 1,
          about: expect.stringContaining(parked.operationId),
          stillDue: false,
          delivery: "succeeded",
          back: 1,
        });
      },
      scaled(120_000),
    );
  });
}
