/**
 * 0002: fewer pages written per transition. Never edit once landed; add 0003 instead.
 *
 * Measured with 0001 (bench/, strace): a claim and a completion wrote about 6.5 WAL pages per
 * SQLite commit against 1.5 for a bare INSERT and UPDATE, and on Postgres each transition added
 * an events tuple with three index entries through a PL/pgSQL insert. So:
 *
 * - `id` is unique per tenant rather than alone, and that (tenant_id, id) index also lists a
 *   tenant's operations in creation order (ids are time-ordered): one index instead of the id
 *   and listing indexes. On SQLite the table stays a rowid table: clustered on the random key
 *   hash (WITHOUT ROWID) its wide rows split leaves on most inserts (measured: more pages, not
 *   fewer), while rowid order appends.
 * - The audit history lives in the row (`history`, a JSON array of events): the trigger appends
 *   the event to the row it describes, in the same statement, on the page being written anyway
 *   (Postgres: a BEFORE trigger sets NEW.history, no second tuple). Pruning an operation prunes
 *   its history with it. Events of 0001 are carried over in their order.
 */
const COLUMNS = `id, tenant_id, key, key_label, action, args_hash, args_json, status, attempt, lease_owner,
  lease_expires_at, provider_reference, result_json, error_json, actor, reason, next_check_at, checks,
  alert_pending, last_execution_at, created_at, updated_at, completed_at, expires_at`;

function table(name: string, types: { int: string; json: string; empty: string }, unique: string): string {
  return `CREATE TABLE ${name} (
    tenant_id TEXT NOT NULL,
    key TEXT NOT NULL,
    id TEXT NOT NULL,
    key_label TEXT,
    action TEXT NOT NULL,
    args_hash TEXT,
    args_json TEXT,
    status TEXT NOT NULL CHECK (status IN ('running','succeeded','failed','unknown','needs_review','pending')),
    attempt INTEGER NOT NULL,
    lease_owner TEXT,
    lease_expires_at ${types.int},
    provider_reference TEXT,
    result_json TEXT,
    error_json TEXT,
    actor TEXT,
    reason TEXT,
    next_check_at ${types.int},
    checks INTEGER NOT NULL DEFAULT 0,
    alert_pending INTEGER NOT NULL DEFAULT 0,
    last_execution_at ${types.int},
    created_at ${types.int} NOT NULL,
    updated_at ${types.int} NOT NULL,
    completed_at ${types.int},
    expires_at ${types.int},
    history ${types.json} NOT NULL DEFAULT ${types.empty},
    ${unique} (tenant_id, key)
  )`;
}

/** 0001's partial indexes (dropped with its table), and (tenant_id, id) in place of the id and listing indexes. */
const INDEXES = [
  `CREATE UNIQUE INDEX idem_operations_id ON idem_operations (tenant_id, id)`,
  `CREATE INDEX idem_operations_running ON idem_operations (lease_expires_at) WHERE status = 'running'`,
  `CREATE INDEX idem_operations_due ON idem_operations (next_check_at) WHERE status IN ('unknown', 'pending')`,
  `CREATE INDEX idem_operations_alerts ON idem_operations (updated_at) WHERE alert_pending = 1`,
  `CREATE INDEX idem_operations_expiry ON idem_operations (expires_at) WHERE expires_at IS NOT NULL`,
];

const sqliteEvent = (from: string) =>
  `json_object('from', ${from}, 'to', NEW.status, 'attempt', NEW.attempt, 'actor', NEW.actor, 'reason', NEW.reason, 'ref', NEW.provider_reference, 'at', NEW.updated_at)`;

export const sqlite = [
  table("idem_operations_v2", { int: "INTEGER", json: "TEXT", empty: "'[]'" }, "UNIQUE"),
  `INSERT INTO idem_operations_v2 (${COLUMNS}, history)
   SELECT ${COLUMNS}, coalesce((
     SELECT json_group_array(json_object('from', from_status, 'to', to_status, 'attempt', attempt, 'actor', actor, 'reason', reason, 'ref', provider_reference, 'at', at) ORDER BY id)
     FROM idem_events WHERE operation_id = o.id
   ), '[]') FROM idem_operations o`,
  `DROP TABLE idem_events`,
  `DROP TABLE idem_operations`,
  `ALTER TABLE idem_operations_v2 RENAME TO idem_operations`,
  ...INDEXES,
  // The row is on the page this statement is writing: the second UPDATE costs no extra page.
  `CREATE TRIGGER idem_operations_audit_insert AFTER INSERT ON idem_operations
   BEGIN
     UPDATE idem_operations SET history = json_array(${sqliteEvent("NULL")}) WHERE rowid = NEW.rowid;
   END`,
  `CREATE TRIGGER idem_operations_audit_update AFTER UPDATE OF status, attempt ON idem_operations
   WHEN OLD.status IS NOT NEW.status OR OLD.attempt IS NOT NEW.attempt
   BEGIN
     UPDATE idem_operations SET history = json_insert(history, '$[#]', ${sqliteEvent("OLD.status")}) WHERE rowid = NEW.rowid;
   END`,
];

export const postgres = [
  table("idem_operations_v2", { int: "BIGINT", json: "JSONB", empty: "'[]'::jsonb" }, "PRIMARY KEY"),
  `INSERT INTO idem_operations_v2 (${COLUMNS}, history)
   SELECT ${COLUMNS}, coalesce((
     SELECT jsonb_agg(jsonb_build_object('from', from_status, 'to', to_status, 'attempt', attempt, 'actor', actor, 'reason', reason, 'ref', provider_reference, 'at', at) ORDER BY e.id)
     FROM idem_events e WHERE e.operation_id = o.id
   ), '[]'::jsonb) FROM idem_operations o`,
  `DROP TABLE idem_events`,
  `DROP TABLE idem_operations`,
  `DROP FUNCTION idem_operations_audit()`,
  `ALTER TABLE idem_operations_v2 RENAME TO idem_operations`,
  `ALTER INDEX idem_operations_v2_pkey RENAME TO idem_operations_pkey`,
  ...INDEXES,
  `CREATE FUNCTION idem_operations_history() RETURNS trigger LANGUAGE plpgsql AS $$
   BEGIN
     NEW.history := CASE WHEN TG_OP = 'UPDATE' THEN NEW.history ELSE '[]'::jsonb END || jsonb_build_array(jsonb_build_object(
       'from', CASE WHEN TG_OP = 'UPDATE' THEN OLD.status END, 'to', NEW.status, 'attempt', NEW.attempt,
       'actor', NEW.actor, 'reason', NEW.reason, 'ref', NEW.provider_reference, 'at', NEW.updated_at));
     RETURN NEW;
   END $$`,
  `CREATE TRIGGER idem_operations_audit_insert BEFORE INSERT ON idem_operations
   FOR EACH ROW EXECUTE FUNCTION idem_operations_history()`,
  `CREATE TRIGGER idem_operations_audit_update BEFORE UPDATE OF status, attempt ON idem_operations
   FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status OR OLD.attempt IS DISTINCT FROM NEW.attempt)
   EXECUTE FUNCTION idem_operations_history()`,
];
