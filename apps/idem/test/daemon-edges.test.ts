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
import { defineAction, openLedger, type OperationContext } from "@idem/core";
import { Daemon, DaemonMetrics, alertActions, parseConfig } from "@idem/cli";
import { pino } from "pino";
import { DIALECTS, freshDatabase, scaled, startChild } from "@idem/testkit";
import { fileURLToPath } from "node:url";
import { CLI } from "./support.js";

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
          // The receiver refused it (tried again within the delivery's retry budget: nothing was delivered).
          expect(hook.asked()).toBeGreaterThanOrEqual(1);
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
        const ledger = await openLedger(url, { poolSize: 2, actions: alertActions(config, silent) });
        cleanups.push(() => ledger.close());
        const daemon = new Daemon(ledger, config, silent, new DaemonMetrics(ledger, 1_000), "d-scope");
        await new Promise((r) => setTimeout(r, 50)); // due
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
        const ledger = await openLedger(url, { poolSize: 2, actions: alertActions(config, silent) });
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
        const deadline = Date.now() + 10_000;
        for (;;) {
          const [op] = await ledger.admin.list({ tenant: t });
          if (op && (await ledger.get({ tenant: t, id: op.id })).args !== null) {
            id = op.id;
            break;
          }
          if (Date.now() > deadline) throw new Error("the args were never stored");
          await new Promise((r) => setTimeout(r, 20));
        }
        await new Promise((r) => setTimeout(r, 400));
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
  });
}

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
});
