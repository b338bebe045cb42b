/**
 * The shapes the runner's modules share (runner.ts, durable-writes.ts, fence.ts, lease.ts): a call
 * as the ledger or the daemon hands it over, the settings it runs under, and the step that ends
 * it or asks to look again. Types only.
 */
import type { Action } from "./action.js";
import type { RetryBudget } from "./policy.js";
import type { RunResult } from "./result.js";
import type { Row } from "./store.js";

export interface RunnerSettings {
  readonly owner: string;
  readonly leaseMs: number;
  readonly waitMs: number;
  readonly budget: RetryBudget;
  readonly maxArgsBytes: number;
  readonly maxResultBytes: number;
  readonly retentionMs: number | null;
}

/** One call's view: the action, its args (given or to be generated) and its settings. */
export interface Call<A, R> {
  readonly action: Action<A, R>;
  readonly tenant: string;
  readonly key: { hash: string; label: string | null };
  /** Given args, hashed up front; or a generator run once, for the first attempt only. */
  readonly args: /** `stored`: read from the row (the daemon's), not checked by this version's `validate` as a caller's are. */
    | { kind: "given"; value: A; hash: string; json: string; stored?: true }
    | { kind: "lazy"; make: () => A | Promise<A> }
    /** Settling without a caller: only the args stored by an earlier attempt can be used. */
    | { kind: "stored" };
  readonly storeArgs: boolean;
  readonly actor: string | null;
  readonly settings: RunnerSettings;
  readonly signal?: AbortSignal | undefined;
  /**
   * Once aborted, this call ends as a closing ledger's calls do (a daemon stopping): nothing more
   * is sent, a pause ends at once, the effect under way is recorded.
   */
  readonly stop?: AbortSignal | undefined;
}

/** The daemon's limits: an unknown outcome checked this often, or this old, goes to a person. */
export interface Escalation {
  readonly maxChecks: number;
  readonly maxAgeMs: number;
}

/** What a step of a call gives: the call's answer, or the ms to pause before it looks again. */
export type Step<R> = { done: RunResult<R> } | { again: number };

/** A row our attempt holds, with the local time the statement that gave us the lease was sent. */
export interface Held {
  readonly row: Row & { db_now: number };
  readonly since: number;
  /** Taken from `pending` to execute (a run again from known not done: runner.ts `complete` reads it). */
  readonly rerun?: boolean;
}
