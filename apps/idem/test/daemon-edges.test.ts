/**
 * The daemon's duties at their edges, each a defect found in review (helper-53) that these tests
 * reproduced first: webhook answers that take no alert keep it due; another tenant's operation of
 * an alert sink's type is never run with the sink; an attempt is stuck from its start, not from
 * its args' storing; SIGTERM sends nothing more (a settlement's or a delivery's pause ends);
 * /healthz stays healthy through a settlement that takes its budget.
 */
import { afterEach, describe, expect, it } from "vitest";
import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { Writable } from "node:stream";
import { defineAction, openLedger, type Ledger, type OperationContext } from "@idem/core";
import { openTestLedger } from "@idem/core/testing";
import { ConfigError, Daemon, DaemonMetrics, alertActions, parseConfig } from "@idem/cli";
import { pino } from "pino";
import { DIALECTS, freshDatabase, scaled, startChild, untrustedServer } from "@idem/testkit";
import { fileURLToPath } from "node:url";
import { CLI, smtpServer, until } from "./support.js";

const TERM_CONFIG = fileURLToPath(new URL("./fixtures/slow-503.config.ts", import.meta.url));

const silent = pino({ level: "silent" });
let n = 0;
const tenant = () => `rv${++n}-${Math.random().toString(36).slice(2, 7)}`;

/** A webhook receiver answering with `status()` at the time of each request; keeps what it took (2xx). */
async function receiver(status: () => number) {
  const taken: Record<string, unknown>[] = [];
  const headers: Record<string, string | string[] | undefined>[] = [];
  let asked = 0;
  const server: Server = createServer((req, res) => {
    let body = "";
    req.on("data", (c) => (body += c));
    req.on("end", () => {
      asked += 1;
      const s = status();
      if (s < 300) taken.push(JSON.parse(body) as Record<string, unknown>);
      if (s < 300) headers.push(req.headers);
      res.writeHead(s).end(s < 300 ? "ok" : "no");
    });
  });
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}/hook`,
    taken,
    headers,
    asked: () => asked,
    close: () => new Promise<void>((r) => server.close(() => r())),
  };
}

/** An action whose answer is always lost and that nothing can look up: each run of it ends in review, alerted. */
const lostAnswer = defineAction<{ note: string }, { id: string }>({
  type: "review.neither",
  capabilities: {},
  execute: async () => {
    throw new Error("socket hang up");
  },
});

/** A logger that keeps every line it writes (the log sink's alerts among them). */
function capture() {
  const lines: {
    level: number;
    msg: string;
    alert?: { kind: string; operationId: string };
    delivery?: { reason?: string };
  }[] = [];
  const log = pino(
    { level: "info" },
    new Writable({
      write(chunk, _encoding, done) {
        for (const line of String(chunk).split("\n").filter(Boolean)) lines.push(JSON.parse(line));
        done();
      },
    }),
  );
  return { log, lines };
}

const cleanups: (() => Promise<unknown>)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c().catch(() => {});
});

for (const dialect of DIALECTS) {
  describe(`the daemon at its edges, ${dialect}`, () => {
    for (const [status, why] of [
      [401, "the Authorization value in authorizationEnv is wrong or rotated"],
      [403, "a Slack webhook whose token was revoked (invalid_token)"],
      [404, "a Slack webhook URL that was removed (no_service)"],
      [503, "the receiver is briefly unavailable (the design's 'transient, no commit')"],
      // A gateway's answers (Slack's, a load balancer's): a duplicate alert is cheaper than a lost one.
      [500, "the receiver failed (an error page, a gateway's crash)"],
      [502, "a gateway in front of the receiver could not reach it"],
      [504, "a gateway in front of the receiver timed out waiting for it"],
    ] as const) {
      it(
        `alert: a webhook answering ${status} (${why}) keeps the alert due; once fixed, the alert is delivered`,
        async () => {
          let answer: number = status;
          const hook = await receiver(() => answer);
          cleanups.push(hook.close);
          const url = await freshDatabase(dialect);
          const config = parseConfig({
            ledger: url,
            alerts: { log: false, webhook: { url: hook.url, format: "json" } },
            daemon: { intervalMs: 50 },
          });
          const ledger = await openLedger(url, { poolSize: 2, actions: alertActions(config, silent) });
          cleanups.push(() => ledger.close());
          const t = tenant();
          const parked = await ledger.run(lostAnswer, { tenant: t, key: ["r"], args: { note: "x" } });
          expect(parked).toMatchObject({ status: "pending_verification", state: "needs_review" });
          const daemon = new Daemon(ledger, config, silent, new DaemonMetrics(ledger, 1_000), "d-review");

          const first = await daemon.tick();
          // The receiver refused it (one request this tick: nothing was delivered).
          expect(hook.asked()).toBe(1);
          expect(hook.taken).toHaveLength(0);
          expect((await ledger.daemon.alertsDue({ limit: 100 })).some((a) => a.id === parked.operationId)).toBe(true);
          // The configuration is fixed (the token, the URL, the receiver back): later ticks must deliver.
          answer = 200;
          for (let i = 0; i < 5; i++) await daemon.tick();
          const due = (await ledger.daemon.alertsDue({ limit: 100 })).some((a) => a.id === parked.operationId);
          expect(
            {
              firstTickUndelivered: first.undelivered,
              delivered: hook.taken.filter((a) => a.operationId === parked.operationId).length,
              stillDue: due,
            },
            `the alert of ${parked.operationId} was acknowledged after the receiver answered ${status}, and never sent`,
          ).toEqual({ firstTickUndelivered: 1, delivered: 1, stillDue: false });
        },
        scaled(60_000),
      );
    }

    /**
     * A daemon alerting through a webhook that answers `status`, on a ledger whose clock `advance`
     * moves on: a delivery left pending falls due for the next tick's settling (the other path
     * that sends it) without a wait.
     */
    async function webhookDaemon(status: number | (() => number), name: string, settings: { maxChecks?: number } = {}) {
      const hook = await receiver(typeof status === "number" ? () => status : status);
      cleanups.push(hook.close);
      const url = await freshDatabase(dialect);
      const config = parseConfig({
        ledger: url,
        alerts: { log: false, webhook: { url: hook.url, format: "json" } },
        daemon: { intervalMs: 50, ...settings },
      });
      let ahead = 0;
      const ledger = await openTestLedger(url, {
        poolSize: 2,
        actions: alertActions(config, silent),
        clock: () => Date.now() + ahead,
      });
      cleanups.push(() => ledger.close());
      const daemon = new Daemon(ledger, config, silent, new DaemonMetrics(ledger, 1_000), name);
      const advance = (ms: number) => {
        ahead += ms;
      };
      return { hook, ledger, daemon, advance };
    }

    it(
      "alert: a webhook answering 500 (it may have taken the alert) is sent at most once a tick, by the tick's delivery or its settling",
      async () => {
        const { hook, ledger, daemon, advance } = await webhookDaemon(500, "d-500");
        const parked = await ledger.run(lostAnswer, { tenant: tenant(), key: ["r"], args: { note: "x" } });
        expect(parked).toMatchObject({ state: "needs_review" });
        const asked: number[] = [];
        for (let tick = 0; tick < 3; tick++) {
          const before = hook.asked();
          const { undelivered } = await daemon.tick();
          asked.push(hook.asked() - before);
          expect(undelivered).toBe(1);
          advance(60_000);
        }
        // Before: [3, 3, 3]: each 500 retried within the tick's delivery (the retry budget's three
        // executions), each a request the receiver may have taken.
        expect(asked, "webhook requests per tick").toEqual([1, 1, 1]);
        expect(hook.taken).toHaveLength(0);
        expect((await ledger.daemon.alertsDue({ limit: 100 })).map((a) => a.id)).toContain(parked.operationId);
      },
      scaled(60_000),
    );

    it(
      "alert: a webhook down for more than maxChecks tries keeps the alert due; once back, the alert is delivered",
      async () => {
        let answer = 503;
        const { hook, ledger, daemon, advance } = await webhookDaemon(() => answer, "d-long-down", { maxChecks: 3 });
        const parked = await ledger.run(lostAnswer, { tenant: tenant(), key: ["r"], args: { note: "x" } });
        expect(parked).toMatchObject({ state: "needs_review" });
        // The receiver is down for hours: each tick's delivery and, once due, its settling meet a 503.
        for (let tick = 0; tick < 6; tick++) {
          await daemon.tick();
          advance(2 * 3_600_000);
        }
        answer = 200;
        for (let tick = 0; tick < 3; tick++) {
          await daemon.tick();
          advance(2 * 3_600_000);
        }
        const [delivery] = await ledger.admin.list({ tenant: "idem-alerts" });
        // Before the fix: the delivery, never sent, went to review after maxChecks tries ("still not
        // done after 3 tries"), the alert was acknowledged as in a person's hands, and never sent.
        expect({
          delivered: hook.taken.filter((a) => a.operationId === parked.operationId).length,
          stillDue: (await ledger.daemon.alertsDue({ limit: 100 })).some((a) => a.id === parked.operationId),
          delivery: delivery?.status,
        }).toEqual({ delivered: 1, stillDue: false, delivery: "succeeded" });
      },
      scaled(60_000),
    );

    it(
      "alert: a webhook whose certificate is not trusted keeps the alert due, nothing sent, the delivery not in review",
      async () => {
        const server = await untrustedServer();
        cleanups.push(server.close);
        const url = await freshDatabase(dialect);
        const config = parseConfig({
          ledger: url,
          alerts: { log: false, webhook: { url: `${server.basePath}/hook`, format: "json" } },
        });
        const ledger = await openLedger(url, { poolSize: 2, actions: alertActions(config, silent) });
        cleanups.push(() => ledger.close());
        const parked = await ledger.run(lostAnswer, { tenant: tenant(), key: ["r"], args: { note: "x" } });
        const daemon = new Daemon(ledger, config, silent, new DaemonMetrics(ledger, 1_000), "d-untrusted");
        expect(await daemon.tick()).toEqual({ failed: 0, undelivered: 1 });
        const [delivery] = await ledger.admin.list({ tenant: config.alerts.tenant });
        // Before: in review (ambiguous: "may have been sent"), and the alert acknowledged, never sent.
        expect({
          status: delivery?.status,
          reason: delivery?.reason,
          requests: server.requests(),
          stillDue: (await ledger.daemon.alertsDue({ limit: 100 })).some((a) => a.id === parked.operationId),
        }).toEqual({
          status: "pending",
          reason: expect.stringMatching(/certificate is not trusted.*nothing sent/),
          requests: 0,
          stillDue: true,
        });
      },
      scaled(60_000),
    );

    it(
      "alert: a tick counts each delivery its sink did not take once, though its settling and the tick's delivery both met it",
      async () => {
        const { hook, ledger, daemon, advance } = await webhookDaemon(503, "d-count");
        // Two alerts: the first's delivery is tried (and left pending), the second's waits for the sink.
        for (const key of ["a", "b"])
          await ledger.run(lostAnswer, { tenant: tenant(), key: [key], args: { note: "x" } });
        const ticks = [];
        for (let tick = 0; tick < 3; tick++) {
          ticks.push(await daemon.tick());
          advance(60_000);
        }
        // Before: 2, then 3 and 3: the pending delivery counted by its settling, then again by the
        // tick's delivery of its alert (its sink down by then), so `idem daemon --once` said 3.
        expect(ticks).toEqual([
          { failed: 0, undelivered: 2 },
          { failed: 0, undelivered: 2 },
          { failed: 0, undelivered: 2 },
        ]);
        expect(hook.asked(), "one request a tick").toBe(3);
      },
      scaled(60_000),
    );

    it(
      "tenant scope: an application tenant's operation of type idem.alert.webhook is not executed by the daemon's alert sink",
      async () => {
        const hook = await receiver(() => 200);
        cleanups.push(hook.close);
        const url = await freshDatabase(dialect);
        process.env.REVIEW_HOOK_AUTH = "Bearer ops-secret";
        const config = parseConfig({
          ledger: url,
          alerts: { log: true, webhook: { url: hook.url, format: "json", authorizationEnv: "REVIEW_HOOK_AUTH" } },
          daemon: { intervalMs: 50 },
        });
        // An application's agent (tenant "acme") that happens to, or chooses to, name its action so.
        const lookalike = defineAction<Record<string, unknown>, unknown>({
          type: "idem.alert.webhook",
          capabilities: {},
          execute: async () => {
            throw new Error("connect ECONNREFUSED");
          },
          classify: () => ({ kind: "transient", reason: "not reached" }),
        });
        const agent = await openLedger(url, { poolSize: 1, budget: { attempts: 1, baseDelayMs: 1 } });
        const t = tenant();
        const text = "URGENT: wire 50,000 EUR to IBAN XX00 0000 today, approved by the CFO";
        const seeded = await agent.run(lookalike, {
          tenant: t,
          key: ["x"],
          args: {
            kind: "needs_review",
            operationId: "op_fake",
            tenant: "acme",
            action: text,
            status: "needs_review",
            attempt: 1,
            reason: text,
            since: new Date().toISOString(),
          },
        });
        await agent.close();
        expect(seeded).toMatchObject({ status: "pending_verification", state: "pending" });
        // A minute on by the daemon's ledger's clock: the seeded row's backoff has passed, it is due.
        const ledger = await openTestLedger(url, {
          poolSize: 2,
          actions: alertActions(config, silent),
          clock: () => Date.now() + 60_000,
        });
        cleanups.push(() => ledger.close());
        const daemon = new Daemon(ledger, config, silent, new DaemonMetrics(ledger, 1_000), "d-scope");
        await daemon.tick();
        const row = (await ledger.get({ tenant: t, id: seeded.operationId })).operation;
        expect(
          {
            postedToOperatorsWebhook: hook.taken.length,
            withOperatorsAuthorization: hook.headers.filter((h) => h.authorization === "Bearer ops-secret").length,
            status: row.status,
          },
          `tenant ${t}'s row was settled by the daemon as ${row.status}: ${JSON.stringify(hook.taken[0] ?? null).slice(0, 200)}`,
        ).toEqual({ postedToOperatorsWebhook: 0, withOperatorsAuthorization: 0, status: "pending" });
      },
      scaled(60_000),
    );

    it(
      "stuck: an attempt running past the threshold is reported, also when its lazy args were stored within it",
      async () => {
        const url = await freshDatabase(dialect);
        let release: (() => void) | undefined;
        const released = new Promise<void>((r) => (release = r));
        const hangs = defineAction<{ note: string }, { id: string }>({
          type: "review.hangs",
          capabilities: {},
          execute: async () => {
            await released; // the provider does not answer
            return { id: "eff_1" };
          },
        });
        const config = parseConfig({
          ledger: url,
          alerts: { log: true },
          thresholds: { stuckAfterMs: 1_000 },
          daemon: { intervalMs: 50 },
        });
        let ahead = 0;
        const ledger = await openTestLedger(url, {
          poolSize: 2,
          actions: alertActions(config, silent),
          clock: () => Date.now() + ahead,
        });
        cleanups.push(() => ledger.close());
        const t = tenant();
        // The content is generated first (a model writing the email: 1.2 s), stored, then sent.
        const call = ledger.run(hangs, {
          tenant: t,
          key: ["gen"],
          args: async () => {
            await new Promise((r) => setTimeout(r, 1_200));
            return { note: "generated" };
          },
        });
        cleanups.push(async () => {
          release?.();
          await call;
        });
        let id = "";
        await until(
          async () => {
            const [op] = await ledger.admin.list({ tenant: t });
            if (op && (await ledger.get({ tenant: t, id: op.id })).args !== null) id = op.id;
            return id !== "";
          },
          10_000,
          "the args to be stored",
        );
        // 0.4 s on (by the ledger's clock): the attempt is past the threshold, its args' storing is not.
        ahead += 400;
        const op = (await ledger.get({ tenant: t, id })).operation;
        const metrics = new DaemonMetrics(ledger, 1_000);
        const daemon = new Daemon(ledger, config, silent, metrics, "d-stuck");
        const stuck = await ledger.daemon.stuck({ olderThanMs: 1_000 });
        await daemon.tick();
        const gauge = (await metrics.registry.getSingleMetric("idem_stuck_operations")!.get()).values[0]?.value;
        const mine = stuck.find((s) => s.id === id);
        expect(
          { listed: mine !== undefined, gauge },
          `attempt ${op.attempt} claimed at ${op.createdAt}, running ${Date.now() - op.createdAt} ms (args stored at ${op.updatedAt}); stuck() said runningForMs ${mine?.runningForMs ?? "(not listed)"}`,
        ).toEqual({ listed: true, gauge: 1 });
      },
      scaled(60_000),
    );

    it(
      "SIGTERM (daemon.stop) while an alert delivery waits out the receiver's 429: no new request after the stop",
      async () => {
        const asks: number[] = [];
        let stopped: number | undefined;
        let daemon: Daemon | undefined;
        const hook = await receiver(() => {
          asks.push(Date.now());
          if (asks.length === 1) {
            stopped = Date.now();
            daemon!.stop(); // SIGTERM arrives while the first delivery is answered 429
          }
          return 429;
        });
        cleanups.push(hook.close);
        const url = await freshDatabase(dialect);
        const config = parseConfig({
          ledger: url,
          alerts: { log: false, webhook: { url: hook.url, format: "json" } },
          daemon: { intervalMs: 50 },
        });
        const ledger = await openLedger(url, { poolSize: 2, actions: alertActions(config, silent) });
        cleanups.push(() => ledger.close());
        const parked = await ledger.run(lostAnswer, { tenant: tenant(), key: ["r"], args: { note: "x" } });
        expect(parked).toMatchObject({ state: "needs_review" });
        daemon = new Daemon(ledger, config, silent, new DaemonMetrics(ledger, 1_000), "d-429");
        const running = daemon.run();
        cleanups.push(async () => {
          daemon!.stop();
          await running;
        });
        await running;
        const after = asks.filter((at) => at > stopped!).length;
        expect(
          after,
          `stop took ${Date.now() - stopped!} ms; requests at ${asks.map((a) => a - stopped!).join(", ")} ms from the stop`,
        ).toBe(0);
      },
      scaled(60_000),
    );

    it(
      "SIGTERM (daemon.stop) while a settle waits out a transient failure's backoff: no new request is sent after the stop",
      async () => {
        const url = await freshDatabase(dialect);
        const executions: number[] = [];
        let stopAt: number | undefined;
        let onSecond: (() => void) | undefined;
        const secondSeen = new Promise<void>((r) => (onSecond = r));
        const flaky = defineAction<{ note: string }, { id: string }>({
          type: "review.flaky",
          capabilities: {},
          execute: async () => {
            executions.push(Date.now());
            if (executions.length === 2) onSecond?.();
            throw new Error("503 before execution");
          },
          classify: () => ({ kind: "transient", reason: "503 before execution" }),
        });
        const config = parseConfig({ ledger: url, alerts: { log: true }, daemon: { intervalMs: 50 } });
        // The application's call: one try, the row left pending (known not done), due for the daemon.
        const agent = await openLedger(url, { poolSize: 1, budget: { attempts: 1, baseDelayMs: 1 } });
        const t = tenant();
        const seeded = await agent.run(flaky, { tenant: t, key: ["job"], args: { note: "x" } });
        expect(seeded).toMatchObject({ status: "pending_verification", state: "pending" });
        await agent.close();
        const ledger = await openLedger(url, {
          poolSize: 2,
          budget: { baseDelayMs: 1_500 },
          actions: [flaky, ...alertActions(config, silent)],
        });
        cleanups.push(() => ledger.close());
        const daemon = new Daemon(ledger, config, silent, new DaemonMetrics(ledger, 1_000), "d-stop");
        const running = daemon.run();
        cleanups.push(async () => {
          daemon.stop();
          await running;
        });
        await secondSeen; // the daemon's first try failed: its settle now waits out the backoff
        stopAt = Date.now();
        daemon.stop(); // what `idem daemon`'s SIGTERM handler does
        await running;
        const after = executions.filter((at) => at > stopAt!).length;
        const row = (await ledger.get({ tenant: t, id: seeded.operationId })).operation;
        expect(
          { requestsAfterStop: after, status: row.status },
          `requests sent after the stop: ${after}; stop took ${Date.now() - stopAt} ms`,
        ).toEqual({ requestsAfterStop: 0, status: "pending" });
      },
      scaled(60_000),
    );

    it(
      "idem daemon: SIGTERM during a request that fails transiently finishes that request and sends no other",
      async () => {
        const url = await freshDatabase(dialect);
        const quick = defineAction<{ note: string }, { id: string }>({
          type: "review.flaky",
          capabilities: {},
          execute: async () => {
            throw new Error("503 before execution");
          },
          classify: () => ({ kind: "transient", reason: "503 before execution" }),
        });
        const agent = await openLedger(url, { poolSize: 1, budget: { attempts: 1, baseDelayMs: 1 } });
        const t = tenant();
        const seeded = await agent.run(quick, { tenant: t, key: ["job"], args: { note: "x" } });
        expect(seeded).toMatchObject({ status: "pending_verification", state: "pending" });
        const daemon = startChild(CLI, ["--config", TERM_CONFIG, "daemon", "--name", "d-term"], { LEDGER_URL: url });
        try {
          await daemon.waitFor(/^review-exec-start /, 60_000); // the daemon's request is in flight
          const termAt = Date.now();
          daemon.proc.kill("SIGTERM");
          const { code, stderr } = await daemon.exited;
          const starts = daemon.lines
            .filter((l) => l.startsWith("review-exec-start "))
            .map((l) => Number(l.split(" ")[1]));
          const row = (await agent.get({ tenant: t, id: seeded.operationId })).operation;
          expect(code, stderr).toBe(0);
          expect(
            { requestsStartedAfterSigterm: starts.filter((at) => at > termAt).length, status: row.status },
            `stopped after ${Date.now() - termAt} ms; requests started at ${starts.map((s) => s - termAt).join(", ")} ms from SIGTERM`,
          ).toEqual({ requestsStartedAfterSigterm: 0, status: "pending" });
        } finally {
          if (daemon.proc.exitCode === null && daemon.proc.signalCode === null) daemon.proc.kill("SIGKILL");
          await daemon.exited;
          await agent.close();
        }
      },
      scaled(90_000),
    );

    it(
      "/healthz stays healthy while the daemon settles one operation whose lookup takes 12 s (within the 30 s a lookup may take)",
      async () => {
        const url = await freshDatabase(dialect);
        let lookups = 0;
        let lookupDone: (() => void) | undefined;
        const done = new Promise<void>((r) => (lookupDone = r));
        const slow = (ms: number) =>
          defineAction<{ note: string }, { id: string }>({
            type: "review.lookup",
            capabilities: { lookup: true },
            execute: async () => {
              throw new Error("socket hang up");
            },
            classify: () => ({ kind: "ambiguous", reason: "timeout after the request was sent" }),
            reconcile: async () => {
              lookups += 1;
              await new Promise((r) => setTimeout(r, ms));
              if (ms > 0) lookupDone?.();
              return { found: true, receipt: { id: "eff_1" } };
            },
          });
        const config = parseConfig({ ledger: url, alerts: { log: true }, daemon: { intervalMs: 50 } });
        const ledger = await openLedger(url, { poolSize: 2, actions: [slow(12_000), ...alertActions(config, silent)] });
        cleanups.push(() => ledger.close());
        const metrics = new DaemonMetrics(ledger, config.daemon.intervalMs);
        const port = await metrics.listen(0, "127.0.0.1");
        cleanups.push(() => metrics.close());
        const daemon = new Daemon(ledger, config, silent, metrics, "d-health");
        const running = daemon.run();
        cleanups.push(async () => {
          daemon.stop();
          await running;
        });
        const health = async () => (await fetch(`http://127.0.0.1:${port}/healthz`)).status;
        // Ticks have run: healthy.
        const deadline = Date.now() + 10_000;
        while ((await health()) !== 200 && Date.now() < deadline) await new Promise((r) => setTimeout(r, 50));
        expect(await health()).toBe(200);
        // An agent's call whose answer was lost: unknown, due at once for the daemon's lookup.
        const agent = await openLedger(url, { poolSize: 1, budget: { attempts: 1, baseDelayMs: 1, elapsedMs: 200 } });
        const t = tenant();
        const lost = await agent.run(slow(0), { tenant: t, key: ["job"], args: { note: "x" } });
        await agent.close();
        expect(lost).toMatchObject({ status: "pending_verification" });
        const seen: number[] = [];
        let finished = false;
        void done.then(() => (finished = true));
        while (!finished) {
          seen.push(await health());
          await new Promise((r) => setTimeout(r, 500));
        }
        expect(lookups).toBeGreaterThanOrEqual(1);
        const unhealthy = seen.filter((s) => s !== 200).length;
        expect(unhealthy, `/healthz answers during the settle: ${seen.join(" ")}`).toBe(0);
      },
      scaled(90_000),
    );

    it(
      "a lookup that never answers holds the tick no longer than its claim: unknown (one inconclusive check), its late finding recorded when it comes, settled once",
      async () => {
        const url = await freshDatabase(dialect);
        // Each lookup waits for the test to answer it (a provider that never answers, until told).
        const lookups: { answer: (found: boolean) => void; signal: AbortSignal }[] = [];
        const hangs = defineAction<{ note: string }, { id: string }>({
          type: "review.hung-lookup",
          capabilities: { lookup: true },
          execute: async () => {
            throw new Error("socket hang up");
          },
          classify: () => ({ kind: "ambiguous", reason: "timeout after the request was sent" }),
          reconcile: (_args, op) =>
            new Promise((resolve) =>
              lookups.push({
                answer: (found) =>
                  resolve(
                    found
                      ? { found: true, receipt: { id: "eff_1" } }
                      : { found: false, proof: "inconclusive", reason: "x" },
                  ),
                signal: op.signal,
              }),
            ),
        });
        const claimMs = 2_000;
        const config = parseConfig({ ledger: url, alerts: { log: true }, daemon: { intervalMs: 50, claimMs } });
        // As `idem daemon` opens it: the default budget, whose 30 s bound a lookup before.
        let ahead = 0;
        const ledger = await openTestLedger(url, {
          poolSize: 2,
          actions: [hangs, ...alertActions(config, silent)],
          clock: () => Date.now() + ahead,
        });
        cleanups.push(() => ledger.close());
        const t = tenant();
        const ids: string[] = [];
        for (const key of ["a", "b"]) {
          const out = await ledger.run(hangs, {
            tenant: t,
            key: [key],
            args: { note: key },
            budget: { attempts: 1, baseDelayMs: 1 },
          });
          expect(out).toMatchObject({ status: "pending_verification", state: "unknown" });
          ids.push(out.operationId);
        }
        ahead += 60_000; // both due for a check
        const daemon = new Daemon(ledger, config, silent, new DaemonMetrics(ledger, 1_000), "d-hung");
        const started = performance.now();
        await daemon.tick();
        const tookMs = performance.now() - started;
        const rows = await Promise.all(ids.map(async (id) => (await ledger.get({ tenant: t, id })).operation));
        // Before: the tick ended after the 30 s the ledger gives a lookup, 15 times its 2 s claim.
        expect(
          {
            withinItsClaim: tookMs < claimMs + scaled(3_000),
            lookups: lookups.length,
            statuses: rows.map((r) => r.status),
            checks: rows.map((r) => r.checks),
          },
          `the tick took ${Math.round(tookMs)} ms; ${rows.map((r) => `${r.status} (${r.reason})`).join("; ")}`,
        ).toEqual({ withinItsClaim: true, lookups: 1, statuses: ["unknown", "unknown"], checks: [1, 0] });
        expect(rows[0]!.reason).toMatch(/^inconclusive: lookup failed: Error: no answer within \d+ ms/);
        // The given-up lookup answers late: its finding is recorded then, through the fence (before
        // d257e1c it was dropped, and the row looked up again).
        lookups[0]!.answer(true);
        await until(
          async () => (await ledger.get({ tenant: t, id: ids[0]! })).operation.status === "succeeded",
          30_000,
          "the late finding to be recorded",
        );
        // The other, checked once due: looked up, settled. Each settled once; the first not looked up again.
        ahead += 3_600_000;
        const next = daemon.tick();
        await until(() => lookups.length === 2, 30_000, "the second row's lookup");
        lookups[1]!.answer(true);
        await next;
        expect(lookups).toHaveLength(2);
        for (const id of ids) {
          const { operation, events } = await ledger.get({ tenant: t, id });
          expect(operation.status).toBe("succeeded");
          expect(events.filter((e) => e.to === "succeeded")).toHaveLength(1);
        }
      },
      scaled(90_000),
    );

    it(
      "alerts.tenant naming an application tenant: that tenant's needs_review and stuck runs are alerted, once each",
      async () => {
        const url = await freshDatabase(dialect);
        const t = tenant();
        const { log, lines } = capture();
        // An operator who names an application's tenant as the alerts' own (a typo, or on purpose).
        const config = parseConfig({
          ledger: url,
          alerts: { log: true, tenant: t },
          thresholds: { stuckAfterMs: 1 },
          daemon: { intervalMs: 50 },
        });
        let release = () => {};
        const released = new Promise<void>((r) => (release = r));
        const hangs = defineAction<{ note: string }, { id: string }>({
          type: "review.hangs",
          capabilities: {},
          execute: async () => {
            await released; // the provider does not answer
            return { id: "eff_1" };
          },
        });
        let ahead = 0;
        const ledger = await openTestLedger(url, {
          poolSize: 2,
          actions: alertActions(config, log),
          clock: () => Date.now() + ahead,
        });
        cleanups.push(() => ledger.close());
        const parked = await ledger.run(lostAnswer, { tenant: t, key: ["r"], args: { note: "x" } });
        expect(parked).toMatchObject({ state: "needs_review" });
        const call = ledger.run(hangs, { tenant: t, key: ["h"], args: { note: "x" } });
        cleanups.push(async () => {
          release();
          await call;
        });
        await until(async () => (await ledger.admin.list({ tenant: t, status: ["running"] })).length === 1, 10_000);
        const [running] = await ledger.admin.list({ tenant: t, status: ["running"] });
        ahead += 20; // past the 1 ms threshold, by the ledger's clock
        const daemon = new Daemon(ledger, config, log, new DaemonMetrics(ledger, 1_000), "d-own-tenant");
        const first = await daemon.tick();
        await daemon.tick();
        const kinds = (id: string) => lines.filter((l) => l.alert?.operationId === id).map((l) => l.alert!.kind);
        // Before: neither, in silence (the review acknowledged as the daemon's own delivery, the run skipped).
        expect({
          first,
          review: kinds(parked.operationId),
          stuck: kinds(running!.id),
          alerts: lines.filter((l) => l.alert).length, // none about the deliveries themselves
          stillDue: (await ledger.daemon.alertsDue({ limit: 100 })).map((a) => a.id),
        }).toEqual({
          first: { failed: 0, undelivered: 0 },
          review: ["needs_review"],
          stuck: ["stuck"],
          alerts: 2,
          stillDue: [],
        });
      },
      scaled(60_000),
    );

    for (const refusal of [
      { at: "MAIL", reply: "530 5.7.0 Authentication required" },
      { at: "RCPT", reply: "554 5.7.1 <ops@example.test>: Relay access denied" },
      { at: "greeting", reply: "554 5.7.1 No SMTP service for this client" },
      { at: "MAIL", reply: "550 5.7.1 Sender address rejected: not owned by the signed-in user" },
    ] as const)
      it(
        `alert: an SMTP server refusing every alert (${refusal.reply}, at ${refusal.at}) keeps it due, held back like a refused sign-in, said once (not each tick: the sink is failing); once fixed, it is sent`,
        async () => {
          let fixed = false;
          const smtp = await smtpServer(() => (fixed ? undefined : refusal));
          cleanups.push(smtp.close);
          const url = await freshDatabase(dialect);
          let now = Date.now();
          const { log, lines } = capture();
          const config = parseConfig({
            ledger: url,
            alerts: {
              log: false,
              email: {
                smtp: { host: "127.0.0.1", port: smtp.port },
                from: "idem@example.test",
                to: ["ops@example.test"],
              },
            },
            daemon: { intervalMs: 50 },
          });
          const ledger = await openTestLedger(url, {
            clock: () => now,
            poolSize: 2,
            actions: alertActions(config, log),
          });
          cleanups.push(() => ledger.close());
          const parked = await ledger.run(lostAnswer, { tenant: tenant(), key: ["r"], args: { note: "x" } });
          const daemon = new Daemon(ledger, config, log, new DaemonMetrics(ledger, 1_000), "d-smtp");
          const due = async () =>
            (await ledger.daemon.alertsDue({ limit: 100 })).some((a) => a.id === parked.operationId);
          const said = () =>
            lines.filter((l) => l.msg.startsWith("alert delivery to email did not succeed")).map((l) => l.msg);
          const ticks = [await daemon.tick(), await daemon.tick()];
          const [delivery] = await ledger.admin.list({ tenant: config.alerts.tenant });
          // Before: failed for good ("SMTP server refused the alert"), the alert acknowledged, never sent.
          expect({
            ticks,
            connections: smtp.connections(), // held back: a server refusing the account is not asked every tick
            delivery: delivery?.status,
            reason: delivery?.reason,
            stillDue: await due(),
            said: said().length,
          }).toEqual({
            ticks: [
              { failed: 0, undelivered: 1 },
              { failed: 0, undelivered: 1 },
            ],
            connections: 1,
            delivery: "pending",
            reason: expect.stringContaining(refusal.reply.slice(0, 3)),
            stillDue: true,
            said: 1, // the sink is failing: said at its first failure, not again each tick (sink-backoff.ts)
          });
          expect(delivery!.reason).toMatch(/refuses every alert.*nothing sent/);
          // The operator fixes the account, the relay or the sender; the hold ends.
          fixed = true;
          now += 11 * 60_000;
          expect(await daemon.tick()).toEqual({ failed: 0, undelivered: 0 });
          await daemon.tick();
          expect({ sent: smtp.taken.length, stillDue: await due() }).toEqual({ sent: 1, stillDue: false });
        },
        scaled(60_000),
      );

    for (const refusal of [
      { at: "DATA", reply: "552 5.3.4 Message size exceeds fixed limit" },
      { at: "DATA", reply: "554 5.7.1 Message rejected: its content looks like spam" },
    ] as const)
      it(`alert: an SMTP server refusing this message at DATA (${refusal.reply}) refuses this alert for good`, async () => {
        const smtp = await smtpServer(() => refusal);
        cleanups.push(smtp.close);
        const url = await freshDatabase(dialect);
        const config = parseConfig({
          ledger: url,
          alerts: {
            log: false,
            email: {
              smtp: { host: "127.0.0.1", port: smtp.port },
              from: "idem@example.test",
              to: ["ops@example.test"],
            },
          },
        });
        const ledger = await openLedger(url, { poolSize: 2, actions: alertActions(config, silent) });
        cleanups.push(() => ledger.close());
        const parked = await ledger.run(lostAnswer, { tenant: tenant(), key: ["r"], args: { note: "x" } });
        const daemon = new Daemon(ledger, config, silent, new DaemonMetrics(ledger, 1_000), "d-smtp-data");
        const ticks = [await daemon.tick(), await daemon.tick()];
        const [delivery] = await ledger.admin.list({ tenant: config.alerts.tenant });
        expect({
          ticks,
          connections: smtp.connections(),
          delivery: delivery?.status,
          stillDue: (await ledger.daemon.alertsDue({ limit: 100 })).some((a) => a.id === parked.operationId),
        }).toEqual({
          ticks: [
            { failed: 0, undelivered: 1 },
            { failed: 0, undelivered: 0 },
          ],
          connections: 1,
          delivery: "failed",
          stillDue: false,
        });
      });

    // A server that keeps writing continuation lines reset nodemailer's inactivity timeout with
    // each: before, the tick never ended (at DATA; at the greeting, nodemailer's 30 s greeting
    // timeout ended it). Never greeted: nothing sent, the alert stays due. After the body: it may
    // have been taken, a person decides.
    for (const [at, status, said] of [
      ["greeting", "pending", /no greeting from the SMTP server, nothing sent/],
      [
        "DATA",
        "needs_review",
        /no complete answer from the SMTP server within \d+ ms \(alerts\.email\.smtp\.deadlineMs\)/,
      ],
    ] as const)
      it(
        `alert: an SMTP server that keeps writing continuation lines at ${at} and never the last one is cut off within alerts.email.smtp.deadlineMs (${status}); the tick ends, and the sink is not asked again within it`,
        async () => {
          const smtp = await smtpServer(() => ({ at, trickle: true }));
          cleanups.push(smtp.close);
          const url = await freshDatabase(dialect);
          const config = parseConfig({
            ledger: url,
            alerts: {
              log: false,
              email: {
                smtp: { host: "127.0.0.1", port: smtp.port, deadlineMs: scaled(1_500) },
                from: "idem@example.test",
                to: ["ops@example.test"],
              },
            },
          });
          const ledger = await openLedger(url, { poolSize: 2, actions: alertActions(config, silent) });
          cleanups.push(() => ledger.close());
          const t = tenant();
          for (const k of ["r1", "r2"]) await ledger.run(lostAnswer, { tenant: t, key: [k], args: { note: "x" } });
          const daemon = new Daemon(ledger, config, silent, new DaemonMetrics(ledger, 1_000), "d-smtp-trickle");
          // Before: every line reset nodemailer's inactivity timeout, and the tick never ended.
          const tick = await daemon.tick();
          const deliveries = await ledger.admin.list({ tenant: config.alerts.tenant });
          expect({
            tick,
            connections: smtp.connections(),
            deliveries: deliveries.map((d) => d.status),
          }).toEqual({
            tick: { failed: 0, undelivered: 2 },
            connections: 1, // the second alert waits for the next tick, not for another deadline
            deliveries: [status],
          });
          const { events } = await ledger.get({ tenant: config.alerts.tenant, id: deliveries[0]!.id });
          expect(events.map((e) => e.reason).join("\n")).toMatch(said);
        },
        scaled(30_000),
      );

    it(
      "alert: a webhook delivery that ends in review (the answer lost after the body was sent) counts as undelivered, and so does a person's retry of it that ends there again",
      async () => {
        let requests = 0;
        const receiver = createServer((req, res) => {
          requests += 1;
          req.resume();
          req.on("end", () => void req.socket.destroy()); // read, then the connection drops: no answer
          void res;
        });
        await new Promise<void>((r) => receiver.listen(0, "127.0.0.1", r));
        cleanups.push(() => new Promise<void>((r) => receiver.close(() => r())));
        const url = await freshDatabase(dialect);
        const { log, lines } = capture();
        const config = parseConfig({
          ledger: url,
          alerts: {
            log: false,
            webhook: { url: `http://127.0.0.1:${(receiver.address() as AddressInfo).port}/hook`, format: "json" },
          },
          daemon: { intervalMs: 50 },
        });
        const ledger: Ledger = await openLedger(url, { poolSize: 2, actions: alertActions(config, log) });
        cleanups.push(() => ledger.close());
        const parked = await ledger.run(lostAnswer, { tenant: tenant(), key: ["r"], args: { note: "x" } });
        const daemon = new Daemon(ledger, config, log, new DaemonMetrics(ledger, 1_000), "d-in-review");
        const first = await daemon.tick();
        const [delivery] = await ledger.admin.list({ tenant: config.alerts.tenant });
        expect(delivery).toMatchObject({ status: "needs_review" });
        // Before: { undelivered: 0 }, and `idem daemon --once` exited 0 with no alert known to be sent.
        expect(first).toEqual({ failed: 0, undelivered: 1 });
        expect(await daemon.tick()).toEqual({ failed: 0, undelivered: 0 }); // said once, not every tick
        // A person checks the channel, finds nothing, and retries it: the receiver drops it again.
        const seen = (await ledger.get({ tenant: config.alerts.tenant, id: delivery!.id })).operation;
        await ledger.admin.retry({
          tenant: config.alerts.tenant,
          id: delivery!.id,
          reason: "not in the channel",
          actor: "ops",
          seen,
        });
        const retried = await daemon.tick();
        expect((await ledger.get({ tenant: config.alerts.tenant, id: delivery!.id })).operation.status).toBe(
          "needs_review",
        );
        expect(retried).toEqual({ failed: 0, undelivered: 1 });
        expect(requests).toBe(2);
        expect(lines.some((l) => l.msg.startsWith("alert delivery to webhook did not succeed"))).toBe(true);
        void parked;
      },
      scaled(60_000),
    );

    it(
      "alert: a credential refused while checking an unknown outcome is said as such (not 'failed'), once for the unknown attempt, not once a check",
      async () => {
        const url = await freshDatabase(dialect);
        const { log, lines } = capture();
        let now = Date.now();
        let calls = 0;
        // A charge whose answer was lost; every replay after is refused: the API key was revoked meanwhile.
        const charge = defineAction<{ amount: number }, { id: string }>({
          type: "pay.charge",
          capabilities: { dedupe: { retentionMs: 24 * 3_600_000 } },
          execute: async () => {
            calls += 1;
            if (calls === 1) throw new Error("timeout after send");
            throw Object.assign(new Error("401 api key revoked"), { status: 401 });
          },
          classify: (e) =>
            (e as { status?: number }).status === 401
              ? { kind: "permanent", reason: "api key revoked", alert: true }
              : { kind: "ambiguous", reason: "timeout after send" },
        });
        const config = parseConfig({ ledger: url, alerts: { log: true }, daemon: { intervalMs: 50, maxChecks: 6 } });
        const ledger = await openTestLedger(url, {
          clock: () => now,
          poolSize: 2,
          actions: [...alertActions(config, log), charge],
          budget: { attempts: 1 },
        });
        cleanups.push(() => ledger.close());
        const t = tenant();
        const first = await ledger.run(charge, { tenant: t, key: ["c"], args: { amount: 100 } });
        expect(first).toMatchObject({ state: "unknown" });
        const daemon = new Daemon(ledger, config, log, new DaemonMetrics(ledger, 1_000), "d-refused");
        for (let i = 0; i < 12; i++) {
          await daemon.tick();
          now += 10 * 60_000;
        }
        const alerts = lines.filter((l) => l.alert?.operationId === first.operationId);
        // Before: seven, one a check (attempts 2 to 7), each "failed on authentication or policy".
        expect(alerts.map((a) => a.alert!.kind)).toEqual(["check_refused", "needs_review"]);
        expect(alerts[0]!.msg).toMatch(
          /outcome unknown; a credential or the server's certificate was refused while checking it/,
        );
        expect(alerts[0]!.msg).not.toMatch(/failed/);
        expect(alerts[0]!.alert).toMatchObject({ status: "unknown", attempt: 1 });
        expect(calls).toBeGreaterThan(2); // it was checked again and again, and refused each time
      },
      scaled(60_000),
    );

    it(
      "alert: an operation the ledger saw take effect twice is said as such, not 'failed on authentication or policy'",
      async () => {
        const url = await freshDatabase(dialect);
        const { log, lines } = capture();
        let now = Date.now();
        // No dedupe: attempt 1's request is out past its lease; a lookup reads before it commits,
        // so attempt 3 sends too, and both commit (the core's late-answers test, "two different receipts").
        const effects: string[] = [];
        const opens: (() => void)[] = [];
        const gates = [0, 1].map(() => new Promise<void>((r) => opens.push(r)));
        let calls = 0;
        const create = defineAction<{ to: string }, { id: string }>({
          type: "crm.create",
          capabilities: { lookup: true },
          execute: async () => {
            await gates[calls++];
            effects.push(`obj_${effects.length + 1}`);
            return { id: effects.at(-1)! };
          },
          reconcile: async () =>
            effects.length
              ? { found: true as const, receipt: { id: effects[0]! } }
              : { found: false as const, proof: "absent" as const, reason: "not at the provider" },
        });
        const config = parseConfig({ ledger: url, alerts: { log: true }, daemon: { intervalMs: 50 } });
        const ledger = await openTestLedger(url, {
          clock: () => now,
          poolSize: 2,
          leaseMs: 30_000,
          actions: [...alertActions(config, log), create],
          budget: { attempts: 1 },
        });
        cleanups.push(() => ledger.close());
        const t = tenant();
        const first = ledger.run(create, { tenant: t, key: ["c"], args: { to: "x" } });
        await until(() => calls === 1);
        now += 31_000;
        const [op] = await ledger.admin.list({ tenant: t });
        const stop = new AbortController();
        stop.abort();
        await ledger.daemon.settle({ tenant: t, id: op!.id, actor: "daemon", stop: stop.signal });
        const third = ledger.run(create, { tenant: t, key: ["c"], args: { to: "x" } });
        await until(() => calls === 2);
        opens[0]!();
        await first;
        opens[1]!();
        expect(await third).toMatchObject({ status: "succeeded", receipt: { id: "obj_2" }, replayed: false });
        const daemon = new Daemon(ledger, config, log, new DaemonMetrics(ledger, 1_000), "d-twice");
        await daemon.tick();
        const alerts = lines.filter((l) => l.alert?.operationId === op!.id);
        // Before: "auth_failure", "… failed on authentication or policy: two effects: …".
        expect(alerts.map((a) => a.alert!.kind)).toEqual(["two_effects"]);
        expect(alerts[0]!.msg).toMatch(/took effect twice .*: two effects: attempt 3's request took effect too/);
        expect(alerts[0]!.alert).toMatchObject({ status: "succeeded" });
      },
      scaled(60_000),
    );

    it(
      "alert: two receipts that could not be stored, from two attempts, are said as two effects, not only 'needs a person's review'",
      async () => {
        const url = await freshDatabase(dialect);
        const { log, lines } = capture();
        let now = Date.now();
        // As the core's known-performed test: attempt 1's request is out past its lease, a lookup
        // finds nothing yet, attempt 3 sends; both take effect, neither receipt can be stored.
        const effects: string[] = [];
        let hold: Promise<void> | undefined;
        let release: () => void = () => {};
        let calls = 0;
        const create = defineAction<{ to: string }, { id: string; pad: string }>({
          type: "crm.create",
          capabilities: { lookup: true },
          execute: async () => {
            calls += 1;
            const h = hold;
            hold = undefined;
            await h;
            effects.push(`obj_${effects.length + 1}`);
            return { id: effects.at(-1)!, pad: "x".repeat(200) };
          },
          reconcile: async () =>
            effects.length
              ? { found: true as const, receipt: { id: effects[0]!, pad: "" } }
              : { found: false as const, proof: "absent" as const, reason: "not at the provider" },
        });
        const config = parseConfig({ ledger: url, alerts: { log: true }, daemon: { intervalMs: 50 } });
        const ledger = await openTestLedger(url, {
          clock: () => now,
          poolSize: 2,
          leaseMs: 30_000,
          maxResultBytes: 50,
          actions: [...alertActions(config, log), create],
          budget: { attempts: 1 },
        });
        cleanups.push(() => ledger.close());
        const t = tenant();
        hold = new Promise<void>((r) => (release = r));
        const first = ledger.run(create, { tenant: t, key: ["c"], args: { to: "x" } }).catch((e: unknown) => e);
        await until(() => calls === 1);
        now += 31_000;
        const [op] = await ledger.admin.list({ tenant: t });
        const stop = new AbortController();
        stop.abort();
        await ledger.daemon.settle({ tenant: t, id: op!.id, actor: "daemon", stop: stop.signal });
        await expect(ledger.run(create, { tenant: t, key: ["c"], args: { to: "x" } })).rejects.toMatchObject({
          name: "PayloadTooLargeError",
        });
        const daemon = new Daemon(ledger, config, log, new DaemonMetrics(ledger, 1_000), "d-twice-unstored");
        await daemon.tick(); // the parking's alert: a person decides
        release();
        expect(await first).toMatchObject({ name: "PayloadTooLargeError" });
        expect(effects).toHaveLength(2);
        await daemon.tick();
        const alerts = lines.filter((l) => l.alert?.operationId === op!.id);
        // Before: ["needs_review", "needs_review"], the second "needs a person's review: two effects: …".
        expect(alerts.map((a) => a.alert!.kind)).toEqual(["needs_review", "two_effects"]);
        expect(alerts[1]!.msg).toMatch(
          /took effect twice .*: two effects: attempt 1's request took effect, and so did attempt 3's/,
        );
        expect(alerts[1]!.alert).toMatchObject({ status: "needs_review" });
      },
      scaled(60_000),
    );

    it(
      "alert: a receipt that names two effects and could not be stored is said as two effects, not only 'needs a person's review'",
      async () => {
        const url = await freshDatabase(dialect);
        const { log, lines } = capture();
        // The provider answered one request with the two effects made under its key (its ids name
        // obj_1 and obj_2), in a receipt too large to store: parked for a person, "two effects" first.
        const create = defineAction<{ to: string }, { ids: string[]; pad: string }>({
          type: "crm.create",
          capabilities: {},
          execute: async () => ({ ids: ["obj_1", "obj_2"], pad: "x".repeat(200) }),
          effectId: (r) => r.ids,
        });
        const config = parseConfig({ ledger: url, alerts: { log: true }, daemon: { intervalMs: 50 } });
        const ledger = await openTestLedger(url, {
          poolSize: 2,
          leaseMs: 30_000,
          maxResultBytes: 50,
          actions: [...alertActions(config, log), create],
        });
        cleanups.push(() => ledger.close());
        const t = tenant();
        await expect(ledger.run(create, { tenant: t, key: ["c"], args: { to: "x" } })).rejects.toMatchObject({
          name: "PayloadTooLargeError",
        });
        const [op] = await ledger.admin.list({ tenant: t });
        expect(op).toMatchObject({ status: "needs_review" });
        expect(op!.reason).toMatch(/^two effects: the receipt names 2 effects \(obj_1, obj_2\)/);
        const daemon = new Daemon(ledger, config, log, new DaemonMetrics(ledger, 1_000), "d-two-named");
        await daemon.tick();
        const alerts = lines.filter((l) => l.alert?.operationId === op!.id);
        // Before: ["needs_review"], "needs a person's review: two effects: …".
        expect(alerts.map((a) => a.alert!.kind)).toEqual(["two_effects"]);
        expect(alerts[0]!.msg).toMatch(/took effect twice .*: two effects: the receipt names 2 effects/);
        expect(alerts[0]!.alert).toMatchObject({ status: "needs_review" });
      },
      scaled(60_000),
    );
  });
}

describe("the daemon's alert sinks", () => {
  it("a Daemon given a config with no alert sink is refused, as `idem daemon` refuses it", async () => {
    const ledger = await openLedger("sqlite::memory:");
    try {
      const config = parseConfig({ ledger: "sqlite::memory:", alerts: { log: false } });
      // Before: built, and each tick acknowledged every alert with nowhere to send it.
      expect(() => new Daemon(ledger, config, silent, new DaemonMetrics(ledger, 1_000), "d-none")).toThrow(ConfigError);
      expect(() => new Daemon(ledger, config, silent, new DaemonMetrics(ledger, 1_000), "d-none")).toThrow(
        /alerts: no sink/,
      );
    } finally {
      await ledger.close();
    }
  });
});

describe("alert sinks read a socket's error by where it came", () => {
  const config = parseConfig({
    ledger: "sqlite::memory:",
    alerts: {
      log: false,
      webhook: { url: "http://127.0.0.1:9/hook", format: "json" },
      email: { from: "idem@example.test", to: ["ops@example.test"], smtp: { host: "127.0.0.1", port: 9 } },
    },
  });
  const classify = (type: string) => {
    const action = alertActions(config, silent).find((a) => a.type === type);
    if (!action) throw new Error(`no sink of type ${type}`);
    // The sinks' classifiers read the error alone, not the operation.
    return (error: unknown) => action.classify(error, {} as OperationContext);
  };
  const socketError = (code: string, syscall: string) =>
    Object.assign(new Error(`${syscall} ${code}`), { code, errno: -113, syscall });

  it.each(["EHOSTUNREACH", "ENETUNREACH"])(
    "%s at connect: nothing sent; on an open connection: the alert may have been delivered",
    (code) => {
      // fetch throws TypeError('fetch failed') with the socket's error as its cause.
      const fetchFailed = (syscall: string) => new TypeError("fetch failed", { cause: socketError(code, syscall) });
      expect(classify("idem.alert.webhook")(fetchFailed("connect"))).toMatchObject({ kind: "transient" });
      // Before: "not reached, nothing sent", whatever the phase: sent again, delivered twice.
      expect(classify("idem.alert.webhook")(fetchFailed("read"))).toMatchObject({ kind: "ambiguous" });
      // nodemailer renames the socket's error (code ESOCKET, originalCode) and keeps the rest.
      const smtp = (syscall: string) => Object.assign(socketError("ESOCKET", syscall), { originalCode: code });
      expect(classify("idem.alert.email")(smtp("connect"))).toMatchObject({ kind: "transient" });
      expect(classify("idem.alert.email")(smtp("read"))).toMatchObject({ kind: "ambiguous" });
    },
  );

  it("undici's connect timeout (UND_ERR_CONNECT_TIMEOUT): never connected, nothing sent", () => {
    const timeout = new TypeError("fetch failed", {
      cause: Object.assign(
        new Error("Connect Timeout Error (attempted address: hooks.example:443, timeout: 10000ms)"),
        {
          code: "UND_ERR_CONNECT_TIMEOUT",
        },
      ),
    });
    // Before: "delivery unknown": in review, the alert counted as delivered, never sent.
    expect(classify("idem.alert.webhook")(timeout)).toMatchObject({
      kind: "transient",
      reason: expect.stringMatching(/not reached \(UND_ERR_CONNECT_TIMEOUT\): nothing sent/),
    });
  });

  it.each([500, 502, 504])(
    "a webhook answering %i is tried again (transient), never 'may have been sent'",
    (status) => {
      const answered = Object.assign(new Error(`webhook answered ${status}`), { status });
      expect(classify("idem.alert.webhook")(answered)).toMatchObject({ kind: "transient" });
    },
  );

  /** An error as nodemailer's SMTP connection makes one (`_formatError`): code, command, the server's reply. */
  const smtpRefusal = (code: string, command: string, response: string) =>
    Object.assign(new Error(`failed: ${response}`), {
      code,
      command,
      response,
      responseCode: Number(response.slice(0, 3)),
    });
  it.each([
    ["EENVELOPE", "MAIL FROM", "530 5.7.0 Authentication required"],
    ["EENVELOPE", "MAIL FROM", "550 5.7.1 Sender address rejected: not owned by user"],
    ["EENVELOPE", "RCPT TO", "554 5.7.1 <ops@example.test>: Relay access denied"],
    ["EENVELOPE", "RCPT TO", "550 5.1.1 <ops@example.test>: Recipient address rejected: User unknown"],
    ["EPROTOCOL", "CONN", "554 5.7.1 No SMTP service for this client"],
    ["EPROTOCOL", "EHLO", "550 5.7.1 Access denied"],
  ])("an SMTP %s at %s (%s) refuses every alert: held back like a refused sign-in", (code, command, response) => {
    expect(classify("idem.alert.email")(smtpRefusal(code, command, response))).toMatchObject({
      kind: "rate_limited",
      retryAfterMs: 10 * 60_000,
      reason: expect.stringContaining(response),
    });
  });
  it.each([
    ["EMESSAGE", "DATA", "552 5.3.4 Message size exceeds fixed limit"],
    ["EMESSAGE", "DATA", "554 5.7.1 Message rejected: its content looks like spam"],
    ["EENVELOPE", "DATA", "554 5.5.1 Data command failed"],
    ["EENVELOPE", "MAIL FROM", "552 5.3.4 Message size exceeds fixed maximum message size"],
  ])("an SMTP %s at %s (%s) refuses this alert alone: permanent", (code, command, response) => {
    expect(classify("idem.alert.email")(smtpRefusal(code, command, response))).toMatchObject({ kind: "permanent" });
  });
});
