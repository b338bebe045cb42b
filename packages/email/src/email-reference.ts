/**
 * The provider reference of an email operation, recorded before a send (the ledger keeps it from
 * the first attempt that may have sent, and hands it to every later attempt and lookup): the
 * Message-ID, then how that send's copy was to be made.
 *
 *   <idem.{40 hex}@{domain}> copy=provider-saves in=imap://{login}@{host}:{port}/{Sent mailbox}
 *   <idem.{40 hex}@{domain}> copy=append in=imap://{login}@{host}:{port}/{Sent mailbox}
 *   <idem.{40 hex}@{domain}> copy=journal bcc={address} in=imap://{login}@{host}:{port}/{mailbox}
 *
 * What "no copy found" proves depends on how the copy was made and where, not on a config
 * deployed since: a send made in append mode that crashed before its APPEND, looked up after a
 * switch to provider-saves, would be "proven absent" and sent again; so would one filed in a Sent
 * folder a later config no longer searches. The account is named by an IMAP URL (RFC 5092: login,
 * host, port, mailbox; the Sent mailbox as configured, `\Sent` for the special-use folder), never
 * with its password. The Message-ID stays the first token, up to the first space. References
 * written before the copy was recorded are a bare Message-ID; before its Sent folder was, a
 * `copy=provider-saves` or `copy=append` without `in=`.
 *
 * The terms are compared as text with those of today's config (email-actions.ts): rendering the
 * same config differently would make every recorded reference differ from it. Keep the rendering,
 * or read the old one too. One exception: a Sent place of the same account spelled otherwise
 * (`%5CSent` and `Sent`, say) is taken to the server, which says whether both name one mailbox
 * (`sameAccountMailbox`, email-mailbox.ts).
 */
import type { CopyConfig, EmailConfig, ImapConfig } from "./email-config.js";

/** What of a config says how and where its copies are made. */
export type CopySource = Pick<EmailConfig, "copy" | "imap" | "sentMailbox">;

export interface EmailReference {
  readonly messageId: string;
  /**
   * How the copy of the first send was to be made (the `copy=…` terms); undefined in a reference
   * written before it was recorded.
   */
  readonly copy: string | undefined;
}

export function formatReference(messageId: string, config: CopySource): string {
  return `${messageId} ${copyTerms(config)}`;
}

/** Splits a recorded reference into its Message-ID and the copy terms after it. */
export function parseEmailReference(reference: string): EmailReference {
  const space = reference.indexOf(" ");
  return space < 0
    ? { messageId: reference, copy: undefined }
    : { messageId: reference.slice(0, space), copy: reference.slice(space + 1) };
}

/** The `copy=…` terms of a config: one config, one text; without spaces inside a term. */
export function copyTerms(config: CopySource): string {
  const copy = config.copy;
  if (copy.mode !== "journal") return `copy=${copy.mode} in=${sentPlace(config)}`;
  return `copy=journal bcc=${term(copy.address.toLowerCase())} in=${imapUrl(copy.imap, copy.mailbox ?? "INBOX")}`;
}

/** Where a config's Sent folder is: its account and mailbox, as the terms name them. */
export function sentPlace(config: Pick<EmailConfig, "imap" | "sentMailbox">): string {
  return imapUrl(config.imap, config.sentMailbox ?? "\\Sent");
}

/** The place a recorded `copy=provider-saves` or `copy=append` names; undefined in terms from before it was recorded. */
export function recordedPlace(terms: string): string | undefined {
  return /(?:^| )in=(\S+)/.exec(terms)?.[1];
}

/**
 * The mailbox a recorded place names, when it is in the same account (login, host and port) as
 * `other` but spelled otherwise: `\Sent` or a path, for the server to say whether both are one
 * mailbox. Undefined for another account, or a place that does not read as one of ours.
 */
export function sameAccountMailbox(place: string, other: string): string | undefined {
  const [a, b] = [place, other].map((url) => /^(imap:\/\/[^/]+)\/(.*)$/.exec(url));
  if (!a || !b || a[1] !== b[1] || a[2] === b[2]) return undefined;
  try {
    return a[2]!.split("/").map(decodeURIComponent).join("/");
  } catch {
    return undefined; // a malformed %-escape: not a place this version wrote
  }
}

/** An account's mailbox as an RFC 5092 IMAP URL, without the password. */
function imapUrl(imap: ImapConfig, mailbox: string): string {
  const host = imap.host.toLowerCase();
  const account = `${encodeURIComponent(imap.auth.user)}@${host.includes(":") ? `[${host}]` : host}:${imap.port}`;
  return `imap://${account}/${mailbox.split("/").map(encodeURIComponent).join("/")}`;
}

/** The mode of recorded copy terms; undefined for terms this version does not know. */
export function recordedMode(terms: string): CopyConfig["mode"] | undefined {
  const mode = /^copy=(\S+)/.exec(terms)?.[1];
  return mode === "provider-saves" || mode === "journal" || mode === "append" ? mode : undefined;
}

/**
 * A send refused before anything went out: the config no longer makes copies the way the
 * operation's reference records, so the copy of a send now would not be where every later
 * lookup of the operation looks (the reference is kept once an attempt may have sent).
 */
export class CopyChangedError extends Error {
  constructor(
    readonly messageId: string,
    /** The copy terms recorded at the first send. */
    readonly recorded: string,
    /** The copy terms of today's config. */
    readonly configured: string,
  ) {
    super(
      `not sent: ${messageId} was first tried with ${recorded}, and the config now says ${configured}; ` +
        "sent now, its copy would not be where its lookups look. Restore that copy config to send it, or send it under a new key",
    );
    this.name = "CopyChangedError";
  }
}

/** Whitespace and % percent-encoded, so a term stays one token and reads as itself. */
function term(s: string): string {
  return s.replace(/[%\s]/gu, (c) => encodeURIComponent(c));
}
