/**
 * Settling an unknown send by looking for its copy, honest about what "not found" proves in each
 * copy mode: with provider-saves and journal, absence counts only after the settle window (copies
 * can appear late); with append, never (a crash between send and APPEND leaves no copy). A journal
 * copy is complete proof because the body never goes out without the server accepting the journal
 * address (email-smtp.ts). The window is measured on the database clock (`op.now`), never ours.
 */
import type { OperationContext, ReconcileResult } from "@idem/core";
import type { CopyConfig } from "./email-config.js";
import type { Mailbox } from "./email-mailbox.js";
import type { EmailReceipt } from "./email-receipt.js";

export async function reconcileByCopy(
  mailbox: Mailbox,
  copy: CopyConfig,
  messageId: string,
  ref: string,
  op: OperationContext,
  settleMs: number,
): Promise<ReconcileResult<EmailReceipt>> {
  const found = await mailbox.find(messageId); // unreachable IMAP throws: inconclusive, try later
  if (found)
    return {
      found: true,
      receipt: { messageId, ref, sent: true, response: null, accepted: [], rejected: [], foundIn: found.mailbox },
    };
  if (copy.mode === "append") {
    return {
      found: false,
      proof: "never",
      reason: `no copy of ${messageId} in Sent, but copies are appended by the client after sending: it may have been sent`,
    };
  }
  // Without the database's time the window cannot be judged (a runner that does not fill `now`):
  // not found proves nothing yet, rather than everything (NaN comparisons are all false).
  if (!Number.isFinite(op.now))
    return { found: false, proof: "inconclusive", reason: "no database time (op.now) to judge the settle window" };
  const waited = op.now - op.lastAttemptAt;
  if (waited < settleMs) {
    // Look again well before the window ends: most copies appear in seconds.
    const retryAfterMs = Math.min(settleMs - waited, Math.max(1_000, Math.round(settleMs / 10)));
    return {
      found: false,
      proof: "inconclusive",
      reason: `no copy of ${messageId} yet; copies may take ${settleMs} ms to appear`,
      retryAfterMs,
    };
  }
  return {
    found: false,
    proof: "absent",
    reason: `no copy of ${messageId} ${copy.mode === "journal" ? "in the journal" : "in Sent"} after the settle window`,
  };
}
