/**
 * Pure decisions of the runner and the daemon, kept apart so they are the same everywhere and
 * tested directly (test/policy.test.ts).
 */
import type { Capabilities, Classification } from "./action.js";
import type { Status } from "./schema.js";

/** How to recover a `running` row whose lease expired, or an `unknown` row. */
export type Recovery =
  /** Send the same request with the same key: the provider returns the first result. */
  | { readonly kind: "replay"; readonly reason: string }
  /** Ask the provider whether the effect exists. */
  | { readonly kind: "reconcile"; readonly reason: string }
  /** Nothing can prove either way: a person decides. */
  | { readonly kind: "review"; readonly reason: string };

const DEFAULT_DEDUPE_MARGIN_MS = 60 * 60 * 1000;

/** The replay policy table of DESIGN.md, as one function. */
export function recoveryFor(caps: Capabilities, createdAt: number, now: number, last?: { replayable?: boolean }): Recovery {
  // The provider saved an error under our key: a replay would only repeat it.
  if (caps.dedupe && last?.replayable !== false) {
    const usable = caps.dedupe.retentionMs - (caps.dedupe.marginMs ?? DEFAULT_DEDUPE_MARGIN_MS);
    // The provider still remembers our key: it answers a replay with the first result.
    if (now - createdAt < usable) return { kind: "replay", reason: "provider dedupes on the key and it is still retained" };
  }
  // A lookup can find the effect (or prove its absence) whatever its age.
  if (caps.lookup) return { kind: "reconcile", reason: caps.dedupe ? "key retention passed; looking the effect up" : "looking the effect up" };
  // Neither: replaying could duplicate, assuming absence could lose the effect.
  return {
    kind: "review",
    reason: caps.dedupe ? "key retention passed and the provider cannot be queried" : "the provider neither dedupes nor can be queried",
  };
}

/** Where a failure class leaves the operation. */
export function statusAfter(cls: Classification): Extract<Status, "failed" | "pending" | "unknown"> {
  switch (cls.kind) {
    case "rejected":
    case "permanent":
      return "failed"; // a permanent answer: replayed to later callers, no effect
    case "rate_limited":
    case "transient":
      return "pending"; // known not committed: safe to run again with the same key
    case "ambiguous":
      return "unknown"; // may have committed: only reconciliation decides
  }
}

/** Retry budget of one `run` call: attempts and elapsed time, outside the model. */
export interface RetryBudget {
  /** Executions of the action within one call, first included. Default 3. */
  readonly attempts: number;
  /** Stop retrying once this much time passed since the call began. Default 30 s. */
  readonly elapsedMs: number;
  /** First backoff for transient failures; doubles each time, capped by `maxDelayMs`. Default 100 ms. */
  readonly baseDelayMs: number;
  /** Default 5 s. A provider's rate-limit signal longer than the remaining budget ends the call. */
  readonly maxDelayMs: number;
}

export const DEFAULT_BUDGET: RetryBudget = { attempts: 3, elapsedMs: 30_000, baseDelayMs: 100, maxDelayMs: 5_000 };

/**
 * The wait before execution number `executed + 1`, or null when the budget is spent. A provider's
 * own signal (Retry-After) wins over our backoff but is never shortened.
 */
export function nextDelay(budget: RetryBudget, executed: number, elapsedMs: number, providerWaitMs?: number): number | null {
  if (executed >= budget.attempts) return null;
  const backoff = Math.min(budget.maxDelayMs, budget.baseDelayMs * 2 ** Math.max(0, executed - 1));
  const wait = providerWaitMs ?? backoff;
  if (elapsedMs + wait > budget.elapsedMs) return null;
  return wait;
}
