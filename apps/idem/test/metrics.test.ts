/** Run-result counters any process can wire into its ledger (agents: duplicates answered from the ledger). */
import { describe, expect, it } from "vitest";
import { Registry } from "prom-client";
import { pino } from "pino";
import { LedgerUnavailableError, defineAction, openLedger } from "@idem/core";
import { openTestLedger } from "@idem/core/testing";
import { DIALECTS, freshDatabase, lockTable, scaled } from "@idem/testkit";
import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { ConfigError, Daemon, DaemonMetrics, alertActions, parseConfig, runResultCounters } from "@idem/cli";
import { until } from "./support.js";

/** The sample of `name` without labels in a scrape, or undefined when the scrape has none. */
const sample = (text: string, name: string) => new RegExp(`^${name} (\\S+)$`, "m").exec(text)?.[1];

describe("/healthz", () => {
  it("healthy while a long tick makes progress, not only when ticks end", async () => {
    const ledger = await openLedger("sqlite::memory:");
    const metrics = new DaemonMetrics(ledger, 1_000);
    try {
      const port = await metrics.listen(0, "127.0.0.1");
      const health = async () => (await fetch(`http://127.0.0.1:${port}/healthz`)).status;
      expect(await health()).toBe(503); // no tick has reached the ledger yet
      metrics.progress(); // a row settled, in a tick still running
      expect(await health()).toBe(200);
    } finally {
      await metrics.close();
      await ledger.close();
    }
  });
});

describe("the /metrics server failing once it listens", () => {
  it("an error (EMFILE on accept) is said each time and survived: the server goes on serving", async () => {
    const metrics = new DaemonMetrics(undefined, 1_000);
    const said: string[] = [];
    try {
      const port = await metrics.listen(0, "127.0.0.1", (e) => said.push(e.message));
      // What net.Server emits when accept fails (too many open files). Before: the listen's one-off
      // listener took the first one silently, and the second was an unhandled 'error' (the daemon gone).
      const server = (metrics as unknown as { server: Server }).server;
      for (let i = 0; i < 2; i++)
        server.emit("error", Object.assign(new Error("accept EMFILE"), { code: "EMFILE", syscall: "accept" }));
      expect(said).toEqual(["accept EMFILE", "accept EMFILE"]);
      expect((await fetch(`http://127.0.0.1:${port}/metrics`)).status).toBe(200);
    } finally {
      await metrics.close();
    }
  });
});

describe("/metrics while the ledger cannot count", () => {
  it("answers 200 with idem_ledger_up, leaving the unsettled gauge out", async () => {
    const ledger = await openLedger("sqlite::memory:");
    const metrics = new DaemonMetrics(ledger, 1_000, { statsTtlMs: 0 });
    try {
      const port = await metrics.listen(0, "127.0.0.1");
      const scrape = async () => {
        const res = await fetch(`http://127.0.0.1:${port}/metrics`);
        return { status: res.status, text: await res.text() };
      };
      const parked = defineAction({
        type: "sms.parked",
        capabilities: {},
        execute: async () => {
          throw new Error("timeout after send");
        },
      });
      await ledger.run(parked, { tenant: "t", key: ["p"], args: {} }); // needs_review: unsettled
      expect((await scrape()).text).toMatch(
        /^idem_unsettled_operations\{status="needs_review",action="sms.parked"\} 1$/m,
      );
      await ledger.close(); // every count fails from here, as on a database that is down
      // Before: 500 with the count's error, and no idem_ledger_up for the scraper.
      const down = await scrape();
      expect(down.status).toBe(200);
      expect(down.text).toMatch(/^idem_ledger_up /m);
      expect(down.text).not.toMatch(/^idem_unsettled_operations\{/m);
    } finally {
      await metrics.close();
    }
  });
});

describe("/metrics when every count takes longer than a scrape waits, on postgres", () => {
  it("shows the count that came in after a scrape gave up on it, not never a count", async () => {
    // A large backlog or a loaded database: the count answers after the scrape's 5 s. Before, its
    // answer was dropped, each scrape began a count of its own and gave up on it: the gauge was
    // never shown, when it matters most.
    const url = await freshDatabase("postgres");
    const ledger = await openLedger(url, { lockTimeoutMs: 120_000 });
    let lock: { release(): Promise<void> } | undefined;
    try {
      const parked = defineAction({
        type: "sms.parked",
        capabilities: {},
        execute: async () => {
          throw new Error("timeout after send");
        },
      });
      await ledger.run(parked, { tenant: "t", key: ["p"], args: {} }); // needs_review: unsettled
      const metrics = new DaemonMetrics(ledger, 1_000, { statsTtlMs: 600_000 });
      lock = await lockTable(url, "idem_operations"); // counts are slow: each waits on this lock
      expect(await metrics.registry.metrics()).not.toMatch(/^idem_unsettled_operations\{/m); // gave up at 5 s
      await lock.release(); // that count answers now, after its scrape
      lock = undefined;
      lock = await lockTable(url, "idem_operations"); // and the next one is as slow
      expect(await metrics.registry.metrics()).toMatch(
        /^idem_unsettled_operations\{status="needs_review",action="sms.parked"\} 1$/m,
      );
    } finally {
      await lock?.release();
      await ledger.close();
    }
  }, 120_000);
});

describe("/metrics with a query string", () => {
  it("is served as /metrics (a scrape config's params), and /healthz as /healthz", async () => {
    const metrics = new DaemonMetrics(undefined, 1_000);
    try {
      const port = await metrics.listen(0, "127.0.0.1");
      // Before: 404 for both, a scraper with `params` saw the target down.
      const scraped = await fetch(`http://127.0.0.1:${port}/metrics?format=prometheus`);
      expect(scraped.status).toBe(200);
      expect(await scraped.text()).toMatch(/^idem_ledger_up 0$/m);
      expect((await fetch(`http://127.0.0.1:${port}/healthz?probe=k8s`)).status).toBe(503); // no tick yet
      expect((await fetch(`http://127.0.0.1:${port}/metricsx`)).status).toBe(404);
    } finally {
      await metrics.close();
    }
  });
});

describe("idem_stuck_operations before the daemon has read it", () => {
  it("is absent, not a 0 nobody read", async () => {
    const ledger = await openLedger("sqlite::memory:");
    try {
      const text = await new DaemonMetrics(ledger, 1_000).registry.metrics();
      // Before: "idem_stuck_operations 0" from the start, whatever the ledger held.
      expect(sample(text, "idem_stuck_operations")).toBeUndefined();
      expect(text).toMatch(/^# HELP idem_daemon_errors_total .*could not be settled/m);
    } finally {
      await ledger.close();
    }
  });
});

describe("the metrics port", () => {
  it("in use: a ConfigError naming it, not an unhandled error event", async () => {
    const taken: Server = createServer();
    await new Promise<void>((resolve) => taken.listen(0, "127.0.0.1", resolve));
    const { port } = taken.address() as AddressInfo;
    const ledger = await openLedger("sqlite::memory:");
    const metrics = new DaemonMetrics(ledger, 1_000);
    try {
      await expect(metrics.listen(port, "127.0.0.1")).rejects.toThrow(ConfigError);
      await expect(metrics.listen(port, "127.0.0.1")).rejects.toThrow(`127.0.0.1:${port}`);
    } finally {
      await new Promise((resolve) => taken.close(resolve));
      await ledger.close();
    }
  });
});

for (const dialect of DIALECTS) {
  describe(`run-result metrics on ${dialect}`, () => {
    it("counts runs by outcome and the duplicates the ledger answered", async () => {
      const registry = new Registry();
      const counters = runResultCounters(registry);
      const ledger = await openLedger(await freshDatabase(dialect), { onResult: counters.onResult });
      let executed = 0;
      const send = defineAction({ type: "sms.send", capabilities: {}, execute: async () => ({ n: ++executed }) });
      for (let i = 0; i < 3; i++) await ledger.run(send, { tenant: "t", key: ["same"], args: {} });
      await ledger.close();
      const text = await registry.metrics();
      expect(executed).toBe(1);
      expect(text).toMatch(/^idem_duplicates_answered_total\{action="sms.send"\} 2$/m);
      expect(text).toMatch(/^idem_runs_total\{action="sms.send",outcome="succeeded"\} 3$/m);
    });

    it("counts the operations not settled yet by status and action, summed over tenants unless a tenant label is asked for", async () => {
      const ledger = await openLedger(await freshDatabase(dialect));
      const send = defineAction({ type: "sms.send", capabilities: {}, execute: async () => ({ ok: true }) });
      // An answer lost after the request left, with no way to look it up: a person must decide.
      const lost = defineAction({
        type: "sms.lost",
        capabilities: {},
        execute: async () => {
          throw new Error("socket closed after the request was sent");
        },
      });
      for (const tenant of ["a", "b", "c"]) {
        await ledger.run(send, { tenant, key: ["k"], args: {} });
        await ledger.run(lost, { tenant, key: ["k"], args: {} });
      }
      const bounded = await new DaemonMetrics(ledger, 1_000).registry.metrics();
      expect(bounded).toMatch(/^idem_unsettled_operations\{status="needs_review",action="sms.lost"\} 3$/m);
      expect(bounded).not.toMatch(/^idem_unsettled_operations\{status="succeeded"/m); // settled: idem_runs_total counts them
      expect(bounded).not.toMatch(/^idem_unsettled_operations\{.*tenant=/m);
      expect(bounded).toMatch(/^process_resident_memory_bytes \d+/m);
      const labelled = await new DaemonMetrics(ledger, 1_000, { perTenant: true }).registry.metrics();
      for (const tenant of ["a", "b", "c"]) {
        expect(labelled).toMatch(
          new RegExp(
            `^idem_unsettled_operations\\{status="needs_review",action="sms.lost",tenant="${tenant}"\\} 1$`,
            "m",
          ),
        );
      }
      await ledger.close();
    });

    it(
      "idem_stuck_operations counts every stuck run: past the read's 1,000, not hidden by the daemon's own deliveries, and absent during an outage",
      async () => {
        const url = await freshDatabase(dialect);
        const config = parseConfig({
          ledger: url,
          alerts: { log: true },
          thresholds: { stuckAfterMs: 60_000 },
          daemon: { intervalMs: 1_000 },
        });
        const silent = pino({ level: "silent" });
        let now = Date.now();
        let release: () => void = () => {};
        const released = new Promise<void>((r) => (release = r));
        const hangs = (type: string) =>
          defineAction<{ n: number }, { id: string }>({
            type,
            capabilities: {},
            execute: async () => {
              await released; // the provider does not answer
              return { id: "done" };
            },
          });
        const ledger = await openTestLedger(url, {
          clock: () => now,
          poolSize: 4,
          leaseMs: 24 * 3_600_000,
          actions: alertActions(config, silent),
        });
        const runs: Promise<unknown>[] = [];
        const running = async (n: number) =>
          until(
            async () => (await ledger.admin.stats()).unsettled.reduce((s, r) => s + r.count, 0) === n,
            60_000,
            `${n} runs to be running`,
          );
        try {
          // A thousand of the daemon's own deliveries to a webhook that does not answer, oldest;
          // then 1,001 runs of an application's action.
          const delivery = hangs("idem.alert.webhook");
          for (let i = 0; i < 1_000; i++)
            runs.push(ledger.run(delivery, { tenant: config.alerts.tenant, key: ["d", i], args: { n: i } }));
          await running(1_000);
          now += 60_000;
          const send = hangs("mail.send");
          for (let i = 0; i < 1_001; i++) runs.push(ledger.run(send, { tenant: "t", key: ["s", i], args: { n: i } }));
          await running(2_001);
          now += 10 * 60_000; // all running for 10 minutes or more: stuck
          const metrics = new DaemonMetrics(ledger, 1_000);
          const daemon = new Daemon(ledger, config, silent, metrics, "d-stuck-count");
          // Stopping: the tick reads and counts the stuck runs, and sends none of their 1,001 alerts.
          daemon.stop();
          await daemon.tick();
          metrics.tick(); // as the daemon's loop marks a tick done
          // Before: 0, the read's 1,000 rows all deliveries, left out after it.
          expect(sample(await metrics.registry.metrics(), "idem_stuck_operations")).toBe("1001");
          // The next tick finds the ledger unavailable, as the daemon's loop says it: the count is
          // no longer known. Before: 1001 (the last value) for as long as the outage lasted.
          metrics.unavailable(new LedgerUnavailableError("the ledger database is unavailable"));
          expect(sample(await metrics.registry.metrics(), "idem_stuck_operations")).toBeUndefined();
        } finally {
          release();
          await Promise.allSettled(runs);
          await ledger.close();
        }
      },
      scaled(180_000),
    );

    it("two scrapes at once while the ledger counts read the same counts, not twice them", async () => {
      // Two Prometheus servers (an HA pair) scraping the same daemon, or a person's curl during a
      // scrape: both wait for the one count. Before, each emptied the gauge before waiting and
      // added the rows after it, so both scrapes read 2 where the ledger held 1.
      const ledger = await openLedger(await freshDatabase(dialect));
      const lost = defineAction({
        type: "sms.lost",
        capabilities: {},
        execute: async () => {
          throw new Error("socket closed after the request was sent");
        },
      });
      await ledger.run(lost, { tenant: "a", key: ["k"], args: {} });
      const metrics = new DaemonMetrics(ledger, 1_000);
      try {
        // As the server answers two requests: each one's registry.metrics(), the second begun
        // while the first waits for the count.
        const both = await Promise.all([metrics.registry.metrics(), metrics.registry.metrics()]);
        for (const text of both)
          expect(text).toMatch(/^idem_unsettled_operations\{status="needs_review",action="sms.lost"\} 1$/m);
      } finally {
        await ledger.close();
      }
    });
  });
}
