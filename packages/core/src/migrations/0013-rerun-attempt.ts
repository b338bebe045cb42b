/**
 * 0013: `rerun_attempt`, the latest attempt that ran the operation from `pending` (known not done:
 * a lookup proved absence, or a person said so) after it was first sent. Its request may be an
 * effect of its own, not the one an earlier attempt's key names: an earlier attempt's late answer
 * (fence.ts), proving an effect after all, may then be one of two, and a person hears of it.
 * NULL until such a run, and on every row from before. A process of an earlier release refuses a
 * ledger migrated past what it knows when it opens it; one already running when 0013 is applied
 * (or opened with `migrate: false` before it, until its `admin.migrate()`) runs rows unmarked, and
 * a late answer on them is settled as before 0013. Never edit the SQL once landed.
 */
export const NAME = "0013-rerun-attempt";

export const sqlite = [`ALTER TABLE idem_operations ADD COLUMN rerun_attempt INTEGER`];

export const postgres = [`ALTER TABLE idem_operations ADD COLUMN rerun_attempt INTEGER`];
