/**
 * An alert is the transition that raised it, not the row's last write (h3): a row in review whose
 * version moves without a transition (an earlier attempt's request, out past its lease, ends
 * late and is noted in its history) must not be alerted again. Before, the delivery's key and its
 * acknowledgement named the row's `updated_at`: the late end gave the alert a new key, and the
 * sink that had it pending (down for a tick) was sent it twice, once under each.
 */
import { afterEach, describe, expect, it } from "vitest";
import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { defineAction, type RunResult } from "@idem/core";
import { openTestLedger } from "@idem/core/testing";
import { Daemon, DaemonMetrics, alertActions, parseConfig } from "@idem/cli";
import { pino } from "pino";
import { DIALECTS, freshDatabase, scaled } from "@idem/testkit";
import { until } from "./support.js";

const silent = pino({ level: "silent" });
let n = 0;
const tenant = () => `av${++n}-${Math.random().toString(36).slice(2, 7)}`;

/** A webhook receiver answering `status()` at each request; keeps the alerts it took (2xx). */
async function receiver(status: () => number) {
  const taken: { kind: string; operationId: string; since: string }[] = [];
  const server: Server = createServer((req, res) => {
    let body = "";
    req.on("data", (c) => (body += c));
    req.on("end", () => {
      const s = status();
      if (s < 300) taken.push(JSON.parse(body) as (typeof taken)[number]);
      res.writeHead(s).end();
    });
  });
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}/hook`,
    taken,
    close: () => new Promise<void>((r) => server.close(() => r())),
  };
}

const cleanups: (() => Promise<unknown>)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c().catch(() => {});
});

for (const dialect of DIALECTS) {
  describe(`an alert's identity (h3), ${dialect}`, () => {
    it(
      "a row in review noted again without a transition (an earlier attempt's late end) is alerted once, though its sink was down when it was parked",
      async () => {
        let answer = 503;
        const hook = await receiver(() => answer);
        cleanups.push(hook.close);
        const url = await freshDatabase(dialect);
        const config = parseConfig({
          ledger: url,
          alerts: { log: false, webhook: { url: hook.url, format: "json" } },
          // The run held past its lease is no stuck alert here: only the review's is counted.
          thresholds: { stuckAfterMs: 7 * 24 * 3_600_000 },
          daemon: { intervalMs: 50 },
        });
        let ahead = 0;
        let answerLate: () => void = () => {};
        const late = new Promise<void>((r) => (answerLate = r));
        let entered: () => void = () => {};
        const inside = new Promise<void>((r) => (entered = r));
        // Its request goes out and its answer comes back only when the test says: a timeout then.
        const post = defineAction<{ note: string }, { id: string }>({
          type: "crm.post",
          capabilities: {},
          execute: async () => {
            entered();
            await late;
            throw new Error("socket hang up");
          },
          classify: () => ({ kind: "ambiguous", reason: "socket hang up after the request was sent" }),
        });
        const ledger = await openTestLedger(url, {
          poolSize: 3,
          // A lease no heartbeat renews within the test; the clock moves past it.
          leaseMs: 600_000,
          budget: { attempts: 1 },
          actions: [...alertActions(config, silent), post],
          clock: () => Date.now() + ahead,
        });
        cleanups.push(() => ledger.close());
        const t = tenant();
        const worker: Promise<RunResult<{ id: string }>> = ledger.run(post, {
          tenant: t,
          key: ["p"],
          args: { note: "x" },
        });
        cleanups.push(async () => {
          answerLate();
          await worker.catch(() => {});
        });
        await inside;
        ahead += 3_600_000; // the worker's lease ran out long ago: the daemon takes the row over
        const daemon = new Daemon(ledger, config, silent, new DaemonMetrics(ledger, 1_000), "d-versions");
        // Parked for a person (nothing can check it), alerted; the webhook is down: its delivery pending.
        await daemon.tick();
        const [op] = await ledger.admin.list({ tenant: t });
        expect(op).toMatchObject({ status: "needs_review" });
        const parkedAt = op!.updatedAt;
        // The worker's request answers now, late: its end is noted on the row (its version moves).
        answerLate();
        await worker;
        await until(
          async () => (await ledger.get({ tenant: t, id: op!.id })).operation.updatedAt !== parkedAt,
          10_000,
          "the late end to be noted on the row",
        );
        expect((await ledger.get({ tenant: t, id: op!.id })).operation.status).toBe("needs_review");
        // The webhook is back; the pending delivery falls due.
        answer = 200;
        ahead += 60_000;
        for (let i = 0; i < 3; i++) {
          await daemon.tick();
          ahead += 60_000;
        }
        const said = hook.taken.filter((a) => a.operationId === op!.id);
        // Before: 2, one under the row's version when parked (the pending delivery, settled), one
        // under the version the late end gave it (a new key for the same alert).
        expect(
          {
            alerts: said.map((a) => a.kind),
            stillDue: (await ledger.daemon.alertsDue({ limit: 100 })).some((a) => a.id === op!.id),
          },
          "the review's alerts the webhook took",
        ).toEqual({ alerts: ["needs_review"], stillDue: false });
        // It says since when the operation waits for a person: its parking, not the late end.
        expect(said[0]!.since).toBe(new Date(parkedAt).toISOString());
      },
      scaled(60_000),
    );
  });
}
