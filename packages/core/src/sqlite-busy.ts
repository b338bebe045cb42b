/**
 * Waiting for another connection's lock on a SQLite ledger. SQLite's own busy handler waits by
 * sleeping the thread, and better-sqlite3 runs on the thread of the process: while another
 * process held the write lock (the daemon committing, `idem prune`, a migration), every timer,
 * socket and lease heartbeat of this one stood still for up to the busy timeout. So the ledger's
 * connections have no busy handler (`busy_timeout = 0`): a statement that meets a lock fails at
 * once, having done nothing, and is run again after a pause, the event loop free meanwhile.
 */
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
