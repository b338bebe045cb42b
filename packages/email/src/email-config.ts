/** Configuration of the email actions: SMTP out, IMAP for the copy, and how the copy gets there. */
import type { TlsTrust } from "./email-tls.js";

export interface ImapConfig {
  readonly host: string;
  readonly port: number;
  /** Implicit TLS (port 993). Default false: STARTTLS, required unless `requireTLS` is false. */
  readonly secure?: boolean;
  readonly auth: { readonly user: string; readonly pass: string };
  /**
   * Without implicit TLS, sign in only after STARTTLS (imapflow's `doSTARTTLS: true`): a server
   * that does not offer it, or a man in the middle that took it out of the capabilities, gets no
   * login; the lookup fails instead. Default true. False: STARTTLS when offered, else the login
   * in clear text (a test server on loopback). Ignored with `secure`.
   */
  readonly requireTLS?: boolean;
  /**
   * Which server certificates to trust (a private CA's, or the server's self-signed one), as
   * email-tls.ts says; the certificate is always verified. Default: Node's bundled public CAs.
   */
  readonly tls?: TlsTrust;
  /**
   * The most one session may take (connect, sign-in, the commands of a lookup or an APPEND,
   * logout), whatever traffic flows: imapflow's inactivity timeouts are reset by every line, so a
   * server that keeps writing untagged `* OK` lines and never the tagged answer would hold the
   * check before sending, and the operation's lease, forever. When it passes, the connection is
   * closed and the session fails as unavailable: before a send nothing was sent, a lookup is
   * inconclusive, an APPEND may have filed its copy. Default 2 minutes (IMAP_DEADLINE_MS).
   */
  readonly deadlineMs?: number;
}

/**
 * The default `smtp.deadlineMs`. RFC 5321 §4.5.3.2 lets a server take up to 5 minutes on MAIL,
 * RCPT and DATA and 10 on the final "." (3 minutes a data block for the client); no send has to
 * wait that long at every step, and the 30 s inactivity timeout ends a silent server long before.
 * This bounds only a server that keeps talking: 10 minutes is room for a large body on a slow
 * link (25 MB at 1 Mbit/s takes under 4 minutes) and a slow final answer, and still an end to a
 * send that would otherwise hold its operation `running` for good.
 */
export const SMTP_DEADLINE_MS = 600_000;

/**
 * The default `imap.deadlineMs`. A lookup is one LIST, SELECT, SEARCH and FETCH, each answered in
 * well under a second by a healthy server; an APPEND uploads the message once. 2 minutes is room
 * for a slow server and a copy of several MB on a slow link; raise it when larger copies are
 * appended over a slower one (each APPEND cut off is tried again, then reported in the receipt).
 */
export const IMAP_DEADLINE_MS = 120_000;

export interface SmtpConfig {
  readonly host: string;
  readonly port: number;
  /** Implicit TLS (port 465). Default false: STARTTLS, required when signing in (`requireTLS`). */
  readonly secure?: boolean;
  readonly auth?: { readonly user: string; readonly pass: string };
  /**
   * Without implicit TLS, send only after STARTTLS (nodemailer's `requireTLS`): a server that
   * does not offer it, or a man in the middle that took it out of the EHLO reply, gets neither
   * the credentials nor the message; the send fails, nothing sent (permanent, with an alert).
   * Default true when `auth` is given, false without it (then STARTTLS when offered). False
   * with `auth`: the password in clear text where the server offers no STARTTLS (a test server
   * on loopback). Ignored with `secure`.
   */
  readonly requireTLS?: boolean;
  /**
   * Which server certificates to trust (a private CA's, or the server's self-signed one), as
   * email-tls.ts says; the certificate is always verified. Default: Node's bundled public CAs.
   */
  readonly tls?: TlsTrust;
  /** Connection, greeting and socket inactivity timeout. Default 30 s; a timeout after DATA is ambiguous. */
  readonly timeoutMs?: number;
  /**
   * The most one send may take, from the connect to the server's last reply, whatever traffic
   * flows: `timeoutMs` is reset by every line, so a server (a tarpit, a broken proxy) that keeps
   * writing continuation lines and never the last one would hold the send, and the operation's
   * lease, forever. When it passes, the connection is closed and the send fails as a timeout at
   * that point does: before the body was handed over nothing was sent (tried again), after it the
   * outcome is unknown (reconciled). Default 10 minutes (SMTP_DEADLINE_MS).
   */
  readonly deadlineMs?: number;
}

/**
 * Where a copy of each sent message can be found, and what its absence proves:
 *  - provider-saves: the provider files SMTP-sent mail in Sent itself (Gmail, Office 365);
 *    absence is proof once the settle window passed.
 *  - journal: a Bcc to `address`, delivered by the server once it accepted the message, is
 *    searched in the account that address delivers to (`imap`, required: searched in an account
 *    it does not deliver to, every copy is missing, every unknown outcome looks absent and is
 *    sent again), in `mailbox` (default INBOX). A message is not sent unless the server accepts
 *    that address (see email-smtp.ts). The copy goes through the server's queue like any other
 *    delivery, so absence counts only after a long window (`settleMs`, 30 min by default): the
 *    journal must be delivered locally and promptly, never deferred for longer than that (a
 *    copy filed after the window reads absent, and the email is sent again).
 *  - append: we APPEND to Sent after sending; a crash in between leaves no copy, so absence
 *    proves nothing and an unknown outcome goes to review. An APPEND that fails for a reason that
 *    may pass (a lost connection, NO [INUSE]) is tried again twice at most, never filing a second
 *    copy (email-append.ts); one refused (no right to file into Sent, a quota) or still failing
 *    leaves the send succeeded, its receipt's `copyNotFiled` saying why no copy will be found.
 *    The message is never sent again for it.
 */
export type CopyConfig =
  | { readonly mode: "provider-saves" }
  | { readonly mode: "journal"; readonly address: string; readonly imap: ImapConfig; readonly mailbox?: string }
  | { readonly mode: "append" };

export interface EmailConfig {
  readonly smtp: SmtpConfig;
  /** The sender's mailbox, where Sent is. */
  readonly imap: ImapConfig;
  readonly from: string;
  readonly copy: CopyConfig;
  /** Sent folder path; default the SPECIAL-USE \Sent folder, else one named "Sent". */
  readonly sentMailbox?: string;
  /** Domain of the deterministic Message-ID. Default: the domain of `from`. */
  readonly messageIdDomain?: string;
  /** Subject with its reference. Default `${subject} [ref:${ref}]`. */
  readonly subjectWithRef?: (subject: string, ref: string) => string;
  /**
   * How long a copy may take to appear after a send before its absence proves the send did not
   * happen: set it to the longest the copy can take. Default 10 minutes for a Sent copy
   * (provider-saves: the provider files it as it commits the message, which RFC 5321 lets a server
   * do up to 10 minutes after the final ".") and 30 minutes for a journal copy (the
   * server's queue delivers it, and a deferred delivery waits for the queue's next run).
   * Measured on the ledger's database clock (`op.now`).
   */
  readonly settleMs?: number;
  /**
   * The send action's type, default `email.send`. A ledger with two mailers (another account, another
   * copy config) needs one each: an operation's key and the daemon's settlement of it go by its
   * type, and a ledger refuses two different actions of one type.
   */
  readonly type?: string;
}
