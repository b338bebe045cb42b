/**
 * Waiting for another connection's lock on a SQLite ledger. SQLite's own busy handler waits by
 * sleeping the thread, and better-sqlite3 runs on the thread of the process: while another
 * process held the write lock (the daemon committing, `idem prune`, a migration), every timer,
 * socket and lease heartbeat of this one stood still for up to the busy timeout. So the ledger's
 * connections have no busy handler (`busy_timeout = 0`): a statement that meets a lock fails at
 * once, having done nothing, and is run again after a pause, the event loop free meanwhile.
 */
import type { Database } from "better-sqlite3";
import pRetry from "p-retry";

/** The pauses between tries (ms): short at first, since most locks are a commit's fsync. */
export const LOCK_PAUSE = { minTimeout: 1, maxTimeout: 50 } as const;

/**
 * Another connection holds a lock this statement needs (SQLITE_BUSY and its extended codes).
 * Outside a transaction nothing of the statement ran, so running it again is safe.
 */
export function isBusy(error: unknown): boolean {
  const code = (error as { code?: unknown } | null | undefined)?.code;
  return typeof code === "string" && code.startsWith("SQLITE_BUSY");
}

/**
 * Runs `run`, a statement outside a transaction or the BEGIN of one. While it meets a lock, runs
 * it again after a pause, until `timeoutMs` is spent; then its last error is thrown.
 */
export function patiently<T>(run: () => T, timeoutMs: number): T | Promise<T> {
  try {
    return run();
  } catch (error) {
    if (!isBusy(error) || timeoutMs <= 0) throw error;
    // p-retry's first attempt is the one that just failed: it pauses before the second.
    let retrying = false;
    const again = () => {
      if (retrying) return run();
      retrying = true;
      throw error;
    };
    return pRetry(again, {
      ...LOCK_PAUSE,
      retries: Number.POSITIVE_INFINITY,
      randomize: true, // processes waiting for one lock do not try again in step
      maxRetryTime: timeoutMs,
      shouldRetry: ({ error }) => isBusy(error),
    });
  }
}

/**
 * The waits of one connection. A statement tried again must not run inside a transaction this
 * process opened meanwhile on the same connection (a migration): it would be that transaction's,
 * acknowledged, then rolled back with it. So each try finds the connection free of transactions,
 * or waits as for a lock. And the connection closes only once every wait has ended.
 */
export class LockWaits {
  private readonly waiting = new Set<Promise<unknown>>();

  /**
   * `closedBy`: why the connection was closed under the waits, if it was (a group commit that
   * could be neither committed nor rolled back, group-commit.ts `abandoned`). A statement still
   * waiting then is refused with it at its next try: better-sqlite3's own "The database connection
   * is not open" would be heard as an outage that may pass, and retried. `refusesClaims`: why a
   * fresh claim still waiting is refused, once the ledger is closing (group-commit.ts `refusesClaims`).
   */
  constructor(
    private readonly database: Database,
    readonly timeoutMs: number,
    private readonly closedBy: () => Error | undefined = () => undefined,
    private readonly refusesClaims: () => Error | undefined = () => undefined,
  ) {}

  /** Runs `run` (outside a transaction), waiting for a lock as `patiently` does; `claim`: a fresh claim's write. */
  run<T>(run: () => T, claim = false): T | Promise<T> {
    const out = patiently(() => {
      const closed = this.closedBy() ?? (claim ? this.refusesClaims() : undefined);
      if (closed) throw closed;
      if (this.database.inTransaction) throw inTransaction();
      return run();
    }, this.timeoutMs);
    if (!(out instanceof Promise)) return out;
    this.waiting.add(out);
    const done = () => this.waiting.delete(out);
    out.then(done, done);
    return out;
  }

  /** Resolves once no statement waits (each ran, or failed at its busy timeout). */
  async drain(): Promise<void> {
    while (this.waiting.size > 0) await Promise.allSettled([...this.waiting]);
  }
}

/** A transaction of this process holds the connection: wait for it as for another's lock. */
function inTransaction(): Error {
  return Object.assign(new Error("database is locked (by a transaction of this process)"), { code: "SQLITE_BUSY" });
}
