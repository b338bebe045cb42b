/**
 * 0008: `idem_daemons`, one row per daemon (by its name), written at every tick (daemon-heartbeat.ts).
 * A daemon whose ledger answers reads but takes no write (a full disk) reported itself healthy:
 * its reads passed, and a claim matching no row commits nothing. The row's write always changes
 * a page (`beats` counts up), so the tick fails as the agents' claims do. No tenant's data: no
 * report, listing or prune reads the table. Never edit once landed; add 0009 instead.
 */
export const sqlite = [
  `CREATE TABLE idem_daemons (
    name TEXT PRIMARY KEY,
    beat_at INTEGER NOT NULL,
    beats INTEGER NOT NULL
  )`,
];

export const postgres = [
  `CREATE TABLE idem_daemons (
    name TEXT PRIMARY KEY,
    beat_at BIGINT NOT NULL,
    beats BIGINT NOT NULL
  )`,
];
