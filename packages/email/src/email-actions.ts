/**
 * Email as an idem action. SMTP has no idempotency key, so each message gets a deterministic
 * Message-ID, an `X-Idem-Key` header and a reference in the subject, and before sending we look
 * for the copy an earlier attempt left (Sent folder or journal, over IMAP): found means done.
 *
 * The message is rendered by nodemailer without its Bcc header and those bytes are sent over SMTP
 * (email-smtp.ts: cancelled on `op.signal`; in journal mode, only if the server accepted the
 * journal address); in append mode the same message with its Bcc is APPENDed to Sent. Windows
 * are measured on the database clock (`op.now`).
 */
import nodemailer from "nodemailer";
import { defineAction, type Action } from "@idem/core";
import type { EmailConfig } from "./email-config.js";
import { classifyEmailError } from "./email-classify.js";
import { Mailbox } from "./email-mailbox.js";
import { domainOf, messageIdFor, referenceFor } from "./email-message.js";
import type { EmailReceipt } from "./email-receipt.js";
import { reconcileByCopy } from "./email-reconcile.js";
import { sendRaw } from "./email-smtp.js";

export interface EmailArgs {
  readonly to: string | readonly string[];
  readonly cc?: string | readonly string[];
  readonly bcc?: string | readonly string[];
  readonly subject: string;
  readonly text?: string;
  readonly html?: string;
  /** Inline content only (strings, base64 with `encoding`): file and URL access are disabled. */
  readonly attachments?: readonly {
    filename: string;
    content: string;
    encoding?: "base64" | "utf8";
    contentType?: string;
  }[];
  readonly headers?: Readonly<Record<string, string>>;
}

export interface EmailActions {
  readonly send: Action<EmailArgs, EmailReceipt>;
}

export function emailActions(config: EmailConfig): EmailActions {
  const domain = config.messageIdDomain ?? domainOf(config.from);
  const withRef = config.subjectWithRef ?? ((subject: string, ref: string) => `${subject} [ref:${ref}]`);
  const copy = config.copy;
  if (copy.mode === "journal" && !copy.imap?.host)
    throw new TypeError(
      "email: copy.imap is required in journal mode: the IMAP account the journal address delivers to",
    );
  const lookIn =
    copy.mode === "journal"
      ? new Mailbox(copy.imap, copy.mailbox ?? "INBOX")
      : new Mailbox(config.imap, config.sentMailbox ?? "\\Sent");
  const sent = new Mailbox(config.imap, config.sentMailbox ?? "\\Sent");
  const render = nodemailer.createTransport({
    streamTransport: true,
    buffer: true,
    newline: "windows",
    disableFileAccess: true,
    disableUrlAccess: true,
  });

  const send = defineAction<EmailArgs, EmailReceipt>({
    type: "email.send",
    capabilities: { lookup: true },
    providerReference: (_args, op) => messageIdFor(op.key, domain),
    validate(args) {
      if (!args.subject?.trim()) throw new Error("email.send needs a subject");
      if (!list(args.to).length) throw new Error("email.send needs at least one recipient");
    },
    async execute(args, op) {
      const messageId = messageIdOf(op);
      const ref = referenceFor(op.key);
      // An earlier attempt's copy means it was sent: nothing more to do.
      const earlier = await lookIn.find(messageId);
      if (earlier)
        return { messageId, ref, sent: false, response: null, accepted: [], rejected: [], foundIn: earlier.mailbox };

      const journal = copy.mode === "journal" ? [copy.address] : [];
      const message = {
        from: config.from,
        to: list(args.to),
        cc: list(args.cc),
        bcc: [...list(args.bcc), ...journal],
        subject: withRef(args.subject, ref),
        messageId,
        ...(args.text !== undefined && { text: args.text }),
        ...(args.html !== undefined && { html: args.html }),
        ...(args.attachments && { attachments: args.attachments.map((a) => ({ ...a })) }),
        headers: { ...args.headers, "X-Idem-Key": op.key },
        date: new Date(),
      };
      const rendered = async (m: typeof message) => (await render.sendMail(m)).message as Buffer;
      // What every recipient gets has no Bcc header (nodemailer's stream transport keeps it), or
      // each would read who else had a blind copy, the journal among them: those are envelope only.
      const raw = await rendered({ ...message, bcc: [] });
      const to = [...message.to, ...message.cc, ...message.bcc];
      const info = await sendRaw(config.smtp, { from: config.from, to, raw, journal: journal[0] }, op.signal);
      if (copy.mode === "append") {
        // Sent already; a failed APPEND only loses the copy, not the effect. The sender's own
        // copy keeps its Bcc, as a mail client's does (the same message: its Message-ID and date).
        const own = message.bcc.length > 0 ? await rendered(message) : raw;
        await sent.append(own).catch(() => undefined);
      }
      return {
        messageId,
        ref,
        sent: true,
        response: info.response,
        accepted: [...info.accepted],
        rejected: [...info.rejected],
      };
    },
    classify: (error) => classifyEmailError(error),
    reconcile: (_args, op) =>
      reconcileByCopy(lookIn, copy, messageIdOf(op), referenceFor(op.key), op, config.settleMs ?? 60_000),
  });
  return { send };

  /**
   * The Message-ID recorded for the operation before its first send, not one computed again from
   * today's config: with another `from` or `messageIdDomain` since, the copy of the first send
   * would be looked for under a name it never had, "proven absent", and sent again.
   */
  function messageIdOf(op: { readonly key: string; readonly providerReference: string | null }): string {
    return op.providerReference ?? messageIdFor(op.key, domain);
  }
}

function list(v: string | readonly string[] | undefined): string[] {
  return v === undefined ? [] : typeof v === "string" ? [v] : [...v];
}
