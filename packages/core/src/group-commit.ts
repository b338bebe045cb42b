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
 * alone, in a commit of its own. When the ROLLBACK after it fails too and the transaction stays
 * open, the connection is abandoned: closed (the one way left to end that transaction, and to give
 * up the write lock it holds), and every write of that commit, and every statement still bound to
 * this connection (one waiting for a lock or for the next commit included), is refused with a
 * `LedgerUnavailableError` marked `reopen`: none was committed. The ledger's next statement opens
 * the file again, with a group commit of its own (sqlite-driver.ts `SqliteConnection`).
 *
 * While another connection holds the write lock, the writes wait for it without blocking the
 * process (sqlite-busy.ts): the queue is tried again after a pause, each write until it has waited
 * the busy timeout.
 */
import type { Database } from "better-sqlite3";
import { LedgerUnavailableError } from "./errors.js";
import { isBusy, LOCK_PAUSE } from "./sqlite-busy.js";

interface Waiting {
  readonly run: () => unknown;
  readonly resolve: (value: any) => void;
  readonly reject: (error: unknown) => void;
  /** A fresh claim's write: refused, not run, once the ledger is closing (`refusesClaims`). */
  readonly claim: boolean;
  /** When it first found the write lock held by another connection (performance.now()). */
  since?: number;
}

export class GroupCommit {
  private queue: Waiting[] = [];
  private scheduled = false;
  /** The last commit carried several writes: under load even a turn's first write waits for the next. */
  private busy = false;
  /** The pause before the queue is tried again while another connection holds the write lock (ms). */
  private pause = 0;
  /** How many writes at the queue's head this flush put back to wait for the lock (they keep their order). */
  private ahead = 0;
  /** Who waits for the queue to be empty (`drain`). */
  private drained: (() => void)[] = [];
  private closedBy: LedgerUnavailableError | undefined;

  /**
   * `check` runs before each commit, once for all its writes (the file is still the ledger's:
   * sqlite-driver.ts `fileCheck`); when it throws, none of them is written and each fails so.
   */
  constructor(
    private readonly database: Database,
    private readonly busyTimeoutMs: number,
    private readonly check: () => void = () => {},
    /** The ledger opens its connection again once this one is abandoned (said in the abandon's message). */
    private readonly reopens = false,
    /**
     * Why a fresh claim not yet run (waiting for the next commit or for the write lock) is refused,
     * none of it run, once the ledger is closing (sqlite-driver.ts `close`). Committed after the
     * close, it would be a row running under a lease nobody renews, of a call the close could not
     * name (its claim had no answer yet), which the replay policy later takes for an effect that
     * may have started. Every other write still waiting is committed as before: it records what a
     * call did or learned (an outcome, a request not sent), or a person's decision.
     */
    private readonly refusesClaims: () => Error | undefined = () => undefined,
  ) {}

  /**
   * Why this connection was closed: a transaction of a group commit that could be neither
   * committed nor rolled back (see `abandon`). Every write given to this group since is refused
   * with it; the ledger's new statements go to a connection opened again (sqlite-driver.ts
   * `SqliteConnection`), or, where it opens none, are refused with it too.
   */
  get abandoned(): LedgerUnavailableError | undefined {
    return this.closedBy;
  }

  /**
   * Runs the write `run` and answers once its commit has returned. Writes wait for the next turn
   * of the event loop, after this turn's microtasks, and share one commit; but when the last
   * commit was a lone write, the first write of a turn commits at once (a caller alone waits for
   * nothing). `claim`: a fresh claim's write (see `refusesClaims`).
   */
  write<T>(run: () => T, claim = false): T | Promise<T> {
    if (this.closedBy) throw this.closedBy;
    const refused = claim ? this.refusesClaims() : undefined;
    if (refused) throw refused;
    if (!this.scheduled) {
      this.scheduled = true;
      setImmediate(() => this.flush());
      // Not inside a transaction this process holds (a migration began while the write waited
      // for its statement): it would be answered there, and undone by its rollback.
      if (!this.busy && !this.database.inTransaction) {
        this.check();
        try {
          return run();
        } catch (error) {
          if (!isBusy(error)) throw error; // else it waits in the queue for the lock
        }
      }
    }
    return new Promise<T>((resolve, reject) => this.queue.push({ run, resolve, reject, claim }));
  }

  /** Commits everything queued now (also before the connection closes). */
  flush(): void {
    this.scheduled = false;
    // A transaction kysely holds (a migration in this process) owns the connection: wait for it.
    // (Not one this group left open: see `abandon`, which closes the connection.)
    if (this.closedBy === undefined && this.database.open && this.database.inTransaction) {
      this.scheduled = true;
      setTimeout(() => this.flush(), 1);
      return;
    }
    let batch = this.queue;
    this.queue = [];
    this.ahead = 0;
    this.busy = batch.length > 1;
    while (batch.length > 0) batch = this.commit(batch);
    if (this.queue.length === 0) for (const resolve of this.drained.splice(0)) resolve();
  }

  /** Resolves once no write waits: each committed, or failed (at the latest at its busy timeout). */
  async drain(): Promise<void> {
    this.flush();
    while (this.queue.length > 0) await new Promise<void>((resolve) => this.drained.push(resolve));
  }

  /** Commits what it can of `batch`; returns the writes that must run again in a new transaction. */
  private commit(batch: Waiting[]): Waiting[] {
    if (this.closedBy) {
      for (const w of batch) w.reject(this.closedBy);
      return [];
    }
    const refused = batch.some((w) => w.claim) ? this.refusesClaims() : undefined;
    if (refused) {
      for (const w of batch) if (w.claim) w.reject(refused);
      batch = batch.filter((w) => !w.claim);
      if (batch.length === 0) return [];
    }
    if (batch.length === 1) {
      // Alone: committed by the statement itself, as without group commit.
      const [only] = batch as [Waiting];
      try {
        this.check();
        only.resolve(only.run());
        this.pause = 0;
      } catch (error) {
        if (isBusy(error)) this.wait(batch, error);
        else only.reject(error);
      }
      return [];
    }
    try {
      this.check();
    } catch (error) {
      for (const w of batch) w.reject(error);
      return [];
    }
    try {
      this.database.exec("BEGIN IMMEDIATE");
      this.pause = 0;
    } catch (error) {
      if (isBusy(error)) this.wait(batch, error);
      else for (const w of batch) w.reject(error);
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
    } catch (commitError) {
      let rollbackError: unknown;
      if (this.database.inTransaction) {
        try {
          this.database.exec("ROLLBACK");
        } catch (error) {
          rollbackError = error; // the connection may be gone: nothing was committed either way
        }
      }
      if (this.database.open && this.database.inTransaction) {
        // Neither committed nor rolled back: a write run again now would be answered inside
        // this transaction, never committed. Refuse them all.
        this.abandon(commitError, rollbackError);
        for (const w of batch) w.reject(this.closedBy);
        return [];
      }
      // Which write the commit could not take is not known (a full disk shows at COMMIT in WAL
      // mode, as does a deferred constraint): none was acknowledged, so each runs again alone.
      for (const f of failed) f.w.reject(f.error);
      const alone = done.map((d) => d.w);
      for (let i = 0; i < alone.length; i++) {
        // Once one waits for the lock, the rest wait behind it, in their order.
        if (this.ahead > 0) {
          this.queue.splice(this.ahead, 0, ...alone.slice(i));
          this.ahead += alone.length - i;
          break;
        }
        this.commit([alone[i]!]);
      }
      return [];
    }
    for (const d of done) d.w.resolve(d.value);
    for (const f of failed) f.w.reject(f.error);
    return [];
  }

  /**
   * The transaction of a group commit could be neither committed nor rolled back, and is still
   * open. Nothing may run on this connection again: a write would be answered inside that
   * transaction and never committed, and a flush would wait for it as for a migration's, forever,
   * with `close()` waiting behind it. Meanwhile it holds the file's write lock, which every other
   * process's writes wait for. Closing the connection ends it (SQLite rolls back the transaction
   * of a connection it closes, and frames of the log that no commit ended are never read). The
   * statements bound to this connection are told so; the ledger's next statement opens the file
   * again (sqlite-driver.ts `SqliteConnection`).
   */
  private abandon(commitError: unknown, rollbackError: unknown): void {
    const said = (e: unknown) =>
      e === undefined ? "it ended without error, the transaction still open" : ((e as Error)?.message ?? String(e));
    this.closedBy = new LedgerUnavailableError(
      `SQLite could neither commit nor roll back a group commit (COMMIT: ${said(commitError)}; ROLLBACK: ${said(rollbackError)}): none of its writes was committed, and the ledger's connection was closed to end its transaction (${this.reopens ? "the ledger opens it again for its next statement" : "reopen the ledger"})`,
      undefined,
      {
        cause: new AggregateError([commitError, rollbackError], "COMMIT failed, then ROLLBACK"),
        reopen: true,
        reopensItself: this.reopens,
      },
    );
    try {
      this.database.close();
    } catch {
      // Busy (a statement of this process mid-iteration): it is refused all the same, and
      // `close()` of the ledger tries again.
    }
  }

  /**
   * Another connection holds the write lock (none of `batch` ran): the writes wait for it, ahead
   * of those queued since and in their order, and the queue is tried again after a pause
   * (doubling up to 50 ms, with jitter so that processes waiting for one lock do not try in
   * step). A write that has waited its busy timeout fails with the lock's error.
   */
  private wait(batch: Waiting[], error: unknown): void {
    const now = performance.now();
    const waiting = batch.filter((w) => {
      w.since ??= now;
      if (now - w.since < this.busyTimeoutMs) return true;
      w.reject(error);
      return false;
    });
    this.queue.splice(this.ahead, 0, ...waiting);
    this.ahead += waiting.length;
    this.pause = Math.min(Math.max(this.pause * 2, LOCK_PAUSE.minTimeout), LOCK_PAUSE.maxTimeout);
    if (this.queue.length > 0 && !this.scheduled) {
      this.scheduled = true;
      setTimeout(() => this.flush(), Math.min(this.pause * (1 + Math.random()), LOCK_PAUSE.maxTimeout));
    }
  }
}
