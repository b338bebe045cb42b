/**
 * 0005: the claim writes the operation's first audit event itself. Never edit once landed; add
 * 0006 instead.
 *
 * Until 0005 an INSERT trigger wrote it. On Postgres that trigger ran BEFORE the insert, so it
 * also ran for every duplicate claim, whose INSERT … ON CONFLICT DO NOTHING inserts nothing: a
 * plpgsql call building a jsonb array on every replay, the most frequent statement of a retrying
 * agent. On SQLite it ran AFTER the insert as a second UPDATE of the new row. The claim
 * (store.ts `insertRunning`, the only statement that inserts an operation) now sets `history` to
 * its first event in the same statement; every later event is still written by the UPDATE
 * trigger, so no transition goes unrecorded.
 */
export const sqlite = [`DROP TRIGGER idem_operations_audit_insert`];

export const postgres = [`DROP TRIGGER idem_operations_audit_insert ON idem_operations`];
