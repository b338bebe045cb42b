/**
 * Guards around the action's own code, which may be JavaScript answering anything: a classify that
 * throws or answers no classification is read as ambiguous (`safeClassify`), a reconcile answering
 * no verdict fails its lookup (`verdictOf`), and a lookup that does not answer in time is given up
 * (`givenUp`). An action's bug ends as an outcome of the call, not as a row left running.
 */
import {
  describeError,
  type Action,
  type Classification,
  type OperationContext,
  type ReconcileResult,
} from "./action.js";

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
