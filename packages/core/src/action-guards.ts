/**
 * Guards around the action's own code, which may be JavaScript answering anything: a classify that
 * throws or answers no classification is read as ambiguous (`safeClassify`), a reconcile answering
 * no verdict fails its lookup (`verdictOf`), a lookup that does not answer in time is given up
 * (`givenUp`), and so is an execute silent past its bound and its signal (`answerWithin`). An
 * action's bug ends as an outcome of the call, not as a row left running.
 */
import {
  describeError,
  type Action,
  type Classification,
  type OperationContext,
  type ReconcileResult,
} from "./action.js";
import { LedgerUnavailableError } from "./errors.js";

/**
 * A lookup's answer, checked: a JavaScript reconcile may resolve to anything, and what is not a
 * verdict fails the lookup (inconclusive) instead of the call (a TypeError reading `found`).
 */
export function verdictOf<R>(answer: ReconcileResult<R>): ReconcileResult<R> {
  const a = answer as unknown as { found?: unknown } | null | undefined;
  if (typeof a !== "object" || a === null || typeof a.found !== "boolean")
    throw new Error(`the lookup answered no verdict (${describeValue(answer)}): expected { found: true | false, … }`);
  return answer;
}

/** A lookup's `twice`, as its alert says it: its words, or what it gave instead (an action's bug, still alerted). */
export function describeTwice(twice: unknown): string {
  return typeof twice === "string" && twice.trim() !== "" ? twice.slice(0, 300) : `said as ${describeValue(twice)}`;
}

function describeValue(v: unknown): string {
  try {
    return (JSON.stringify(v) ?? String(v)).slice(0, 100);
  } catch {
    return typeof v;
  }
}

/** `lookup`, or a rejection once `signal` aborts or `elapsedMs` pass, whichever comes first. */
export function givenUp<T>(
  lookup: Promise<T>,
  signal: AbortSignal,
  elapsedMs: number,
  /** Told when the lookup is given up: its signal aborts, so its request does not run on unseen. */
  abandon: (reason: Error) => void,
): Promise<T> {
  // A timer takes 1 ms to 2^31-1 ms (about 24 days); outside, node fires it at once.
  const ms = Math.min(Math.max(1, elapsedMs), 2 ** 31 - 1);
  const answer = Promise.resolve(lookup); // a plain value from a JavaScript reconcile too
  answer.catch(() => {}); // observed even when given up before it settles
  return new Promise<T>((resolve, reject) => {
    let timer: NodeJS.Timeout | undefined;
    const onAbort = () => settle(() => reject(signal.reason ?? new Error("aborted")));
    const settle = (then: () => void) => {
      clearTimeout(timer);
      signal.removeEventListener("abort", onAbort);
      then();
    };
    if (signal.aborted) return onAbort();
    signal.addEventListener("abort", onAbort, { once: true });
    timer = setTimeout(
      () =>
        settle(() => {
          const late = new Error(`no answer within ${ms} ms (the lookup's time bound)`);
          abandon(late);
          reject(late);
        }),
      ms,
    );
    answer.then(
      (v) => settle(() => resolve(v)),
      (e) => settle(() => reject(e)),
    );
  });
}

/**
 * How long an execute whose signal aborted (its settlement's time bound passed, its caller gave
 * up, its lease was lost) is still awaited. An action that honours the signal answers at once (its
 * client closes the connection and says whether the request was out), and that answer is the
 * truthful one; one silent this long after the abort ignores it.
 */
export const ABANDON_AFTER_MS = 1_000;

/** An execute's answer, or why it is no longer awaited (`answerWithin`). */
export type ExecuteAnswer<T> = { answer: PromiseSettledResult<T> } | { abandoned: string };

/** What ends the wait for an execute's answer (`answerWithin`). */
export interface ExecuteBounds {
  /** A settlement's time left; undefined for a caller's call. */
  readonly boundMs: number | undefined;
  /** The caller's signal (withLease aborts the action's signal with it). */
  readonly gaveUp: AbortSignal | undefined;
  /**
   * Tells its listener once the lease is lost, or the ledger's close stopped waiting for the call
   * (a `LedgerUnavailableError` marked `closed`: no heartbeat renews the lease after it); withLease
   * aborts the action's signal then.
   */
  readonly onLost: (listener: (reason: Error) => void) => void;
  /** Aborts the action's signal (at `boundMs`). */
  readonly abandon: (reason: Error) => void;
  readonly attempt: number;
}

/**
 * `request`'s answer, unless it is abandoned. At `boundMs` its signal aborts (`abandon`), and so
 * it does when the caller gives up (`gaveUp`) or the lease is lost (`onLost`: another owner may
 * hold the row now, or soon). Either way it is awaited ABANDON_AFTER_MS more, then given up: its
 * request may have been sent, and its answer, when one comes, is for the caller to record
 * (`request` is still observed; its rejection is not unhandled). With none of these (a caller's
 * call without a signal, its lease kept) it is awaited however long it takes.
 */
export function answerWithin<T>(
  request: Promise<T>,
  { boundMs, gaveUp, onLost, abandon, attempt }: ExecuteBounds,
): Promise<ExecuteAnswer<T>> {
  return new Promise<ExecuteAnswer<T>>((resolve) => {
    let bound: NodeJS.Timeout | undefined;
    let grace: NodeJS.Timeout | undefined;
    let ended = false;
    const end = (out: ExecuteAnswer<T>) => {
      ended = true;
      clearTimeout(bound);
      clearTimeout(grace);
      gaveUp?.removeEventListener("abort", onGiveUp);
      resolve(out);
    };
    const late = "it may have been sent; its answer, if one comes, is recorded then";
    const stopWaiting = (why: string, then = late) => {
      if (ended) return;
      grace ??= setTimeout(() => end({ abandoned: `${why}: ${then}` }), ABANDON_AFTER_MS);
    };
    const silent = `did not answer within ${ABANDON_AFTER_MS} ms after its signal aborted`;
    const onGiveUp = () => stopWaiting(`the caller gave up and attempt ${attempt}'s request ${silent}`);
    if (boundMs !== undefined) {
      const ms = Math.min(Math.max(1, boundMs), 2 ** 31 - 1);
      bound = setTimeout(() => {
        abandon(new Error(`no answer within ${ms} ms (the settlement's time bound)`));
        stopWaiting(
          `attempt ${attempt}'s request had no answer within ${ms} ms (the settlement's time bound), nor ${ABANDON_AFTER_MS} ms after its signal aborted`,
        );
      }, ms);
    }
    if (gaveUp?.aborted) onGiveUp();
    else gaveUp?.addEventListener("abort", onGiveUp, { once: true });
    onLost((reason) =>
      reason instanceof LedgerUnavailableError && reason.closed
        ? stopWaiting(
            `the ledger was closed while attempt ${attempt}'s request was out (its close stopped waiting for it) and its request ${silent}`,
            "it may have been sent; nothing more is recorded, and its lease is no longer renewed: the operation stays running under it, settled by the replay policy once it ends",
          )
        : stopWaiting(`attempt ${attempt}'s lease was lost (${reason.message}) and its request ${silent}`),
    );
    request.then(
      (value) => end({ answer: { status: "fulfilled", value } }),
      (reason: unknown) => end({ answer: { status: "rejected", reason } }),
    );
  });
}

/** A classify that throws must not lose the outcome: treat it as ambiguous. */
export function safeClassify<A, R>(action: Action<A, R>, error: unknown, ctx: OperationContext): Classification {
  let cls: Classification;
  try {
    cls = action.classify(error, ctx);
  } catch (bug) {
    return { kind: "ambiguous", reason: `classify threw (${describeError(bug)}) on ${describeError(error)}` };
  }
  // A JavaScript classify may return anything (a missing return): what is no classification is
  // not understood, so it may have committed, as when classify throws. Read as one, it threw a
  // TypeError out of the call and left the row running until its lease ran out.
  const c = cls as unknown as { kind?: unknown; reason?: unknown } | null | undefined;
  if (typeof c !== "object" || c === null || !CLASSES.includes(c.kind as Classification["kind"]))
    return {
      kind: "ambiguous",
      reason: `classify answered no classification (${describeValue(cls)}) on ${describeError(error)}`,
    };
  if (typeof c.reason !== "string") return { ...cls, reason: describeError(error) } as Classification;
  return cls;
}

const CLASSES: readonly Classification["kind"][] = ["rejected", "permanent", "rate_limited", "transient", "ambiguous"];
