/**
 * The daemon's heartbeat: a write each tick, so that its health says whether the ledger takes
 * writes, as the agents need it to. A ledger on a full disk answers reads, and a claim that
 * matches no row commits nothing, so a daemon that only read reported itself healthy while every
 * agent's claim failed. The heartbeat's row (`idem_daemons`, migration 0008: one per daemon name,
 * no tenant's data) changes at each beat, so the beat commits a page or fails as a claim would.
 */
import { sql } from "kysely";
import { requireName } from "./keys.js";
import { contextOf, type Ledger } from "./ledger.js";

/** A daemon's row no beat has written for this long is removed (its daemon is gone: a name per process). */
const GONE_AFTER_MS = 7 * 24 * 3_600_000;

/** The daemons that have beaten in this process, by ledger: each sweeps the rows of gone daemons once. */
const swept = new WeakMap<Ledger, Set<string>>();

/**
 * Records that the daemon `name` reached the ledger now (database clock): its row written, a page
 * committed. `idem daemon` beats before each tick. Throws `LedgerUnavailableError` when the write
 * fails (a full disk, a read-only file, the database gone), as the agents' claims then do;
 * `InvalidValueError` for a malformed name. The first beat of a name in a process also removes the
 * rows of daemons gone for a week.
 */
export async function daemonHeartbeat(ledger: Ledger, name: string): Promise<void> {
  requireName(name, "daemon name");
  const context = contextOf(ledger);
  context.assertOpen();
  const { db, store } = context;
  await context.runner.track(async () => {
    const now = store.now();
    await store.guard(
      undefined,
      db
        .insertInto("idem_daemons")
        .values({ name, beat_at: now, beats: 1 })
        .onConflict((oc) =>
          oc.column("name").doUpdateSet({
            beat_at: (eb) => eb.ref("excluded.beat_at"),
            beats: sql<number>`idem_daemons.beats + 1`,
          }),
        )
        .execute(),
    );
    const names = swept.get(ledger) ?? new Set<string>();
    if (names.has(name)) return;
    await store.guard(
      undefined,
      db.deleteFrom("idem_daemons").where("beat_at", "<", sql<number>`${store.now()} - ${GONE_AFTER_MS}`).execute(),
    );
    swept.set(ledger, names.add(name));
  });
}
