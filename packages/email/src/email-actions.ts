/**
 * Email as an idem action. SMTP has no idempotency key, so each message gets a deterministic
 * Message-ID, an `X-Idem-Key` header and a reference in the subject, and before sending we look
 * for the copy an earlier attempt left (Sent folder or journal, over IMAP): found means done.
 *
 * The message is rendered by nodemailer without its Bcc header and those bytes are sent over SMTP
 * (email-smtp.ts: cancelled on `op.signal`; in journal mode, only if the server accepted the
 * journal address); in append mode the same message with its Bcc is APPENDed to Sent. The SMTP
 * envelope is the one nodemailer parses from the message's From, To, Cc and Bcc (display names
 * taken off, IDN domains in punycode), as its own transports send it. Windows are measured on
 * the database clock (`op.now`).
 *
 * How the copy is made is recorded with the Message-ID before the first send (email-reference.ts),
 * and every later check, lookup and send of the operation goes by that record, not by a copy
 * config deployed since.
 *
 * Journal mode needs the journal copy filed promptly: the server's queue delivers it after its
 * 250, and a copy not there when the settle window ends (30 minutes by default) reads "absent",
 * so an unknown send is sent again. Attachments are content only: nothing is read from disk or
 * a URL, and a message that cannot be built fails before any connection (rejected).
 */
import nodemailer from "nodemailer";
import MailComposer from "nodemailer/lib/mail-composer";
import { defineAction, type Action } from "@idem/core";
import type { EmailConfig } from "./email-config.js";
import { classifyEmailError } from "./email-classify.js";
import { fileCopy } from "./email-append.js";
import { Mailbox } from "./email-mailbox.js";
import { domainOf, messageIdFor, referenceFor } from "./email-message.js";
import {
  copyAttention,
  emailReceiptSchema,
  foundReceipt,
  recipientHash,
  rejectionsOf,
  sendName,
  sendOf,
  type EmailReceipt,
} from "./email-receipt.js";
import { JOURNAL_SETTLE_MS, SENT_SETTLE_MS, reconcileByCopy, type CopyPlace } from "./email-reconcile.js";
import {
  CopyChangedError,
  copyTerms,
  formatReference,
  parseEmailReference,
  recordedMode,
  recordedPlace,
  sameAccountMailbox,
  sentPlace,
} from "./email-reference.js";
import type { MessageContent } from "./email-reply.js";
import { InvalidMessageError, SendAbortedError, sendRaw } from "./email-smtp.js";
import { parseTlsTrust } from "./email-tls.js";

export interface EmailArgs {
  readonly to: string | readonly string[];
  readonly cc?: string | readonly string[];
  readonly bcc?: string | readonly string[];
  readonly subject: string;
  readonly text?: string;
  readonly html?: string;
  /**
   * Inline content only (strings, base64 with `encoding`): one that names a `path`, an `href` or
   * `raw` is refused before anything is claimed, so nothing is read from disk or a URL; so is any
   * other key than these, and a value of another type (nodemailer writes an object's value into
   * the part's header as it is, line breaks and all).
   */
  readonly attachments?: readonly {
    filename: string;
    content: string;
    encoding?: "base64" | "utf8";
    contentType?: string;
    /** The Content-ID an HTML part refers to (`<img src="cid:…">`), without angle brackets. */
    cid?: string;
    contentDisposition?: "attachment" | "inline";
    /** The part's own header lines; not those nodemailer writes itself (Content-Type, Content-ID, …). */
    headers?: Readonly<Record<string, string>>;
  }[];
  readonly headers?: Readonly<Record<string, string>>;
}

export interface EmailActions {
  readonly send: Action<EmailArgs, EmailReceipt>;
}

export function emailActions(config: EmailConfig): EmailActions {
  const domain = config.messageIdDomain ?? domainOf(config.from);
  // The Message-ID is the reference's first token, up to a space.
  if (/[\s<>]/.test(domain))
    throw new TypeError(`email: the Message-ID domain "${domain}" holds a space or an angle bracket`);
  const withRef = config.subjectWithRef ?? ((subject: string, ref: string) => `${subject} [ref:${ref}]`);
  const copy = config.copy;
  if (copy.mode === "journal" && !copy.imap?.host)
    throw new TypeError(
      "email: copy.imap is required in journal mode: the IMAP account the journal address delivers to",
    );
  // Checked here, not at the first send: a CA given as a file's name, or an option meant to turn
  // verification off, is a configuration error before anything runs (email-tls.ts).
  checkDeadline(config.smtp.deadlineMs, "smtp.deadlineMs");
  checkDeadline(config.imap.deadlineMs, "imap.deadlineMs");
  if (copy.mode === "journal") checkDeadline(copy.imap.deadlineMs, "copy.imap.deadlineMs");
  parseTlsTrust(config.smtp.tls, "smtp.tls");
  parseTlsTrust(config.imap.tls, "imap.tls");
  if (copy.mode === "journal") parseTlsTrust(copy.imap.tls, "copy.imap.tls");
  /** How today's config makes copies, as a reference records it. */
  const today = copyTerms(config);
  const sentHere = sentPlace(config);
  const sent = new Mailbox(config.imap, config.sentMailbox ?? "\\Sent", "sentMailbox");
  const journal = copy.mode === "journal" ? new Mailbox(copy.imap, copy.mailbox ?? "INBOX", "copy.mailbox") : undefined;
  /** The journal's address as the envelope holds it (nodemailer's parse), for the gate to find among the RCPT answers. */
  const journalAddress = copy.mode === "journal" ? envelopeAddress(copy.address) : undefined;
  const render = nodemailer.createTransport({
    streamTransport: true,
    buffer: true,
    newline: "windows",
    disableFileAccess: true,
    disableUrlAccess: true,
  });

  const send = defineAction<EmailArgs, EmailReceipt>({
    type: config.type ?? "email.send",
    capabilities: { lookup: true },
    receipt: emailReceiptSchema,
    providerReference: (_args, op) => formatReference(messageIdFor(op.key, domain), config),
    validate(args) {
      if (!args.subject?.trim()) throw new Error("email.send needs a subject");
      if (!list(args.to).length) throw new Error("email.send needs at least one recipient");
      // Only strings: nodemailer writes a string's line breaks as spaces, but an object's value
      // (`{ prepared: true, value }`) as it is, so its CR LF would add header lines or end the
      // header before the Message-ID, leaving a copy no lookup finds (proven absent: sent again).
      const nonString = Object.entries(args.headers ?? {}).find(([, value]) => typeof value !== "string");
      if (nonString)
        throw new Error(
          `email.send: headers[${JSON.stringify(nonString[0])}] must be a string (nodemailer writes another value's line breaks into the header as they are)`,
        );
      // What tells this operation's sends apart is the action's to write: a caller's own would
      // make a copy name another send (or another operation), and a late answer read as its own.
      for (const name of Object.keys(args.headers ?? {})) {
        const own = OWN_HEADERS.get(headerName(name));
        if (own)
          throw new Error(
            `email.send: headers may not set ${JSON.stringify(name)}: ${own}, the action writes it on each send`,
          );
        // nodemailer writes these itself: a caller's Content-Type went out beside its own (two, a
        // message each reader parses its own way), a Bcc into the message every recipient reads,
        // a MIME-Version in place of its own; the others it drops without a word.
        const written = MESSAGE_HEADERS.get(headerName(name));
        if (written)
          throw new Error(
            `email.send: headers may not set ${JSON.stringify(name)}: nodemailer writes it (${written}); nothing was sent`,
          );
      }
      (args.attachments ?? []).forEach((a, i) => {
        const problem = attachmentProblem(a);
        if (problem)
          throw new Error(
            `email.send: attachments[${i}] ${problem}: attachments are content only (a string in content, base64 with encoding), nothing is read from disk or a URL`,
          );
      });
    },
    async execute(args, op) {
      const { messageId, recorded } = referenceOf(op);
      const ref = referenceFor(op.key);
      const place = placeOf(messageId, recorded);
      const subject = withRef(args.subject, ref);
      // What the message says: kept out of what a server answers (SMTP and IMAP alike), as stored.
      const content = messageContent(args, subject);
      // An earlier attempt's copy means it was sent: nothing more to do.
      // Cancelled during the check (the signal closes its session): nothing sent, as a send
      // cancelled before its body is.
      const earlier = await place.mailbox?.find(messageId, { signal: op.signal, content }).catch((cause: unknown) => {
        if (op.signal.aborted) throw new SendAbortedError(false, { cause: op.signal.reason ?? cause });
        throw cause;
      });
      if (earlier) return foundReceipt(messageId, ref, false, earlier);
      // An earlier attempt may have sent under another copy config, and the config changed since.
      // The ledger does not get here (an operation that may have been sent is looked up, not
      // executed; one known not sent gets a reference of today's config): a guard for a direct
      // call with a reference from elsewhere. The
      // reference keeps that attempt's record for good, so a send now would leave its copy where
      // the operation's lookups do not look: a crash after it would be "proven absent" there (or
      // never settled), and a later config change would hide it again. Looking in both places
      // would only hold until that next change. So nothing is sent; a person restores the config
      // or sends it under a new key (classified permanent, with an alert).
      if (recorded !== today) throw new CopyChangedError(messageId, recorded, today);

      const bcc = copy.mode === "journal" ? [copy.address] : [];
      const message = {
        from: config.from,
        to: list(args.to),
        cc: list(args.cc),
        bcc: [...list(args.bcc), ...bcc],
        subject,
        messageId,
        ...(args.text !== undefined && { text: args.text }),
        ...(args.html !== undefined && { html: args.html }),
        ...(args.attachments && { attachments: args.attachments.map((a) => ({ ...a })) }),
        // The send's name tells its copies from another send's (`sendOf`): the Message-ID is theirs too.
        headers: { ...args.headers, "X-Idem-Key": op.key, "X-Idem-Attempt": sendName(op) },
        date: new Date(),
      };
      // A render that fails (an attachment nodemailer will not read) failed before any connection.
      const rendered = async (m: typeof message) => {
        try {
          return await render.sendMail(m);
        } catch (cause) {
          throw new InvalidMessageError(cause);
        }
      };
      // The whole message, Bcc included: nodemailer's envelope of it (sender and every recipient,
      // bare addresses) is what goes to MAIL FROM and RCPT TO, as its own transports do. The raw
      // strings would not do: "Agent <agent@example.com>" is no address for MAIL FROM.
      const whole = await rendered(message);
      const envelope = whole.envelope as { from?: string | false; to?: string[] };
      // What every recipient gets has no Bcc header (nodemailer's stream transport keeps it), or
      // each would read who else had a blind copy, the journal among them: those are envelope only.
      const raw = (message.bcc.length > 0 ? await rendered({ ...message, bcc: [] }) : whole).message as Buffer;
      const out = {
        from: envelope.from || "",
        to: envelope.to ?? [],
        raw,
        journal: journalAddress,
        content: content.fields,
      };
      const info = await sendRaw(config.smtp, out, op.signal);
      // Sent already: a failed APPEND loses the copy, not the effect, so the send still succeeded,
      // and nothing below sends again. One that may pass is tried again (email-append.ts); without
      // the copy no lookup can find this send, so the receipt says why it is missing (the one
      // place that outlives this call). The sender's own copy keeps its Bcc, as a mail client's
      // does (the same message: its Message-ID and date).
      const copyNotFiled =
        copy.mode === "append"
          ? await fileCopy(sent, whole.message as Buffer, messageId, op.signal, content)
          : undefined;
      // Recipients by their hash only: the ledger keeps receipts, and an address is a customer's.
      return {
        messageId,
        ref,
        sent: true,
        response: info.response,
        accepted: info.accepted.map(recipientHash),
        rejected: info.rejected.map(recipientHash),
        rejections: rejectionsOf(info.rejected, info.rejectedCodes),
        ...(copyNotFiled && { copyNotFiled }),
        send: sendName(op),
      };
    },
    classify: (error) => classifyEmailError(error),
    effectId: sendOf,
    // A send whose Sent copy was not filed: an operator hears of it (alerted once).
    attention: copyAttention,
    reconcile: (args, op) => {
      const { messageId, recorded } = referenceOf(op);
      const place = placeOf(messageId, recorded);
      // A journal copy comes through the server's queue, a Sent copy as the provider accepts the
      // message: their own default windows (email-reconcile.ts).
      const settleMs = config.settleMs ?? (journal && place.mailbox === journal ? JOURNAL_SETTLE_MS : SENT_SETTLE_MS);
      const ref = referenceFor(op.key);
      const content = messageContent(args, withRef(args.subject, ref));
      return reconcileByCopy(place, messageId, ref, op, settleMs, content);
    },
  });
  return { send };

  /**
   * The Message-ID and copy terms recorded for the operation before its first send, not ones
   * computed again from today's config: with another `from` or `messageIdDomain` since, the copy
   * of the first send would be looked for under a name it never had; with another copy mode, in
   * a place it never was, or with the proof of a mode it was not made with. Either way "proven
   * absent", and sent again.
   */
  function referenceOf(op: { readonly key: string; readonly providerReference: string | null }): {
    messageId: string;
    recorded: string;
  } {
    // No reference: the action called without a ledger, or a row from before references existed.
    if (op.providerReference === null) return { messageId: messageIdFor(op.key, domain), recorded: today };
    const { messageId, copy: recorded } = parseEmailReference(op.providerReference);
    // A bare Message-ID was written by a version that did not record the copy mode: today's config
    // is all that is known of how its copy was made, as that version assumed. So an outcome such a
    // version left unknown is judged by a copy mode changed since: settle those before changing it.
    return { messageId, recorded: recorded ?? today };
  }

  /**
   * Where the copy of the operation's send is, and what its absence proves, by how its first send
   * made it. Sent is searched in today's account and folder: a copy found there is the send's
   * (its Message-ID is its own), but its absence proves something only where the send's copy was
   * recorded to be filed (a reference from before that was recorded: today's Sent, as then; one
   * naming the same account's Sent otherwise: if the server says it is the folder searched). A
   * journal only when today's config has that very journal (address, account and mailbox): its
   * password is there, and a search of another mailbox finds nothing whatever was sent.
   */
  function placeOf(messageId: string, recorded: string): CopyPlace {
    const note =
      recorded === today ? "" : ` (copy recorded at its first send: ${recorded}; the config now says ${today})`;
    const mode = recordedMode(recorded);
    if (mode === "append") return { mailbox: sent, name: "Sent", absence: "never", note };
    if (mode === "provider-saves") {
      const where = recordedPlace(recorded);
      const here = where === undefined || where === sentHere;
      if (here) return { mailbox: sent, name: "Sent", absence: "settles", note };
      // The same account, its Sent named otherwise (an unset sentMailbox, `\Sent`, and "Sent", say):
      // the server says at the lookup whether both names are one mailbox.
      const named = sameAccountMailbox(where, sentHere);
      if (named !== undefined) {
        const recordedAs = { mailbox: named, place: where, configured: sentHere };
        return { mailbox: sent, name: "Sent", absence: "settles", recordedAs, note };
      }
      const because = `its copy was to be filed in ${where}, which is not where the config now looks (${sentHere})`;
      return { mailbox: sent, name: "Sent", absence: "never", because, note };
    }
    if (mode === "journal" && recorded === today && journal)
      return { mailbox: journal, name: "the journal", absence: "settles", note };
    return {
      mailbox: undefined,
      reason: `cannot look for ${messageId}: its first send made its copy with ${recorded}, and the config now says ${today}; that copy cannot be searched, so its absence proves nothing`,
    };
  }
}

/** The headers each send gets from the action, by their names in lower case: the operation's key and the send (operation and attempt). */
const OWN_HEADERS: ReadonlyMap<string, string> = new Map([
  ["x-idem-key", "X-Idem-Key"],
  ["x-idem-attempt", "X-Idem-Attempt"],
]);

/**
 * The message headers nodemailer writes itself, by their names in lower case, with what args set
 * instead (checked against nodemailer 10.6: what it does with a caller's header of that name).
 */
const MESSAGE_HEADERS: ReadonlyMap<string, string> = new Map([
  ["content-type", "from the text, HTML and attachments; a second one would go out beside it"],
  ["content-transfer-encoding", "from the content; a caller's is dropped"],
  ["mime-version", "as 1.0; a caller's would replace it"],
  ["message-id", "the action's own, which every lookup searches by"],
  ["date", "the time of the send; a caller's is dropped"],
  ["from", "from the config's from"],
  ["sender", "from the config; a caller's is no envelope sender"],
  ["to", "from args.to"],
  ["cc", "from args.cc"],
  ["bcc", "from args.bcc, never into the message: a caller's Bcc header every recipient would read"],
  ["subject", "from args.subject, with its reference"],
]);

/** The part headers nodemailer writes itself for an attachment, with what args set instead. */
const PART_HEADERS: ReadonlyMap<string, string> = new Map([
  ["content-type", "contentType (a second Content-Type would go out beside nodemailer's)"],
  ["content-transfer-encoding", "encoding (nodemailer's replaces it)"],
  ["content-disposition", "contentDisposition (nodemailer's replaces it)"],
  ["content-id", "cid (nodemailer's replaces it)"],
]);

/** The keys an attachment may have: content only, and how nodemailer names and places it. */
const ATTACHMENT_KEYS = new Set([
  "filename",
  "content",
  "encoding",
  "contentType",
  "cid",
  "contentDisposition",
  "headers",
]);

/** A header's name as nodemailer writes it (line breaks as spaces, trimmed, a trailing colon dropped), in lower case. */
function headerName(name: string): string {
  return name
    .replace(/[\r\n]+/g, " ")
    .trim()
    .replace(/:+$/, "")
    .trim()
    .toLowerCase();
}

/**
 * The one envelope address nodemailer reads in `address` (a display name taken off), for a config
 * value; a TypeError when it reads none or several (a configuration to fix before anything runs).
 */
function envelopeAddress(address: string): string {
  const to = new MailComposer({ bcc: address }).compile().getEnvelope().to;
  if (to.length !== 1 || !to[0])
    throw new TypeError(`email: no single address can be read in the journal address "${address}"`);
  return to[0];
}

/**
 * Why an attachment would make nodemailer read a file or a URL, write something into its part's
 * header as it is (an object's value: `{ prepared: true, value }` keeps its line breaks), or is
 * no content; undefined when it is none of these. Checked against nodemailer 10.6: a string's
 * line breaks become spaces (or nothing) in contentType, cid and contentDisposition, an object's
 * are written as they are.
 */
function attachmentProblem(attachment: unknown): string | undefined {
  const given = (attachment ?? {}) as Record<string, unknown>;
  for (const key of ["path", "href", "raw"]) if (given[key] !== undefined) return `gives a ${key}`;
  const other = Object.keys(given).find((key) => !ATTACHMENT_KEYS.has(key) && given[key] !== undefined);
  if (other !== undefined) return `gives ${other}, which is not one of ${[...ATTACHMENT_KEYS].join(", ")}`;
  // nodemailer reads a content object too ({ path }, a stream): only a string is content here.
  if (typeof given.content !== "string") return "has no content string";
  for (const key of ["filename", "contentType", "cid"] as const) {
    const value = given[key];
    if (value === undefined) continue;
    if (typeof value !== "string" || /[\r\n]/.test(value))
      return `has a ${key} that must be a string without a line break`;
  }
  if (given.cid !== undefined && /[<>\s]/.test(given.cid as string))
    return "has a cid that must be a string without a line break, a space or an angle bracket (nodemailer adds the brackets)";
  if (
    given.contentDisposition !== undefined &&
    given.contentDisposition !== "attachment" &&
    given.contentDisposition !== "inline"
  )
    return 'has a contentDisposition that must be "attachment" or "inline"';
  if (given.encoding !== undefined && given.encoding !== "base64" && given.encoding !== "utf8")
    return 'has an encoding that must be "base64" or "utf8"';
  // Its part's headers are written as the message's are: an object's value with its line breaks.
  const headers = given.headers;
  if (headers !== undefined) {
    if (typeof headers !== "object" || headers === null || Array.isArray(headers))
      return "has headers that are no record of strings";
    const bad = Object.entries(headers).find(([, value]) => typeof value !== "string");
    if (bad) return `has headers[${JSON.stringify(bad[0])}] that must be a string`;
    const written = Object.keys(headers).find((name) => PART_HEADERS.has(headerName(name)));
    if (written !== undefined)
      return `has headers that may not set ${JSON.stringify(written)}: nodemailer writes it, set ${PART_HEADERS.get(headerName(written))}`;
  }
  return undefined;
}

/**
 * What the message says, as given and as sent: cut out of a server's reply before the ledger keeps
 * it (email-reply.ts). An attachment's content in base64 also as its text, as a server quotes it.
 */
function contentOf(args: EmailArgs, subject: string): string[] {
  const fields = [args.subject, subject, args.text ?? "", args.html ?? "", ...Object.values(args.headers ?? {})];
  fields.push(...list(args.to), ...list(args.cc), ...list(args.bcc));
  for (const a of args.attachments ?? []) {
    fields.push(a.filename, a.content, ...Object.values(a.headers ?? {}));
    if (a.encoding === "base64") fields.push(Buffer.from(a.content, "base64").toString("utf8"));
  }
  return fields.filter((f): f is string => typeof f === "string");
}

/**
 * What the message says, for a server's text to be kept without it (email-reply.ts): its fields
 * (`contentOf`) and its recipients' addresses as the envelope has them (nodemailer's parse of To,
 * Cc and Bcc, display names taken off), each to be hashed.
 */
function messageContent(args: EmailArgs, subject: string): MessageContent {
  try {
    const addresses = { to: list(args.to), cc: list(args.cc), bcc: list(args.bcc) };
    return { recipients: new MailComposer(addresses).compile().getEnvelope().to, fields: contentOf(args, subject) };
  } catch {
    // Args an earlier version stored that do not read so (a lookup reads the stored ones, unchecked):
    // a lookup must not fail on them. A server's text is still bounded and on one line.
    return { recipients: [], fields: [] };
  }
}

/**
 * A deadline a timer can keep: a whole number of ms from 1 to 2^31 - 1 (Node fires a longer one at
 * once, which would end every send as it starts), or undefined for the default.
 */
function checkDeadline(ms: number | undefined, name: string): void {
  if (ms === undefined) return;
  if (!Number.isInteger(ms) || ms < 1 || ms > 2_147_483_647)
    throw new TypeError(`email: ${name} must be a whole number of milliseconds from 1 to 2147483647, not ${ms}`);
}

function list(v: string | readonly string[] | undefined): string[] {
  return v === undefined ? [] : typeof v === "string" ? [v] : [...v];
}
