/**
 * Alert sinks that are failing (a webhook refusing connections or answering 5xx, an SMTP server
 * down or refusing the account), held back per sink so that an outage of hours is not a failed
 * request and a log line every tick. A sink's first failure does not hold it back (a blip: the
 * next tick tries it, as before); from the second in a row it is tried again after a wait that
 * doubles from the daemon's interval, capped at `SINK_BACKOFF_MAX_MS` and spread (core's `spread`,
 * as the ledger's own backoffs) so that replicas do not knock in step. The schedule is this
 * process's (each replica finds out for itself, a restart tries at once), on the database clock
 * (`ledger.admin.now()`), as every other wait of the daemon.
 *
 * Nothing is dropped: a delivery held back is not tried, its alert stays due (`deliver` counts it
 * missed) and is delivered once when the sink takes alerts again. The log says once that a sink
 * fails (its first failure, with the reason), once at warn each other reason it fails for while
 * it keeps failing (a webhook that refused, now not reached), and once that it is back; the
 * failures between are at debug level.
 */
import type { Logger } from "pino";
import { spread, type RunResult } from "@idem/core";

/** The longest a failing sink is left before it is tried again: how late an alert may be once the sink is back. */
export const SINK_BACKOFF_MAX_MS = 5 * 60_000;

interface Failing {
  /** Failed tries in a row. */
  tries: number;
  /** When the first of them failed (database clock). */
  readonly since: number;
  /** Not tried before this time (database clock). */
  nextAt: number;
  /** The reasons said for this failing (`gist`): each is said once. */
  readonly reasons: Set<string>;
}

/** One failed delivery as the log says it; `fields.delivery`: what the sink's run answered. */
export interface FailureSaid {
  readonly fields: { readonly delivery: RunResult<unknown> };
  readonly msg: string;
}

/** Why a delivery failed, as its run answered it. */
function reasonOf(delivery: RunResult<unknown>): string {
  if (delivery.status === "pending_verification") return delivery.reason;
  return delivery.status === "failed" ? delivery.error.reason : delivery.status;
}

/** A reason without its waits ("retried in 4800 ms"), which differ from try to try for the same failure. */
const gist = (reason: string) => reason.replace(/\d+ ms\b/g, "some ms");

export class SinkBackoff {
  readonly #failing = new Map<string, Failing>();

  /**
   * `baseMs`: the daemon's interval, the first wait after two failures in a row. `now`: the
   * database clock. `random`: for the spread.
   */
  constructor(
    private readonly log: Logger,
    private readonly baseMs: number,
    private readonly now: () => Promise<number>,
    private readonly random: () => number = Math.random,
  ) {}

  /**
   * The sinks held back now: a tick starts with them as down (not tried in it). Reads the
   * database clock only while a sink is failing.
   */
  async heldBack(): Promise<Set<string>> {
    if (this.#failing.size === 0) return new Set();
    const now = await this.now();
    return new Set([...this.#failing].filter(([, f]) => f.nextAt > now).map(([sink]) => sink));
  }

  /**
   * A delivery the sink did not take (not reached, failing, refusing every alert): schedules its
   * next try. `said`: the log line of this failure, at error the first time in a row, at warn for
   * a reason not said yet while it keeps failing, else debug.
   */
  async failed(sink: string, said: FailureSaid): Promise<void> {
    const now = await this.now();
    const f = this.#failing.get(sink) ?? { tries: 0, since: now, nextAt: now, reasons: new Set<string>() };
    f.tries += 1;
    f.nextAt = now + this.waitMs(f.tries);
    this.#failing.set(sink, f);
    const reason = reasonOf(said.fields.delivery);
    const fresh = !f.reasons.has(gist(reason));
    f.reasons.add(gist(reason));
    const when = { sink, tries: f.tries, nextTryAt: new Date(f.nextAt).toISOString() };
    if (f.tries === 1)
      this.log.error(
        { ...said.fields, ...when },
        `${said.msg}; the sink is failing: it is tried again with backoff (up to ${SINK_BACKOFF_MAX_MS / 60_000} minutes apart), its alerts stay due and are delivered when it takes them again`,
      );
    else if (fresh)
      this.log.warn(
        { ...said.fields, ...when, failingSince: new Date(f.since).toISOString() },
        `alert sink ${sink} is still failing, now for another reason: ${reason}; it is tried again with backoff, its alerts stay due (${said.msg})`,
      );
    else this.log.debug({ ...said.fields, ...when, nextInMs: f.nextAt - now }, said.msg);
  }

  /** The sink took a delivery: it is tried as usual again, and the log says it is back. */
  took(sink: string): void {
    const f = this.#failing.get(sink);
    if (f === undefined) return;
    this.#failing.delete(sink);
    this.log.info(
      { sink, failedTries: f.tries, failingSince: new Date(f.since).toISOString() },
      `alert sink ${sink} takes alerts again after ${f.tries} failed tries: the alerts held back are delivered`,
    );
  }

  /** The wait after `tries` failures in a row: none after the first, then doubling from `baseMs`, capped, spread. */
  private waitMs(tries: number): number {
    if (tries < 2) return 0;
    return spread(Math.min(this.baseMs * 2 ** Math.min(tries - 1, 30), SINK_BACKOFF_MAX_MS), this.random);
  }
}

/**
 * One tick's view of the sinks: those not tried again in it (held back, or not taking a delivery
 * this tick), and what its deliveries told of each (`SinkBackoff`).
 */
export class SinksThisTick {
  private constructor(
    private readonly backoff: SinkBackoff,
    private readonly down: Set<string>,
  ) {}

  static async start(backoff: SinkBackoff): Promise<SinksThisTick> {
    return new SinksThisTick(backoff, await backoff.heldBack());
  }

  /** Not to be tried again in this tick. */
  has(sink: string): boolean {
    return this.down.has(sink);
  }

  /** Not tried again in this tick (a delivery that went unanswered, to review): no backoff, said by its caller. */
  add(sink: string): void {
    this.down.add(sink);
  }

  /** The sink did not take a delivery (not reached, failing): not tried again in this tick, and backed off. */
  async failed(sink: string, said: FailureSaid): Promise<void> {
    this.down.add(sink);
    await this.backoff.failed(sink, said);
  }

  /** The sink took a delivery now (not a replay). */
  took(sink: string): void {
    this.backoff.took(sink);
  }
}
