/**
 * pg's Pool, whose `end()` ends what still waits on the ledger's behalf as the ledger closes.
 *
 * - A call waiting for a connection (every one busy: with statements waiting for a lock, say):
 *   pg-pool's `end()` never serves its queue again, and left it to its connect timeout
 *   (`connectionTimeoutMillis`, 10 s by default) on a timer that does not hold the process. A
 *   closed ledger's caller heard of the close that much later, or never when the process had
 *   nothing else to do and ended. Each such wait fails at `end()`, nothing sent for it
 *   (`PoolEndedError`); a connection that comes for it afterwards is given back unused.
 * - A fresh claim still running on the server (waiting for another session's lock): pg-pool's
 *   end waits for it, and once granted it was a row running under a lease nobody renews, which the
 *   replay policy later took for an effect that may have started (a lookup, or a person's review
 *   of an effect that never ran). Its backend is asked to cancel it (`pg_cancel_backend`, on a
 *   connection of its own): refused there, a claim commits nothing. One the server finished first
 *   is committed and named by the close as before (Runner.claimedAfterClose); the cancel then
 *   reaches an idle backend, whose connection the ending pool takes back for no other statement.
 */
import type { PoolClient, QueryConfig, QueryResult } from "pg";

type Pool = typeof import("pg").Pool;
type Release = (error?: unknown) => void;
/** What the caller waiting for a connection is told (pg-pool's callback). */
type Waiter = (error: Error | undefined, client: PoolClient | undefined, release: Release) => void;
/** What pg-pool answers (its connect timeout gives no release). */
type Answer = (error: Error | undefined, client?: PoolClient, release?: Release) => void;
const NOTHING_TO_RELEASE: Release = () => {};

/** A call that waited for a connection when the pool ended: no statement of it was sent. */
export class PoolEndedError extends Error {
  constructor() {
    super("the ledger's connections were closed while this call waited for one: none of its statements was sent");
    this.name = "PoolEndedError";
  }
}

/** A pool whose end cancels the claims still running (`claim`), with `cancel` (backends' process ids). */
export interface EndingPool extends InstanceType<Pool> {
  /** `query`, for a fresh claim: cancelled if it still runs as the pool ends. */
  claim(config: QueryConfig): Promise<QueryResult>;
}

export function endingPool(
  Base: Pool,
  cancel: (pids: number[]) => Promise<void>,
): new (
  ...args: ConstructorParameters<Pool>
) => EndingPool {
  return class extends Base {
    /** The answers of the calls waiting for a connection now: each leaves as it is answered. */
    private readonly waiting = new Set<Answer>();
    /** The connections running a claim now. */
    private readonly claiming = new Set<PoolClient & { processID?: number }>();

    // pool.query waits through here too, with a callback; kysely awaits the promise.
    override connect(callback?: Waiter): any {
      if (callback === undefined)
        return new Promise((resolve, reject) =>
          this.connect((error, client) => (error ? reject(error) : resolve(client))),
        );
      const answer: Answer = (error, client, release) => {
        // Not waiting any more: the end answered it, and this connection came after. Back unused
        // (the ending pool drops it).
        if (!this.waiting.delete(answer)) return release?.();
        callback(error, client, release ?? NOTHING_TO_RELEASE);
      };
      this.waiting.add(answer);
      (Base.prototype.connect as (cb: Answer) => void).call(this, answer);
    }

    claim(config: QueryConfig): Promise<QueryResult> {
      return new Promise((resolve, reject) =>
        this.connect((error, client, release) => {
          if (error || !client) return reject(error);
          this.claiming.add(client);
          const answered = (err: Error | undefined, res?: QueryResult) => {
            this.claiming.delete(client);
            release(err); // one that failed is not handed to the next caller (pg-pool's query does so too)
            if (err) reject(err);
            else resolve(res!);
          };
          try {
            client.query(config, answered);
          } catch (err) {
            answered(err as Error);
          }
        }),
      );
    }

    override end(...args: unknown[]): any {
      for (const answer of [...this.waiting]) answer(new PoolEndedError());
      const pids = [...this.claiming].flatMap((c) => (typeof c.processID === "number" ? [c.processID] : []));
      // Not awaited: the end waits for the claims, which end sooner for it. Best effort: a server
      // that does not answer it lets them end as they would have.
      if (pids.length > 0) cancel(pids).catch(() => {});
      return (Base.prototype.end as (...a: unknown[]) => unknown).apply(this, args);
    }
  } as never;
}
