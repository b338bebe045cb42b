/**
 * 0007: an operation keeps the retention of the ledger that claimed it (`retention_ms`: ms, or
 * -1 to keep it), whoever completes it. Until 0007 the completer's own applied: the daemon or a
 * person's `idem resolve`, opened with the CLI's retention, gave an operation the application
 * kept forever 30 days, and once it was pruned a redelivered job ran again. Rows claimed before
 * 0007 hold NULL and keep the completer's retention, as before. Never edit once landed.
 */
export const sqlite = [`ALTER TABLE idem_operations ADD COLUMN retention_ms INTEGER`];

export const postgres = [`ALTER TABLE idem_operations ADD COLUMN retention_ms BIGINT`];
