/**
 * 0011: the daemon's due index leaves out the pending rows whose args are not stored (hash-only,
 * lazily generated args released). Only a caller with the args can run such a row, so the daemon
 * has nothing to do with it; yet it claimed each one every `claimMs`, for ever, to answer "a
 * caller with the args must run it again" (and, lacking the action, counted an error each time).
 * Clearing such a row's `next_check_at` instead would drop the rate-limit wait its callers read
 * from it. Never edit once landed; add 0012 instead.
 *
 * The predicate is the old one and more terms, each written as the claim writes it (store.ts
 * `claimDue`): SQLite uses a partial index only when the query holds each of its terms, so the
 * claim uses this index once migrated and the old one before (a ledger opened without migrating).
 * `next_check_at IS NOT NULL` (which the claim's `next_check_at <= now` implies: no row without a
 * time is ever due) keeps the operators' lists by status off it: a list of one tenant's unknown
 * outcomes, newest first, is a range of the status index (0006), not a read of every due row.
 */
const STATEMENTS = [
  `DROP INDEX idem_operations_due`,
  `CREATE INDEX idem_operations_due ON idem_operations (next_check_at)
     WHERE status IN ('unknown', 'pending') AND (status = 'unknown' OR args_json IS NOT NULL)
       AND next_check_at IS NOT NULL`,
];

export const sqlite = STATEMENTS;

export const postgres = STATEMENTS;
