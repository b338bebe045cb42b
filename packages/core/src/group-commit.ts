/**
 * Group commit on SQLite. With `synchronous=FULL` every commit waits for an fsync, and one
 * connection commits one statement at a time, so concurrent callers in one process queue behind
 * each other's fsyncs. Here the ledger's writes (from the direct executor and from its kysely
 * driver, sqlite-driver.ts) issued in the same turn of the event loop wait for the next one and
 * then run together in one transaction: one fsync for all of them.
 *
 * better-sqlite3 is synchronous, so a batch runs from BEGIN to COMMIT without yielding: nothing
 * else on this connection can run inside it, and no caller hears of its write before the COMMIT
 * returned (durable with `synchronous=FULL`, the default). A read that runs while writes wait
 * sees the state before them, as if it had run first; no write has been acknowledged, so that
 * order is a true one.
 *
 * A statement that fails inside a batch fails alone. SQLite undoes that statement and keeps the
 * transaction (constraint errors, RAISE(ABORT), SQLITE_FULL raised by the statement), or it rolls
 * the whole transaction back: then the failing statement is refused, and the others, none of
 * them acknowledged, run again in a new transaction. When the COMMIT fails, each write runs again
 * alone, in a commit of its own.
 */
import type { Database } from "better-sqlite3";

interface Waiting {
  readonly run: () => unknown;
  readonly resolve: (value: any) => void;
  readonly reject: (error: unknown) => void;
}

export class GroupCommit {
  private queue: Waiting[] = [];
  private scheduled = false;
  /** The last commit carried several writes: under load even a turn's first write waits for the next. */
  private busy = false;

  constructor(private readonly database: Database) {}

  /**
   * Runs the write `run` and answers once its commit has returned. Writes wait for the next turn
   * of the event loop, after this turn's microtasks, and share one commit; but when the last
   * commit was a lone write, the first write of a turn commits at once (a caller alone waits for
   * nothing).
   */
  write<T>(run: () => T): T | Promise<T> {
    if (!this.scheduled) {
      this.scheduled = true;
      setImmediate(() => this.flush());
      if (!this.busy) return run();
    }
    return new Promise<T>((resolve, reject) => this.queue.push({ run, resolve, reject }));
  }

  /** Commits everything queued now (also before the connection closes). */
  flush(): void {
    this.scheduled = false;
    // A transaction kysely holds (a migration in this process) owns the connection: wait for it.
    if (this.database.open && this.database.inTransaction) {
      this.scheduled = true;
      setTimeout(() => this.flush(), 1);
      return;
    }
    let batch = this.queue;
    this.queue = [];
    this.busy = batch.length > 1;
    while (batch.length > 0) batch = this.commit(batch);
  }

  /** Commits what it can of `batch`; returns the writes that must run again in a new transaction. */
  private commit(batch: Waiting[]): Waiting[] {
    if (batch.length === 1) {
      // Alone: committed by the statement itself, as without group commit.
      const [only] = batch as [Waiting];
      try {
        only.resolve(only.run());
      } catch (error) {
        only.reject(error);
      }
      return [];
    }
    try {
      this.database.exec("BEGIN IMMEDIATE");
    } catch (error) {
      for (const w of batch) w.reject(error);
      return [];
    }
    const done: { w: Waiting; value: unknown }[] = [];
    const failed: { w: Waiting; error: unknown }[] = [];
    for (let i = 0; i < batch.length; i++) {
      const w = batch[i]!;
      try {
        done.push({ w, value: w.run() });
      } catch (error) {
        if (this.database.inTransaction) {
          failed.push({ w, error }); // SQLite undid this statement alone
          continue;
        }
        // The whole transaction was rolled back: this write is refused, the others run again.
        w.reject(error);
        for (const f of failed) f.w.reject(f.error);
        return [...done.map((d) => d.w), ...batch.slice(i + 1)];
      }
    }
    try {
      this.database.exec("COMMIT");
    } catch {
      if (this.database.inTransaction) {
        try {
          this.database.exec("ROLLBACK");
        } catch {
          // the connection is gone: nothing was committed either way
        }
      }
      // Which write the commit could not take is not known (a full disk shows at COMMIT in WAL
      // mode, as does a deferred constraint): none was acknowledged, so each runs again alone.
      for (const f of failed) f.w.reject(f.error);
      for (const d of done) this.commit([d.w]);
      return [];
    }
    for (const d of done) d.w.resolve(d.value);
    for (const f of failed) f.w.reject(f.error);
    return [];
  }
}
