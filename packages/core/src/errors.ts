/**
 * The few errors idem throws. Outcomes of side effects are values (see `RunResult`); these are
 * for caller bugs and broken configuration, and each carries its evidence so an operator can act
 * without reproducing the call. Every error keeps `{ cause }` when it wraps another.
 */
import type { Seen } from "./context.js";
import type { Status } from "./schema.js";

/** Every `code` an `IdemError` can carry: a closed set, so a `switch` over it can be exhaustive. */
export type IdemErrorCode =
  | "ARGS_MISMATCH"
  | "INVALID_VALUE"
  | "PAYLOAD_TOO_LARGE"
  | "UNKNOWN_ACTION"
  | "LEDGER_CONFIG"
  | "NOT_FOUND"
  | "INVALID_TRANSITION"
  /** A decision taken on a view of the operation that is no longer current (`ChangedSinceSeenError`). */
  | "CHANGED_SINCE_SEEN"
  | "GUARDRAIL"
  | "LEDGER_UNAVAILABLE"
  | "COMPLETION_NOT_RECORDED"
  | "LEASE_DEADLINE"
  /** The `idem` command's configuration file or flags (thrown by @idem/cli). */
  | "CONFIG";

/** Base class: `code` is stable for scripts; `message` is for people. */
export class IdemError extends Error {
  readonly code: IdemErrorCode;
  constructor(code: IdemErrorCode, message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = new.target.name;
    this.code = code;
  }
}

/** The same (tenant, key) was reused with other arguments. Nothing was executed. */
export class ArgsMismatchError extends IdemError {
  constructor(
    readonly operationId: string,
    readonly storedArgsHash: string,
    readonly givenArgsHash: string,
    readonly action: string,
    /** Where the operation made with the stored args is: done, failed, or not settled yet. */
    readonly status?: Status,
    /**
     * Its effect is known to have happened, though its receipt could not be stored (`needs_review`:
     * a person records it, nobody decides whether it happened).
     */
    readonly performed: boolean = false,
  ) {
    super(
      "ARGS_MISMATCH",
      `operation ${operationId} (${action}) was created with args ${storedArgsHash}, ` +
        `this call gave ${givenArgsHash}: a changed payload needs a new key (a new revision), not a reused one`,
    );
  }
}

/** A value cannot be part of a key or stored args: it would make the key unstable or meaningless. */
export class InvalidValueError extends IdemError {
  constructor(
    readonly path: string,
    readonly reason: string,
    /** The operation, when the value is an effect's receipt that cannot be kept (the effect happened). */
    readonly operationId?: string,
  ) {
    super("INVALID_VALUE", `${path}: ${reason}`);
  }
}

/** Args or a receipt exceed the configured size; nothing was written for the args case. */
export class PayloadTooLargeError extends IdemError {
  constructor(
    readonly what: "args" | "result" | "error",
    readonly bytes: number,
    readonly limit: number,
    readonly operationId?: string,
  ) {
    // A result too large is an effect's receipt: the effect happened, whatever becomes of it.
    const performed =
      what === "result" && operationId ? ": the effect happened; its receipt cannot be kept (maxResultBytes)" : "";
    super(
      "PAYLOAD_TOO_LARGE",
      `${what} is ${bytes} bytes, over the limit of ${limit}${operationId ? ` (operation ${operationId})` : ""}${performed}`,
    );
  }
}

/** A stored operation names an action type this ledger was not given. The row is untouched. */
export class UnknownActionError extends IdemError {
  constructor(
    readonly action: string,
    readonly operationId?: string,
  ) {
    super(
      "UNKNOWN_ACTION",
      `no action of type "${action}" is registered${operationId ? ` (operation ${operationId})` : ""}`,
    );
  }
}

/**
 * The ledger URL or options cannot be used. `unreachable`: the database did not answer (down,
 * restarting, or a wrong address: from here the two look alike), so trying again later may work.
 */
export class LedgerConfigError extends IdemError {
  readonly unreachable: boolean;

  constructor(message: string, options?: { cause?: unknown; unreachable?: boolean }) {
    super("LEDGER_CONFIG", message, options);
    this.unreachable = options?.unreachable ?? false;
  }
}

/**
 * The ledger was migrated by a newer release of idem (`migrations`: the ones this release does not
 * know), and this one must not write to it. The message says to upgrade @idem/core; a program that
 * people upgrade under another name (the `idem` command: @idem/cli) says its own.
 */
export class NewerLedgerError extends LedgerConfigError {
  constructor(readonly migrations: readonly string[]) {
    super(`this ledger was migrated by a newer idem (${migrations.join(", ")}): upgrade @idem/core to use it`);
  }
}

/**
 * Postgres: a migration gave up waiting, at open or in `admin.migrate()`: for the locks of the
 * ledger's tables (`waitedFor: "locks"`: a long transaction on them, a report, a dump; bounded by
 * `migrationLockPatienceMs`) or for a statement's answer (`"answer"`: another process migrating,
 * or a server that stopped answering; bounded by `migrationTimeoutMs`). Unreachable: trying again,
 * or with a longer bound, may work. `setting` is how the message names the bound: the option by
 * default; a program whose users set it otherwise (a flag, a config key) gives its own.
 */
export class MigrationWaitError extends LedgerConfigError {
  /** The `openLedger` option that bounds this wait. */
  readonly option: "migrationLockPatienceMs" | "migrationTimeoutMs";

  constructor(
    readonly waitedFor: "locks" | "answer",
    readonly limitMs: number,
    options: { cause?: unknown; setting?: string } = {},
  ) {
    const option = waitedFor === "locks" ? "migrationLockPatienceMs" : "migrationTimeoutMs";
    const setting = options.setting ?? option;
    super(
      waitedFor === "locks"
        ? `ledger migration failed: the migration's locks were not free within ${limitMs} ms (${setting}): a long transaction on the ledger's tables (a report, a dump); try again, or give it longer`
        : `ledger migration failed: a migration statement had no answer within ${limitMs} ms (${setting}): another process migrating (holding the migration lock) or a server that stopped answering; try again, or give it longer`,
      { cause: options.cause, unreachable: true },
    );
    this.option = option;
  }
}

/** No operation with that id exists for that tenant (another tenant's id is reported the same way). */
export class OperationNotFoundError extends IdemError {
  constructor(
    readonly tenant: string,
    readonly operationId: string,
  ) {
    super("NOT_FOUND", `no operation ${operationId} for tenant ${tenant}`);
  }
}

/**
 * A manual transition was asked of an operation in a status that does not allow it (code
 * `INVALID_TRANSITION`): asking again will not help. Its subclass `ChangedSinceSeenError` (code
 * `CHANGED_SINCE_SEEN`) is the refusal of a decision taken on a view that is no longer current,
 * which may be taken again on the operation as it is now.
 */
export class InvalidTransitionError extends IdemError {
  constructor(
    readonly operationId: string,
    /** The status the operation is in, or (older callers read it) why the transition was refused. */
    readonly from: string,
    readonly to: string,
    /** @internal A subclass's own code and message. */
    refusal?: { readonly code: "CHANGED_SINCE_SEEN"; readonly message: string },
  ) {
    super(
      refusal?.code ?? "INVALID_TRANSITION",
      refusal?.message ?? `operation ${operationId} is ${from}; it cannot become ${to} this way`,
    );
  }
}

/**
 * A person's decision (`admin.resolve`, `admin.retry`) refused because the operation changed since
 * the view it was taken on: the `seen` the caller gave (`shown`), or the row as the ledger read it
 * when another change won the race to write (`shown` false: no `seen` was given). Nothing was
 * decided. Unlike a status that does not allow the move, this may pass: read the operation again
 * and decide on what it is now. An `InvalidTransitionError`, so a `catch` of that still takes it
 * as a refusal; `code` (`CHANGED_SINCE_SEEN`) tells the two apart.
 */
export class ChangedSinceSeenError extends InvalidTransitionError {
  constructor(
    operationId: string,
    to: string,
    /** The operation as the decision saw it. */
    readonly seen: Seen,
    /** The operation as it is now (when the decision was refused). */
    readonly now: Seen,
    readonly shown: boolean,
  ) {
    const version = (v: Seen) => `${v.status}.${v.attempt}.${v.checks}.${v.updatedAt}`;
    super(operationId, `${now.status} and ${shown ? "changed since it was shown" : "changed concurrently"}`, to, {
      code: "CHANGED_SINCE_SEEN",
      message: `operation ${operationId} ${shown ? "changed since it was shown" : "changed while it was being decided"} (version ${version(seen)}): it is now ${now.status} at attempt ${now.attempt} (version ${version(now)}); nothing was decided: read it again and decide on what it is now`,
    });
  }
}

/** The tenant may not perform this action type, or a spend budget would be exceeded. */
export class GuardrailError extends IdemError {
  constructor(
    readonly tenant: string,
    readonly action: string,
    reason: string,
  ) {
    super("GUARDRAIL", `tenant ${tenant} may not run ${action}: ${reason}`);
  }
}

/**
 * The ledger's database could not be read or written (unreachable, full disk, read-only, a
 * failed commit). Thrown by `run` before an attempt executed, nothing was sent; thrown while an
 * attempt's outcome was being recorded, the row stays `running` and is settled by the replay
 * policy when its lease ends. Either way the call can be repeated with the same key: it is never
 * performed twice.
 */
export class LedgerUnavailableError extends IdemError {
  /**
   * This statement's connection is gone for good: no retry of it on that connection can pass,
   * however long one waits (false for an outage that may pass: a restart, a full disk, a lock).
   * Two causes, told apart by the message and by `reopensItself`:
   * - its SQLite file (or the file's log or index) was deleted or replaced since the ledger opened
   *   it (a ledger made anew at its path, a backup renamed over it): this ledger never writes
   *   again. Close it and open the ledger again: the open opens the file at the path now.
   * - SQLite: a group commit it was part of (or waited for) could be neither committed nor rolled
   *   back, and the connection was closed to end its transaction: nothing of it was committed.
   *   The ledger opens its connection again by itself for its next statement (checking that the
   *   file is still the one it opened), so a new call may pass once the file is usable, and the
   *   ledger's own writes that must outlast an outage retry through it (`reopensItself`: call
   *   again, nothing to close).
   */
  readonly reopen: boolean;

  /**
   * With `reopen`: the ledger opens its connection again by itself for its next statement (a
   * SQLite connection closed after a group commit it could neither commit nor roll back, on a
   * ledger opened from a path). Nothing to do but call again; a call may fail while the file is
   * still unusable, as in any outage. The ledger's own writes that must outlast an outage (a
   * receipt's completion) retry it as one. False: close the ledger and open it again.
   */
  readonly reopensItself: boolean;

  /**
   * This process closed the ledger (`close` stopped waiting) while the call was in flight: nothing
   * more is recorded through it, and no retry is made. The operation is as the call's last write
   * left it (running under its lease: settled by the replay policy once that ends), unless the
   * call had none (`unclaimed`). Not an outage.
   */
  readonly closed: boolean;

  /**
   * With `closed`: the close came before this call's claim was written (on SQLite, a claim still
   * waiting for another process's write lock or for its group commit; anywhere, a claim not yet
   * sent), so this call recorded no operation and sent nothing; `operationId` is unset. Calling
   * again with the same key on an open ledger is safe: it claims the key, or is answered by the
   * operation already holding it.
   */
  readonly unclaimed: boolean;

  constructor(
    message: string,
    readonly operationId?: string,
    options?: { cause?: unknown; reopen?: boolean; reopensItself?: boolean; closed?: boolean; unclaimed?: boolean },
  ) {
    super("LEDGER_UNAVAILABLE", message + (operationId ? ` (operation ${operationId})` : ""), options);
    // Said again of an operation (the same failure, wrapped), it stays one that needs a reopen.
    this.reopen =
      options?.reopen ?? (options?.cause instanceof LedgerUnavailableError && options.cause.reopen === true);
    this.reopensItself =
      this.reopen &&
      (options?.reopensItself ??
        (options?.cause instanceof LedgerUnavailableError && options.cause.reopensItself === true));
    this.closed =
      options?.closed ?? (options?.cause instanceof LedgerUnavailableError && options.cause.closed === true);
    // Not inherited from a cause: a wrap that names an operation says of it what a claim refused cannot.
    this.unclaimed = options?.unclaimed ?? false;
  }
}

/**
 * What a call hears when the ledger's close came before its claim was written (`unclaimed`): a
 * claim refused unsent, at the close, by the store (store.ts `claim`) or by a SQLite connection's
 * lock waits and group commit (sqlite-driver.ts `close`). Not the close's message for a call in
 * flight (Store.closedError), which speaks of an operation and a lease this call never had.
 */
export function claimNotWritten(): LedgerUnavailableError {
  return new LedgerUnavailableError(
    "the ledger was closed before this call's claim was written: no operation was recorded for this call and nothing was sent; calling again with the same key on an open ledger is safe",
    undefined,
    { closed: true, unclaimed: true },
  );
}

/**
 * The effect HAPPENED, but the ledger could not record its receipt (the database failed after
 * the effect, and retrying the write did not help). The receipt is here; the operation stays
 * `running` in the ledger until its lease expires, and is then settled by the replay policy
 * (replayed by key, found by lookup, or sent to a person). Never retry the effect yourself.
 */
export class CompletionNotRecordedError extends IdemError {
  constructor(
    readonly operationId: string,
    readonly attempt: number,
    readonly receipt: unknown,
    options?: { cause?: unknown },
  ) {
    super(
      "COMPLETION_NOT_RECORDED",
      `operation ${operationId} attempt ${attempt}: the effect happened but the ledger could not record it; ` +
        `the receipt is on this error and the operation will be settled by reconciliation`,
      options,
    );
  }
}

/**
 * The reason an action's `op.signal` is aborted with when its lease could not be renewed in time:
 * the attempt must stop before another worker may take the operation over.
 */
export class LeaseDeadlineError extends IdemError {
  constructor(
    readonly operationId: string,
    readonly attempt: number,
  ) {
    super(
      "LEASE_DEADLINE",
      `attempt ${attempt} of ${operationId} could not renew its lease in time; stopping before another attempt may take over`,
    );
  }
}
