/**
 * 0006: the operators' reads (list by status, stats, prune) go through indexes, so they cost the
 * same in a ledger of a thousand operations and of a million. Never edit once landed; add 0007
 * instead.
 *
 * - `idem_operations_status`: the failed, unknown, pending and needs_review rows, by status,
 *   tenant and id (ids are time-ordered: newest first is a backward read). Partial, for the
 *   write path's sake: succeeded rows (nearly all of them) and running rows (every claim) are
 *   not in it, so a guarded call that succeeds never touches it; only a transition into or out of
 *   these statuses writes it. Running rows are read through `idem_operations_running`. SQLite
 *   uses a partial index only when the query repeats its condition literally: reports.ts writes
 *   the same `status IN (...)`, in the same order.
 * - `idem_operations_tenant_expiry` replaces `idem_operations_expiry` (expires_at alone): prune
 *   is per tenant, and read through expires_at alone it walked every tenant's expired rows to
 *   find this one's. Same rows, same writes (a completion sets expires_at), one more key column.
 */
const STATEMENTS = [
  `CREATE INDEX idem_operations_status ON idem_operations (status, tenant_id, id)
     WHERE status IN ('failed', 'unknown', 'pending', 'needs_review')`,
  `CREATE INDEX idem_operations_tenant_expiry ON idem_operations (tenant_id, expires_at) WHERE expires_at IS NOT NULL`,
  `DROP INDEX idem_operations_expiry`,
];

export const sqlite = STATEMENTS;

export const postgres = STATEMENTS;
