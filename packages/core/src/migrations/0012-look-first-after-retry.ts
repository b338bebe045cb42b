/**
 * 0012: `look_first`, a person's retry of an operation that may have committed (`admin.retry` of
 * an `unknown` row, or of a `needs_review` one that may have). The person found nothing at the
 * provider, and the row is `pending`, but their look may have come before the earlier request
 * landed (mail queued at the server, a search index that lags): the runner that takes the row
 * looks the effect up first, with the settle windows the action knows, as it would for an unknown
 * outcome. 1 until the row executes or settles; NULL otherwise, and on every row from before.
 * A process of an earlier release refuses a ledger migrated past what it knows (the migration's
 * name it does not know), so none runs such a row at once. Never edit once landed; add 0013 instead.
 */
export const NAME = "0012-look-first-after-retry";

export const sqlite = [`ALTER TABLE idem_operations ADD COLUMN look_first INTEGER`];

export const postgres = [`ALTER TABLE idem_operations ADD COLUMN look_first SMALLINT`];
