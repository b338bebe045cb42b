/**
 * What a command that runs until stopped (`idem daemon`, `idem mcp`) says of its ledger's close:
 * the close waits within the stop's bound, and the calls and late answers it could not wait out
 * are named in the log and in the command's failure (exit 1), never left unsaid.
 */
import type { Closed, Ledger, OperationRef } from "@idem/core";
import type { Logger } from "pino";

/**
 * The part of a stop's bound (`daemon.stopTimeoutMs`, `mcp.stopTimeoutMs`) kept for the ledger's connection to end once the close
 * stopped waiting for late answers (at most a tenth of the bound): its exit would cut it.
 */
const CLOSE_RESERVE_MS = 1_000;
/** The operations a command's failure names, whose late answers or calls went unrecorded; the log names every one. */
const LATE_NAMED = 10;

/**
 * A stop's bound (`daemon.stopTimeoutMs`, `mcp.stopTimeoutMs`: `setting`, its value `ms`) and when
 * the stop came (`stoppedAt`, performance.now()): the ledger's close has what is left of it.
 */
export interface StopBound {
  readonly setting: string;
  readonly ms: number;
  readonly stoppedAt: number;
}

/**
 * Closes the ledger within what is left of the stop's bound, less a part kept for the connection's
 * end: the close waits up to a lease for the calls in flight and the late answers of requests cut
 * off, and a bound shorter than that (20 s against 30 s, by default) exited in the middle of it.
 * Without a bound (nobody stopped the command), it waits a lease.
 */
export function closeWithin(ledger: Ledger, bound: StopBound | undefined): Promise<Closed> {
  if (!bound) return ledger.close({});
  const { ms, stoppedAt } = bound;
  return ledger.close({
    waitMs: Math.max(0, stoppedAt + ms - Math.min(CLOSE_RESERVE_MS, ms / 10) - performance.now()),
  });
}

/** What ended a close's wait, in a log line: the stop's bound (naming its setting), else a lease. */
const waitEnder = (bound: StopBound | undefined) => (bound ? `the stop's bound (${bound.setting})` : "a lease");

/**
 * Says which calls a close could not wait out (`Closed.inFlight`: their request, lookup or lazy
 * args still under way): unrecorded, running under their leases. Named as the late answers are.
 * `settledLater`: what then becomes of each, as the command can say it truthfully (the daemon
 * settles it by the replay policy once its lease expires; `idem mcp` runs no such policy itself).
 */
export function sayLeftInFlight(
  log: Logger,
  inFlight: readonly OperationRef[],
  bound: StopBound | undefined,
  settledLater = "is settled by the replay policy once that expires",
): void {
  if (!inFlight.length) return;
  log.error(
    { inFlight, ...(bound && { stopTimeoutMs: bound.ms }) },
    `the ledger closed with ${inFlight.length} call(s) still in flight (${inFlight.map((r) => r.id).join(", ")}): ${waitEnder(bound)} ended the wait; their outcomes are not recorded by them (a write already on its way then may still have recorded one: \`idem show\` says), and each left unrecorded stays running under its lease and ${settledLater}`,
  );
}

/** Says which late answers of requests cut off a close did not await (`Closed.lateAnswers`). */
export function sayUnawaited(log: Logger, lateAnswers: readonly OperationRef[], bound: StopBound | undefined): void {
  if (!lateAnswers.length) return;
  log.error(
    { lateAnswers, ...(bound && { stopTimeoutMs: bound.ms }) },
    `the ledger closed without the late answer of ${lateAnswers.length} request(s) cut off (${lateAnswers.map((r) => r.id).join(", ")}): ${waitEnder(bound)} ended the wait; each operation stays as its cut-off left it (unknown, checked again, or with a person) where its answer would have settled it${bound ? `; a longer ${bound.setting} waits longer for such answers` : ""}`,
  );
}

/** The first LATE_NAMED operations' ids, and how many more. */
export function named(refs: readonly OperationRef[]): string {
  const ids = refs.slice(0, LATE_NAMED).map((r) => r.id);
  const more = refs.length - ids.length;
  return `${ids.join(", ")}${more ? ` and ${more} more` : ""}`;
}

/**
 * The calls a close left in flight, in a command's failure. "May not": a write of theirs already on
 * its way as the close stopped waiting still ends, and may have recorded an outcome (as the log
 * line says, `sayLeftInFlight`); the operation's own state is the truth.
 */
export const inFlightSummary = (inFlight: readonly OperationRef[]) =>
  `the ledger closed with ${inFlight.length} call(s) still in flight, their outcomes may not be recorded (${named(inFlight)}): check each with idem show`;

/**
 * The failure a command ends with when its ledger's close left anything unrecorded (`Closed`),
 * naming the operations (the log says more); undefined when it left nothing. `who` stopped.
 */
export function closeLeftFailure(who: string, { lateAnswers, inFlight }: Closed): Error | undefined {
  const said = [
    ...(lateAnswers.length
      ? [
          `${who} stopped without recording the late answers of ${lateAnswers.length} request(s) cut off (${named(lateAnswers)})`,
        ]
      : []),
    ...(inFlight.length ? [inFlightSummary(inFlight)] : []),
  ];
  return said.length ? new Error(`${said.join("; ")}; see the log`) : undefined;
}

/**
 * What may hold a process open past its ledger's close, as the exits that end it say it (a stop's
 * bound, a `--once` pass held open): the requests whose late answers the close left unrecorded,
 * still out, and the calls it left in flight (`Closed`), each with its operations; undefined when
 * the close left nothing.
 */
export function heldBy({ lateAnswers, inFlight }: Closed): string | undefined {
  const what = [
    ...(lateAnswers.length ? [`the request(s) whose late answers were not recorded (${named(lateAnswers)})`] : []),
    ...(inFlight.length
      ? [`the call(s) still in flight, their outcomes may not be recorded (${named(inFlight)})`]
      : []),
  ];
  return what.length ? what.join(" and ") : undefined;
}
