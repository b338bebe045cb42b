/**
 * What the ledger keeps of a send: the identifiers and the server's answer, not the content, and
 * no recipient's address (each is kept as its hash, `recipientHash`).
 */
import { z } from "zod";
import { sensitiveHash } from "@idem/core";

export type EmailReceipt = SentEmailReceipt | FoundEmailReceipt;

/** More copies of one message than this are not read (their sends unknown): it went out more than once anyway. */
export const MAX_COPIES = 20;

/** A send's name, `<operation id>/<attempt>`: its receipt's `send`, and its message's `X-Idem-Attempt`. */
export function sendName(op: { readonly id: string; readonly attempt: number }): string {
  return `${op.id}/${op.attempt}`;
}

/** What `sendName` makes, as a copy's header or a person's receipt must give it. */
export const SEND_NAME = /^[A-Za-z0-9_.-]{1,64}\/[1-9]\d{0,8}$/;

/** This attempt sent the message: the server's answer. */
export interface SentEmailReceipt {
  readonly messageId: string;
  /** The short reference in the subject. */
  readonly ref: string;
  readonly sent: true;
  /** The server's final reply (with its queue id). */
  readonly response: string;
  /**
   * The envelope recipients the server accepted (the journal address among them in journal mode),
   * each as `recipientHash(address)`, never the address: `accepted.length` is how many. Receipts
   * stored by earlier versions hold the addresses.
   */
  readonly accepted: readonly string[];
  /** The envelope recipients the server refused at RCPT TO, for now or for good, hashed the same way. */
  readonly rejected: readonly string[];
  /**
   * How the server refused each of `rejected`, in its order: a recipient `deferred` (4xx) may be
   * taken on another try, but this operation sent its message and will not send it again; one
   * `refused` (5xx, or no code seen) will not be. Absent from receipts stored by earlier versions.
   */
  readonly rejections?: readonly Rejection[];
  /**
   * Append mode only, when the copy of this send could not be filed in Sent after it went out:
   * no lookup can find this send, so if this receipt were lost (or pruned) nothing would show it
   * was sent; and a Sent folder that refused it refuses the next copy too. Absent when the copy
   * was filed, and in the other modes (the provider or the journal files the copy).
   */
  readonly copyNotFiled?: CopyNotFiled;
  /**
   * Which send it was: `<operation id>/<attempt>`, as the message's `X-Idem-Attempt` header
   * says, so every copy of it names it too. Absent from receipts stored by earlier versions.
   */
  readonly send?: string;
  readonly foundIn?: undefined;
}

/** Why a send's Sent copy (append mode) is not there. */
export interface CopyNotFiled {
  /**
   * True when the server refused the APPEND until a person acts (`responseCode`: NOPERM, no right
   * to file into Sent; OVERQUOTA; TRYCREATE or NONEXISTENT, no such mailbox), so every later
   * copy is lost too, or answered it with a refusal that trying again gets again (TOOBIG, LIMIT,
   * CONTACTADMIN, a BAD: nothing filed); false when it failed otherwise, after the few tries a failure that may pass
   * gets (the connection, a NO [INUSE] or [UNAVAILABLE], a NO without a code): the copy may or
   * may not be there.
   */
  readonly refused: boolean;
  /** The server's response code to the last try (INUSE, say, or NOPERM), null when none was seen. */
  readonly responseCode: string | null;
  /**
   * What failed, as the error said it (the account and mailbox, the server's text; never the
   * message), after "after N tries: " when it was tried more than once.
   */
  readonly reason: string;
}

/** A recipient the server did not take at RCPT TO, and how. */
export interface Rejection {
  /** `recipientHash(address)`, never the address. */
  readonly recipient: string;
  /** "deferred": a 4xx, not now; "refused": a 5xx, or no code seen. */
  readonly kind: "deferred" | "refused";
  /** The server's reply code, null when none was seen. */
  readonly code: number | null;
}

/**
 * The copy of an earlier attempt's send was found: the message went out, but a copy does not say
 * which recipients the server accepted, so `accepted` and `rejected` are null (not known), never
 * an empty list (accepted by nobody). Receipts stored by earlier versions hold empty lists.
 */
export interface FoundEmailReceipt {
  readonly messageId: string;
  /** The short reference in the subject. */
  readonly ref: string;
  /**
   * False when the check before sending found the copy (this attempt sent nothing); true when a
   * lookup settled an unknown outcome.
   */
  readonly sent: boolean;
  readonly response: null;
  readonly accepted: null;
  readonly rejected: null;
  readonly rejections?: undefined;
  /** The mailbox where the copy was found. */
  readonly foundIn: string;
  /**
   * The sends the copies found are (each `<operation id>/<attempt>`, as its `X-Idem-Attempt`
   * header names it), sorted: one when the message went out once. Absent when that is not known of
   * every copy (one sent by an earlier version, say), and from receipts stored by earlier versions.
   */
  readonly sends?: readonly string[];
  /**
   * How many copies were found, when some were not read (more than MAX_COPIES in one mailbox: only
   * the first are): the message went out more than once, whatever sends those name. Absent
   * otherwise, also for copies in several \Sent mailboxes that add up to more but were all read.
   */
  readonly copies?: number;
}

export function foundReceipt(
  messageId: string,
  ref: string,
  sent: boolean,
  found: {
    readonly mailbox: string;
    readonly sends: readonly string[];
    readonly copies?: number;
    /** Copies not read (more than MAX_COPIES in one mailbox); `copies` is kept only then. */
    readonly unread?: number;
  },
): FoundEmailReceipt {
  const { mailbox: foundIn, sends, copies = 0, unread = 0 } = found;
  return {
    messageId,
    ref,
    sent,
    response: null,
    accepted: null,
    rejected: null,
    foundIn,
    ...(sends.length > 0 && { sends: [...sends] }),
    // Not for copies in several mailboxes, each read, that only add up to more: what they name is known.
    ...(unread > 0 && copies > MAX_COPIES && { copies }),
  };
}

/**
 * What an operator must hear of a send whose Sent copy was not filed (append mode: the action's
 * `attention`, alerted once): without the copy no lookup can find this send, so a reconcile, or
 * a run of the same key once its row is pruned, would not see it. Refused: every later copy is
 * refused too until the account is fixed; given up: the copy may or may not be there.
 */
export function copyAttention(receipt: EmailReceipt): string | undefined {
  const missing = receipt.foundIn === undefined ? receipt.copyNotFiled : undefined;
  if (missing === undefined) return undefined;
  const code = missing.responseCode ?? "no response code";
  const why = missing.refused
    ? `refused by the server (${code}): every later copy will be refused until the account is fixed; no lookup can find this send`
    : `given up (${code}): the copy may or may not be there; if it is not, no lookup can find this send`;
  return `sent, but its Sent copy was not filed, ${why}: ${missing.reason}`;
}

/**
 * Which send a receipt describes (the action's `effectId`): the Message-ID, which every copy and
 * every attempt (and an operation pruned and run again under the key) shares, and the send:
 * the operation and its attempt. So a request's late answer and the copy a lookup found of that
 * very send are one effect; a copy of another send, a second. Copies of several sends: each
 * one's. Undefined when the receipt cannot say (not known of every copy found, a receipt from an
 * earlier version): then a late answer that differs is alerted for a person to check.
 */
export function sendOf(receipt: EmailReceipt): string | readonly string[] | undefined {
  const named = (send: string) => `${receipt.messageId} ${send}`;
  if (receipt.foundIn === undefined) return receipt.send === undefined ? undefined : named(receipt.send);
  const sends = receipt.sends ?? [];
  // More copies than are read, naming fewer than two sends: more than one went out all the same,
  // one of them unnamed (so a late answer is never taken for it).
  const many = (receipt.copies ?? 0) > MAX_COPIES && sends.length < 2;
  if (many)
    return [
      sends.length === 1 ? named(sends[0]!) : `${receipt.messageId} (a send of its ${receipt.copies} copies)`,
      `${receipt.messageId} (another send of its ${receipt.copies} copies)`,
    ];
  // Copies of several sends (the lookup alerted them): a late answer of one of them is no other.
  return sends.length === 0 ? undefined : sends.length === 1 ? named(sends[0]!) : sends.map(named);
}

/**
 * How a receipt names a recipient: `sha256:<hex>` of the address in lower case, as core's
 * `sensitive()` hashes a key part. So an operator can tell whether an address was among the
 * recipients (hash it and compare), and it matches the recipient part of the email tool's key
 * (which hashes the lower-cased address too), without the ledger holding the address.
 */
export function recipientHash(address: string): string {
  return sensitiveHash(address.trim().toLowerCase());
}

/** The `rejections` of a receipt: each refused address hashed, with its code read as deferred or refused. */
export function rejectionsOf(rejected: readonly string[], codes: readonly (number | undefined)[]): Rejection[] {
  return rejected.map((address, i) => {
    const code = codes[i] ?? null;
    const kind = code !== null && code >= 400 && code < 500 ? "deferred" : "refused";
    return { recipient: recipientHash(address), kind, code };
  });
}

/** `<...@...>`, as messageIdFor makes one. */
const messageId = z.string().regex(/^<[^\s<>@]+@[^\s<>@]+>$/, "must be a Message-ID in angle brackets (<…@…>)");
/** 8 characters of referenceFor's alphabet, as in the subject's `[ref:…]`. */
const ref = z.string().regex(/^[A-HJKMNP-TV-Z0-9]{8}$/, "must be the 8-character reference in the subject ([ref:…])");
const recipient = z
  .string()
  .regex(/^sha256:[0-9a-f]{64}$/, "must be recipientHash(address): a receipt never holds an address");
/**
 * A send, `<operation id>/<attempt>`, as a copy's `X-Idem-Attempt` header names it: a person who
 * records one copies it from there (it decides whether a late answer is that send or a second).
 */
const send = z.string().regex(SEND_NAME, "must be <operation id>/<attempt>, as the copy's X-Idem-Attempt header says");
const rejection = z.object({
  recipient,
  kind: z.enum(["deferred", "refused"]),
  code: z.number().int().min(200).max(599).nullable(),
});
const sentShape = z.object({
  messageId,
  ref,
  sent: z.literal(true),
  response: z.string().min(1),
  accepted: z.array(recipient),
  rejected: z.array(recipient),
  rejections: z.array(rejection).exactOptional(),
  copyNotFiled: z
    .object({ refused: z.boolean(), responseCode: z.string().max(64).nullable(), reason: z.string().min(1).max(1_000) })
    .exactOptional(),
  send: send.exactOptional(),
  foundIn: z.undefined().exactOptional(),
});
/** A person found the copy (or the message itself): it went out, so `sent` defaults to true. */
const foundShape = z.object({
  messageId,
  ref,
  sent: z.boolean().default(true),
  response: z.null().default(null),
  accepted: z.null().default(null),
  rejected: z.null().default(null),
  foundIn: z.string().min(1).max(200),
  sends: z.array(send).min(1).max(MAX_COPIES).exactOptional(),
  copies: z
    .number()
    .int()
    .min(MAX_COPIES + 1)
    .exactOptional(),
});

/**
 * The receipt's schema: what a person may record as the receipt when they resolve an operation
 * as succeeded (`admin.resolve`), either shape the action stores. Most often the copy they found
 * (`{ messageId, ref, foundIn }`: where they found it; `sent` defaults to true, the server's
 * answer and the recipients to null, not known), or the server's answer from its log (a
 * SentEmailReceipt). Recipients only as `recipientHash(address)`, never an address; fields besides
 * these are dropped (never the message's content).
 */
export const emailReceiptSchema = z.union([sentShape, foundShape], {
  error:
    "must be the receipt of a message sent ({ messageId, ref, sent: true, response, accepted, rejected }) or of its copy found ({ messageId, ref, foundIn })",
});
