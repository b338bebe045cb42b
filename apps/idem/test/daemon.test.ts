/**
 * The daemon as a real child process, on SQLite and Postgres: settling rows left by dead workers
 * and unknown outcomes at the providers' sandboxes, alerting once, sharing work between replicas,
 * stopping cleanly. Effects and reconciliations are counted in files and at the sandboxes.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createServer } from "node:http";
import { createServer as createNetServer, type AddressInfo } from "node:net";
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { openLedger, type Ledger, type LedgerOptions } from "@idem/core";
import { databaseOf, openTestLedger } from "@idem/core/testing";
import { Daemon, DaemonMetrics, alertActions, parseConfig } from "@idem/cli";
import { pino } from "pino";
import { HubSpotSandbox, MailSandbox, SENDER, StripeSandbox } from "@idem/sandbox";
import { DIALECTS, freePort, freshDatabase, kill9, scaled, startChild, tempDir, type Child } from "@idem/testkit";
import { emailActions } from "@idem/email";
import { hubspotActions } from "@idem/hubspot";
import { stripeActions } from "@idem/stripe";
import { operationVersion } from "../src/output.js";
import { fileAction, lines } from "./fixtures/file-actions.js";
import { CLI, CONFIG, WORKER, idem, moreTicks, until, webhookReceiver } from "./support.js";

let n = 0;
const tenant = () => `t${++n}-${Math.random().toString(36).slice(2, 7)}`;

function startDaemon(env: Record<string, string>, name = "d1"): Child {
  return startChild(CLI, ["--config", CONFIG, "daemon", "--name", name], env);
}
async function stopDaemon(d: Child): Promise<void> {
  d.proc.kill("SIGTERM");
  const { code, stderr } = await d.exited;
  expect(code, stderr).toBe(0);
}

/** A daemon in this process, on `ledger`, logging nothing. */
function inProcess(ledger: Ledger, config: ReturnType<typeof parseConfig>, name: string): Daemon {
  return new Daemon(ledger, config, pino({ level: "silent" }), new DaemonMetrics(ledger, 1_000), name);
}

/** An action whose answer is always lost and that nothing can look up: each run of it ends in review, alerted. */
function lostAnswer(dir: string): ReturnType<typeof fileAction> {
  return {
    ...fileAction("neither", dir),
    execute: async () => {
      throw new Error("socket hang up");
    },
  };
}

/** A ledger on a database of its own, for a test that reads every due alert. */
async function ledgerOfItsOwn(
  dialect: (typeof DIALECTS)[number],
  actions: LedgerOptions["actions"] = [],
): Promise<Ledger> {
  return openLedger(await freshDatabase(dialect), { poolSize: 2, budget: { baseDelayMs: 10 }, actions });
}

/** `lookup`'s effect happens, then its answer is lost: unknown, settled by looking it up. */
function answerLost(lookup: ReturnType<typeof fileAction>): ReturnType<typeof fileAction> {
  return {
    ...lookup,
    execute: async (args, op) => {
      await lookup.execute(args, op);
      throw new Error("socket hang up");
    },
  };
}

for (const dialect of DIALECTS) {
  describe(`idem daemon on ${dialect}`, () => {
    let url = "";
    let ledger: Ledger;
    let hook: Awaited<ReturnType<typeof webhookReceiver>>;
    beforeAll(async () => {
      url = await freshDatabase(dialect);
      ledger = await openLedger(url, { poolSize: 2 });
      hook = await webhookReceiver();
    });
    afterAll(async () => {
      await ledger.close();
      await hook.close();
    });
    const alertsFor = (operationId: string) => hook.alerts.filter((a) => a.operationId === operationId);

    it(
      "a row left running by a SIGKILLed worker: one stuck alert, then replayed with the same key",
      async () => {
        const dir = tempDir();
        const t = tenant();
        const worker = startChild(WORKER, [], {
          LEDGER_URL: url,
          TENANT: t,
          KEY: "job",
          EFFECT_DIR: dir,
          KIND: "dedupe",
          LEASE_MS: "6000",
        });
        await worker.waitFor(/^effect-done$/);
        await kill9(worker);
        const [row] = await ledger.admin.list({ tenant: t });
        const metrics = await freePort();
        const daemon = startDaemon({
          LEDGER_URL: url,
          EFFECT_DIR: dir,
          WEBHOOK_URL: hook.url,
          STUCK_MS: "1000",
          METRICS_PORT: String(metrics),
        });
        try {
          await until(
            async () => (await ledger.get({ tenant: t, id: row!.id })).operation.status === "succeeded",
            90_000,
            "the daemon to settle the row",
          );
          await moreTicks(metrics); // a few more ticks: no second alert
        } finally {
          await stopDaemon(daemon);
        }
        expect(alertsFor(row!.id).map((a) => a.kind)).toEqual(["stuck"]);
        expect(lines(join(dir, "effects"))).toHaveLength(1);
        const { operation, events } = await ledger.get({ tenant: t, id: row!.id });
        expect(operation).toMatchObject({ attempt: 2, result: { id: lines(join(dir, "effects"))[0]![1] } });
        expect(events.some((e) => e.actor === "idem-daemon:d1")).toBe(true);
      },
      scaled(240_000),
    );

    it(
      "unknown outcomes at Stripe, HubSpot and the mail server are settled; the unprovable reach review with one alert each",
      async () => {
        const dir = tempDir();
        const t = tenant();
        const stripe = new StripeSandbox();
        const hubspot = new HubSpotSandbox();
        const mail = new MailSandbox({ copyDelayMs: 1_500 });
        const [s, h, m] = await Promise.all([stripe.start(), hubspot.start(), mail.start()]);
        try {
          const agentLedger = await openLedger(url, { poolSize: 2, budget: { attempts: 1 } });
          const crm = hubspotActions({ accessToken: h.accessToken, basePath: h.basePath });
          await crm.ensureSchema(["contacts"]);
          stripe.faults.add({ kind: "drop_after_commit", times: 2 });
          hubspot.faults.add({ kind: "drop_after_commit", match: { method: "POST" } });
          hubspot.faults.add({ kind: "bad_gateway", match: { method: "GET" } }); // the agent's own read-back fails too
          mail.faults.add({ kind: "hold_reply", delayMs: 5_000 });
          const smtpAuth = { user: SENDER.user, pass: SENDER.pass };
          const mailer = emailActions({
            smtp: { host: "127.0.0.1", port: m.smtp.port, auth: smtpAuth, timeoutMs: 1_000, requireTLS: false },
            imap: { host: "127.0.0.1", port: m.imap.port, auth: smtpAuth, requireTLS: false },
            from: SENDER.user,
            copy: { mode: "provider-saves" },
            settleMs: 60_000,
          });
          const neither = fileAction("neither", dir);
          const outs = {
            stripe: await agentLedger.run(
              stripeActions({ apiKey: s.apiKey, host: "127.0.0.1", port: s.port, protocol: "http" })
                .paymentIntentsCreate,
              {
                tenant: t,
                key: ["pi"],
                args: {
                  amount: 900,
                  currency: "usd",
                  payment_method: "pm_card_visa",
                  confirm: true,
                  automatic_payment_methods: { enabled: true, allow_redirects: "never" },
                },
              },
            ),
            hubspot: await agentLedger.run(crm.create("contacts"), {
              tenant: t,
              key: ["lead"],
              args: { properties: { email: "lead@example.test" } },
            }),
            email: await agentLedger.run(mailer.send, {
              tenant: t,
              key: ["report"],
              args: { to: "client@example.test", subject: "Report", text: "x" },
            }),
          };
          // an effect nothing can prove: the runner parks it for review at once
          const failing = {
            ...neither,
            type: "file.neither",
            execute: async () => {
              throw new Error("socket hang up");
            },
          };
          const review1 = await agentLedger.run(failing, { tenant: t, key: ["r1"], args: { note: "x" } });
          const review2 = await agentLedger.run(failing, { tenant: t, key: ["r2"], args: { note: "x" } });
          await agentLedger.close();
          expect(outs.stripe).toMatchObject({ status: "pending_verification", state: "unknown" });
          expect(outs.hubspot).toMatchObject({ status: "pending_verification", state: "unknown" });
          expect(outs.email).toMatchObject({ status: "pending_verification", state: "unknown" });
          expect(review1).toMatchObject({ state: "needs_review" });

          const metrics = await freePort();
          const daemon = startDaemon({
            LEDGER_URL: url,
            EFFECT_DIR: dir,
            WEBHOOK_URL: hook.url,
            METRICS_PORT: String(metrics),
            STRIPE_PORT: String(s.port),
            STRIPE_KEY: s.apiKey,
            HUBSPOT_BASE: h.basePath,
            HUBSPOT_TOKEN: h.accessToken,
            SMTP_PORT: String(m.smtp.port),
            IMAP_PORT: String(m.imap.port),
            MAIL_USER: SENDER.user,
            MAIL_PASS: SENDER.pass,
          });
          try {
            await until(
              async () => {
                const ops = await Promise.all(
                  Object.values(outs).map((o) => ledger.get({ tenant: t, id: o.operationId })),
                );
                return ops.every((o) => o.operation.status === "succeeded");
              },
              90_000,
              "Stripe, HubSpot and email operations to succeed",
            ).catch(async (e) => {
              const ops = await Promise.all(
                Object.values(outs).map((o) => ledger.get({ tenant: t, id: o.operationId })),
              );
              throw new Error(
                `${(e as Error).message}\n${ops.map((o) => `${o.operation.action} ${o.operation.status} ${o.operation.reason}`).join("\n")}\n${daemon.lines.slice(-15).join("\n")}`,
              );
            });
            await until(
              () => alertsFor(review1.operationId).length > 0 && alertsFor(review2.operationId).length > 0,
              60_000,
              "review alerts",
            );
            await moreTicks(metrics); // a few more ticks: no second alert, none for the settled ones
          } finally {
            await stopDaemon(daemon);
          }
          expect(stripe.count("payment_intents")).toBe(1);
          expect(hubspot.count("contacts")).toBe(1);
          expect(mail.count()).toBe(1);
          for (const r of [review1, review2])
            expect(alertsFor(r.operationId).map((a) => a.kind)).toEqual(["needs_review"]);
          for (const o of Object.values(outs)) expect(alertsFor(o.operationId)).toEqual([]);
        } finally {
          await Promise.all([stripe.close(), hubspot.close(), mail.close()]);
        }
      },
      scaled(240_000),
    );

    it(
      "SIGTERM during reconciliation: the lookup in flight finishes, nothing is lost, nothing is done twice",
      async () => {
        const dir = tempDir();
        const t = tenant();
        const agent = await openLedger(url, { poolSize: 2, budget: { attempts: 1 } });
        const lookup = fileAction("lookup", dir);
        const ids: string[] = [];
        for (let i = 0; i < 3; i++) {
          const ambiguous = {
            ...lookup,
            execute: async (a: { note: string }, op: Parameters<typeof lookup.execute>[1]) => {
              await lookup.execute(a, op);
              throw new Error("timeout after send");
            },
          };
          const out = await agent.run(
            {
              ...ambiguous,
              reconcile: async () =>
                ({ found: false, proof: "inconclusive", reason: "index lags", retryAfterMs: 0 }) as const,
            },
            { tenant: t, key: [`k${i}`], args: { note: "x" } },
          );
          expect(out).toMatchObject({ state: "unknown" });
          ids.push(out.operationId);
        }
        await agent.close();
        const env = {
          LEDGER_URL: url,
          EFFECT_DIR: dir,
          WEBHOOK_URL: hook.url,
          RECONCILE_DELAY_MS: "1500",
          // Longer than a lookup: a settlement ends by its claim's end (a lookup not answered by
          // then is given up). The rows the first daemon does not settle are given back at its
          // stop, due at once for the second.
          CLAIM_MS: "10000",
        };
        const first = startDaemon(env);
        await until(() => lines(join(dir, "reconciles")).length >= 1, 90_000, "a reconciliation to start");
        await stopDaemon(first); // returns after the reconcile in flight completed
        const settledBefore = (await Promise.all(ids.map((id) => ledger.get({ tenant: t, id })))).filter(
          (o) => o.operation.status === "succeeded",
        ).length;
        expect(settledBefore).toBeGreaterThanOrEqual(1);
        expect(await ledger.admin.list({ tenant: t, status: "running" })).toEqual([]); // no half-taken row left behind
        const second = startDaemon(env, "d2");
        try {
          await until(
            async () =>
              (await Promise.all(ids.map((id) => ledger.get({ tenant: t, id })))).every(
                (o) => o.operation.status === "succeeded",
              ),
            90_000,
            "the rest to settle",
          );
        } finally {
          await stopDaemon(second);
        }
        const perKey = new Map<string, number>();
        for (const [key] of lines(join(dir, "reconciles"))) perKey.set(key!, (perKey.get(key!) ?? 0) + 1);
        expect([...perKey.values()]).toEqual([1, 1, 1]);
        expect(lines(join(dir, "effects"))).toHaveLength(3);
      },
      scaled(240_000),
    );

    it(
      "an alert whose webhook delivery may have been sent is in review: the source alert is acked, the failure logged once, not every tick",
      async () => {
        const dir = tempDir();
        const t = tenant();
        let requests = 0;
        // Reads the alert, then drops the connection: the delivery may have been received (ambiguous).
        const resetting = createServer((req, _res) => {
          requests += 1;
          req.resume();
          req.on("end", () => req.socket.destroy());
        });
        await new Promise<void>((r) => resetting.listen(0, "127.0.0.1", r));
        const webhook = `http://127.0.0.1:${(resetting.address() as AddressInfo).port}/hook`;
        try {
          const neither = fileAction("neither", dir);
          const failing = {
            ...neither,
            execute: async () => {
              throw new Error("socket hang up");
            },
          };
          const parked = await ledger.run(failing, { tenant: t, key: ["r"], args: { note: "x" } });
          expect(parked).toMatchObject({ state: "needs_review" });
          const metrics = await freePort();
          const daemon = startDaemon(
            { LEDGER_URL: url, EFFECT_DIR: dir, WEBHOOK_URL: webhook, METRICS_PORT: String(metrics) },
            "d-review",
          );
          const failures = () =>
            daemon.lines.filter((l) => l.includes(parked.operationId) && l.includes("did not succeed"));
          try {
            await until(
              async () => !(await ledger.daemon.alertsDue({ limit: 1_000 })).some((a) => a.id === parked.operationId),
              60_000,
              "the source alert to be acked",
            );
            await until(() => failures().length >= 1, 30_000, "the failure to be logged");
            await moreTicks(metrics, 10); // ten more ticks: logged once, not sent again
          } finally {
            await stopDaemon(daemon);
          }
          expect(failures()).toHaveLength(1);
          expect(requests).toBe(1);
        } finally {
          await new Promise((r) => resetting.close(r));
        }
      },
      scaled(240_000),
    );

    /**
     * A needs_review alert whose webhook delivery went to review (the receiver read it, then the
     * connection dropped), after one `idem daemon --once` pass on a database of its own; the
     * receiver answers every later request. `pass` runs `idem daemon --once` again.
     */
    async function deliveryInReview() {
      const own = await freshDatabase(dialect); // each pass reads every due alert: none of the other tests'
      const ownLedger = await openLedger(own, { poolSize: 2 });
      const dir = tempDir();
      let requests = 0;
      const received: Record<string, unknown>[] = [];
      const receiver = createServer((req, res) => {
        const first = ++requests === 1;
        let body = "";
        req.on("data", (c) => (body += c));
        req.on("end", () => {
          if (first) return void req.socket.destroy();
          received.push(JSON.parse(body) as Record<string, unknown>);
          res.writeHead(200).end("ok");
        });
      });
      await new Promise<void>((r) => receiver.listen(0, "127.0.0.1", r));
      const env = {
        LEDGER_URL: own,
        EFFECT_DIR: dir,
        WEBHOOK_URL: `http://127.0.0.1:${(receiver.address() as AddressInfo).port}/hook`,
      };
      const pass = async (config = CONFIG, exit = 0) => {
        const out = await idem(["--config", config, "daemon", "--once", "--name", "d-pass"], env);
        expect(out.code, out.stderr + out.stdout).toBe(exit);
        return out;
      };
      const parked = await ownLedger.run(lostAnswer(dir), { tenant: tenant(), key: ["r"], args: { note: "x" } });
      expect(parked).toMatchObject({ state: "needs_review" });
      // No sink said it took the alert: a cron job hears of it (before: exit 0).
      const first = await pass(CONFIG, 1);
      expect(first.stderr).toMatch(/1 alert delivery\(ies\) were not taken by their sink .*no answer: in review/);
      const [delivery, ...more] = (await ownLedger.admin.list({ tenant: "idem-alerts" })).filter(
        (d) => d.action === "idem.alert.webhook",
      );
      expect(more).toEqual([]);
      expect(delivery).toMatchObject({ status: "needs_review" });
      expect(requests).toBe(1);
      return {
        own,
        ledger: ownLedger,
        delivery: delivery!,
        parked,
        pass,
        requests: () => requests,
        received,
        /** `idem` with this ledger's environment. */
        idem: (args: string[]) => idem(args, env),
        /** `idem retry` of the delivery, as a person types it. */
        retry: async (...flags: string[]) => {
          const out = await idem(
            [
              "--config",
              CONFIG,
              "retry",
              delivery!.id,
              "--tenant",
              "idem-alerts",
              "--seen",
              operationVersion(delivery!),
              "--reason",
              "the channel shows no such alert",
              ...flags,
            ],
            env,
          );
          expect(out.code, out.stderr).toBe(0);
          return out;
        },
        close: async () => {
          await ownLedger.close();
          await new Promise((r) => receiver.close(r));
        },
      };
    }

    it(
      "an alert delivery in review that a person retries (idem retry) is sent by the daemon's next pass, once",
      async () => {
        const s = await deliveryInReview();
        try {
          await s.retry();
          await s.pass();
          // Before: the delivery stayed pending for ever; no pass asked the receiver again.
          expect(s.requests()).toBe(2);
          expect(s.received).toEqual([
            expect.objectContaining({ operationId: s.parked.operationId, kind: "needs_review" }),
          ]);
          const { operation, events } = await s.ledger.get({ tenant: "idem-alerts", id: s.delivery.id });
          expect(operation.status).toBe("succeeded");
          expect(events.at(-1)?.actor).toBe("idem-daemon:d-pass");
          await s.pass();
          expect(s.requests()).toBe(2); // once
        } finally {
          await s.close();
        }
      },
      scaled(240_000),
    );

    it(
      "idem retry --now of an alert delivery sends it at once, with its sink",
      async () => {
        const s = await deliveryInReview();
        try {
          // Before: the retry was recorded, then `no action of type "idem.alert.webhook" is registered`, exit 1.
          const out = await s.retry("--now");
          expect(out.stdout).toMatch(/succeeded/);
          expect(s.requests()).toBe(2);
          await s.pass();
          expect(s.requests()).toBe(2);
        } finally {
          await s.close();
        }
      },
      scaled(240_000),
    );

    it(
      "a retried alert delivery is left to a daemon with its sink: one without it neither fails nor hides it, and says so (retry --now too)",
      async () => {
        const s = await deliveryInReview();
        try {
          const noWebhook = join(tempDir(), "idem.config.json");
          writeFileSync(noWebhook, JSON.stringify({ ledger: s.own, alerts: { log: true } }));
          // --now with a config that cannot run it: the retry is recorded, and it says so.
          const now = await s.idem([
            "--config",
            noWebhook,
            "retry",
            s.delivery.id,
            "--tenant",
            "idem-alerts",
            "--seen",
            operationVersion(s.delivery),
            "--reason",
            "the channel shows no such alert",
            "--now",
          ]);
          // Before: `no action of type "idem.alert.webhook" is registered`, exit 1, silent on the retry.
          // Exit 1, not 2 (bad usage: nothing done): the retry is recorded.
          expect(now.code, now.stderr).toBe(1);
          expect(now.stderr).toMatch(
            /retried: the retry of .* is recorded; not run now: this config has no action of type idem\.alert\.webhook .*; it is now pending at attempt \d+: see idem show/,
          );
          const without = await s.pass(noWebhook);
          // Before: failed ("no webhook alert sink"), and the replica with the sink read that as
          // the final answer for the alert: never sent.
          const { operation } = await s.ledger.get({ tenant: "idem-alerts", id: s.delivery.id });
          expect(operation.status).toBe("pending");
          expect(without.stdout).toMatch(
            /alert deliveries to webhook, email .*are left to a daemon whose config has that sink/,
          );
          expect(s.requests()).toBe(1);
          // Nor claimed by it: the daemon with the sink sends it at its next pass, not a claim later.
          await s.pass();
          await s.pass();
          expect(s.requests()).toBe(2);
          expect(s.received).toEqual([expect.objectContaining({ operationId: s.parked.operationId })]);
          expect((await s.ledger.get({ tenant: "idem-alerts", id: s.delivery.id })).operation.status).toBe("succeeded");
        } finally {
          await s.close();
        }
      },
      scaled(240_000),
    );

    it(
      "an operation the daemon settles keeps its application's retention (null never expires) whatever the config's, and a redelivered job a month later is answered from the ledger",
      async () => {
        const own = await freshDatabase(dialect); // idem daemon --once settles every due row: only this test's
        const dir = tempDir();
        const t = tenant();
        const lookup = fileAction("lookup", dir);
        // The application keeps its operations for ever; its worker's answer was lost after the effect.
        const agent = await openLedger(own, { retentionMs: null, budget: { attempts: 1, baseDelayMs: 1 } });
        const lost = await agent.run(answerLost(lookup), { tenant: t, key: ["job"], args: { note: "x" } });
        expect(lost).toMatchObject({ status: "pending_verification", state: "unknown" });
        const id = lost.operationId;
        await until(
          async () => ((await agent.get({ tenant: t, id })).operation.nextCheckAt ?? 0) < Date.now(),
          10_000,
          "the unknown outcome to be due",
        );
        await agent.close();
        // The daemon's config keeps its own completions a minute: the application's row keeps its own.
        const env = { LEDGER_URL: own, EFFECT_DIR: dir, WEBHOOK_URL: hook.url, RETENTION_MS: "60000" };
        const pass = await idem(["--config", CONFIG, "daemon", "--once", "--name", "d-keep"], env);
        expect(pass.code, pass.stderr + pass.stdout).toBe(0);
        // A month and a day later, by the ledger's clock: the operator's prune, then the job redelivered.
        const later = await openTestLedger(own, {
          retentionMs: null,
          clock: () => Date.now() + 31 * 86_400_000,
          actions: [lookup],
        });
        try {
          const { operation, events } = await later.get({ tenant: t, id });
          expect(events.at(-1)).toMatchObject({ to: "succeeded", actor: "idem-daemon:d-keep" });
          // Before: completedAt + the daemon's retention (the core's 30 days unless configured), whatever the application keeps.
          expect(operation.expiresAt).toBeNull();
          expect(await later.admin.prune({ tenant: t })).toBe(0);
          const again = await later.run(lookup, { tenant: t, key: ["job"], args: { note: "x" } });
          expect(again).toMatchObject({ status: "succeeded", replayed: true });
          expect(lines(join(dir, "effects"))).toHaveLength(1); // done once
        } finally {
          await later.close();
        }
      },
      scaled(240_000),
    );

    /** A needs_review operation alone in a database of its own, whose alert `idem daemon --once` passes try to send. */
    async function alertToSend() {
      const own = await freshDatabase(dialect);
      const ownLedger = await openLedger(own, { poolSize: 2 });
      const dir = tempDir();
      const parked = await ownLedger.run(lostAnswer(dir), { tenant: tenant(), key: ["r"], args: { note: "x" } });
      expect(parked).toMatchObject({ state: "needs_review" });
      let passes = 0;
      /** `idem daemon --once` with this webhook config (`url` or `urlEnv`...) and environment. */
      const pass = (webhook: Record<string, unknown>, env: Record<string, string> = {}) => {
        const file = join(dir, `idem.config.${++passes}.json`);
        writeFileSync(file, JSON.stringify({ ledger: own, alerts: { log: false, webhook } }));
        return idem(["--config", file, "daemon", "--once", "--name", "d-hook"], env);
      };
      const delivery = async () => {
        const [one, ...more] = await ownLedger.admin.list({ tenant: "idem-alerts" });
        expect(more).toEqual([]);
        return (await ownLedger.get({ tenant: "idem-alerts", id: one!.id })).operation;
      };
      const due = async () =>
        (await ownLedger.daemon.alertsDue({ limit: 100 })).some((a) => a.id === parked.operationId);
      return { own, ledger: ownLedger, parked, pass, delivery, due };
    }

    it(
      "idem daemon --once exits 1 when an alert was not delivered (its webhook refuses connections), and says so; 0 once it is",
      async () => {
        const s = await alertToSend();
        try {
          const down = await s.pass({ url: `http://127.0.0.1:${await freePort()}/hook` });
          // Before: exit 0, and a cron job never heard that no alert went out.
          expect(down.code, down.stderr).toBe(1);
          expect(down.stderr).toMatch(
            /^idem: \d+ alert delivery\(ies\) were not taken by their sink .*; see the log\n$/,
          );
          expect(await s.due()).toBe(true);
          expect(await s.delivery()).toMatchObject({
            status: "pending",
            reason: expect.stringMatching(/receiver not reached \(ECONNREFUSED\)/),
          });
          const hook = await webhookReceiver();
          try {
            const up = await s.pass({ url: hook.url });
            expect(up.code, up.stderr).toBe(0);
            expect(hook.alerts.map((a) => a.operationId)).toEqual([s.parked.operationId]);
            expect(await s.due()).toBe(false);
          } finally {
            await hook.close();
          }
        } finally {
          await s.ledger.close();
        }
      },
      scaled(240_000),
    );

    it(
      "a webhook request fetch will not send (a blocked port, a header it refuses) is not sent, not 'maybe sent': the alert stays due, each pass says why, no secret is kept; urlEnv and authorizationEnv send it",
      async () => {
        const s = await alertToSend();
        const received: { authorization: string | undefined; body: Record<string, unknown> }[] = [];
        const receiver = createServer((req, res) => {
          let body = "";
          req.on("data", (c) => (body += c));
          req.on("end", () => {
            received.push({ authorization: req.headers.authorization, body: JSON.parse(body) });
            res.writeHead(200).end("ok");
          });
        });
        await new Promise<void>((r) => receiver.listen(0, "127.0.0.1", r));
        const url = `http://127.0.0.1:${(receiver.address() as AddressInfo).port}/hook`;
        const said = (out: { stdout: string }) =>
          out.stdout
            .split("\n")
            .filter((l) => l.includes("did not succeed"))
            .map((l) => (JSON.parse(l) as { delivery: { reason: string } }).delivery.reason);
        try {
          // 6000 is one of the ports fetch refuses for every request, before connecting.
          for (let i = 0; i < 2; i++) {
            const blocked = await s.pass({ url: "http://127.0.0.1:6000/hook" });
            // Before: "delivery unknown: fetch failed", in review: the alert acked as delivered, never sent.
            expect(await s.delivery()).toMatchObject({
              status: "pending",
              reason: expect.stringMatching(/webhook request not sent: fetch refuses to connect to port 6000/),
            });
            expect(await s.due()).toBe(true);
            expect(said(blocked)).toContainEqual(expect.stringMatching(/refuses to connect to port 6000/)); // each pass
            expect(blocked.code, blocked.stderr).toBe(1);
          }
          // A header value fetch refuses (a line break): the request cannot be made. Its value never shows.
          const badHeader = await s.pass(
            { url, authorizationEnv: "IDEM_TEST_HOOK_AUTH" },
            { IDEM_TEST_HOOK_AUTH: "Bearer s3cr3t-token\nX: y" },
          );
          expect(await s.delivery()).toMatchObject({
            status: "pending",
            reason: expect.stringMatching(/webhook request not sent: fetch could not make the request/),
          });
          expect(said(badHeader)).toContainEqual(expect.stringMatching(/could not make the request/));
          expect(badHeader.code, badHeader.stderr).toBe(1);
          expect(received).toEqual([]);
          const id = (await s.delivery()).id;
          for (const shown of [
            await idem(["--ledger", s.own, "--json", "ls", "--tenant", "idem-alerts"]),
            await idem(["--ledger", s.own, "--json", "show", id, "--tenant", "idem-alerts"]),
          ]) {
            expect(shown.code, shown.stderr).toBe(0);
            expect(shown.stdout).not.toContain("s3cr3t");
          }
          expect(badHeader.stdout + badHeader.stderr).not.toContain("s3cr3t");
          // The URL from the environment (a Slack URL is itself a secret), the token in a header: sent.
          const sent = await s.pass(
            { urlEnv: "IDEM_TEST_HOOK_URL", authorizationEnv: "IDEM_TEST_HOOK_AUTH", format: "slack" },
            { IDEM_TEST_HOOK_URL: url, IDEM_TEST_HOOK_AUTH: "Bearer t0ken" },
          );
          expect(sent.code, sent.stderr + sent.stdout).toBe(0);
          expect(received).toEqual([
            { authorization: "Bearer t0ken", body: { text: expect.stringContaining(s.parked.operationId) } },
          ]);
          expect(await s.delivery()).toMatchObject({ status: "succeeded" });
          expect(await s.due()).toBe(false);
        } finally {
          await s.ledger.close();
          await new Promise((r) => receiver.close(r));
        }
      },
      scaled(240_000),
    );

    it(
      "a webhook that refuses connections is tried once a tick, not once an alert, and settling goes on",
      async () => {
        const dir = tempDir();
        const t = tenant();
        const alerts = `alerts-${t}`;
        const neither = fileAction("neither", dir);
        const failing = {
          ...neither,
          execute: async () => {
            throw new Error("socket hang up");
          },
        };
        const parked = [];
        for (const k of ["a", "b", "c", "d"])
          parked.push(await ledger.run(failing, { tenant: t, key: [k], args: { note: k } }));
        expect(parked.map((p) => p.status === "pending_verification" && p.state)).toEqual(
          Array(4).fill("needs_review"),
        );
        // Work that is due: a dedupe-capable row left pending, which the same tick settles.
        const dedupe = fileAction("dedupe", dir);
        const left = await ledger.run(
          {
            ...dedupe,
            execute: async () => {
              throw Object.assign(new Error("connect ECONNREFUSED"), { code: "ECONNREFUSED" });
            },
          },
          { tenant: t, key: ["due"], args: { note: "due" }, budget: { attempts: 1 } },
        );
        expect(left).toMatchObject({ status: "pending_verification" }); // unknown: the daemon replays it, due shortly
        const config = parseConfig({
          ledger: url,
          actions: [dedupe],
          alerts: { log: false, tenant: alerts, webhook: { url: `http://127.0.0.1:${await freePort()}/hook` } },
          thresholds: { stuckAfterMs: 3_600_000 },
          daemon: { batch: 1_000 },
        });
        // As `idem daemon` opens it: with its alert deliveries' actions, so that its settling takes
        // a pending delivery too (and must count it as the webhook's try of the tick). Its clock is
        // moved on between the last ticks, so that the delivery is due again without a wait.
        let ahead = 0;
        const fast = await openTestLedger(url, {
          poolSize: 2,
          actions: [dedupe, ...alertActions(config, pino({ level: "silent" }))],
          budget: { baseDelayMs: 10 },
          clock: () => Date.now() + ahead,
        });
        try {
          const daemon = inProcess(fast, config, "d-breaker");
          const tried = async () =>
            (await fast.admin.list({ tenant: alerts })).filter((op) => op.action === "idem.alert.webhook").length;
          await daemon.tick();
          expect(await tried()).toBe(1); // one delivery tried; the other alerts wait for the next tick
          // Tick by tick the due row is settled, while the webhook is tried once a tick: the same
          // delivery again, never the ones behind it.
          const settled = async () =>
            (await fast.get({ tenant: t, id: left.operationId })).operation.status === "succeeded";
          let ticks = 1;
          await until(
            async () => {
              await daemon.tick();
              ticks += 1;
              return settled();
            },
            60_000,
            "the due row to be settled",
          );
          // A few more, each once the delivery fell due again (its backoff passed, by the ledger's
          // clock): the tick's settling tries it then.
          for (let i = 0; i < 3; i++) {
            ahead += 1_000;
            await daemon.tick();
            ticks += 1;
          }
          expect(await tried()).toBe(1);
          const [delivery] = (await fast.admin.list({ tenant: alerts })).filter(
            (op) => op.action === "idem.alert.webhook",
          );
          // A try is one execution (one attempt), whichever path makes it: one try a tick.
          expect(delivery!.attempt).toBeLessThanOrEqual(ticks);
          const due = (await fast.daemon.alertsDue({ limit: 1_000 })).map((a) => a.id);
          for (const p of parked) expect(due).toContain(p.operationId); // none acked: the webhook has them all to take
        } finally {
          await fast.close();
        }
      },
      scaled(240_000),
    );

    it(
      "a tick stops settling once its claim on the rows is about to end, and leaves the rest to the next",
      async () => {
        const dir = tempDir();
        const t = tenant();
        const lookup = fileAction("lookup", dir, { reconcileDelayMs: 300 });
        const lost = answerLost(lookup);
        const ids: string[] = [];
        for (const k of ["a", "b", "c", "d"]) {
          const out = await ledger.run(lost, { tenant: t, key: [k], args: { note: k }, budget: { attempts: 1 } });
          if (out.status === "pending_verification" && out.state === "unknown") ids.push(out.operationId);
        }
        expect(ids).toHaveLength(4);
        const config = parseConfig({
          ledger: url,
          actions: [lookup],
          alerts: { log: true, tenant: `alerts-${t}` }, // the daemon's silent logger
          thresholds: { stuckAfterMs: 3_600_000 },
          daemon: { claimMs: 700, maxChecks: 100 },
        });
        const withActions = await openLedger(url, { poolSize: 2, actions: [lookup] });
        const daemon = inProcess(withActions, config, "d-claim");
        const reconciled = () => lines(join(dir, "reconciles")).length;
        const before = reconciled();
        const succeeded = async () =>
          (await Promise.all(ids.map((id) => ledger.get({ tenant: t, id })))).filter(
            (o) => o.operation.status === "succeeded",
          ).length;
        // All four due (their first check comes shortly), so that one tick claims them all.
        await until(
          async () =>
            (await Promise.all(ids.map((id) => ledger.get({ tenant: t, id })))).every(
              (o) => o.operation.nextCheckAt !== null && o.operation.nextCheckAt < Date.now() - 50,
            ),
          30_000,
          "the rows to be due",
        );
        await until(
          async () => {
            await daemon.tick();
            return reconciled() > before;
          },
          30_000,
          "a tick to settle something",
        );
        // 300 ms a lookup, a claim of 700 ms: the tick stopped before the fourth (it did all four).
        expect(reconciled() - before).toBeLessThan(4);
        await until(
          async () => {
            await daemon.tick();
            return (await succeeded()) === 4;
          },
          60_000,
          "every row to be settled",
        );
        // Once each, and once more for a lookup given up at the claim's end (the third, started
        // before 90 % of the claim, outlasts it): inconclusive, still unknown, looked up again;
        // unless its own finding, answered after it was given up, settled the row from unknown
        // first (recorded through the fence): then it is not looked up again.
        const events = (await Promise.all(ids.map((id) => ledger.get({ tenant: t, id })))).flatMap((o) => o.events);
        const cut = events.filter((e) => e.reason?.startsWith("inconclusive")).length;
        const lateFound = events.filter(
          (e) => e.from === "unknown" && e.to === "succeeded" && e.reason?.includes("lookup's finding proves"),
        ).length;
        expect(reconciled() - before).toBe(4 + cut - lateFound);
        await withActions.close();
      },
      scaled(240_000),
    );

    /**
     * Five unknown outcomes of a lookup action on a database of their own (claimDue works across
     * tenants), and a daemon in this process whose second lookup calls `duringSecond` (which stops
     * it, as SIGTERM does). Every ledger here reads the database clock an hour later: each row is due.
     */
    async function stoppedMidTick(
      duringSecond: (s: { daemon: Daemon; tried: string[] }) => Promise<void>,
      options: { lockTimeoutMs?: number } = {},
    ) {
      const dir = tempDir();
      const t = tenant();
      const own = await freshDatabase(dialect);
      const lookup = fileAction("lookup", dir);
      const agent = await openLedger(own, { poolSize: 2 });
      const ids: string[] = [];
      for (const k of ["a", "b", "c", "d", "e"]) {
        const out = await agent.run(answerLost(lookup), {
          tenant: t,
          key: [k],
          args: { note: k },
          budget: { attempts: 1 },
        });
        if (out.status === "pending_verification" && out.state === "unknown") ids.push(out.operationId);
      }
      await agent.close();
      expect(ids).toHaveLength(5);
      const tried: string[] = [];
      const checkedElsewhere = new Set<string>();
      let daemon: Daemon | undefined;
      const hooked: typeof lookup = {
        ...lookup,
        reconcile: async (args, op) => {
          if (checkedElsewhere.has(op.id))
            return { found: false, proof: "inconclusive", reason: "someone else's check", retryAfterMs: 600_000 };
          tried.push(op.id);
          const found = await lookup.reconcile!(args, op);
          if (tried.length === 2) await duringSecond({ daemon: daemon!, tried });
          return found;
        },
      };
      const later = (more: { lockTimeoutMs?: number } = {}) =>
        openTestLedger(own, { poolSize: 2, actions: [hooked], clock: () => Date.now() + 3_600_000, ...more });
      const ledgers = [await later(options), await later()];
      const [mine, other] = ledgers as [Ledger, Ledger];
      const logged: { level: number; msg: string; released?: number }[] = [];
      const config = parseConfig({
        ledger: own,
        actions: [lookup],
        alerts: { log: true, tenant: `alerts-${t}` }, // a sink the daemon requires; no alert is due here
        thresholds: { stuckAfterMs: 3_600_000 },
        daemon: { claimMs: 60_000, batch: 100 },
      });
      const log = pino({ level: "info" }, { write: (line: string) => void logged.push(JSON.parse(line)) });
      daemon = new Daemon(mine, config, log, new DaemonMetrics(mine, 1_000), "d-stopped");
      return {
        own,
        t,
        ids,
        tried,
        daemon,
        mine,
        other,
        logged,
        /** The row's status and next check, by `mine`. */
        row: async (id: string) => {
          const { status, nextCheckAt } = (await mine.get({ tenant: t, id })).operation;
          return { status, nextCheckAt };
        },
        /** Someone else (a person's `idem retry --now`, another replica) checks `id` now: inconclusive. */
        checkElsewhere: async (id: string) => {
          checkedElsewhere.add(id);
          await other.daemon.settle({ tenant: t, id, actor: "someone-else" });
        },
        /** Stops the daemon (if a test failed before its hook did) and closes every ledger opened here. */
        close: async () => {
          daemon.stop();
          await Promise.all(ledgers.map((l) => l.close()));
        },
      };
    }

    it(
      "a daemon stopped mid-tick gives back the rows it claimed and did not settle: another claims them at once; a row changed since keeps its change",
      async () => {
        let changed: { id: string; before: { status: string; nextCheckAt: number | null } } | undefined;
        const s = await stoppedMidTick(async ({ daemon, tried }) => {
          daemon.stop();
          // One of the rows it claimed and has not tried is checked by someone else meanwhile.
          const id = s.ids.find((i) => !tried.includes(i))!;
          await s.checkElsewhere(id);
          changed = { id, before: await s.row(id) };
        });
        try {
          await s.daemon.run(); // one tick: stopped within it
          expect(s.tried).toHaveLength(2);
          for (const id of s.tried) expect((await s.row(id)).status).toBe("succeeded");
          const untried = s.ids.filter((id) => !s.tried.includes(id) && id !== changed!.id);
          expect(untried).toHaveLength(2);
          // Before: none (the rest stayed hidden for claimMs, a minute).
          const taken = await s.other.daemon.claimDue({ limit: 100, claimMs: 60_000 });
          expect(taken.map((r) => r.id).sort()).toEqual(untried.sort());
          expect(changed!.before.status).toBe("unknown");
          expect(await s.row(changed!.id)).toEqual(changed!.before);
          expect(s.logged.find((l) => l.msg.startsWith("gave back"))?.released).toBe(2);
        } finally {
          await s.close();
        }
      },
      scaled(120_000),
    );

    // Postgres only (not registered on SQLite): there a lock holds back the rows it covers only (on
    // SQLite, the whole database: the settling in flight would fail first).
    if (dialect === "postgres")
      it(
        "a daemon stopped mid-tick whose give-back the database does not take still stops: logged, the rows due once the claim ends",
        async () => {
          let unlock = () => {};
          let holding: Promise<void> | undefined;
          const s = await stoppedMidTick(
            async ({ daemon, tried }) => {
              daemon.stop();
              // Someone holds the rows it has not tried locked: its give-back waits, then times out.
              const untried = s.ids.filter((id) => !tried.includes(id));
              await new Promise<void>((locked, failed) => {
                holding = databaseOf(s.other)
                  .transaction()
                  .execute(async (trx) => {
                    await trx
                      .selectFrom("idem_operations")
                      .select("id")
                      .where("id", "in", untried)
                      .forUpdate()
                      .execute();
                    locked();
                    await new Promise<void>((r) => (unlock = r));
                  });
                holding.catch(failed);
              });
            },
            { lockTimeoutMs: 200 },
          );
          try {
            await s.daemon.run(); // resolves: a failed give-back never fails the stop
            expect(s.tried).toHaveLength(2);
            const warned = s.logged.filter((l) => l.msg.startsWith("could not give back"));
            expect(warned).toMatchObject([
              {
                level: 40,
                claimed: 3,
                err: { type: "LedgerUnavailableError", message: expect.stringMatching(/lock/) },
              },
            ]);
            unlock();
            await holding;
            // Still claimed, as before the give-back existed: due again once the claim ends.
            expect(await s.other.daemon.claimDue({ limit: 100, claimMs: 60_000 })).toEqual([]);
          } finally {
            unlock();
            await holding?.catch(() => {});
            await s.close();
          }
        },
        scaled(120_000),
      );

    it(
      "a sink that is down does not keep newer alerts from the sinks that work: due alerts are read a page at a time",
      async () => {
        const dir = tempDir();
        const t = tenant();
        const alerts = `alerts-${t}`;
        const failing = lostAnswer(dir);
        const config = parseConfig({
          ledger: "sqlite::memory:", // unused: the daemon runs on `fast`
          alerts: { log: true, tenant: alerts, webhook: { url: `http://127.0.0.1:${await freePort()}/hook` } },
          thresholds: { stuckAfterMs: 3_600_000 },
          daemon: { batch: 2 },
        });
        // Other tests' alerts would be pages ahead of these. Opened as `idem daemon` opens its ledger.
        const fast = await ledgerOfItsOwn(dialect, alertActions(config, pino({ level: "silent" })));
        const ids: string[] = [];
        for (const k of ["a", "b", "c", "d", "e"])
          ids.push((await fast.run(failing, { tenant: t, key: [k], args: { note: k } })).operationId);
        try {
          const daemon = inProcess(fast, config, "d-pages");
          const logged = async () =>
            (await fast.admin.list({ tenant: alerts })).filter(
              (d) =>
                d.action === "idem.alert.log" && d.status === "succeeded" && ids.some((id) => d.keyLabel?.includes(id)),
            ).length;
          // Before: the oldest two alerts (the webhook never takes them) came back every tick, and
          // the log sink never heard of the other three.
          await until(
            async () => {
              await daemon.tick();
              return (await logged()) === ids.length;
            },
            60_000,
            "every alert to reach the log sink",
          );
          const due = (await fast.daemon.alertsDue({ limit: 10_000 })).map((a) => a.id);
          for (const id of ids) expect(due).toContain(id); // the webhook still has them all to take
        } finally {
          await fast.close();
        }
      },
      scaled(240_000),
    );

    it(
      "an email alert sink whose sign-in is refused is held back for minutes, not tried again every tick (no account lockout)",
      async () => {
        const own = await ledgerOfItsOwn(dialect);
        // An SMTP server that refuses every sign-in (535), counting the tries.
        let signIns = 0;
        const smtp = createNetServer((socket) => {
          socket.write("220 test ESMTP\r\n");
          socket.on("data", (d) => {
            for (const line of d.toString().split("\r\n").filter(Boolean)) {
              if (/^EHLO/i.test(line)) socket.write("250-test\r\n250 AUTH PLAIN LOGIN\r\n");
              else if (/^AUTH/i.test(line)) {
                signIns += 1;
                socket.write("535 5.7.8 Authentication failed\r\n");
              } else if (/^QUIT/i.test(line)) socket.end("221 bye\r\n");
              else socket.write("250 ok\r\n");
            }
          });
        });
        await new Promise<void>((r) => smtp.listen(0, "127.0.0.1", r));
        process.env.IDEM_TEST_SMTP_USER = "alerts";
        process.env.IDEM_TEST_SMTP_PASS = "wrong";
        try {
          const dir = tempDir();
          const t = tenant();
          const failing = lostAnswer(dir);
          await own.run(failing, { tenant: t, key: ["a"], args: { note: "a" } });
          const port = (smtp.address() as AddressInfo).port;
          const config = parseConfig({
            ledger: "sqlite::memory:", // unused: the daemon runs on `own`
            alerts: {
              log: false,
              tenant: `alerts-${t}`,
              email: {
                smtp: {
                  host: "127.0.0.1",
                  port,
                  requireTLS: false, // this test's server has no TLS: the refusal is the sign-in's
                  userEnv: "IDEM_TEST_SMTP_USER",
                  passEnv: "IDEM_TEST_SMTP_PASS",
                },
                from: "idem@example.test",
                to: ["ops@example.test"],
              },
            },
            thresholds: { stuckAfterMs: 3_600_000 },
          });
          const daemon = inProcess(own, config, "d-signin");
          for (let i = 0; i < 3; i++) await daemon.tick();
          // Before: the default budget's three tries a tick (nine sign-ins in three ticks), for ever.
          expect(signIns).toBe(1);
          const [delivery] = await own.admin.list({ tenant: `alerts-${t}` });
          expect(delivery).toMatchObject({ status: "pending", reason: expect.stringMatching(/sign-in refused/) });
        } finally {
          delete process.env.IDEM_TEST_SMTP_USER;
          delete process.env.IDEM_TEST_SMTP_PASS;
          await new Promise((r) => smtp.close(r));
          await own.close();
        }
      },
      scaled(240_000),
    );

    it(
      "an email alert sink that cannot be reached keeps the alert due: its delivery is pending, not in review",
      async () => {
        const dir = tempDir();
        const t = tenant();
        const alerts = `alerts-${t}`;
        const failing = lostAnswer(dir);
        const fast = await ledgerOfItsOwn(dialect); // the daemon would try other tests' alerts first
        const { operationId } = await fast.run(failing, { tenant: t, key: ["m"], args: { note: "m" } });
        const smtp = { host: "127.0.0.1", port: await freePort() }; // nothing listens: refused
        const config = parseConfig({
          ledger: "sqlite::memory:", // unused: the daemon runs on `fast`
          alerts: { log: false, tenant: alerts, email: { smtp, from: "idem@example.test", to: ["ops@example.test"] } },
          thresholds: { stuckAfterMs: 3_600_000 },
          daemon: { batch: 1_000 },
        });
        try {
          const due = async () => (await fast.daemon.alertsDue({ limit: 10_000 })).map((a) => a.id);
          const before = await due();
          expect(before).toContain(operationId);
          await inProcess(fast, config, "d-mail").tick();
          // One try (then the sink counts as down for this tick). Before: an unclassified error,
          // so "may have been sent": the delivery went to review, which counted as handled, and
          // its alert was acknowledged, never sent.
          expect((await fast.admin.list({ tenant: alerts })).map((d) => d.status)).toEqual(["pending"]);
          expect(await due()).toEqual(before);
        } finally {
          await fast.close();
        }
      },
      scaled(240_000),
    );

    it(
      "a stuck attempt is alerted once, also when its lazy args are stored within it, and no alert can stop the tick's settling",
      async () => {
        const dir = tempDir();
        const t = tenant();
        const lookup = fileAction("lookup", dir);
        // A row due for settling: its effect happened, the answer was lost.
        const lost = answerLost(lookup);
        const due = await ledger.run(lost, { tenant: t, key: ["due"], args: { note: "due" }, budget: { attempts: 1 } });
        expect(due).toMatchObject({ status: "pending_verification", state: "unknown" });
        // A worker whose lazy args take long, then whose send hangs: running, and changed in between.
        let release: (args: { note: string }) => void = () => {};
        const made = new Promise<{ note: string }>((r) => (release = r));
        const stop = new AbortController();
        const hang = {
          ...lookup,
          type: "hang.lazy",
          execute: (_args: { note: string }, op: { signal: AbortSignal }) =>
            new Promise<never>((_, reject) => op.signal.addEventListener("abort", () => reject(new Error("stopped")))),
        };
        const running = ledger.run(hang, { tenant: t, key: ["hang"], args: () => made, signal: stop.signal });
        running.catch(() => {});
        const config = parseConfig({
          ledger: url,
          actions: [lookup],
          alerts: { log: true, tenant: `alerts-${t}` },
          thresholds: { stuckAfterMs: 3_600_000, perAction: { "hang.lazy": 1 } },
          daemon: { maxChecks: 100 },
        });
        const withActions = await openLedger(url, { poolSize: 2, actions: [lookup] });
        const daemon = inProcess(withActions, config, "d-stuck");
        const stuckAlerts = async () =>
          (await withActions.admin.list({ tenant: `alerts-${t}` })).filter((o) => o.keyLabel?.includes('"stuck"'))
            .length;
        try {
          await until(
            async () => (await ledger.admin.list({ tenant: t, status: "running" })).length === 1,
            10_000,
            "the hanging worker to claim",
          );
          await daemon.tick();
          expect(await stuckAlerts()).toBe(1);
          // Its args are stored (not a transition: its attempt, and its age, go on), and the send hangs.
          release({ note: "hang" });
          await until(
            async () => (await ledger.admin.list({ tenant: t, status: "running" }))[0]?.argsHash !== null,
            10_000,
            "the lazy args to be stored",
          );
          await until(
            async () => {
              await daemon.tick(); // never throws for an alert
              return (await ledger.get({ tenant: t, id: due.operationId })).operation.status === "succeeded";
            },
            30_000,
            "the due row to be settled",
          );
          // Before: storing the args restarted the attempt's age (updated_at), and a second alert went out.
          expect(await stuckAlerts()).toBe(1);
        } finally {
          stop.abort();
          await running.catch(() => {});
          await withActions.close();
        }
      },
      scaled(120_000),
    );

    it(
      "idem daemon --once: SIGTERM during a run finishes that request and records it, sends no other, exits 0",
      async () => {
        const dir = tempDir();
        const t = tenant();
        // Two operations known not done, for the pass to run (`file.neither`: nothing can look it
        // up, so an effect not recorded goes to a person). The provider answers only once the
        // daemon has said it is stopping: the stop comes before the first run ends.
        const refused = {
          ...fileAction("neither", dir),
          execute: async () => {
            throw new Error("503 before the provider executed");
          },
          classify: () => ({ kind: "transient", reason: "503", retryAfterMs: 0 }) as const,
        };
        // A database of its own: a pass settles every due row, none of the other tests' here.
        const own = await freshDatabase(dialect);
        const agent = await openLedger(own, { poolSize: 1, budget: { attempts: 1 } });
        const ids: string[] = [];
        try {
          for (const k of ["a", "b"]) {
            const out = await agent.run(refused, { tenant: t, key: [k], args: { note: "x" } });
            expect(out).toMatchObject({ state: "pending" });
            ids.push(out.operationId);
          }
        } finally {
          await agent.close();
        }
        const pass = startChild(CLI, ["--config", CONFIG, "daemon", "--once", "--name", "d-once-stop"], {
          LEDGER_URL: own,
          EFFECT_DIR: dir,
          WEBHOOK_URL: hook.url,
          EXECUTE_GATE: join(dir, "answer"),
        });
        try {
          await until(() => lines(join(dir, "effects")).length >= 1, 90_000, "the pass's first run to start");
          pass.proc.kill("SIGTERM");
          await pass.waitFor(/stopping: finishing the work in flight/);
          writeFileSync(join(dir, "answer"), ""); // the provider answers the request in flight
          const { code, signal, stderr } = await pass.exited;
          // Before: killed by the signal mid-request, the row left running for the next pass
          // (which sends a `neither` action's to a person: its effect is not known).
          expect({ code, signal }, stderr).toEqual({ code: 0, signal: null });
        } finally {
          pass.proc.kill("SIGKILL"); // ended already, unless the test failed before
          await pass.exited;
        }
        const effects = lines(join(dir, "effects"));
        expect(effects).toHaveLength(1); // the request in flight, and no other
        const reader = await openLedger(own, { poolSize: 1 });
        const ops = await Promise.all(ids.map(async (id) => (await reader.get({ tenant: t, id })).operation));
        await reader.close();
        const ran = ops.find((o) => o.key === effects[0]![0])!;
        expect(ran).toMatchObject({ status: "succeeded", result: { id: effects[0]![1] } });
        // The other is due again at once, not once the pass's claim ends.
        expect(ops.find((o) => o !== ran)).toMatchObject({ status: "pending" });
      },
      scaled(120_000),
    );

    it(
      "serves /metrics and /healthz",
      async () => {
        const port = await freePort();
        const daemon = startDaemon({
          LEDGER_URL: url,
          EFFECT_DIR: tempDir(),
          WEBHOOK_URL: hook.url,
          METRICS_PORT: String(port),
        });
        try {
          await until(
            async () => (await fetch(`http://127.0.0.1:${port}/healthz`).catch(() => null))?.status === 200,
            90_000,
            "/healthz",
          );
          const text = await (await fetch(`http://127.0.0.1:${port}/metrics`)).text();
          // Unsettled operations by status and action only (a tenant label is opt-in), and the process's own metrics.
          expect(text).toMatch(/^# TYPE idem_unsettled_operations gauge$/m);
          expect(text).not.toMatch(/^idem_unsettled_operations\{.*tenant=/m);
          expect(text).toMatch(/^process_cpu_user_seconds_total \d/m);
          expect(text).toMatch(/^nodejs_eventloop_lag_seconds \d/m);
          expect(text).toMatch(/^idem_daemon_ticks_total \d+$/m);
          expect(text).toContain("idem_alerts_sent_total");
          expect(text).toContain("idem_duplicates_answered_total");
        } finally {
          await stopDaemon(daemon);
        }
      },
      scaled(240_000),
    );
  });
}

describe("three daemons on one Postgres ledger", () => {
  it(
    "reconcile each operation once and send each alert once",
    async () => {
      const url = await freshDatabase("postgres");
      const ledger = await openLedger(url, { poolSize: 2, budget: { attempts: 1 } });
      const hook = await webhookReceiver();
      const dir = tempDir();
      const t = tenant();
      try {
        const lookup = fileAction("lookup", dir);
        const ambiguous = {
          ...lookup,
          execute: async (a: { note: string }, op: Parameters<typeof lookup.execute>[1]) => {
            await lookup.execute(a, op);
            throw new Error("timeout after send");
          },
          reconcile: async () => ({ found: false, proof: "inconclusive", reason: "lags", retryAfterMs: 0 }) as const,
        };
        const unknown: string[] = [];
        for (let i = 0; i < 24; i++)
          unknown.push((await ledger.run(ambiguous, { tenant: t, key: [`u${i}`], args: { note: "x" } })).operationId);
        const failing = lostAnswer(dir);
        const reviews: string[] = [];
        for (let i = 0; i < 6; i++)
          reviews.push((await ledger.run(failing, { tenant: t, key: [`r${i}`], args: { note: "x" } })).operationId);
        const env = { LEDGER_URL: url, EFFECT_DIR: dir, WEBHOOK_URL: hook.url, RECONCILE_DELAY_MS: "300", BATCH: "2" };
        const ports = [await freePort(), await freePort(), await freePort()];
        const daemons = ["a", "b", "c"].map((name, i) => startDaemon({ ...env, METRICS_PORT: String(ports[i]) }, name));
        try {
          await until(
            async () => (await ledger.admin.list({ tenant: t, status: "succeeded", limit: 100 })).length === 24,
            120_000,
            "all unknowns to be reconciled",
          );
          await until(
            () => reviews.every((id) => hook.alerts.some((a) => a.operationId === id)),
            60_000,
            "review alerts",
          );
          // A few more ticks of every daemon: none sends an alert another sent.
          await Promise.all(ports.map((port) => moreTicks(port)));
        } finally {
          for (const d of daemons) await stopDaemon(d);
        }
        const perKey = new Map<string, number>();
        for (const [key] of lines(join(dir, "reconciles"))) perKey.set(key!, (perKey.get(key!) ?? 0) + 1);
        expect(perKey.size).toBe(24);
        expect([...perKey.values()].every((v) => v === 1)).toBe(true);
        for (const id of reviews) expect(hook.alerts.filter((a) => a.operationId === id)).toHaveLength(1);
        const settledBy = new Set(
          (await Promise.all(unknown.map((id) => ledger.get({ tenant: t, id }))))
            .flatMap((o) => o.events.map((e) => e.actor))
            .filter((a) => a?.startsWith("idem-daemon")),
        );
        expect(settledBy.size).toBeGreaterThan(1); // the work was shared
      } finally {
        await ledger.close();
        await hook.close();
      }
    },
    scaled(300_000),
  );
});

for (const dialect of DIALECTS) {
  describe(`idem daemon stopped as it starts, on ${dialect}`, () => {
    it(
      "a SIGTERM between the open and the loop (warning of its thresholds, its console starting to listen) stops it gracefully: exit 0",
      async () => {
        const dir = tempDir();
        const ledger = await freshDatabase(dialect);
        await (await openLedger(ledger)).close(); // migrated
        // Many thresholds naming no action of the config: a warning each, said once the ledger is
        // open and before the loop starts, for as long as the signal takes to arrive.
        const perAction = Object.fromEntries(Array.from({ length: 20_000 }, (_, i) => [`batch.job${i}`, 3_600_000]));
        const file = join(dir, "idem.config.json");
        writeFileSync(
          file,
          JSON.stringify({
            ledger,
            alerts: { log: true },
            thresholds: { perAction },
            daemon: { console: true },
            console: { port: 0, insecureNoAuth: true },
          }),
        );
        const daemon = startChild(CLI, ["--config", file, "daemon", "--name", "d-early-stop"]);
        try {
          await daemon.waitFor(/names no action of this config/, 60_000);
          daemon.proc.kill("SIGTERM");
          // Before: killed by the signal (no handler between the wait's and the loop's), no exit code.
          const { code, signal, stderr } = await daemon.exited;
          expect({ code, signal }, stderr).toEqual({ code: 0, signal: null });
        } finally {
          daemon.proc.kill("SIGKILL"); // stopped already, unless the test failed before
          await daemon.exited;
        }
      },
      scaled(120_000),
    );
  });
}
