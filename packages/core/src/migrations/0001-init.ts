/**
 * 0001: operations and their audit events. Never edit once landed; add 0002 instead.
 *
 * The audit event of every transition is written by a trigger, so it is in the same transaction
 * as the transition by construction, whichever code path (runner, daemon, CLI, a person with
 * psql) changed the row. A transition is a change of status or of attempt (a takeover).
 */
export const sqlite = [
  `CREATE TABLE idem_operations (
    id TEXT PRIMARY KEY,
    tenant_id TEXT NOT NULL,
    key TEXT NOT NULL,
    key_label TEXT,
    action TEXT NOT NULL,
    args_hash TEXT,
    args_json TEXT,
    status TEXT NOT NULL CHECK (status IN ('running','succeeded','failed','unknown','needs_review','pending')),
    attempt INTEGER NOT NULL,
    lease_owner TEXT,
    lease_expires_at INTEGER,
    provider_reference TEXT,
    result_json TEXT,
    error_json TEXT,
    actor TEXT,
    reason TEXT,
    next_check_at INTEGER,
    checks INTEGER NOT NULL DEFAULT 0,
    alert_pending INTEGER NOT NULL DEFAULT 0,
    last_execution_at INTEGER,
    created_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL,
    completed_at INTEGER,
    expires_at INTEGER,
    UNIQUE (tenant_id, key)
  )`,
  `CREATE TABLE idem_events (
    id INTEGER PRIMARY KEY, -- rowid: ascending; no AUTOINCREMENT bookkeeping page per commit
    operation_id TEXT NOT NULL REFERENCES idem_operations (id) ON DELETE CASCADE,
    tenant_id TEXT NOT NULL,
    from_status TEXT,
    to_status TEXT NOT NULL,
    attempt INTEGER NOT NULL,
    actor TEXT,
    reason TEXT,
    provider_reference TEXT,
    at INTEGER NOT NULL
  )`,
  ...indexes(),
  `CREATE TRIGGER idem_operations_audit_insert AFTER INSERT ON idem_operations
   BEGIN
     INSERT INTO idem_events (operation_id, tenant_id, from_status, to_status, attempt, actor, reason, provider_reference, at)
     VALUES (NEW.id, NEW.tenant_id, NULL, NEW.status, NEW.attempt, NEW.actor, NEW.reason, NEW.provider_reference, NEW.updated_at);
   END`,
  `CREATE TRIGGER idem_operations_audit_update AFTER UPDATE OF status, attempt ON idem_operations
   WHEN OLD.status IS NOT NEW.status OR OLD.attempt IS NOT NEW.attempt
   BEGIN
     INSERT INTO idem_events (operation_id, tenant_id, from_status, to_status, attempt, actor, reason, provider_reference, at)
     VALUES (NEW.id, NEW.tenant_id, OLD.status, NEW.status, NEW.attempt, NEW.actor, NEW.reason, NEW.provider_reference, NEW.updated_at);
   END`,
];

export const postgres = [
  `CREATE TABLE idem_operations (
    id TEXT PRIMARY KEY,
    tenant_id TEXT NOT NULL,
    key TEXT NOT NULL,
    key_label TEXT,
    action TEXT NOT NULL,
    args_hash TEXT,
    args_json TEXT,
    status TEXT NOT NULL CHECK (status IN ('running','succeeded','failed','unknown','needs_review','pending')),
    attempt INTEGER NOT NULL,
    lease_owner TEXT,
    lease_expires_at BIGINT,
    provider_reference TEXT,
    result_json TEXT,
    error_json TEXT,
    actor TEXT,
    reason TEXT,
    next_check_at BIGINT,
    checks INTEGER NOT NULL DEFAULT 0,
    alert_pending INTEGER NOT NULL DEFAULT 0,
    last_execution_at BIGINT,
    created_at BIGINT NOT NULL,
    updated_at BIGINT NOT NULL,
    completed_at BIGINT,
    expires_at BIGINT,
    UNIQUE (tenant_id, key)
  )`,
  `CREATE TABLE idem_events (
    id BIGSERIAL PRIMARY KEY,
    operation_id TEXT NOT NULL REFERENCES idem_operations (id) ON DELETE CASCADE,
    tenant_id TEXT NOT NULL,
    from_status TEXT,
    to_status TEXT NOT NULL,
    attempt INTEGER NOT NULL,
    actor TEXT,
    reason TEXT,
    provider_reference TEXT,
    at BIGINT NOT NULL
  )`,
  ...indexes(),
  `CREATE FUNCTION idem_operations_audit() RETURNS trigger LANGUAGE plpgsql AS $$
   BEGIN
     INSERT INTO idem_events (operation_id, tenant_id, from_status, to_status, attempt, actor, reason, provider_reference, at)
     VALUES (NEW.id, NEW.tenant_id, CASE WHEN TG_OP = 'UPDATE' THEN OLD.status END, NEW.status, NEW.attempt,
             NEW.actor, NEW.reason, NEW.provider_reference, NEW.updated_at);
     RETURN NULL;
   END $$`,
  `CREATE TRIGGER idem_operations_audit_insert AFTER INSERT ON idem_operations
   FOR EACH ROW EXECUTE FUNCTION idem_operations_audit()`,
  `CREATE TRIGGER idem_operations_audit_update AFTER UPDATE OF status, attempt ON idem_operations
   FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status OR OLD.attempt IS DISTINCT FROM NEW.attempt)
   EXECUTE FUNCTION idem_operations_audit()`,
];

/**
 * Partial indexes keep the daemon's scans proportional to the rows it must act on, not to the
 * size of the ledger: succeeded rows (nearly all of them) appear in none but the listing index.
 */
function indexes(): string[] {
  return [
    `CREATE INDEX idem_operations_running ON idem_operations (lease_expires_at) WHERE status = 'running'`,
    `CREATE INDEX idem_operations_due ON idem_operations (next_check_at) WHERE status IN ('unknown', 'pending')`,
    // rows a person must hear about (new needs_review, auth/policy failures) until the alert is sent
    `CREATE INDEX idem_operations_alerts ON idem_operations (updated_at) WHERE alert_pending = 1`,
    `CREATE INDEX idem_operations_expiry ON idem_operations (expires_at) WHERE expires_at IS NOT NULL`,
    // not on status: a transition must not rewrite the listing index
    `CREATE INDEX idem_operations_listing ON idem_operations (tenant_id, created_at)`,
    `CREATE INDEX idem_events_operation ON idem_events (operation_id, id)`,
  ];
}
