/**
 * 0009: `first_execution_at`, when the operation's key was first sent: the start of the first
 * execution since it was last known not done (written by the claim and by a takeover that
 * executes, in the statements they already run). A provider keeps our key for a time from the
 * first request that carried it (Stripe: 24 h), so the replay window, a lookup's key window and
 * "deduped onto the first request" count from here, not from the operation's creation: one first
 * sent a day after it was created (rate limited, then left pending) was handed to a person while
 * the provider still held its key. Rows from before 0009 hold NULL and count from `created_at`,
 * which is earlier: a key thought forgotten early, never one thought held when it is not. Never
 * edit once landed; add 0010 instead.
 */
export const sqlite = [`ALTER TABLE idem_operations ADD COLUMN first_execution_at INTEGER`];

export const postgres = [`ALTER TABLE idem_operations ADD COLUMN first_execution_at BIGINT`];
