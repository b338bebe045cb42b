/**
 * The lease an attempt holds while its action runs (`withLease`): a heartbeat extends it, and a
 * local deadline aborts the action's signal once no heartbeat succeeded for most of a lease, since
 * another worker may then take over (`LeaseDeadlineError`). A close that stops waiting for the
 * action aborts it at once, with the close's `LedgerUnavailableError` (`closed`): no heartbeat
 * renews the lease after it. Also the OperationContext the action is handed, its signal made only
 * when read.
 */
import type { OperationContext } from "./action.js";
import type { Call, Held } from "./call.js";
import { firstSentOf } from "./effects.js";
import { LeaseDeadlineError } from "./errors.js";
import type { Row, Store } from "./store.js";

/**
 * Runs `fn` while a heartbeat keeps our lease. The action's signal aborts when the lease is lost,
 * when the caller gives up, locally when no heartbeat succeeded for most of a lease (the database
 * is unreachable: another worker may take over once the lease runs out), or when the ledger's
 * close stops waiting for this call (Store.markClosed).
 */
export async function withLease<A, R, T>(
  store: Store,
  call: Call<A, R>,
  mine: Held,
  /**
   * `abandon`: aborts the action's signal, when its answer is no longer awaited (a lookup given up).
   * `onLost`: tells its listener (one; a later one replaces it) once the lease is lost, at once if
   * it already is, with why.
   */
  fn: (
    ctx: OperationContext,
    held: () => boolean,
    abandon: (reason: Error) => void,
    onLost: (listener: (reason: Error) => void) => void,
  ) => Promise<T>,
  lastAttemptAt?: number,
  /** Whether an earlier attempt may have taken effect (`OperationContext.mayHaveCommitted`); a lookup's: yes. */
  mayHaveCommitted = true,
): Promise<T> {
  const { row } = mine;
  const leaseMs = call.settings.leaseMs;
  const controller = new LazyAbort();
  const onAbort = () => controller.abort(call.signal?.reason);
  call.signal?.addEventListener("abort", onAbort, { once: true });
  if (call.signal?.aborted) onAbort(); // given up while the lease was being granted: no event comes
  let finished = false;
  // The lease counts from when the statement that granted or extended it was SENT: a conservative end.
  const margin = Math.min(Math.floor(leaseMs / 5), 2_000);
  const clock = store.local;
  let until = 0;
  let lost: Error | undefined;
  let lostListener: ((reason: Error) => void) | undefined;
  const lose = (reason: Error) => {
    if (lost) return;
    lost = reason;
    controller.abort(reason);
    lostListener?.(reason);
  };
  let deadline: NodeJS.Timeout | undefined;
  // Past the deadline the lease may pass to another worker.
  const armDeadline = (from: number) => {
    until = from + leaseMs - margin;
    clearTimeout(deadline);
    deadline = setTimeout(() => lose(new LeaseDeadlineError(row.id, row.attempt)), Math.max(0, until - clock()));
  };
  armDeadline(mine.since);
  const timer = setInterval(
    () => {
      const asked = clock();
      store.heartbeat(row, leaseMs).then(
        (kept) => {
          // Answered after the call ended, or after the lease was lost (the close stopped waiting,
          // a deadline met): nothing to keep, no deadline to arm (its timer would hold the process).
          if (finished || lost) return;
          if (kept) return armDeadline(asked);
          lose(new Error(`lease of attempt ${row.attempt} lost`));
        },
        // The database unreachable (the deadline above stops the action), or the ledger closed (its
        // close stopped the action already).
        () => {},
      );
    },
    Math.max(10, Math.floor(leaseMs / 3)),
  );
  // The heartbeat alone does not keep the process running: an action that waits on nothing
  // (it ignored its signal) after the ledger closed must not hold the process open for ever.
  timer.unref();
  // Once the ledger's close stopped waiting for this call, no heartbeat renews the lease and
  // nothing more is recorded: the action hears the close then, as the call's own statements do,
  // not a lease deadline up to a lease later (meanwhile an action honouring its signal could still
  // send a request the ledger will never hear of).
  const unlisten = store.whenClosed(() => {
    clearInterval(timer);
    clearTimeout(deadline);
    lose(store.closedError(row.id));
  });
  // Read synchronously, before a request is sent: the deadline's timer may not have fired yet
  // when the answer that granted the lease arrived late.
  const held = () => !lost && clock() < until;
  try {
    return await fn(
      context(row, controller, lastAttemptAt, mayHaveCommitted),
      held,
      (reason) => controller.abort(reason),
      (listener) => {
        if (lost) listener(lost);
        else lostListener = listener;
      },
    );
  } finally {
    finished = true;
    clearInterval(timer);
    clearTimeout(deadline);
    unlisten();
    call.signal?.removeEventListener("abort", onAbort);
  }
}

/**
 * An AbortController made when its signal is first read: most actions never read it, and making
 * one costs more (~5 µs) than the rest of a replayed call's bookkeeping.
 */
class LazyAbort {
  private controller: AbortController | undefined;
  private reason: { value: unknown } | undefined;

  get signal(): AbortSignal {
    if (!this.controller) {
      this.controller = new AbortController();
      if (this.reason) this.controller.abort(this.reason.value);
    }
    return this.controller.signal;
  }

  abort(reason: unknown): void {
    if (this.controller) this.controller.abort(reason);
    else this.reason ??= { value: reason };
  }
}

function context(
  row: Row & { db_now: number },
  abort: LazyAbort,
  lastAttemptAt = row.updated_at,
  mayHaveCommitted = true,
): OperationContext {
  return {
    id: row.id,
    tenant: row.tenant_id,
    key: row.key,
    keyLabel: row.key_label,
    attempt: row.attempt,
    createdAt: row.created_at,
    firstSentAt: firstSentOf(row),
    lastAttemptAt,
    mayHaveCommitted,
    now: row.db_now,
    providerReference: row.provider_reference,
    get signal() {
      return abort.signal;
    },
  };
}
