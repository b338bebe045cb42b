/**
 * The provider reference of an email operation, recorded before a send (the ledger keeps it from
 * the first attempt that may have sent, and hands it to every later attempt and lookup): the
 * Message-ID, then how that send's copy was to be made.
 *
 *   <idem.{40 hex}@{domain}> copy=provider-saves
 *   <idem.{40 hex}@{domain}> copy=append
 *   <idem.{40 hex}@{domain}> copy=journal bcc={address} in=imap://{login}@{host}:{port}/{mailbox}
 *
 * What "no copy found" proves depends on how the copy was made, not on a config deployed since:
 * a send made in append mode that crashed before its APPEND, looked up after a switch to
 * provider-saves, would be "proven absent" and sent again. The journal's account is named by an
 * IMAP URL (RFC 5092: login, host, port, mailbox), never with its password. The Message-ID stays
 * the first token, up to the first space. References written before the copy was recorded are a
 * bare Message-ID.
 *
 * The terms are compared as text with those of today's config (email-actions.ts): rendering the
 * same config differently would make every recorded reference differ from it. Keep the rendering,
 * or read the old one too.
 */
import type { CopyConfig } from "./email-config.js";

export interface EmailReference {
  readonly messageId: string;
  /**
   * How the copy of the first send was to be made (the `copy=…` terms); undefined in a reference
   * written before it was recorded.
   */
  readonly copy: string | undefined;
}

export function formatReference(messageId: string, copy: CopyConfig): string {
  return `${messageId} ${copyTerms(copy)}`;
}

/** Splits a recorded reference into its Message-ID and the copy terms after it. */
export function parseEmailReference(reference: string): EmailReference {
  const space = reference.indexOf(" ");
  return space < 0
    ? { messageId: reference, copy: undefined }
    : { messageId: reference.slice(0, space), copy: reference.slice(space + 1) };
}

/** The `copy=…` terms of a copy config: one config, one text; without spaces inside a term. */
export function copyTerms(copy: CopyConfig): string {
  if (copy.mode !== "journal") return `copy=${copy.mode}`;
  const host = copy.imap.host.toLowerCase();
  const account = `${encodeURIComponent(copy.imap.auth.user)}@${host.includes(":") ? `[${host}]` : host}:${copy.imap.port}`;
  const mailbox = (copy.mailbox ?? "INBOX").split("/").map(encodeURIComponent).join("/");
  return `copy=journal bcc=${term(copy.address.toLowerCase())} in=imap://${account}/${mailbox}`;
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
