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
}

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
