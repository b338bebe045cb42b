/**
 * Prometheus metrics and health for the daemon (prom-client). Counters are the daemon's own;
 * the operations not settled yet, by status and action (and tenant, when asked: one series per
 * tenant can be millions), come from `ledger.admin.stats()`, which reads only those rows through
 * their indexes (its cost follows the work waiting, not the ledger's size), cached for
 * `statsTtlMs`; the process's own metrics (CPU, memory, event loop lag, GC) too. Settled
 * operations are counted where they settle: `idem_runs_total` in the agents (`onResult`).
 */
import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { Counter, Gauge, Registry, collectDefaultMetrics } from "prom-client";
import type { Ledger, RunResult } from "@idem/core";
import { ConfigError } from "./config.js";

/**
 * Counters of `ledger.run` results, for any process: pass `onResult` to `openLedger`. In an
 * agent, `idem_duplicates_answered_total` counts the calls the ledger answered without executing.
 */
export function runResultCounters(registry: Registry) {
  const runs = new Counter({
    name: "idem_runs_total",
    help: "ledger.run results by action and outcome",
    labelNames: ["action", "outcome"],
    registers: [registry],
  });
  const duplicates = new Counter({
    name: "idem_duplicates_answered_total",
    help: "Calls answered from the ledger (a stored receipt or failure replayed), by action",
    labelNames: ["action"],
    registers: [registry],
  });
  const onResult = (r: RunResult<unknown>, info: { action: string }) => {
    runs.inc({
      action: info.action,
      outcome: r.status === "pending_verification" ? `pending_verification:${r.state}` : r.status,
    });
    if (r.status !== "pending_verification" && r.replayed) duplicates.inc({ action: info.action });
  };
  return { runs, duplicates, onResult };
}

/** How long a scrape waits for the ledger's counts (Prometheus gives a scrape 10 s by default). */
const STATS_WAIT_MS = 5_000;

/** The promise's value, or undefined if it failed or took longer than `ms`. */
async function answerWithin<T>(p: Promise<T>, ms: number): Promise<T | undefined> {
  let timer: NodeJS.Timeout | undefined;
  const late = new Promise<undefined>((resolve) => {
    timer = setTimeout(() => resolve(undefined), ms);
  });
  try {
    return await Promise.race([p.catch(() => undefined), late]);
  } finally {
    clearTimeout(timer);
  }
}

export class DaemonMetrics {
  readonly registry = new Registry();
  readonly reconciliations = new Counter({
    name: "idem_reconciliations_total",
    help: "Operations the daemon settled, by outcome",
    labelNames: ["outcome"],
    registers: [this.registry],
  });
  readonly alerts = new Counter({
    name: "idem_alerts_sent_total",
    help: "Alerts delivered, by kind and sink",
    labelNames: ["kind", "sink"],
    registers: [this.registry],
  });
  readonly escalations = new Counter({
    name: "idem_escalations_total",
    help: "Operations sent to review by the daemon's limits: unknown outcomes after too many checks or too long, work known not done after too many tries the provider refused (or too long, its action not in the daemon's config)",
    registers: [this.registry],
  });
  /**
   * The last tick's count, shown only while the ledger is up (as /healthz says): before the first
   * tick and during an outage (down, frozen) the sample is left out, rather than a 0 that was never
   * read or a count that is no longer true. `absent(idem_stuck_operations)` (or `idem_ledger_up 0`)
   * is what a rule sees then.
   */
  private stuckCount: number | undefined;
  private readonly stuck: Gauge = new Gauge({
    name: "idem_stuck_operations",
    help: "Operations running longer than their threshold, as the daemon's last tick counted them; absent before its first tick and while the ledger is not up (idem_ledger_up 0)",
    registers: [this.registry],
    collect: (): void => {
      if (this.stuckCount !== undefined && this.health().ledger === "up") this.stuck.set(this.stuckCount);
      else this.stuck.remove({}); // a gauge without labels otherwise shows 0
    },
  });
  readonly ticks = new Counter({
    name: "idem_daemon_ticks_total",
    help: "Daemon loop iterations",
    registers: [this.registry],
  });
  readonly errors = new Counter({
    name: "idem_daemon_errors_total",
    help: "Daemon failures: ticks that failed (the ledger unavailable included), due operations that could not be settled, and tries to open the ledger while its database was unreachable",
    registers: [this.registry],
  });
  readonly results = runResultCounters(this.registry);
  readonly ledgerUp: Gauge = new Gauge({
    name: "idem_ledger_up",
    help: "1 when the daemon's last tick reached the ledger database and wrote to it, recently; 0 while it cannot, or while a tick has not come back (a frozen database), as /healthz says",
    registers: [this.registry],
    collect: (): void => this.ledgerUp.set(this.health().ledger === "up" ? 1 : 0),
  });
  private lastTickAt = 0;
  private lastProgressAt = 0;
  /** Set while ticks fail because the ledger's database cannot be reached: since when, and why. */
  private outage: { since: number; error: string } | undefined;
  private server: Server | undefined;

  /** `ledger`: undefined while the daemon waits for its database (see `attach`). */
  constructor(
    private ledger: Ledger | undefined,
    private readonly intervalMs: number,
    options: { statsTtlMs?: number; perTenant?: boolean } = {},
  ) {
    const statsTtlMs = options.statsTtlMs ?? 15_000;
    const perTenant = options.perTenant === true;
    collectDefaultMetrics({ register: this.registry });
    type Counted = { at: number; rows: Awaited<ReturnType<Ledger["admin"]["stats"]>>["unsettled"] };
    let cache: Counted | undefined;
    let counting: Promise<Counted> | undefined; // one count at a time, shared by overlapping scrapes
    /** The rows to show: cached, else counted now; undefined while the ledger is not open or does not answer. */
    const counted = async (): Promise<Counted["rows"] | undefined> => {
      const ledger = this.ledger;
      if (!ledger) return undefined; // not open yet: no rows to count
      if (cache && Date.now() - cache.at <= statsTtlMs) return cache.rows;
      // A ledger that does not answer (down, frozen) leaves the gauge out of this scrape: the
      // rest, idem_ledger_up 0 first, is what the scraper needs then, within its timeout.
      // Cached when it answers, not when a scrape still waits for it: a count that takes longer
      // than a scrape waits (a large backlog, a loaded database) is shown by the next scrape;
      // dropped, each scrape began a count of its own and gave up on it, and none was ever shown.
      counting ??= ledger.admin
        .stats()
        .then((s) => (cache = { at: Date.now(), rows: s.unsettled }))
        .finally(() => (counting = undefined));
      return (await answerWithin(counting, STATS_WAIT_MS))?.rows;
    };
    new Gauge({
      name: "idem_unsettled_operations",
      help: `Operations not settled yet (running, unknown, pending, needs_review) by status and action${perTenant ? " and tenant" : ""}`,
      labelNames: perTenant ? ["status", "action", "tenant"] : ["status", "action"],
      registers: [this.registry],
      async collect() {
        const rows = await counted();
        // Emptied and filled in one go, after the wait: a scrape that began meanwhile (an HA pair of
        // scrapers, a person's curl) emptied it before its own wait, and filled before ours, the
        // sums (inc) counted each row twice.
        this.reset();
        if (!rows) return;
        if (perTenant) {
          for (const r of rows) this.set({ status: r.status, action: r.action, tenant: r.tenant }, r.count);
          return;
        }
        for (const r of rows) this.inc({ status: r.status, action: r.action }, r.count);
      },
    });
  }

  /** The count of stuck operations a tick read (`idem_stuck_operations`). */
  stuckRead(count: number): void {
    this.stuckCount = count;
  }

  /** The ledger, once opened after a wait for its database. */
  attach(ledger: Ledger): void {
    this.ledger = ledger;
  }

  /** A tick completed; returns how long the ledger had been unavailable before it, if it had. */
  tick(): number | undefined {
    this.lastTickAt = Date.now();
    this.ticks.inc();
    const down = this.outage && this.lastTickAt - this.outage.since;
    this.outage = undefined;
    return down;
  }

  /**
   * A step of a tick reached the ledger (a row settled, an alert delivered): a long tick that is
   * making progress is healthy, not stuck.
   */
  progress(): void {
    this.lastProgressAt = Date.now();
  }

  /** A tick failed because the ledger is unavailable; returns true for the first failure of an outage. */
  unavailable(error: Error): boolean {
    this.errors.inc();
    const first = this.outage === undefined;
    this.outage = { since: this.outage?.since ?? Date.now(), error: error.message };
    return first;
  }

  /**
   * Healthy: the last tick reached the ledger and wrote to it, recently. During an outage (the
   * database down, or taking no writes: a full disk) the daemon keeps running and retrying; the
   * body says since when and why, for the operator and the probe. A tick that has not come back (a
   * frozen database: its statement fails only at the client's read timeout, statementTimeoutMs +
   * 5 s) makes it unhealthy first; the ledger is then "unknown", not "up", until that statement's
   * failure says "unavailable" (or the tick ends).
   */
  private health() {
    const last = Math.max(this.lastTickAt, this.lastProgressAt);
    const fresh = Date.now() - last < Math.max(3 * this.intervalMs, 10_000);
    return {
      ok: fresh && !this.outage,
      ledger: this.outage ? "unavailable" : fresh ? "up" : "unknown",
      lastTickAt: this.lastTickAt,
      lastProgressAt: this.lastProgressAt,
      ...(this.outage && { unavailableSince: this.outage.since, error: this.outage.error }),
    };
  }

  /**
   * Serves /metrics and /healthz. `onError`: a server error once listening (EMFILE on accept),
   * said and survived: the daemon's settling does not stop for its metrics endpoint.
   */
  async listen(port: number, host: string, onError: (error: Error) => void = () => undefined): Promise<number> {
    this.server = createServer(async (req, res) => {
      // By its path: a scraper may add parameters (`params` in Prometheus' scrape config).
      const path = (req.url ?? "").split("?")[0];
      if (path === "/metrics") {
        try {
          const body = await this.registry.metrics();
          res.writeHead(200, { "content-type": this.registry.contentType }).end(body);
        } catch (e) {
          res.writeHead(500).end(String(e));
        }
      } else if (path === "/healthz") {
        const body = this.health();
        res.writeHead(body.ok ? 200 : 503, { "content-type": "application/json" }).end(JSON.stringify(body));
      } else {
        res.writeHead(404).end();
      }
    });
    // A port in use (or not ours to bind) is a configuration problem to report, not an
    // unhandled 'error' event that takes the daemon down with a stack trace.
    await new Promise<void>((resolve, reject) => {
      this.server!.once("error", (cause: Error) =>
        reject(new ConfigError(`cannot serve /metrics on ${host}:${port}: ${cause.message}`, { cause })),
      );
      this.server!.listen(port, host, () => {
        this.server!.removeAllListeners("error").on("error", onError);
        resolve();
      });
    });
    return (this.server.address() as AddressInfo).port;
  }

  async close(): Promise<void> {
    if (this.server) await new Promise((r) => this.server!.close(r));
  }
}
