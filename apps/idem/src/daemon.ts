/**
 * `idem daemon`: loops until stopped. Each tick it claims due operations (a dead worker's expired
 * lease, an unknown outcome or known-undone work whose time came) and settles each by the replay
 * policy (its own alert deliveries too: one a person retried is settled with its sink's action,
 * which the ledger must hold: `alertActions`), each settlement ending by the claim's end (a lookup
 * that hangs is given up there: still unknown, checked again later); escalates unknowns that
 * stayed inconclusive too long; alerts once on new needs_review, on auth/policy failures, once
 * per unknown attempt on a credential refused while checking it, and on operations running longer
 * than their threshold (of every tenant: only its own deliveries, in `alerts.tenant` and of a
 * sink's type, are not alerted). It refuses a config with no alert sink. SIGTERM lets the request
 * in flight finish and be recorded, sends no other (a settlement waiting out a backoff ends at
 * once), gives back the rest of the tick's claim (another replica may take those rows at once,
 * not a claim later), then exits (a second signal: stop-signals.ts). While the ledger's database is unreachable (a restart, a
 * failover) or takes no writes (a full or read-only disk: reads still pass, so each tick begins with a write,
 * `ledger.daemon.heartbeat`) it keeps running: it says so once, reports it on /healthz, retries
 * every interval and says when it is back. A SQLite ledger whose file was deleted or replaced
 * under it (made anew at its path) is no outage that passes: it says so and exits non-zero, for
 * its supervisor to start it again on the file now at the path.
 */
import type { Logger } from "pino";
import {
  LedgerUnavailableError,
  UnknownActionError,
  isEscalation,
  isFailureOverruled,
  isFoundOnRetry,
  isPossiblyTwo,
  isVerdictOverruled,
  performedProof,
  twoEffectsTold,
  type DueOperation,
  type Ledger,
  type Operation,
  type OperationEvent,
  type RunResult,
} from "@idem/core";
import {
  ALERT_TYPES,
  DELIVERY_BUDGET,
  alertOf,
  alertSinks,
  deliver,
  isAlertDelivery,
  loadEmailClient,
  requireAlertSink,
  sinkOf,
  unconfiguredSinks,
  type Alert,
  type AlertKind,
  type SinkName,
} from "./alerts.js";
import type { IdemConfig } from "./config.js";
import type { DaemonMetrics } from "./metrics.js";
import { SinkBackoff, SinksThisTick } from "./sink-backoff.js";
import { stuckRunsCounted } from "./stuck.js";

/** Pages of due alerts one tick goes through (daemon.batch each). */
const ALERT_PAGES = 10;

export class Daemon {
  /** Aborted by `stop()`: the settlement in flight sends nothing more and ends its pause. */
  private readonly stopped = new AbortController();
  private wake: (() => void) | undefined;
  private readonly sinks;
  private readonly unconfigured: { names: SinkName[]; types: string[] };
  private readonly actor: string;
  private readonly name: string;
  /** Sinks that failed, held back across ticks (this process's schedule, on the database clock). */
  private readonly backoff: SinkBackoff;

  constructor(
    private readonly ledger: Ledger,
    private readonly config: IdemConfig,
    private readonly log: Logger,
    private readonly metrics: DaemonMetrics,
    name: string,
  ) {
    // As `idem daemon` refuses it: with no sink, every alert would be acknowledged, sent nowhere.
    requireAlertSink(config);
    this.sinks = alertSinks(config, log);
    // Not awaited, as `idem daemon` does before its ledger opens: a library user building a Daemon
    // hears at once, at error, that its email sink's client cannot be loaded, not at the first
    // email alert. Said once a log (`loadEmailClient`), so `idem daemon`'s start says it once.
    loadEmailClient(config, log);
    this.unconfigured = unconfiguredSinks(this.sinks);
    this.name = name;
    this.actor = `idem-daemon:${name}`;
    this.backoff = new SinkBackoff(log, config.daemon.intervalMs, () => ledger.admin.now());
    if (this.unconfigured.names.length > 0)
      log.info(
        { sinks: this.sinks.map((s) => s.name), unconfigured: this.unconfigured.names },
        `alert deliveries to ${this.unconfigured.names.join(", ")} (a person's retry of one) are left to a daemon whose config has that sink`,
      );
  }

  /**
   * Runs until `stop()`; resolves after the last tick finished. Rejects with the
   * `LedgerUnavailableError` of a ledger that must be reopened (`reopen`: its SQLite file was
   * replaced or deleted), which no retry could get past. A connection closed on a transaction
   * SQLite could neither commit nor roll back (`reopensItself`) is opened again by the ledger at
   * its next statement: that tick failed, the next one goes on.
   */
  async run(): Promise<void> {
    while (!this.stopping) {
      try {
        // The ledger takes writes: a full disk still answers the tick's reads.
        await this.ledger.daemon.heartbeat(this.name);
        await this.tick();
        const downMs = this.metrics.tick();
        if (downMs !== undefined) this.log.info({ downMs }, "the ledger database is reachable again");
      } catch (error) {
        if (error instanceof LedgerUnavailableError && error.reopen && !error.reopensItself) {
          // A SQLite file deleted or replaced under the ledger: this ledger never writes again, so
          // waiting is for ever. Its supervisor starts the daemon again, which opens the file now
          // at the path. (A connection closed on a transaction that could not end is opened again
          // by the ledger itself: an outage, retried below.)
          this.log.fatal(
            { err: error },
            `the ledger must be opened again (${error.message}): exiting; restart the daemon to open the ledger now at its path`,
          );
          throw error;
        }
        if (error instanceof LedgerUnavailableError) {
          if (this.metrics.unavailable(error))
            this.log.error({ err: error }, "the ledger database is unavailable; retrying every interval");
        } else {
          this.metrics.errors.inc();
          this.log.error({ err: error }, "daemon tick failed; retrying next interval");
        }
      }
      if (this.stopping) break;
      await new Promise<void>((resolve) => {
        const t = setTimeout(resolve, this.config.daemon.intervalMs);
        this.wake = () => {
          clearTimeout(t);
          resolve();
        };
      });
    }
  }

  /** Stops the loop (or the pass): the work in flight ends and is recorded. */
  stop(): void {
    this.stopped.abort(new Error("the daemon is stopping"));
    this.wake?.();
  }

  /**
   * One pass: settle what is due, then alert. Exposed for tests and `idem daemon --once`.
   * `failed`: due operations it could not settle; `undelivered`: alert deliveries no sink took
   * this tick (a sink down or refusing, or one gone to review without an answer; `Delivery.missed`),
   * each once, though both the settling and the alert's delivery met it. Each is logged; a run
   * once exits non-zero on either.
   */
  async tick(): Promise<{ failed: number; undelivered: number }> {
    // Sinks held back by their backoff, and those that do not take a delivery this tick, are not tried in it.
    const down = await SinksThisTick.start(this.backoff);
    // By the delivery's key: a pending delivery the settling tried is met again by its alert's delivery.
    const undelivered = new Set<string>();
    // Stuck first: a dead worker's row is reported even when this tick is about to settle it.
    await this.alertStuck(down, undelivered);
    const failed = await this.settleDue(down, undelivered);
    await this.alertPending(down, undelivered);
    return { failed, undelivered: undelivered.size };
  }

  /**
   * Settles what is due, alert deliveries last (a slow sink must not hold back the rest within
   * the claim). A delivery due is one a person retried, or one left pending whose alert is still
   * due (then this is the delivery's try for the tick): it is settled with its sink's action, and
   * counts for the sink as a delivery of the tick does (alerts.ts `deliver`).
   */
  private async settleDue(down: SinksThisTick, undelivered: Set<string>): Promise<number> {
    if (this.stopping) return 0; // nothing claimed only to be given back
    let failed = 0;
    const d = this.config.daemon;
    // Our claim on these rows ends claimMs after the claim was asked for (then another daemon may
    // take them): stop starting settlements a little before, and give the rest back. A settlement
    // under way ends by the claim's end (`timeoutMs`): a lookup that hangs is given up there (the
    // operation stays unknown, checked again later), and so is a request, a second after its
    // signal aborted (unknown: it may have been sent), rather than holding the tick (30 s, the
    // ledger's budget, whatever the claim; a request, for as long as it hung).
    const claimEnds = performance.now() + d.claimMs;
    const until = performance.now() + d.claimMs * 0.9;
    // A delivery to a sink this config lacks is not claimed: another replica's, or a person's to
    // configure (failed here, the replica with the sink would read the alert as answered).
    const except = { tenant: this.config.alerts.tenant, actions: this.unconfigured.types };
    // A sink's action type in another tenant is no delivery of ours: never run with our sink
    // (its credentials, the operators' channel), whatever args that tenant stored.
    const reserved = { tenant: this.config.alerts.tenant, actions: ALERT_TYPES };
    const claimed = await this.ledger.daemon.claimDue({ limit: d.batch, claimMs: d.claimMs, except, reserved });
    const due = [...claimed.filter((row) => !this.sinkOf(row)), ...claimed.filter((row) => this.sinkOf(row))];
    for (const [i, row] of due.entries()) {
      if (this.stopping || performance.now() >= until) {
        // The rows not tried are due again now, not once the claim ends; a down sink's deliveries
        // wait for the claim's end, as below.
        const waits = (r: DueOperation) => {
          const sink = this.sinkOf(r);
          return sink !== undefined && down.has(sink);
        };
        await this.release(due.slice(i).filter((r) => !waits(r)));
        break;
      }
      const sink = this.sinkOf(row);
      try {
        if (sink && down.has(sink)) {
          // Not tried again this tick; due again once the claim ends.
          undelivered.add((await this.ledger.get(row)).operation.key);
          continue;
        }
        // Escalation is decided on the same snapshot as the rest, by the database clock.
        const out = await this.busy(() =>
          this.ledger.daemon.settle({
            tenant: row.tenant,
            id: row.id,
            actor: this.actor,
            // Not a delivery's: its sink's tries refused (down, failing, a bad authorization) would
            // send it to a person after maxChecks, and `deliver` then acknowledges its alert unsent.
            // It stays due until a sink takes it; the log says why (`undelivered`, once while the sink fails).
            ...(!sink && { escalate: { maxChecks: d.maxChecks, maxAgeMs: d.maxAgeMs } }),
            stop: this.stopped.signal,
            timeoutMs: Math.max(1, Math.floor(claimEnds - performance.now())),
            // A delivery is one request a tick, as `deliver` makes it (alerts.ts).
            ...(sink && { budget: DELIVERY_BUDGET }),
          }),
        );
        if (out.status === "pending_verification" && out.state === "needs_review" && isEscalation(out.reason))
          this.metrics.escalations.inc();
        const outcome = out.status === "pending_verification" ? `pending_verification:${out.state}` : out.status;
        this.metrics.reconciliations.inc({ outcome });
        this.metrics.progress();
        this.log.info(
          { operationId: row.id, tenant: row.tenant, action: row.action, from: row.status, outcome },
          "settled",
        );
        if (sink) await this.delivered(row, sink, out, down, undelivered);
      } catch (error) {
        // The database is gone: end the tick rather than fail each row. The rest stay claimed for
        // claimMs: giving them back would only wait on the same database (a frozen one: its timeouts).
        if (error instanceof LedgerUnavailableError) throw error;
        this.metrics.errors.inc();
        failed += 1;
        const msg = !(error instanceof UnknownActionError)
          ? "settling failed"
          : sink
            ? `no action of type ${row.action} in the daemon's ledger: open it with alertActions(config, log) among its actions`
            : `no action of type ${row.action} in the daemon's config`;
        this.log.error({ err: error, operationId: row.id, tenant: row.tenant, action: row.action }, msg);
      }
    }
    return failed;
  }

  /**
   * Gives back claimed rows this tick will not settle (stopping, or out of claim time), so that
   * another daemon may take them now rather than once the claim ends. Best-effort: when it fails
   * (the database is gone), they are due again once the claim ends, as before; it never throws.
   */
  private async release(rows: DueOperation[]): Promise<void> {
    if (rows.length === 0) return;
    try {
      const released = await this.ledger.daemon.release(rows);
      this.log.info({ claimed: rows.length, released }, "gave back the claim on operations not settled this tick");
    } catch (error) {
      this.log.warn(
        { err: error, claimed: rows.length },
        "could not give back the claim on operations not settled this tick: they are due again once it ends",
      );
    }
  }

  /**
   * Runs one settlement or delivery, which may take its whole retry budget (a slow lookup, a
   * provider's Retry-After), saying it is making progress meanwhile so that /healthz does not call
   * a working daemon dead; for at most a claim's time, the longest one may rightly take (a
   * settlement ends by its claim's end). One that takes longer (a request that never answers, the
   * action's client having no timeout) makes the daemon unhealthy: it is stuck. Progress is a
   * heartbeat that the ledger took, each interval, not the work merely being under way: a
   * database that froze meanwhile answers none, and /healthz says so (it said "up" for the
   * whole claim while the request waited on the provider and no statement came back).
   */
  private async busy<T>(work: () => Promise<T>): Promise<T> {
    const until = Date.now() + this.config.daemon.claimMs;
    let beating = false; // one beat at a time: a frozen database's beats would pile up
    const timer = setInterval(() => {
      if (beating || Date.now() >= until) return;
      beating = true;
      this.ledger.daemon
        .heartbeat(this.name)
        .then(
          () => {
            if (Date.now() < until) this.metrics.progress();
          },
          () => {}, // the tick's own statements report an outage; a missed beat only withholds progress
        )
        .finally(() => (beating = false));
    }, this.config.daemon.intervalMs);
    try {
      return await work();
    } finally {
      clearInterval(timer);
    }
  }

  private get stopping(): boolean {
    return this.stopped.signal.aborted;
  }

  /** The sink of one of this daemon's alert deliveries; undefined for any other operation. */
  private sinkOf(row: DueOperation): SinkName | undefined {
    return isAlertDelivery(this.config, row) ? sinkOf(row.action) : undefined;
  }

  /**
   * What a settled alert delivery tells: sent (counted), or not, said once; its sink not taking it,
   * for the tick. Its key goes to `undelivered` when its sink did not say it took it now (not
   * reached, refusing it, or no answer: in review, it may have been sent, and a person checks).
   */
  private async delivered(
    row: DueOperation,
    sink: SinkName,
    out: RunResult<unknown>,
    down: SinksThisTick,
    undelivered: Set<string>,
  ): Promise<void> {
    if (out.status === "pending_verification" && out.state === "running") return; // another replica has it now
    const stored = await this.ledger.get({ tenant: row.tenant, id: row.id });
    const alert = stored.args as Alert | null;
    if (out.status === "succeeded") {
      if (!out.replayed && alert) this.sent(alert.kind, sink);
      if (!out.replayed) down.took(sink);
      return;
    }
    // In review too: it may have been sent, but nothing says so; a person decides (said below), as deliver() counts it.
    undelivered.add(stored.operation.key);
    const said = {
      fields: { sink, operationId: alert?.operationId, delivery: out },
      msg: `alert delivery to ${sink} did not succeed (${out.status}); see idem show ${row.id} --tenant ${row.tenant}`,
    };
    if (out.status === "pending_verification") {
      // Not taken (unreachable, rate limiting, no answer), as deliver() counts it. Only a pending
      // delivery was sent to the sink here: an unknown one, or one whose daemon died sending it, goes
      // to review without the sink being asked (a webhook's or an email's; a log line is written again), and tells nothing about it now.
      const inReview = out.state === "needs_review";
      if (inReview) this.reported.add(out.operationId); // said here, not again by deliver()
      if (row.status === "pending" && !inReview) return down.failed(sink, said); // backs off, said once
      if (row.status === "pending") down.add(sink);
    }
    this.log.error(said.fields, said.msg);
  }

  private async alertStuck(down: SinksThisTick, undelivered: Set<string>): Promise<void> {
    const t = this.config.thresholds;
    // Each threshold read apart: another action's many runs within their own, longer one must not
    // hide these. Not the daemon's own deliveries (a slow sink is said in their log lines), left
    // out by the reads, before their limit (many of them filled it and hid every other run), but
    // every other operation, also of a tenant the config names as the alerts' own.
    const except = { tenant: this.config.alerts.tenant, actions: ALERT_TYPES };
    const { runs: stuck, count } = await stuckRunsCounted(this.ledger, t, except);
    this.metrics.stuckRead(count);
    for (const op of stuck) {
      if (this.stopping) return;
      // Once per attempt: its updatedAt is the attempt's start (storing its args or reference is
      // no transition), which the alert gives as its "since".
      await this.deliver(alertOf("stuck", op), op.updatedAt, down, undelivered);
      this.metrics.progress();
    }
  }

  /**
   * Alerts due, oldest first, a page at a time: alerts a sink that is down left undelivered stay
   * due, and must not keep the newer ones from the sinks that work (at most ALERT_PAGES a tick).
   */
  private async alertPending(down: SinksThisTick, undelivered: Set<string>): Promise<void> {
    const limit = this.config.daemon.batch;
    let after: { updatedAt: number; id: string } | undefined;
    for (let page = 0; page < ALERT_PAGES && !this.stopping; page++) {
      const due = await this.ledger.daemon.alertsDue({ limit, ...(after && { after }) });
      await this.alertPage(due, down, undelivered);
      if (due.length < limit) return;
      const last = due[due.length - 1]!;
      after = { updatedAt: last.updatedAt, id: last.id };
    }
  }

  /** One alert to every sink (alerts.ts `deliver`), the deliveries no sink took added to `undelivered`; true when done. */
  private async deliver(
    alert: Alert,
    version: number,
    down: SinksThisTick,
    undelivered: Set<string>,
  ): Promise<boolean> {
    const { done, missed } = await this.busy(() =>
      deliver(
        this.ledger,
        this.config,
        this.sinks,
        alert,
        version,
        this.log,
        this.sent,
        this.reported,
        down,
        this.stopped.signal,
      ),
    );
    for (const key of missed) undelivered.add(key);
    return done;
  }

  private async alertPage(due: Operation[], down: SinksThisTick, undelivered: Set<string>): Promise<void> {
    for (const op of due) {
      if (this.stopping) return;
      if (isAlertDelivery(this.config, op)) {
        await this.ledger.daemon.ackAlert(op); // a delivery in review was logged when it failed
        continue;
      }
      // Taken over since its alerted transition (an unknown outcome checked again, by a caller or
      // another replica): it is neither failed nor in review now. Left due, unacknowledged: the
      // attempt's end says what it is (a success clears the alert; a refusal again keeps it due).
      if (op.status === "running") continue;
      // Known not done since (a refused check, then one that proved the effect absent): nothing for
      // a person now, and no failure; a refusal of its next run is alerted as that run's own.
      // Failed since by a refusal that asks no alert of its own (a refused check, then a run refused
      // for its content): the alert is an earlier state's, and said now it would be untrue.
      // Not a row a person's retry marked (lookFirst): not known not done, its look refused (a
      // revoked key) is alerted as an unknown outcome's is, or no one hears why it waits.
      if ((op.status === "pending" && !op.lookFirst) || (op.status === "failed" && op.error?.alert !== true)) {
        await this.ledger.daemon.ackAlert(op);
        continue;
      }
      const done =
        op.status === "unknown" || op.status === "pending"
          ? await this.alertCheckRefused(op, down, undelivered)
          : await this.alertRaised(op, down, undelivered);
      if (done) await this.ledger.daemon.ackAlert(op);
      this.metrics.progress();
    }
  }

  /**
   * The alert of the transition that raised it (to review, failed on a refused credential, two
   * effects), keyed by that transition and saying since when, not by the row's version: an
   * earlier attempt's request that ends late is noted in the history and moves `updatedAt`
   * without a transition. Keyed by the version, the same alert got a second key, and a sink that
   * had it pending was sent it twice; the acknowledgement (by the version read) missed it, and the
   * next pass delivers it under the same key: a replay, nothing sent again.
   */
  private async alertRaised(op: Operation, down: SinksThisTick, undelivered: Set<string>): Promise<boolean> {
    const since = await this.raisedAt(op);
    return this.deliver(alertOf(kindOf(op), op, { attempt: op.attempt, since }), since, down, undelivered);
  }

  /**
   * When the row became what it is: the last event to its status, at its attempt, with its reason
   * (only a transition writes the row's reason; a noted event writes its own to the history
   * alone). The row's version when that event was elided from a long history.
   */
  private async raisedAt(op: Operation): Promise<number> {
    const { events } = await this.ledger.get({ tenant: op.tenant, id: op.id });
    for (let i = events.length - 1; i >= 0; i--) {
      const e = events[i]!;
      if (e.to === op.status && e.attempt === op.attempt && e.reason === op.reason) return e.at;
    }
    return op.updatedAt;
  }

  /**
   * An unknown outcome whose check a credential refused (the replay or the lookup that would have
   * told: `ambiguous` or a replay's `permanent` with `alert`): not a failure, the effect may have
   * happened. Each check refused again asks for an alert; one is sent for the attempt whose
   * outcome is unknown, keyed by it and when it became unknown, not by each check.
   */
  private async alertCheckRefused(op: Operation, down: SinksThisTick, undelivered: Set<string>): Promise<boolean> {
    const since = await this.unknownSince(op);
    return this.deliver(alertOf("check_refused", op, since), since.since, down, undelivered);
  }

  /**
   * The attempt whose outcome is unknown, and when it became so: the first of the operation's last
   * run of unknown outcomes. Its checks (a replay is a new attempt, itself unknown when refused)
   * continue the run; anything else (a person's retry, pending again) ends it, and a later unknown
   * starts another, alerted again.
   */
  private async unknownSince(op: Operation): Promise<{ attempt: number; since: number }> {
    const { events } = await this.ledger.get({ tenant: op.tenant, id: op.id });
    // A row a person's retry marked (lookFirst): unknown again since that retry, each look of it
    // refused one more check of the same outcome (one alert for the retry, not one a look).
    if (op.status === "pending") {
      const retried = events.findLast((e) => e.to === "pending" && (e.from === "unknown" || e.from === "needs_review"));
      return retried ? { attempt: retried.attempt, since: retried.at } : { attempt: op.attempt, since: op.updatedAt };
    }
    let first: OperationEvent | undefined;
    for (let i = events.length - 1; i >= 0; i--) {
      const e = events[i]!;
      if (e.to !== "unknown" && e.to !== "running") break;
      if (e.to === "unknown") first = e;
    }
    return first ? { attempt: first.attempt, since: first.at } : { attempt: op.attempt, since: op.updatedAt };
  }

  private readonly sent = (kind: AlertKind, sink: string) => this.metrics.alerts.inc({ kind, sink });

  /** Alert deliveries already reported as waiting for a person (kept for this process's life; bounded by them). */
  private readonly reported = new Set<string>();
}

/**
 * What an alerted operation that is not unknown says: it took effect twice (succeeded: a second
 * request's receipt differed from the recorded one; or waiting for a person with two attempts'
 * receipts that could not be stored, `performedBy`, or with one that names two effects: the
 * ledger's words for them, first or after an overruled "failed", `twoEffectsTold`), it took effect
 * but not in full (succeeded with the words of its action's `attention` as the reason it was
 * alerted with: the ledger puts them first unless two effects are), a person's retry found it
 * done and did not run (succeeded with the ledger's reason for it, `isFoundOnRetry`: one effect,
 * none to undo), it may have taken effect twice (the ledger's words for it, `twoEffectsTold` and
 * `isPossiblyTwo`), a receipt contradicted a person's verdict "failed" (succeeded with the
 * ledger's reason for it, `isVerdictOverruled`: one effect, but the person may have acted on
 * "failed"), a receipt contradicted a "failed" the provider gave (`isFailureOverruled`: one
 * effect, but a caller told "failed" may have sent the work again under another key), a person
 * decides (needs_review), or it failed on a refused credential or a policy.
 */
function kindOf(op: Operation): AlertKind {
  // Two effects, proven or possible, told by the ledger's reason wherever it puts them (one
  // reading with the ledger's own, so the two never drift apart): said first, as the ledger does.
  const two = op.reason === null ? undefined : twoEffectsTold(op.reason);
  const twice = two === undefined ? undefined : isPossiblyTwo(two) ? "maybe_two_effects" : "two_effects";
  // Parked for a person: two effects proven by two attempts' requests, or told by one receipt
  // that names two (too large to store), perhaps after the "failed" it overrules.
  if (op.status === "needs_review")
    return (performedProof(op)?.performedBy?.length ?? 0) > 1 ? "two_effects" : (twice ?? "needs_review");
  if (op.status !== "succeeded") return "auth_failure";
  if (op.attention !== undefined && op.reason?.startsWith(op.attention)) return "incomplete";
  if (twice !== undefined) return twice;
  if (op.reason !== null && isVerdictOverruled(op.reason)) return "verdict_overruled";
  if (op.reason !== null && isFailureOverruled(op.reason)) return "failure_overruled";
  return op.reason !== null && isFoundOnRetry(op.reason) ? "retry_not_run" : "two_effects";
}
