/**
 * How the reasons the ledger writes start when a person must hear of them in a way of their own
 * (two effects, an overruled "failed", a retry that did not run), and the one reading of each that
 * the ledger (fence.ts, effects.ts, durable-writes.ts, runner.ts) and the daemon's alert kinds
 * share, so that a reason written is never read as less than it says. Words only: no imports.
 */

/**
 * How the reason of an effect proven after the operation was run again starts (see `fenced`):
 * one effect proven, a second one possible. The daemon tells its alert by it.
 */
export const POSSIBLY_TWO = "possibly two effects: ";

/** Whether a succeeded operation's reason says a second effect is possible, not proven (`fenced`). */
export function isPossiblyTwo(reason: string): boolean {
  return reason.startsWith(POSSIBLY_TWO);
}

/**
 * How the reason of a receipt that contradicts a person's verdict "failed" starts (see `fenced`):
 * the effect happened, and the person may have acted on their verdict (told the customer, done
 * the work by hand). The daemon tells its alert by it.
 */
export const VERDICT_OVERRULED = 'a person\'s verdict "failed" is overruled: ';

/** Whether a succeeded operation's reason says a receipt contradicted a person's "failed" (`fenced`). */
export function isVerdictOverruled(reason: string): boolean {
  return reason.startsWith(VERDICT_OVERRULED);
}

/**
 * How the reason of a receipt that contradicts a "failed" no person gave starts (`fenced`): the
 * provider's, or a refusal's, replayed to every caller since; one (a model) may have acted on it,
 * sending the same work again under another key. The daemon tells its alert by it.
 */
export const FAILURE_OVERRULED = 'a "failed" replayed to its callers is overruled: ';

/** Whether a succeeded operation's reason says a receipt contradicted a provider's "failed" (`fenced`). */
export function isFailureOverruled(reason: string): boolean {
  return reason.startsWith(FAILURE_OVERRULED);
}

/**
 * How the reason of a receipt that settles a person's retry before it ran starts (`fenced`): an
 * earlier attempt's request, still out when they retried, took effect after all (its late answer,
 * or a lookup's given up before the retry), once, and the retry does not run. The person hears it
 * as they would had the retry's own lookup found it (runner.ts `isFoundOnRetry` reads both).
 */
export const SETTLED_BEFORE_RETRY =
  "settled after a person's retry, before it ran (the earlier attempt committed after all); not run again: ";

/** What a person hears of the callers a provider's "failed" was replayed to, once it is overruled. */
export const CALLER_TOLD_FAILED =
  'a caller told "failed" may have acted on it (the same work sent again under another key, say)';

/**
 * The words of two effects, proven ("two effects") or possible (`isPossiblyTwo` of them), that an
 * operation's reason tells, from where they start: first, or after the overruled "failed" and the
 * attempt that `DurableWrites.unstorable` puts before them on a row it found moved (`<VERDICT_OVERRULED
 * or FAILURE_OVERRULED>attempt N: two effects: …`). Undefined when it tells none. One reading for
 * the ledger (`fenced`: two effects told to no one yet stay first) and for the daemon's alert
 * kind, so a reason the ledger writes is never alerted as less than it says.
 */
export function twoEffectsTold(reason: string): string | undefined {
  let from = reason;
  for (const prefix of [VERDICT_OVERRULED, FAILURE_OVERRULED]) {
    if (from.startsWith(prefix)) from = from.slice(prefix.length);
  }
  from = from.replace(/^attempt \d+: /, "");
  return from.startsWith("two effects") || isPossiblyTwo(from) ? from : undefined;
}
