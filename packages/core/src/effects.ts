/**
 * One effect or two: whether a receipt's ids (an action's `effectId`) name several effects,
 * whether two receipts name the same one, and whether the provider deduped a second request onto
 * the first inside its key retention. Read where an attempt's receipt meets another's (runner.ts
 * `complete`, fence.ts, durable-writes.ts `unstorable`); a doubt is said as "two effects", and a
 * person looks. Also what a receipt says a person must hear of an effect not done in full
 * (`attentionOf`).
 */
import { describeError, type Action } from "./action.js";
import { twoEffectsTold } from "./reasons.js";
import { keySentAt } from "./policy.js";
import type { Row } from "./store.js";

/**
 * What a receipt whose ids (`effectId`) name more than one effect says, as the reason recorded
 * with it; undefined for one effect, none named, or a receipt the action cannot read.
 */
export function severalEffects(
  action: Pick<Action<unknown, unknown>, "effectId">,
  receipt: unknown,
): string | undefined {
  const ids = effectIds(action, receipt);
  if (ids.length < 2) return undefined;
  const named = ids.slice(0, 5).join(", ") + (ids.length > 5 ? `, and ${ids.length - 5} more` : "");
  return `two effects: the receipt names ${ids.length} effects (${named.slice(0, 300)}); a person must check the provider`;
}

/**
 * Whether the provider's ids (`effectId`) say each effect our receipt describes is one the
 * recorded receipt describes: the same effect told twice (a lookup's finding says less than the
 * request's answer), or one of several a finding named (alerted then). False when the action
 * gives none or either receipt has none (then a difference is alerted).
 */
export function namesEach(
  action: Pick<Action<unknown, unknown>, "effectId">,
  recorded: string,
  ours: unknown,
  mine = effectIds(action, ours),
): boolean {
  if (mine.length === 0) return false;
  const known = new Set(effectIds(action, recorded, { stored: true }));
  return mine.every((id) => known.has(id));
}

/**
 * Whether the two effects `several` tells of were said on `row` already: it was recorded or
 * alerted with this very finding (a lookup that took over while ours was out, our own alert whose
 * answer was lost), its words first or after the "failed" they overrule (fence.ts
 * `twoEffectsTold`: said again, they replaced the words that callers were told "failed"), or its
 * receipt names each of ours, which itself is alerted when recorded. A receipt of one id says
 * nothing of a second effect a lookup's `twice` tells of.
 */
export function alertedBefore(
  action: Pick<Action<unknown, unknown>, "effectId">,
  row: Pick<Row, "reason" | "result_json">,
  several: string,
  ours: unknown,
): boolean {
  if (row.reason !== null && twoEffectsTold(row.reason)?.startsWith(several)) return true;
  const mine = effectIds(action, ours);
  return row.result_json !== null && mine.length > 1 && namesEach(action, row.result_json, ours, mine);
}

/** The most of an action's `attention` text kept (the reason column is read by people, not parsed). */
export const ATTENTION_CHARS = 500;

/**
 * What a person must hear about the effect a receipt describes (the action's `attention`),
 * bounded; undefined when nothing, or the action gives no hook. A hook that throws is said, never
 * silent. `stored`: the receipt is the row's JSON text (`result_json`). Read the same way where
 * the ledger records the receipt (runner.ts `complete`, fence.ts) and where it reports the row
 * (`Operation.attention`), so the daemon can tell the alert it raised by its reason.
 */
export function attentionOf(
  action: Pick<Action<unknown, unknown>, "attention">,
  receipt: unknown,
  { stored = false } = {},
): string | undefined {
  if (!action.attention) return undefined;
  try {
    const said = action.attention(stored ? JSON.parse(receipt as string) : receipt);
    return typeof said === "string" && said !== "" ? said.slice(0, ATTENTION_CHARS) : undefined;
  } catch (error) {
    return `could not tell whether the effect happened in full (its action's attention failed: ${describeError(error).slice(0, 200)})`;
  }
}

/**
 * A success's reason with the action's `attention` (undefined: `told` as it is): its words first,
 * as the daemon tells its alert by them (`Operation.attention`), unless two effects are (`twice`),
 * whose alert comes first. Recorded so by runner.ts `complete` and by fence.ts.
 */
export function withAttention(told: string, attention: string | undefined, twice: boolean): string {
  if (attention === undefined) return told;
  return twice ? `${told}; ${attention}` : `${attention}; ${told}`;
}

/**
 * A receipt's distinct effect ids, none when the action gives none or cannot read it. `stored`:
 * the receipt is the row's JSON text (`result_json`), parsed here, where a bad one reads as none.
 */
function effectIds(
  action: Pick<Action<unknown, unknown>, "effectId">,
  receipt: unknown,
  { stored = false } = {},
): string[] {
  if (!action.effectId) return [];
  try {
    const id = action.effectId(stored ? JSON.parse(receipt as string) : receipt);
    const ids = typeof id === "string" ? [id] : Array.isArray(id) ? id : [];
    return [...new Set(ids.filter((i): i is string => typeof i === "string" && i !== ""))];
  } catch {
    return [];
  }
}

/**
 * Two requests that each took effect by their answer, of `attempt` (our held row: `updated_at` is
 * when it started) and of the attempt that recorded `other` (a receipt, or a proof; its
 * `updated_at` is no earlier than that attempt's start): the provider dedupes on our key and the
 * later of them started inside its retention counted from the key's first send, so it was
 * answered with the first one's effect, never made a second. The first send is the earlier that
 * either row counts (an earlier attempt's late end may come after a run from known not done
 * started the count anew), and the later start is over-estimated: a doubt says "two effects", a
 * person looks.
 */
export function dedupedOntoFirst(
  action: Pick<Action<unknown, unknown>, "capabilities">,
  attempt: Pick<Row, "first_execution_at" | "created_at" | "updated_at">,
  other: Pick<Row, "first_execution_at" | "created_at" | "updated_at">,
): boolean {
  const dedupe = action.capabilities.dedupe;
  if (dedupe === undefined) return false;
  const first = Math.min(firstSentOf(attempt), firstSentOf(other));
  return Math.max(Number(attempt.updated_at), Number(other.updated_at)) - first < dedupe.retentionMs;
}

/** When the key of the row's operation was first sent, as the row says (policy.ts `keySentAt`). */
export function firstSentOf(row: Pick<Row, "first_execution_at" | "created_at">): number {
  // Number(): a pool we did not configure may read the BIGINT as a string.
  return Number(keySentAt({ firstExecutionAt: row.first_execution_at, createdAt: row.created_at }));
}
