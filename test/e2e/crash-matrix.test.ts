/**
 * The crash matrix: for each adapter and each crash point, on SQLite and Postgres, a worker is
 * killed with SIGKILL, the caller replays, the daemon runs, and effects are counted at the target.
 * Every cell must end in exactly one effect, or in needs_review with one alert: zero silent
 * duplicates, zero lost receipts. The same table is in the README.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { fileURLToPath } from "node:url";
import { createServer } from "node:http";
import type { AddressInfo } from "node:net";
import { setTimeout as sleep } from "node:timers/promises";
import { pino } from "pino";
import { openLedger, type Ledger } from "@idem/core";
import { Daemon, DaemonMetrics, parseConfig } from "@idem/cli";
import { HubSpotSandbox, JOURNAL, MailSandbox, SENDER, StripeSandbox } from "@idem/sandbox";
import { DIALECTS, freshDatabase, kill9, scaled, startChild } from "@idem/testkit";
import { messageIdFor } from "@idem/email";
import { ADAPTERS, POINTS, actionFor, argsFor, type Adapter, type Ports } from "./adapters.js";
import { cuttableProxy } from "./proxy.js";

const WORKER = fileURLToPath(new URL("./crash-worker.ts", import.meta.url));
const LEASE_MS = 1_500;

type Expected = { effects: 0 | 1; status: "succeeded" | "needs_review"; alerts: 0 | 1 };
const ONE: Expected = { effects: 1, status: "succeeded", alerts: 0 };
/** The expected outcome of every cell (also in the README). */
const EXPECTED: Record<Adapter, Record<(typeof POINTS)[number], Expected>> = {
  // Stripe dedupes on our key: the replay returns the first object, or creates it if none was.
  stripe: { claim: ONE, accepted: ONE, response: ONE },
  // The provider files sent mail: found by Message-ID, or proven absent after the settle window and sent once.
  "email-provider-saves": { claim: ONE, accepted: ONE, response: ONE },
  // The server delivers the journal Bcc once it accepted the message: the same proofs.
  "email-journal": { claim: ONE, accepted: ONE, response: ONE },
  // We append the copy ourselves after sending: a crash before the APPEND leaves nothing to prove
  // either way, so a person decides (even when nothing was sent); after it, the copy is found.
  "email-append": {
    claim: { effects: 0, status: "needs_review", alerts: 1 },
    accepted: { effects: 1, status: "needs_review", alerts: 1 },
    response: ONE,
  },
  // The external id is a unique value in the CRM: the consistent read finds it, or proves it absent.
  hubspot: { claim: ONE, accepted: ONE, response: ONE },
};

let stripe: StripeSandbox;
let hubspot: HubSpotSandbox;
let mail: MailSandbox;
let ports: Ports;
const alerts: { operationId: string; kind: string }[] = [];
let hookUrl = "";
const hook = createServer((req, res) => {
  let body = "";
  req
    .on("data", (c) => (body += c))
    .on("end", () => {
      alerts.push(JSON.parse(body));
      res.end("ok");
    });
});

beforeAll(async () => {
  stripe = new StripeSandbox();
  hubspot = new HubSpotSandbox();
  mail = new MailSandbox();
  const [s, h, m] = await Promise.all([stripe.start(), hubspot.start(), mail.start()]);
  ports = {
    stripePort: s.port,
    stripeKey: s.apiKey,
    smtpPort: m.smtp.port,
    imapPort: m.imap.port,
    hubspotBase: h.basePath,
    hubspotToken: h.accessToken,
    mailUser: SENDER.user,
    mailPass: SENDER.pass,
    journalUser: JOURNAL.user,
    journalPass: JOURNAL.pass,
  };
  await (await import("@idem/hubspot"))
    .hubspotActions({ accessToken: h.accessToken, basePath: h.basePath })
    .ensureSchema(["contacts"]);
  await new Promise<void>((r) => hook.listen(0, "127.0.0.1", r));
  hookUrl = `http://127.0.0.1:${(hook.address() as AddressInfo).port}/alerts`;
}, scaled(60_000));
afterAll(async () => {
  await Promise.all([stripe?.close(), hubspot?.close(), mail?.close(), new Promise((r) => hook.close(r))]);
});

/** Effects at the target for an operation key. */
function effects(adapter: Adapter, key: string): number {
  if (adapter === "stripe")
    return stripe.objects.all("payment_intents").filter((p) => p.metadata.idem_operation === key).length;
  if (adapter === "hubspot")
    return hubspot.crm.all("contacts").filter((r) => r.properties.idem_external_id === key).length;
  return mail.count(messageIdFor(key, "idem.test"));
}

/** The server holds its answer after the effect; resolves when it committed. */
function holdAtServer(adapter: Adapter): Promise<unknown> {
  if (adapter === "stripe") {
    stripe.faults.add({ kind: "delay_after_commit", match: { method: "POST" }, delayMs: 60_000 });
    return new Promise((r) => stripe.events.once("commit", r));
  }
  if (adapter === "hubspot") {
    hubspot.faults.add({ kind: "delay_after_commit", match: { method: "POST" }, delayMs: 60_000 });
    return new Promise((r) => hubspot.events.once("commit", r));
  }
  mail.faults.add({ kind: "hold_reply", delayMs: 60_000 });
  return new Promise((r) => mail.events.once("accepted", r));
}

for (const dialect of DIALECTS) {
  describe(`crash matrix on ${dialect}`, () => {
    let url = "";
    let ledger: Ledger;
    beforeAll(async () => {
      url = await freshDatabase(dialect);
      ledger = await openLedger(url, { poolSize: 2, leaseMs: LEASE_MS }); // migrates before the workers start
    });
    afterAll(() => ledger?.close());

    for (const adapter of ADAPTERS) {
      for (const point of POINTS) {
        const want = EXPECTED[adapter][point];
        it(
          `${adapter}, crash ${point === "claim" ? "after the claim commits" : point === "accepted" ? "after the provider accepted" : "after the response, before the completion"}: ${want.effects} effect, ${want.status}${want.alerts ? ", 1 alert" : ""}`,
          async () => {
            if (adapter.startsWith("email"))
              mail.mode =
                adapter === "email-journal" ? "journal" : adapter === "email-append" ? "none" : "provider-saves";
            const tenant = `${dialect}-${adapter}-${point}`;
            const action = actionFor(adapter, ports, 5_000);
            const agent = await openLedger(url, { poolSize: 2, leaseMs: LEASE_MS, actions: [action] });
            const config = parseConfig({
              ledger: url,
              actions: [action],
              alerts: { log: false, webhook: { url: hookUrl } },
              thresholds: { stuckAfterMs: 3_600_000 },
            });
            // The email actions of the three copy modes share a type: the daemon gets the cell's own.
            const daemon = new Daemon(
              agent,
              config,
              pino({ level: "silent" }),
              new DaemonMetrics(agent, 1_000),
              "matrix",
            );
            try {
              const held = point === "accepted" ? holdAtServer(adapter) : undefined;
              const child = startChild(WORKER, [], {
                LEDGER_URL: url,
                TENANT: tenant,
                KEY: "job",
                ADAPTER: adapter,
                POINT: point,
                LEASE_MS: String(LEASE_MS),
                PORTS: JSON.stringify(ports),
              });
              await (held ?? child.waitFor(/^crash-point$/));
              await kill9(child);
              const [row] = await agent.admin.list({ tenant });
              // Running, held by the dead worker. Not necessarily its first attempt: on a loaded
              // machine the claim and the reference's write can outlast most of the lease, and an
              // attempt then gives up before sending (runner.ts, `held`) and the next one crashes.
              expect(row).toMatchObject({ status: "running" });
              await sleep(LEASE_MS + 200);

              // the caller retries, then the daemon runs until the operation is settled or a person was told
              const replay = await agent.run(action, { tenant, key: ["job"], args: argsFor(adapter, tenant) as never });
              const deadline = Date.now() + 30_000;
              for (;;) {
                await daemon.tick();
                const op = (await agent.get({ tenant, id: row!.id })).operation;
                const alerted = alerts.some((a) => a.operationId === row!.id);
                if ((op.status === "succeeded" && !want.alerts) || (op.status === "needs_review" && alerted)) break;
                if (Date.now() > deadline)
                  throw new Error(
                    `cell did not settle: ${op.status} (${op.reason}); replay said ${JSON.stringify(replay)}`,
                  );
                await sleep(100);
              }
              for (let i = 0; i < 3; i++) await daemon.tick(); // no late second effect or alert
              const { operation } = await agent.get({ tenant, id: row!.id });
              expect({
                effects: effects(adapter, row!.key),
                status: operation.status,
                alerts: alerts.filter((a) => a.operationId === row!.id).length,
              }).toEqual(want);
              if (operation.status === "succeeded") expect(operation.result).not.toBeNull(); // no lost receipt
            } finally {
              stripe.faults.clear();
              hubspot.faults.clear();
              mail.faults.clear();
              await agent.close();
            }
          },
          scaled(120_000),
        );
      }
    }
  });
}

describe("a database that becomes unreachable right after the effect (Postgres)", () => {
  it(
    "leaves the row running; it is settled later with no duplicate",
    async () => {
      const url = await freshDatabase("postgres");
      const direct = await openLedger(url, {
        poolSize: 2,
        leaseMs: LEASE_MS,
        actions: [actionFor("stripe", ports, 5_000)],
      });
      const target = new URL(url);
      const proxy = await cuttableProxy(Number(target.port));
      const viaProxy = new URL(url);
      viaProxy.port = String(proxy.port);
      try {
        const committed = new Promise((r) => stripe.events.once("commit", r));
        stripe.faults.add({ kind: "delay_after_commit", match: { method: "POST" }, delayMs: 500 });
        const child = startChild(WORKER, [], {
          LEDGER_URL: viaProxy.toString(),
          TENANT: "unreachable",
          KEY: "job",
          ADAPTER: "stripe",
          POINT: "none",
          LEASE_MS: String(LEASE_MS),
          PORTS: JSON.stringify(ports),
        });
        await committed;
        proxy.cut(); // the effect is done; the completion cannot reach the ledger
        const { code } = await child.exited;
        expect(code).not.toBe(0);
        const [row] = await direct.admin.list({ tenant: "unreachable" });
        expect(row).toMatchObject({ status: "running", attempt: 1 });
        const config = parseConfig({
          ledger: url,
          actions: [actionFor("stripe", ports, 5_000)],
          alerts: { log: true }, // a Daemon needs a sink; its logger is silent
        });
        const daemon = new Daemon(
          direct,
          config,
          pino({ level: "silent" }),
          new DaemonMetrics(direct, 1_000),
          "matrix",
        );
        const deadline = Date.now() + 30_000;
        while ((await direct.get({ tenant: "unreachable", id: row!.id })).operation.status !== "succeeded") {
          if (Date.now() > deadline) throw new Error("not settled");
          await daemon.tick();
          await sleep(100);
        }
        expect(effects("stripe", row!.key)).toBe(1);
      } finally {
        stripe.faults.clear();
        await proxy.close();
        await direct.close();
      }
    },
    scaled(120_000),
  );
});
