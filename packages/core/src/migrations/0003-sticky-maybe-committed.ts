/**
 * 0003: "maybe committed" is remembered, and the history's cost per transition stops growing.
 * Never edit once landed; add 0004 instead.
 *
 * - `maybe_committed`: 1 from the moment an attempt may have reached the provider (a claim or
 *   takeover that executes, lazy args stored just before sending) until a proof clears it: the
 *   effect found, its absence proven by a sound lookup, a person's verdict. Only `pending` (known
 *   not done, runnable again) requires 0, and the database enforces it (CHECK), so no code path
 *   can turn an unproven maybe into "safe to run again". Before 0003 a transient answer to the
 *   replay of an unknown outcome made the row `pending` and it was executed again after the
 *   provider's key window: such rows (pending after a transient answer, with an unknown in their
 *   history) go back to `unknown` here, to be reconciled.
 * - The history keeps its first 10 events (how the operation began) and the last 90, and counts
 *   the events dropped between them in `history_elided`. Before, every transition rewrote the
 *   whole array: an unknown outcome checked a thousand times held 8,006 events (1.3 MiB) and one
 *   transition took 380 ms instead of 17 (measured by the session that filed issue 11).
 */
const HEAD = 10;
const CAP = 100;

const sqliteNow = `cast(unixepoch('subsec') * 1000 as integer)`;
const pgNow = `(extract(epoch from statement_timestamp()) * 1000)::bigint`;

const sqliteEvent = (from: string) =>
  `json_object('from', ${from}, 'to', NEW.status, 'attempt', NEW.attempt, 'actor', NEW.actor, 'reason', NEW.reason, 'ref', NEW.provider_reference, 'at', NEW.updated_at)`;

const REOPEN_REASON = `'migration 0003: a transient answer to the replay of an unknown outcome proved nothing about the earlier attempt; unknown again, to be reconciled'`;

/**
 * The existing rows, marked: running rows whose lazy args were never stored never executed; every
 * other running, unknown or needs_review row may have committed. Pending rows that came from a
 * transient answer after an unknown outcome (`wasUnknown`, per dialect) are unknown again.
 */
function marked(now: string, wasUnknown: string): string[] {
  return [
    `UPDATE idem_operations SET maybe_committed = 1
     WHERE status IN ('unknown', 'needs_review') OR (status = 'running' AND args_hash IS NOT NULL)`,
    `UPDATE idem_operations SET status = 'unknown', maybe_committed = 1, next_check_at = ${now}, updated_at = ${now},
       actor = 'idem-migration', reason = ${REOPEN_REASON}
     WHERE status = 'pending' AND (reason LIKE 'transient:%' OR reason LIKE 'rate_limited:%') AND ${wasUnknown}`,
  ];
}

export const sqlite = [
  `ALTER TABLE idem_operations ADD COLUMN maybe_committed INTEGER NOT NULL DEFAULT 0
     CHECK (maybe_committed IN (0, 1) AND NOT (maybe_committed = 1 AND status = 'pending'))`,
  `ALTER TABLE idem_operations ADD COLUMN history_elided INTEGER NOT NULL DEFAULT 0`,
  ...marked(sqliteNow, `EXISTS (SELECT 1 FROM json_each(history) WHERE json_extract(value, '$.to') = 'unknown')`),
  `DROP TRIGGER idem_operations_audit_update`,
  `CREATE TRIGGER idem_operations_audit_update AFTER UPDATE OF status, attempt ON idem_operations
   WHEN OLD.status IS NOT NEW.status OR OLD.attempt IS NOT NEW.attempt
   BEGIN
     UPDATE idem_operations SET
       history = json_insert(CASE WHEN json_array_length(history) >= ${CAP} THEN json_remove(history, '$[${HEAD}]') ELSE history END,
         '$[#]', ${sqliteEvent("OLD.status")}),
       history_elided = history_elided + (json_array_length(history) >= ${CAP})
     WHERE rowid = NEW.rowid;
   END`,
];

export const postgres = [
  `ALTER TABLE idem_operations ADD COLUMN maybe_committed SMALLINT NOT NULL DEFAULT 0`,
  `ALTER TABLE idem_operations ADD CONSTRAINT idem_operations_maybe_committed
     CHECK (maybe_committed IN (0, 1) AND NOT (maybe_committed = 1 AND status = 'pending'))`,
  `ALTER TABLE idem_operations ADD COLUMN history_elided INTEGER NOT NULL DEFAULT 0`,
  ...marked(pgNow, `history @> '[{"to": "unknown"}]'::jsonb`),
  `CREATE OR REPLACE FUNCTION idem_operations_history() RETURNS trigger LANGUAGE plpgsql AS $$
   DECLARE
     h jsonb := CASE WHEN TG_OP = 'UPDATE' THEN NEW.history ELSE '[]'::jsonb END;
   BEGIN
     IF jsonb_array_length(h) >= ${CAP} THEN
       h := h - ${HEAD};
       NEW.history_elided := NEW.history_elided + 1;
     END IF;
     NEW.history := h || jsonb_build_array(jsonb_build_object(
       'from', CASE WHEN TG_OP = 'UPDATE' THEN OLD.status END, 'to', NEW.status, 'attempt', NEW.attempt,
       'actor', NEW.actor, 'reason', NEW.reason, 'ref', NEW.provider_reference, 'at', NEW.updated_at));
     RETURN NEW;
   END $$`,
];

/** The history's shape, for code that appends to it outside the trigger (store.recordEvent). */
export const HISTORY = { head: HEAD, cap: CAP } as const;
