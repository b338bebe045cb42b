/**
 * What the model reads: a short, fixed vocabulary, always a value, never a thrown error. A model
 * that reads an exception full of hashes, or "please try again", retries; one that reads "already
 * done earlier" or "pending verification, do not retry" does not. Every outcome says what
 * happened and, when it is not final, what happens next and how to check.
 */
import {
  describeEvidence,
  ArgsMismatchError,
  CompletionNotRecordedError,
  GuardrailError,
  InvalidValueError,
  LedgerConfigError,
  LedgerUnavailableError,
  PayloadTooLargeError,
  type RunResult,
  type Status,
  type StoredError,
  type Unsettled,
} from "@idem/core";

export type Outcome =
  /** The effect happened in this call. `result`: what the tool chose to show of the receipt. */
  | { readonly status: "done"; readonly message: string; readonly operationId: string; readonly result?: unknown }
  /**
   * The effect had happened before (an earlier call, a retry, or one the provider found already
   * done when this operation began): not repeated.
   */
  | {
      readonly status: "already_done";
      readonly message: string;
      readonly operationId: string;
      readonly result?: unknown;
    }
  /**
   * The provider said no for good, or a person decided it did not happen (their note stays in the
   * ledger); retrying the same input cannot change it.
   */
  | {
      readonly status: "failed";
      readonly message: string;
      readonly operationId: string;
      readonly reason: string;
      /**
       * What the provider's answer named, as fields (its ids and codes: `payment_intent`,
       * `decline_code`); absent when it named none, or when a person decided.
       */
      readonly evidence?: StoredError["evidence"];
    }
  /**
   * Not settled yet: being performed or recorded, checked with the provider, or waiting for a
   * person (to decide, or to record an effect known done). Never to be retried by the model.
   */
  | {
      readonly status: "pending_verification";
      readonly message: string;
      readonly operationId: string;
      readonly state: Unsettled;
    }
  /** Not attempted, nothing done: the input was refused (other arguments for work already done, not allowed, invalid). */
  | { readonly status: "refused"; readonly message: string; readonly operationId?: string }
  /**
   * Not done. No longer answered: every call that did nothing before the ledger was read is
   * `unconfirmed`, since an earlier call may have done the work. Kept so that code handling it
   * still compiles.
   * @deprecated Handle `unconfirmed`.
   */
  | { readonly status: "not_performed"; readonly message: string }
  /**
   * Not known: the call stopped (an abort, a framework's timeout), it had no answer by its
   * deadline (`GuardOptions.deadlineMs`), the ledger could not be read or written, or was closed,
   * the application's code failed before the ledger was read (its tenant or key function, an MCP
   * `context`), the tool is not set up right (a tenant, actor, wait or key part the ledger refuses:
   * the same again fails until the setup is fixed), or a status check could not read the ledger.
   * Stopped, refused or failed before the ledger had the call, this call sent nothing, but whatever
   * an earlier call did is not known. It may have happened; the same input again is safe and says
   * what happened.
   */
  | { readonly status: "unconfirmed"; readonly message: string; readonly operationId?: string };

const NEXT: Record<Unsettled, string> = {
  // The attempt that holds it now: this one being performed, or its done effect being recorded
  // (a completion the database failed to write waits for its lease to end). Never a second one.
  running: "it is being performed, or its outcome is being recorded",
  unknown: "its outcome is being checked with the provider",
  needs_review: "a person will decide whether it happened",
  pending: "it will be run again with the same identity, once",
};

/** A running operation whose worker stopped (its lease ended): it is neither done nor being done now. */
const STALLED =
  "the worker that ran it stopped before recording its outcome, so its outcome will be checked with the provider; it is done once at most";

/** A person's "failed" verdict as the model reads it, without their note. */
const BY_A_PERSON = "a person checked it and decided it did not happen";

/**
 * The paths of the values the application sets (guard's options) or its code makes (the key
 * function's parts: "key", "key[1]"), never the model's input.
 */
const SETUP = /^(tenant|actor|waitMs|key)$|^key[[.]/;

/** An effect whose receipt could not be stored: known done, so a person records it, and nothing is left to decide. */
const PERFORMED_UNRECORDED = "it was performed, but its result could not be recorded; a person will record it";

/**
 * What the model reads of input it sent that could not be used (`why`: the field and what it
 * must be, or why the arguments could not be read): nothing was done.
 */
export function refusedInput(why: string): Outcome {
  return {
    status: "refused",
    message: `Refused: invalid input: ${why}. Nothing was done; fix the input before calling again.`,
  };
}

/**
 * Whether the outcome says nothing was done (failed, refused): MCP's `isError`, LangChain's error
 * status. Not a pending verification, which must not be retried, nor an unconfirmed one (whether
 * the work was done is not known). `not_performed` is answered no more, but an application may
 * still make one.
 */
export function nothingDone(outcome: Outcome): boolean {
  return outcome.status === "failed" || outcome.status === "refused" || outcome.status === "not_performed";
}

/**
 * `summarize`, answering nothing when it throws or answers what cannot be sent as JSON (a BigInt,
 * a cycle): a failing summary must not change an outcome, nor reach the model as an exception.
 */
export function safeSummary<R>(
  summarize: ((receipt: R) => unknown) | undefined,
): ((receipt: R) => unknown) | undefined {
  return (
    summarize &&
    ((receipt: R) => {
      try {
        const summary = summarize(receipt);
        JSON.stringify(summary);
        return summary;
      } catch {
        return undefined;
      }
    })
  );
}

const OUTCOME_STATUSES = new Set([
  "done",
  "already_done",
  "failed",
  "pending_verification",
  "refused",
  "not_performed",
  "unconfirmed",
]);
/** The statuses whose outcome always names its operation. */
const OF_AN_OPERATION = new Set(["done", "already_done", "failed", "pending_verification"]);

/**
 * Whether `value` is an `Outcome` a framework can hand a model: a known status with a message and
 * the fields that status carries, as JSON (what every framework sends). What an application's
 * `describe` answers is checked with it: anything else (nothing, a string, a cycle) would reach
 * the model as the framework's exception.
 */
export function isOutcome(value: unknown): value is Outcome {
  if (typeof value !== "object" || value === null || Array.isArray(value)) return false;
  const o = value as Record<string, unknown>;
  if (typeof o.status !== "string" || !OUTCOME_STATUSES.has(o.status)) return false;
  if (typeof o.message !== "string" || o.message === "") return false;
  if (
    OF_AN_OPERATION.has(o.status)
      ? typeof o.operationId !== "string"
      : !["string", "undefined"].includes(typeof o.operationId)
  )
    return false;
  if (o.status === "failed" && typeof o.reason !== "string") return false;
  if (o.status === "pending_verification" && !(typeof o.state === "string" && Object.hasOwn(NEXT, o.state)))
    return false;
  try {
    JSON.stringify(value);
    return true;
  } catch {
    return false;
  }
}

/** `ToolDefinition.foundEarlier`: whether a receipt shows the effect was there before its operation began. */
type FoundEarlier<R> = (receipt: R, settled: { readonly attempt: number }) => boolean;

/**
 * Whether a receipt shows the effect was found already done before its operation began (see
 * `ToolDefinition.foundEarlier`). False when there is no receipt, no hook, or the hook throws: a
 * failing hook must not change an outcome, and "done" claims less than "done earlier".
 */
export function isFoundEarlier<R>(result: RunResult<R>, foundEarlier: FoundEarlier<R> | undefined): boolean {
  if (result.status !== "succeeded" || result.receipt === null) return false;
  return receiptFoundEarlier(result.receipt, result.attempt, foundEarlier);
}

/** `foundEarlier` asked of a receipt the `attempt` got; false without a hook or when it throws. */
function receiptFoundEarlier<R>(receipt: R, attempt: number, foundEarlier: FoundEarlier<R> | undefined): boolean {
  if (!foundEarlier) return false;
  try {
    return foundEarlier(receipt, { attempt }) === true;
  } catch {
    return false;
  }
}

/**
 * A ledger result in the model's words; `summarize` picks what to show of a receipt.
 * `foundEarlier`: whether a receipt says the provider found the effect already done before the
 * operation began (it reads "already done earlier", as a replay does).
 */
export function outcomeOf<R>(
  result: RunResult<R>,
  summarize?: (receipt: R) => unknown,
  foundEarlier?: FoundEarlier<R>,
): Outcome {
  const op = `operation ${result.operationId}`;
  switch (result.status) {
    case "succeeded": {
      if (result.receipt === null && result.resolution) {
        // A person found the effect but had no receipt to give: say so, without inventing one.
        return {
          status: "already_done",
          message: `Already done earlier, as a person confirmed; not repeated (${op}).`,
          operationId: result.operationId,
        };
      }
      const summary = summarize?.(result.receipt as R);
      const shown = summary === undefined ? {} : { result: summary };
      return result.replayed || isFoundEarlier(result, foundEarlier)
        ? {
            status: "already_done",
            message: `Already done earlier; not repeated (${op}).`,
            operationId: result.operationId,
            ...shown,
          }
        : { status: "done", message: `Done (${op}).`, operationId: result.operationId, ...shown };
    }
    case "failed": {
      // A person's verdict: their note is for the audit trail (it may name the customer), not the model.
      const reason = result.resolution ? BY_A_PERSON : result.error.reason;
      const evidence = result.resolution ? undefined : result.error.evidence;
      const named = describeEvidence(evidence);
      return {
        status: "failed",
        operationId: result.operationId,
        reason,
        ...(named !== "" && { evidence }),
        message: `Failed because ${reason}${named && ` (${named})`} (${op}).${result.replayed && !result.resolution ? " It failed earlier and was not tried again." : ""} Retrying the same input will not change it.`,
      };
    }
    case "pending_verification":
      return {
        status: "pending_verification",
        operationId: result.operationId,
        state: result.state,
        message: `Pending verification (${op}): ${result.performed ? PERFORMED_UNRECORDED : result.stalled ? STALLED : NEXT[result.state]}. Do not retry it; check later with the status tool and this operation id.`,
      };
  }
}

/** What an operation made with other arguments is, for a model told it cannot redo it with these. */
const MADE_WITH_OTHER_ARGS: Record<Status, string> = {
  succeeded: "was already done with different arguments",
  failed: "was already tried with different arguments, and failed",
  running: "is already under way with different arguments",
  unknown: "was already attempted with different arguments, and its outcome is being checked",
  pending: "was already attempted with different arguments, and will be run again with those",
  needs_review: "was already attempted with different arguments, and a person will decide whether it happened",
};

/** An operation made with other arguments whose effect is known done, its result not recorded (`ArgsMismatchError.performed`). */
const PERFORMED_WITH_OTHER_ARGS =
  "was already performed with different arguments (its result could not be recorded; a person will record it)";

/**
 * What the model reads of a call that had no answer by its deadline (`deadlineMs`): the ledger or
 * the provider did not answer in time. The call was stopped: a request it had sent may still
 * succeed (and is recorded), and nothing more is sent; an earlier call may have done the work.
 */
export function pastDeadline(deadlineMs: number): Outcome {
  return {
    status: "unconfirmed",
    message: `Not confirmed: no answer within ${deadlineMs / 1_000} s, so it may or may not have happened (by this call or an earlier one); this call sends nothing more. Do not tell the user either way; calling this tool again later with the same input is safe (it is never done twice) and says what happened.`,
  };
}

/**
 * What the model reads of a call the framework gave up on (its `signal` or `stop`) before the
 * ledger had it: this call sent nothing, but the ledger was not read either, so an earlier call
 * may have done this work (a model asking again). "Not performed" would be the model's reason to
 * tell the user it was not done, or a person's to redo it.
 */
export function stoppedBeforeLedger(): Outcome {
  return {
    status: "unconfirmed",
    message:
      "Not confirmed: the call was stopped before whether this work was already done (by an earlier call) could be read; this call sent nothing. Do not tell the user either way; calling this tool again with the same input is safe (it is never done twice) and says what happened.",
  };
}

/**
 * An error of the call in the model's words. The ledger's own errors are typed; anything else
 * is reported without its text, which is for the developer's logs. `started`: the ledger had
 * the call (its key was built), so an untyped error (an abort, a framework's timeout) may have
 * come after an attempt reached the provider, and is not reported as "nothing was done".
 * `foundEarlier`: as for `outcomeOf`, asked of a receipt the ledger could not record.
 */
export function outcomeOfError(
  error: unknown,
  what: {
    identity: string;
    action: string;
    summarize?: ((receipt: never) => unknown) | undefined;
    foundEarlier?: FoundEarlier<never> | undefined;
    started?: boolean;
  },
): Outcome {
  if (error instanceof ArgsMismatchError) {
    // An error made without the stored status (an older core) says only that the work exists.
    const made =
      error.performed === true
        ? PERFORMED_WITH_OTHER_ARGS
        : error.status === undefined
          ? "already exists with different arguments; check it with the status tool"
          : MADE_WITH_OTHER_ARGS[error.status];
    return {
      status: "refused",
      operationId: error.operationId,
      message: `Refused: ${what.identity} ${made} (operation ${error.operationId}). Nothing was repeated. Tell the user; do not try it again with other input.`,
    };
  }
  // The effect happened, but its receipt could not be kept: a person checks it.
  const unkept =
    (error instanceof PayloadTooLargeError && error.what !== "args") ||
    (error instanceof InvalidValueError && error.operationId !== undefined);
  if (unkept && error.operationId !== undefined)
    return {
      status: "pending_verification",
      operationId: error.operationId,
      state: "needs_review",
      message: `Pending verification (operation ${error.operationId}): ${PERFORMED_UNRECORDED}. Do not retry it; check later with the status tool and this operation id.`,
    };
  if (error instanceof GuardrailError)
    return { status: "refused", message: `Not allowed: ${what.action} is not allowed here. Nothing was done.` };
  // The application's setup (the tenant read from its context, the actor and wait it set, a key
  // part its key function made), not the model's input. The ledger refused it before reading
  // anything: this call did nothing, but an earlier call whose setup was right (a tenant read from
  // another request) may have done this work, so "not performed" would be the model's reason to
  // tell the user it was not done, or a person's to redo it.
  if (error instanceof InvalidValueError && SETUP.test(error.path))
    return {
      status: "unconfirmed",
      message: `Not confirmed: the tool is not set up right (${error.path}: ${error.reason}), so whether this work was already done (by an earlier call) could not be read; this call did nothing. Tell the user the tool is not set up right, not whether the work was done; do not change the input for it. Calling this tool again will not help until the setup is fixed; then the same input is safe (it is never done twice) and says what happened.`,
    };
  if (error instanceof InvalidValueError)
    return refusedInput(`${error.path.replace(/^args\.?/, "") || "input"}: ${error.reason}`);
  if (error instanceof PayloadTooLargeError)
    return { status: "refused", message: "Refused: the input is too large. Nothing was done." };
  if (error instanceof CompletionNotRecordedError) {
    // The effect happened (its receipt is here), by this call, unless the receipt shows the
    // provider found it already done before the operation began: then, as a recorded one, "already done".
    const summary = what.summarize?.(error.receipt as never);
    const shown = summary === undefined ? {} : { result: summary };
    const op = `operation ${error.operationId}`;
    return receiptFoundEarlier(error.receipt as never, error.attempt, what.foundEarlier)
      ? {
          status: "already_done",
          operationId: error.operationId,
          message: `Already done earlier; not repeated (${op}); recording it is delayed. Do not repeat it.`,
          ...shown,
        }
      : {
          status: "done",
          operationId: error.operationId,
          message: `Done (${op}); recording it is delayed. Do not repeat it.`,
          ...shown,
        };
  }
  // A closed ledger (its process shutting down) refuses every call before reading anything, and
  // its close refuses a claim still waiting then (for a lock, for a connection) unwritten
  // (`unclaimed`), or a call's first read (no operation yet): not an outage. This call sent nothing, but an earlier one
  // may have done this work (a model asking again), so "not done" would be the model's reason to
  // tell the user so, or a person's to redo it.
  if (
    error instanceof LedgerConfigError ||
    (error instanceof LedgerUnavailableError && error.closed && !error.operationId)
  )
    return {
      status: "unconfirmed",
      message:
        "Not confirmed: the tool is not available right now, so whether this work was already done (by an earlier call) could not be read; this call sent nothing. Do not tell the user either way; calling this tool again later with the same input is safe (it is never done twice) and says what happened.",
    };
  if (error instanceof LedgerUnavailableError) {
    // Failed on an operation the ledger holds: its attempt may have reached the provider before
    // the database went (the ledger names the operation once it has one). "Not performed" would
    // have a person redo it by hand. Its own process's close (`closed`: it stopped waiting while
    // the call's request was out or its action ran) is a shutdown, not an outage: said as such.
    if (error.operationId !== undefined)
      return {
        status: "unconfirmed",
        operationId: error.operationId,
        message: `Not confirmed (operation ${error.operationId}): ${error.closed ? "the tool was shut down" : "the ledger became unavailable"} during the call, so it may or may not have happened. Do not tell the user either way; check later with the status tool and this operation id, or call this tool again later with the same input (it is never done twice).`,
      };
    // Before it held one: this call sent nothing, or (rarely) its claim was recorded and nothing
    // more, which the next call with the same input or the daemon may run, once. But the ledger
    // was not read either: an earlier call may have done this work (a model asking again), so
    // "not done" would be the model's reason to tell the user so, or a person's to redo it.
    return {
      status: "unconfirmed",
      message:
        "Not confirmed: the ledger is unavailable right now, so whether this work was already done (by an earlier call) could not be read; this call sent nothing (at most it recorded the work, which may then be done once later). Do not tell the user either way; calling this tool again later with the same input is safe (it is never done twice) and says what happened.",
    };
  }
  const name = error instanceof Error ? error.name : typeof error;
  if (what.started)
    return {
      status: "unconfirmed",
      message: `Not confirmed: the call stopped before its outcome was known (${name}); it may or may not have happened. Do not tell the user either way; calling this tool again with the same input is safe (it is never done twice) and says what happened.`,
    };
  // The application's code failed before the ledger had the call (its tenant or key function, an
  // MCP server's context): this call did nothing, but the ledger was not read either, so an
  // earlier call may have done this work (a model asking again). "Not performed" would be the
  // model's reason to tell the user it was not done, or a person's to redo it.
  return {
    status: "unconfirmed",
    message: `Not confirmed: the tool failed (${name}) before whether this work was already done (by an earlier call) could be read; this call did nothing. Tell the user the tool failed, not whether the work was done. Calling this tool again with the same input is safe (it is never done twice) and, once the tool works, says what happened.`,
  };
}
