/** What a `run` call returns, and what an agent's model may honestly be told about it. */
import { EVIDENCE_LIMITS, type Classification, type Evidence } from "./action.js";
import type { Status } from "./schema.js";

/** A stored failure: the class and reason, never a stack or customer content. */
export interface StoredError {
  readonly kind: Classification["kind"] | "invalid_result";
  readonly reason: string;
  readonly alert?: boolean;
  readonly providerRequestId?: string;
  /**
   * `permanent` only: what the provider's answer, or its record a lookup read, names (the object
   * it created, its codes; see `Evidence`), as the action gave it within the bounds.
   */
  readonly evidence?: Evidence;
  /** How many entries of the action's evidence were outside the bounds and dropped (1: it was no record at all). */
  readonly evidenceDropped?: number;
  /** False when a replay with the same key can only repeat this answer (see Classification). */
  readonly replayable?: boolean;
  /** `permanent` only: refused after the provider had the whole request (Classification `mayHaveTaken`). */
  readonly mayHaveTaken?: boolean;
  /**
   * `invalid_result` only: the attempts whose own requests took effect with a receipt that could
   * not be stored (absent when a lookup found the effect: that may be any attempt's). Two
   * attempts here are two effects (a person is alerted); one attempt's write retried is one.
   */
  readonly performedBy?: readonly number[];
}

/**
 * A person's verdict on an operation that needed one (`needs_review`): kept apart from the
 * action's receipt and provider reference, which stay what the provider gave.
 */
export interface Resolution {
  readonly outcome: "succeeded" | "failed";
  /** Who decided (the operator's name). */
  readonly actor: string;
  readonly reason: string;
  /** What they checked: a dashboard link, the provider's id, "found in Sent". */
  readonly evidence: string | null;
  /** When (ms since epoch, database clock). */
  readonly at: number;
}

export type RunResult<R> =
  /**
   * The effect happened. `replayed`: this call was answered from the ledger, nothing was executed.
   * `resolution`: a person decided it happened (and gave this receipt, checked by the action's
   * receipt schema).
   */
  | {
      readonly status: "succeeded";
      readonly receipt: R;
      readonly replayed: boolean;
      readonly operationId: string;
      readonly attempt: number;
      readonly resolution?: Resolution;
    }
  /**
   * A person decided the effect happened but had no receipt to give: there is none to replay,
   * only their verdict. Never a fresh execution, so `replayed` is always true here.
   */
  | {
      readonly status: "succeeded";
      readonly receipt: null;
      readonly replayed: true;
      readonly operationId: string;
      readonly attempt: number;
      readonly resolution: Resolution;
    }
  /** The provider (or a person: `resolution`) said no for good; replayed to later callers. No effect. */
  | {
      readonly status: "failed";
      readonly error: StoredError;
      readonly replayed: boolean;
      readonly operationId: string;
      readonly attempt: number;
      readonly resolution?: Resolution;
    }
  /**
   * Not proven either way yet: another worker holds the lease (`state: "running"`), the outcome
   * is unknown and awaits reconciliation, a person must decide (`needs_review`), or the retry
   * budget ran out with the work known undone (`pending`). Never report this as done.
   * `performed`: the effect is known to have happened but its receipt could not be stored
   * (`needs_review`, error kind `invalid_result`): a person records it; it is never run again.
   * `stalled` (`ledger.status`): running, but its lease ended by the database clock: its worker
   * stopped (a crash) or lost the database. The next caller or the daemon takes it over, checking
   * with the provider first where the attempt may have sent.
   */
  | {
      readonly status: "pending_verification";
      readonly state: Unsettled;
      readonly reason: string;
      readonly operationId: string;
      readonly attempt: number;
      readonly performed?: true;
      readonly stalled?: true;
    };

/** The statuses an operation can wait in (`pending_verification.state`): all but the settled two. */
export type Unsettled = Exclude<Status, "succeeded" | "failed">;

/**
 * An action's evidence as stored: the entries within `EVIDENCE_LIMITS`, in the record's order,
 * and the count of those dropped; nothing when it gave none. Never throws (a getter that throws,
 * a value that is no record): bad evidence must not keep the failure from being recorded.
 */
export function boundEvidence(given: unknown): { evidence?: Evidence; evidenceDropped?: number } {
  if (given === undefined) return {};
  let entries: [string, unknown][];
  try {
    if (typeof given !== "object" || given === null || Array.isArray(given)) return { evidenceDropped: 1 };
    entries = Object.entries(given);
  } catch {
    return { evidenceDropped: 1 };
  }
  const kept = entries
    .filter(([k, v]) => fits(k) && typeof v === "string" && fits(v))
    .slice(0, EVIDENCE_LIMITS.entries) as [string, string][];
  const dropped = entries.length - kept.length;
  return {
    ...(kept.length > 0 && { evidence: Object.fromEntries(kept) }),
    ...(dropped > 0 && { evidenceDropped: dropped }),
  };
}

/**
 * A key or value within the bounds. Without control characters (Cc), format characters (Cf: a
 * bidi override makes an id read otherwise than it is) or line and paragraph separators (Zl,
 * Zp): each would forge a line or a word in a log or a model's text.
 */
function fits(text: string): boolean {
  return text.length > 0 && text.length <= EVIDENCE_LIMITS.chars && !/[\p{Cc}\p{Cf}\p{Zl}\p{Zp}]/u.test(text);
}

/** Evidence as one short clause: `payment_intent: pi_…; decline_code: insufficient_funds` (empty for none). */
export function describeEvidence(evidence: Evidence | undefined): string {
  return Object.entries(evidence ?? {})
    .map(([k, v]) => `${k}: ${v}`)
    .join("; ");
}

/** The sentence to show a model: never a guessed success. */
export function describeResult(result: RunResult<unknown>): string {
  switch (result.status) {
    case "succeeded":
      if (result.receipt === null && result.resolution)
        return `already done earlier, as ${result.resolution.actor} decided: ${result.resolution.reason}`;
      return `${result.replayed ? "already done earlier" : "done"} (receipt ${JSON.stringify(result.receipt)})`;
    case "failed": {
      const named = describeEvidence(result.error.evidence);
      return `failed: ${result.error.reason}${named ? ` (${named})` : ""}`;
    }
    case "pending_verification":
      // Known not done: the caller's own call again is how it gets done when its args are not
      // stored (no daemon can), and is safe when they are (the key does it once). Not another way.
      if (result.state === "pending")
        return `pending verification (operation ${result.operationId}, pending): ${result.reason.startsWith("known not done") ? "" : "known not done: "}${result.reason}; the same call again does it, once; do not do it another way`;
      return `pending verification (operation ${result.operationId}, ${result.state}): ${result.reason}; do not retry it yourself`;
  }
}

/**
 * The proof on an operation whose effect is known performed: its receipt came back but could not
 * be stored, so it waits for a person (needs_review) with the proof as its error
 * (`invalid_result`). Undefined for any other. Core refuses "failed" and a retry on such an
 * operation, and reads a second such proof as a second effect; so an operator's tool that offers
 * decisions reads it here, as core does.
 */
export function performedProof(o: {
  readonly status: Status;
  readonly error: StoredError | null;
}): StoredError | undefined {
  return o.status === "needs_review" && o.error?.kind === "invalid_result" ? o.error : undefined;
}
