/**
 * 0010: a transition the ledger writes (store.ts `update`, every move of the runner, the daemon
 * and a person's verdict) appends its audit event in its own statement; the UPDATE trigger now
 * writes the event only for a change of status or attempt whose statement left the history as it
 * was (a takeover, a release, any other writer), so no transition goes unrecorded and none is
 * recorded twice. Never edit once landed; add 0011 instead.
 *
 * As 0005 did for the claim: on SQLite the trigger was a second UPDATE of the row, after the one
 * that moved it, on every completion (measured by hand on the ledger's own table and statements,
 * issue 16: 11-14 % of a guarded call's two writes with commits not waiting for fsync, 10 % with
 * them). The event is the trigger's, field for field (store.ts `transitionEvent`), capped as its
 * appends are (0003).
 */
import { HISTORY } from "./0003-sticky-maybe-committed.js";

/** This migration's name: until it is applied, the ledger's moves leave their events to the trigger (Store.movesWriteEvents). */
export const NAME = "0010-transitions-write-their-event";

const { head, cap } = HISTORY;

export const sqlite = [
  `DROP TRIGGER idem_operations_audit_update`,
  `CREATE TRIGGER idem_operations_audit_update AFTER UPDATE OF status, attempt ON idem_operations
   WHEN (OLD.status IS NOT NEW.status OR OLD.attempt IS NOT NEW.attempt) AND OLD.history IS NEW.history
   BEGIN
     UPDATE idem_operations SET
       history = json_insert(CASE WHEN json_array_length(history) >= ${cap} THEN json_remove(history, '$[${head}]') ELSE history END,
         '$[#]', json_object('from', OLD.status, 'to', NEW.status, 'attempt', NEW.attempt, 'actor', NEW.actor, 'reason', NEW.reason, 'ref', NEW.provider_reference, 'at', NEW.updated_at)),
       history_elided = history_elided + (json_array_length(history) >= ${cap})
     WHERE rowid = NEW.rowid;
   END`,
];

export const postgres = [
  `DROP TRIGGER idem_operations_audit_update ON idem_operations`,
  `CREATE TRIGGER idem_operations_audit_update BEFORE UPDATE OF status, attempt ON idem_operations
   FOR EACH ROW WHEN ((OLD.status IS DISTINCT FROM NEW.status OR OLD.attempt IS DISTINCT FROM NEW.attempt)
     AND OLD.history IS NOT DISTINCT FROM NEW.history)
   EXECUTE FUNCTION idem_operations_history()`,
];
