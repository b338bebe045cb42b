/** Configuration of the email actions: SMTP out, IMAP for the copy, and how the copy gets there. */

export interface ImapConfig {
  readonly host: string;
  readonly port: number;
  readonly secure?: boolean;
  readonly auth: { readonly user: string; readonly pass: string };
}

export interface SmtpConfig {
  readonly host: string;
  readonly port: number;
  /** Implicit TLS (port 465). Default false (STARTTLS when offered). */
  readonly secure?: boolean;
  readonly auth?: { readonly user: string; readonly pass: string };
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
 *    that address (see email-smtp.ts).
 *  - append: we APPEND to Sent after sending; a crash in between leaves no copy, so absence
 *    proves nothing and an unknown outcome goes to review.
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
   * How long a copy may take to appear after a send (provider-saves, journal). Default 60 s.
   * Measured on the ledger's database clock (`op.now`).
   */
  readonly settleMs?: number;
}
