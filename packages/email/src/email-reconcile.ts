/**
 * Settling an unknown send by looking for its copy, honest about what "not found" proves for the
 * way the copy was made at the send (recorded in the reference, email-reference.ts), whatever the
 * config says today: with provider-saves and journal, absence counts only after the settle window
 * (copies can appear late); with append, never (a crash between send and APPEND leaves no copy);
 * in a journal today's config cannot search, never either. A journal copy is complete proof
 * because the body never goes out without the server accepting the journal address
 * (email-smtp.ts). The window is measured on the database clock (`op.now`), never ours.
 */
import type { OperationContext, ReconcileResult } from "@idem/core";
import type { Mailbox } from "./email-mailbox.js";
import { foundReceipt, type EmailReceipt } from "./email-receipt.js";

/** Where the copy of an operation's send is looked for, and what its absence there proves. */
export type CopyPlace =
  | {
      readonly mailbox: Mailbox;
      /** "Sent" or "the journal", for reasons. */
      readonly name: string;
      /** "settles": absent once the settle window passed; "never": the copy may be missing though it was sent. */
      readonly absence: "settles" | "never";
      /** Why absence proves nothing here ("never"), for the person who decides. */
      readonly because?: string;
      /** Appended to reasons: how the copy was recorded, when today's config makes it otherwise. */
      readonly note: string;
    }
  | {
      /** The copy cannot be searched with today's config. */
      readonly mailbox: undefined;
      readonly reason: string;
    };

export async function reconcileByCopy(
  place: CopyPlace,
  messageId: string,
  ref: string,
  op: OperationContext,
  settleMs: number,
): Promise<ReconcileResult<EmailReceipt>> {
  if (!place.mailbox) return { found: false, proof: "never", reason: place.reason };
  const found = await place.mailbox.find(messageId); // unreachable IMAP throws: inconclusive, try later
  if (found) return { found: true, receipt: foundReceipt(messageId, ref, true, found.mailbox) };
  if (place.absence === "never") {
    return {
      found: false,
      proof: "never",
      reason: `no copy of ${messageId} in ${place.name}, but ${place.because ?? "copies are appended by the client after sending"}: it may have been sent${place.note}`,
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
      reason: `no copy of ${messageId} in ${place.name} yet; copies may take ${settleMs} ms to appear${place.note}`,
      retryAfterMs,
    };
  }
  return {
    found: false,
    proof: "absent",
    reason: `no copy of ${messageId} in ${place.name} after the settle window${place.note}`,
  };
}
