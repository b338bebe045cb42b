/**
 * The daemon's heartbeat (`ledger.daemon.heartbeat`): a write each tick, so that its health says
 * whether the ledger takes writes, as the agents need it to. A ledger on a full disk answers
 * reads, and a claim that matches no row commits nothing, so a daemon that only read reported
 * itself healthy while every agent's claim failed. The heartbeat's row (`idem_daemons`, migration
 * 0008: one per daemon name, no tenant's data) changes at each beat, so the beat commits a page or
 * fails as a claim would.
 */
import { sql } from "kysely";
import type { LedgerContext } from "./context.js";
import { requireName } from "./keys.js";

/** A daemon's row no beat has written for this long is removed (its daemon is gone: a name per process). */
const GONE_AFTER_MS = 7 * 24 * 3_600_000;

/**
 * Writes the beat of the daemon `name` (database clock). `swept`: the names that have beaten on
 * this ledger in this process; the first beat of each also removes the rows of daemons gone for a
 * week, and is added to it.
 */
export async function heartbeat(context: LedgerContext, name: string, swept: Set<string>): Promise<void> {
  requireName(name, "daemon name");
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
    if (swept.has(name)) return;
    await store.guard(
      undefined,
      db.deleteFrom("idem_daemons").where("beat_at", "<", sql<number>`${store.now()} - ${GONE_AFTER_MS}`).execute(),
    );
    swept.add(name);
  });
}
