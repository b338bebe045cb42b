/**
 * What is kept of an SMTP server's text (its reply, and nodemailer's message around it) once a
 * send ended: the ledger stores it (a failure's reason, a receipt's `response`), and the ledger
 * keeps no customer content beyond what an operator needs. An operator needs the reply code, the
 * enhanced status code (RFC 3463) and the server's own words; a content filter's reply often
 * quotes the message back ("554 5.7.1 spam: subject \"…\""), and a server's text may name a
 * recipient. So:
 *  - each recipient's address becomes its hash (`recipientHash`, as receipts name recipients);
 *  - any span of the text that the message also says (its subject, text, HTML, attachments'
 *    names and contents, header values: at least `QUOTE_CHARS` characters in a row, in any case,
 *    or a whole field shorter than that standing as a word) becomes `[…]`; reply and enhanced
 *    codes are kept whatever the message says;
 *  - the text is cut at `REPLY_CHARS` characters, line breaks made spaces.
 * Not supported: a server that quotes the message encoded otherwise (quoted-printable, base64, a
 * translation) is not recognised; the bound is what limits it.
 */
import { recipientHash } from "./email-receipt.js";

/** The shortest run of characters the message also says that is taken for a quote of it. */
export const QUOTE_CHARS = 8;
/** The longest server text kept, in characters (a 1,000-character field holds the rest of a reason). */
export const REPLY_CHARS = 400;
const QUOTED = "[…]";

/** What a message says, never to be stored from a server's reply. */
export interface MessageContent {
  /** The recipients' addresses (envelope), each kept as its hash. */
  readonly recipients: readonly string[];
  /** Its subject, text, HTML, attachments' names and contents, header values (as given and as sent). */
  readonly fields: readonly string[];
}

/** `text` as the ledger may keep it: recipients hashed, the message's content cut out, bounded. */
export function scrubReply(text: string, content: MessageContent): string {
  let out = hashRecipients(text.replace(/\s*[\r\n]+\s*/g, " "), content.recipients);
  // Bounded before the search, so a long reply against a long message stays cheap; a little more
  // than kept, so a quote cut at the bound is still recognised.
  if (out.length > REPLY_CHARS * 2) out = out.slice(0, REPLY_CHARS * 2);
  out = cutQuotes(out, content.fields);
  return out.length > REPLY_CHARS ? `${out.slice(0, REPLY_CHARS - 1)}…` : out;
}

/** `text` with each of `addresses` (any case) replaced by its hash. */
export function hashRecipients(text: string, addresses: readonly string[]): string {
  let out = text;
  for (const a of addresses) {
    if (!a) continue;
    out = out.replace(new RegExp(escapeRegExp(a), "gi"), recipientHash(a));
  }
  return out;
}

/** `text` matched literally in a RegExp. */
function escapeRegExp(text: string): string {
  return text.replace(/[.*+?^${}()|[\]\\]/g, "\\$&");
}

function cutQuotes(text: string, fields: readonly string[]): string {
  const said = fields.filter((f) => f.trim() !== "").map((f) => f.toLowerCase());
  if (said.length === 0) return text;
  const haystack = said.join("\u0000");
  const lower = text.toLowerCase();
  const quoted = new Uint8Array(text.length);
  // Every run of QUOTE_CHARS the message also says, and so every longer one, piece by piece.
  for (let i = 0; i + QUOTE_CHARS <= lower.length; i++) {
    const gram = lower.slice(i, i + QUOTE_CHARS);
    if (gram.trim().length < QUOTE_CHARS / 2) continue; // mostly spaces: says nothing of the message
    if (haystack.includes(gram)) quoted.fill(1, i, i + QUOTE_CHARS);
  }
  // A short field (a subject "Invoice") quoted whole: as a word, not inside another one.
  for (const field of said) {
    const f = field.trim();
    if (f.length >= QUOTE_CHARS || f.length < 3) continue;
    for (const m of lower.matchAll(new RegExp(`(?<![\\p{L}\\p{N}])${escapeRegExp(f)}(?![\\p{L}\\p{N}])`, "gu")))
      quoted.fill(1, m.index, m.index + f.length);
  }
  // The codes an operator reads are the server's, whatever the message says.
  for (const m of text.matchAll(/\b[245]\d\d\b|\b[245]\.\d{1,3}\.\d{1,3}\b|sha256:[0-9a-f]{64}/g))
    quoted.fill(0, m.index, m.index + m[0].length);
  let out = "";
  for (let i = 0; i < text.length; i++) {
    if (quoted[i] === 0) out += text[i];
    else if (i === 0 || quoted[i - 1] === 0) out += QUOTED;
  }
  return out;
}
