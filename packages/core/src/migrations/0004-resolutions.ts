/**
 * 0004: a person's verdict is stored apart from the action's receipt. Never edit once landed; add
 * 0005 instead.
 *
 * `resolution_json` holds what a person decided on a `needs_review` operation (`outcome`, `actor`,
 * `reason`, `evidence`); its time is the row's `completed_at`. Before 0004 a verdict of
 * "succeeded" replaced the provider reference with the person's and stored
 * `{"reference":…,"resolvedBy":…}` as the receipt, a shape no caller of the action expects: such
 * receipts move into `resolution_json` here and the receipt becomes null (a person gave none).
 * The reference they replaced is still in the history's events.
 */
const PREFIX = "resolved by a person: ";
const byPerson = `reason LIKE '${PREFIX}%' AND status IN ('succeeded', 'failed')`;
// Exactly the two fields the old verdict wrote (a receipt a person gave may share their names).
const oldReceipt = `result_json LIKE '{"reference":%,"resolvedBy":%}'`;
// CASE, not AND: SQL does not promise to test the pattern first, and counting the keys of a
// receipt that is not an object (an array, a string) would fail the migration.
const sqliteOld = `(CASE WHEN ${oldReceipt} THEN (SELECT count(*) FROM json_each(result_json)) = 2 ELSE 0 END)`;
const postgresOld = `(CASE WHEN ${oldReceipt} THEN (SELECT count(*) FROM jsonb_object_keys(result_json::jsonb)) = 2 ELSE false END)`;
const REASON_FROM = PREFIX.length + 1;

export const sqlite = [
  `ALTER TABLE idem_operations ADD COLUMN resolution_json TEXT`,
  `UPDATE idem_operations SET
     resolution_json = json_object('outcome', status, 'actor', actor, 'reason', substr(reason, ${REASON_FROM}),
       'evidence', CASE WHEN status = 'succeeded' AND ${sqliteOld} THEN json_extract(result_json, '$.reference') END),
     result_json = CASE WHEN status = 'succeeded' AND ${sqliteOld} THEN NULL ELSE result_json END
   WHERE ${byPerson}`,
];

export const postgres = [
  `ALTER TABLE idem_operations ADD COLUMN resolution_json TEXT`,
  `UPDATE idem_operations SET
     resolution_json = jsonb_build_object('outcome', status, 'actor', actor, 'reason', substr(reason, ${REASON_FROM}),
       'evidence', CASE WHEN status = 'succeeded' AND ${postgresOld} THEN result_json::jsonb ->> 'reference' END)::text,
     result_json = CASE WHEN status = 'succeeded' AND ${postgresOld} THEN NULL ELSE result_json END
   WHERE ${byPerson}`,
];
