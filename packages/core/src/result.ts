/** What a `run` call returns, and what an agent's model may honestly be told about it. */
import type { Classification } from "./action.js";
import type { Status } from "./schema.js";

/** A stored failure: the class and reason, never a stack or customer content. */
export interface StoredError {
  readonly kind: Classification["kind"] | "fenced" | "invalid_result";
  readonly reason: string;
  readonly alert?: boolean;
  readonly providerRequestId?: string;
  /** False when a replay with the same key can only repeat this answer (see Classification). */
  readonly replayable?: boolean;
}

export type RunResult<R> =
  /** The effect happened. `replayed`: this call was answered from the ledger, nothing was executed. */
  | { readonly status: "succeeded"; readonly receipt: R; readonly replayed: boolean; readonly operationId: string; readonly attempt: number }
  /** The provider said no for good; replayed to later callers. No effect. */
  | { readonly status: "failed"; readonly error: StoredError; readonly replayed: boolean; readonly operationId: string; readonly attempt: number }
  /**
   * Not proven either way yet: another worker holds the lease (`state: "running"`), the outcome
   * is unknown and awaits reconciliation, a person must decide (`needs_review`), or the retry
   * budget ran out with the work known undone (`pending`). Never report this as done.
   */
  | { readonly status: "pending_verification"; readonly state: Status; readonly reason: string; readonly operationId: string; readonly attempt: number };

/** The sentence to show a model: never a guessed success. */
export function describeResult(result: RunResult<unknown>): string {
  switch (result.status) {
    case "succeeded":
      return `${result.replayed ? "already done earlier" : "done"} (receipt ${JSON.stringify(result.receipt)})`;
    case "failed":
      return `failed: ${result.error.reason}`;
    case "pending_verification":
      return `pending verification (operation ${result.operationId}, ${result.state}): ${result.reason}; do not retry it yourself`;
  }
}
