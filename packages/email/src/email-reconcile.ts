/**
 * Settling an unknown send by looking for its copy, honest about what "not found" proves for the
 * way the copy was made at the send (recorded in the reference, email-reference.ts), whatever the
 * config says today: with provider-saves and journal, absence counts only after the settle window
 * (copies can appear late), and then only once no mailbox of the account holds the copy (it may
 * have been moved since: a Sent folder renamed, an archive rule); with append, never (a crash between send and APPEND leaves no copy);
 * in a journal today's config cannot search, never either; in a Sent folder of the same account
 * that today's config names otherwise than the record (`\Sent` for the special-use folder, or its
 * path), only once the server says both names are one mailbox. A journal copy is complete proof
 * because the body never goes out without the server accepting the journal address
 * (email-smtp.ts). The window is measured on the database clock (`op.now`), never ours.
 */
import type { OperationContext, ReconcileResult } from "@idem/core";
import type { Lookup, Mailbox } from "./email-mailbox.js";
import { foundReceipt, MAX_COPIES, type EmailReceipt } from "./email-receipt.js";
import type { MessageContent } from "./email-reply.js";

/**
 * The default settle window of a Sent copy (provider-saves): the provider files it as it commits
 * the message, and RFC 5321 §4.5.3.2.6 lets a server take 10 minutes after the final "." to
 * answer it (a content filter, a virus scan of a large message), while our client gives up after
 * `timeoutMs`. A copy filed after the window reads absent and the email goes out again (RFC 1047's
 * duplicate), so the window is the server's 10 minutes, counted from when our client gave up.
 */
export const SENT_SETTLE_MS = 10 * 60_000;

/**
 * The default settle window of a journal copy, far longer than Sent's. The copy is a delivery
 * like any other: the server's 250 takes responsibility for delivering it (RFC 5321 §6.1), not
 * that it is delivered, and the queue hands it to the journal mailbox later; a delivery it
 * defers waits for the queue's next run (Postfix by default: 5 minutes at first, longer each
 * time). A copy filed after the window reads absent and the email goes out again, so this errs
 * long: a window too long costs an unknown outcome a wait, one too short a second email. A
 * server whose journal copies can take longer needs `settleMs`.
 */
export const JOURNAL_SETTLE_MS = 30 * 60_000;

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
      /**
       * The copy was recorded in this account under another name of its mailbox than today's
       * config gives it: absence counts only when the server says both are the mailbox searched.
       */
      readonly recordedAs?: RecordedName;
    }
  | {
      /** The copy cannot be searched with today's config. */
      readonly mailbox: undefined;
      readonly reason: string;
    };

/** A Sent folder recorded under another name than today's config gives it, in the same account. */
export interface RecordedName {
  /** The recorded name, for the server to resolve: `\Sent` (the special-use folder) or a path. */
  readonly mailbox: string;
  /** The recorded place and today's (IMAP URLs), for reasons. */
  readonly place: string;
  readonly configured: string;
}

export async function reconcileByCopy(
  place: CopyPlace,
  messageId: string,
  ref: string,
  op: OperationContext,
  settleMs: number,
  /** What the message says, kept out of what a server's error says (email-mailbox.ts). */
  content: MessageContent,
): Promise<ReconcileResult<EmailReceipt>> {
  if (!place.mailbox) return { found: false, proof: "never", reason: place.reason };
  // Past the window, "not found" sends again: then the copy is looked for in every mailbox of the
  // account, not only where it was filed (moved since: a Sent folder renamed, an archive rule).
  const settled = place.absence === "settles" && Number.isFinite(op.now) && op.now - op.lastAttemptAt >= settleMs;
  // Unreachable IMAP throws: inconclusive, try later.
  // The settlement's bound (`op.signal`: its timeoutMs, a lease lost) ends the lookup, however many
  // mailboxes are left to search: unavailable, so inconclusive, never "absent" from a part.
  const {
    found,
    searched,
    alias,
    alsoSent,
    elsewhere: scan,
  } = await place.mailbox.lookup(messageId, place.recordedAs?.mailbox, {
    everywhere: settled,
    signal: op.signal,
    content,
  });
  if (found) {
    const receipt = foundReceipt(messageId, ref, true, found);
    // Copies of several sends: the message went out more than once, which a person must hear of.
    // So did one of more copies than are read (MAX_COPIES in a mailbox), whatever sends those read
    // name. Not copies of one send in several \Sent mailboxes that only add up to more: all read.
    const many = found.unread > 0;
    if (found.sends.length < 2 && !many) return { found: true, receipt };
    const twice =
      found.sends.length < 2
        ? `${place.name} holds ${found.copies} copies of ${messageId}, more than ${MAX_COPIES}: it went out more than once`
        : `${place.name} holds copies of ${messageId} from ${found.sends.length}${many ? " or more" : ""} sends (${found.sends.join(", ")})`;
    return { found: true, receipt, twice };
  }
  // The server could not say whether the recorded name is the mailbox searched (its LIST failed):
  // that is a check that could not run now, tried again later, not one for a person.
  if (place.recordedAs && alias?.error) throw alias.error;
  const elsewhere = place.recordedAs && !alias?.same ? notTheSame(place.recordedAs, searched, alias) : undefined;
  if (place.absence === "never" || elsewhere) {
    return {
      found: false,
      proof: "never",
      reason: `no copy of ${messageId} in ${place.name}, but ${elsewhere ?? place.because ?? "copies are appended by the client after sending"}: it may have been sent${place.note}`,
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
  // Every mailbox searched besides the one named: the other \Sent ones (named) and the rest.
  const also = alsoSent.length > 0 ? ` (${alsoSent.join(", ")}, flagged \\Sent too, among them)` : "";
  const others = scan
    ? `, nor in the account's ${scan.searched + alsoSent.length} other mailboxes${also}`
    : alsoSent.length > 0
      ? `, nor in ${alsoSent.join(", ")}, flagged \\Sent too`
      : "";
  return {
    found: false,
    proof: "absent",
    reason: `no copy of ${messageId} in ${place.name} after the settle window${others}${place.note}`,
  };
}

/** Why a copy recorded under another name is not proven absent here: the server resolves it to another mailbox, or none. */
function notTheSame(recorded: RecordedName, searched: string, alias: Lookup["alias"]): string {
  const there =
    alias?.path === undefined
      ? `the server has no mailbox ${recorded.mailbox}`
      : `on the server, ${alias.path}, not ${searched}`;
  return `its copy was to be filed in ${recorded.place}, which is not where the config now looks (${recorded.configured}): ${there}`;
}
