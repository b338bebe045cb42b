/**
 * pg's Pool, whose `end()` answers the calls still waiting for a connection.
 *
 * pg-pool's `end()` lets the connections in use finish and then ends, but never serves its queue
 * again: a call waiting there (every connection busy, with statements waiting for a lock, say)
 * waited out its connect timeout (`connectionTimeoutMillis`, 10 s by default) on a timer that does
 * not hold the process. A closed ledger's caller heard of the close that much later, or never when
 * the process had nothing else to do and ended. Here each such wait fails at `end()`, with nothing
 * sent for it; a connection that comes for it afterwards is given back unused.
 */
import type { PoolClient } from "pg";

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

export function endingPool(Base: Pool): Pool {
  return class EndingPool extends Base {
    /** The answers of the calls waiting for a connection now: each leaves as it is answered. */
    private readonly waiting = new Set<Answer>();

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

    override end(...args: unknown[]): any {
      for (const answer of [...this.waiting]) answer(new PoolEndedError());
      return (Base.prototype.end as (...a: unknown[]) => unknown).apply(this, args);
    }
  } as Pool;
}
