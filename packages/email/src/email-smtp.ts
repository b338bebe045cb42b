/**
 * The SMTP side: one connection per send through nodemailer's SMTPConnection (not its transport),
 * because two guarantees need the connection in hand:
 *  - Cancellation: when the operation's signal aborts, the connection is closed. Until the body
 *    was handed over, that sends nothing: a server that loses the connection before the final
 *    "." must drop the transaction (RFC 5321 §3.8, "as if a RSET had been received").
 *  - A journal copy that can prove absence: the body is held back until the server answered
 *    every RCPT TO, and is sent only if it accepted the journal address and one other recipient.
 *    If it went out without the journal copy, "not in the journal" would later be taken as proof
 *    that nothing was sent, and a crash or a lost reply would send it twice. Holding the body
 *    back (rather than marking the receipt, or answering "never" on reconcile) also covers a
 *    worker killed mid-send, which leaves no classification to consult.
 * Every error a send rejects with says whether the body was handed over (`bodySent`): without a
 * reply from the server, that alone decides whether the message may have gone out (email-classify.ts).
 * Signing in without implicit TLS requires STARTTLS unless the config says otherwise
 * (`requireTLS`): a server that does not offer it gets neither the password nor the message. The
 * server's certificate is verified against the config's `tls` trust (email-tls.ts).
 * A send ends by its deadline (`deadlineMs`, from the connect to the last reply), not only by the
 * inactivity timeout (`timeoutMs`) that any line from the server resets: a server that keeps
 * writing continuation lines and never the last one is cut off, and the send fails as a timeout
 * at that point does (`bodySent` decides).
 * Not supported: connection pooling, proxies, DKIM (a send is one short connection, as nodemailer's
 * non-pooled transport does it).
 */
import { Readable } from "node:stream";
import SMTPConnection from "nodemailer/lib/smtp-connection";
import { SMTP_DEADLINE_MS, type SmtpConfig } from "./email-config.js";
import { scrubReply, type MessageContent } from "./email-reply.js";
import { tlsOptions } from "./email-tls.js";

/** What the server said about a message it took. */
export interface SmtpAnswer {
  readonly response: string;
  readonly accepted: readonly string[];
  readonly rejected: readonly string[];
  /** The server's code to RCPT TO for each of `rejected`, in its order; undefined when none was seen. */
  readonly rejectedCodes: readonly (number | undefined)[];
}

/**
 * What every error `sendRaw` rejects with carries: whether the message body was handed to the
 * server. Until then a lost connection sends nothing (RFC 5321 §3.8: the server drops an
 * unfinished transaction); after, the server may have taken it.
 */
export interface SendFailure {
  readonly bodySent: boolean;
}

/** `bodySent` of an error from `sendRaw`; undefined for an error that did not come from a send. */
export function bodySentOf(error: unknown): boolean | undefined {
  const sent = (error as Partial<SendFailure> | null)?.bodySent;
  return typeof sent === "boolean" ? sent : undefined;
}

/** The body was held back because of the server's RCPT answers: nothing was sent. */
export class EnvelopeRefusedError extends Error implements SendFailure {
  readonly code = "EENVELOPE";
  readonly command = "RCPT TO";
  readonly bodySent = false;
  constructor(
    message: string,
    /** The server's code for the refused journal address; absent when that is not why. */
    readonly responseCode: number | undefined,
    /** True when the journal address was refused (or its answer could not be seen): a configuration to fix. */
    readonly journalRefused: boolean,
  ) {
    super(message);
    this.name = "EnvelopeRefusedError";
  }
}

/** The operation's signal aborted the send; `bodySent` says whether the message may have gone out. */
export class SendAbortedError extends Error implements SendFailure {
  constructor(
    readonly bodySent: boolean,
    options: { cause: unknown },
  ) {
    super(
      bodySent
        ? "send aborted after the message was handed to the server: it may have been accepted"
        : "send aborted before the message was sent: nothing was sent",
      options,
    );
    this.name = "SendAbortedError";
  }
}

/**
 * The sender's address cannot go into MAIL FROM: nodemailer reads no address in the configured
 * `from` (or one it would refuse). Nothing was sent; a person fixes the config.
 */
export class InvalidSenderError extends Error implements SendFailure {
  readonly code = "EENVELOPE";
  readonly command = "MAIL FROM";
  readonly bodySent = false;
  constructor(readonly from: string) {
    super(`not sent: no sender address can be read in the configured from ${JSON.stringify(from)}; fix the config`);
    this.name = "InvalidSenderError";
  }
}

/**
 * The message could not be built from the args (nodemailer's render failed: an attachment it
 * could not read, say), before any connection: nothing left the process, and the same args
 * fail the same way.
 */
export class InvalidMessageError extends Error implements SendFailure {
  readonly bodySent = false;
  constructor(cause: unknown) {
    super(`not sent: the message could not be built: ${cause instanceof Error ? cause.message : String(cause)}`, {
      cause,
    });
    this.name = "InvalidMessageError";
  }
}

/** A message and its SMTP envelope, as nodemailer parsed it from the message's address fields. */
export interface Outgoing {
  /** The envelope sender: a bare address (`agent@example.com`), never a display name. */
  readonly from: string;
  /** Every envelope recipient (To, Cc, Bcc, the journal), bare addresses. */
  readonly to: readonly string[];
  readonly raw: Buffer;
  /** The journal address among `to`, parsed the same way: the body goes out only once the server accepted it. */
  readonly journal?: string | undefined;
  /**
   * What the message says (subject, text, HTML, attachments, header values): cut out of the
   * server's text before it is kept (email-reply.ts), since a content filter's reply quotes it.
   */
  readonly content?: readonly string[] | undefined;
}

/**
 * Sends `out.raw` to `out.to` over one SMTP connection. Resolves with the server's answer, or
 * rejects with an error carrying `bodySent` (SendFailure). nodemailer's and the server's text
 * is scrubbed (`scrubReply`: recipients hashed, the message's content cut out, bounded), since
 * reasons and receipts are stored.
 */
export function sendRaw(config: SmtpConfig, out: Outgoing, signal: AbortSignal): Promise<SmtpAnswer> {
  if (signal.aborted) return Promise.reject(new SendAbortedError(false, { cause: signal.reason }));
  // nodemailer's own rule for MAIL FROM (it refuses line breaks and angle brackets there).
  if (!out.from || /[\r\n<>]/.test(out.from)) return Promise.reject(new InvalidSenderError(out.from));
  const timeout = config.timeoutMs ?? 30_000;
  const deadlineMs = config.deadlineMs ?? SMTP_DEADLINE_MS;
  const conn = new SMTPConnection({
    host: config.host,
    port: config.port,
    secure: config.secure ?? false,
    // Without it, nodemailer upgrades only when the EHLO reply offers STARTTLS: that reply comes
    // in clear text, so a man in the middle who strips the offer gets AUTH PLAIN in clear.
    requireTLS: config.requireTLS ?? config.auth !== undefined,
    // The trust the config gives (its CA, name, version), for STARTTLS and implicit TLS alike;
    // only those three keys (tlsOptions), so verification stays on.
    tls: tlsOptions(config.tls),
    logger: false,
    connectionTimeout: timeout,
    greetingTimeout: timeout,
    socketTimeout: timeout,
  });
  const envelope: TrackedEnvelope = { from: out.from, to: [...out.to] };
  const recipients = out.to.filter((a) => a.toLowerCase() !== out.journal?.toLowerCase());
  const content: MessageContent = { recipients, fields: out.content ?? [] };
  let bodySent = false;

  return new Promise<SmtpAnswer>((resolve, reject) => {
    let settled = false;
    const finish = (error: unknown, answer?: SmtpAnswer) => {
      if (settled) return;
      settled = true;
      signal.removeEventListener("abort", onAbort);
      if (answer) {
        // The deadline still closes a QUIT the server never answers; the connection's end clears it.
        conn.quit();
        resolve(answer);
      } else {
        clearTimeout(deadline);
        conn.close();
        reject(failure(error, bodySent, content));
      }
    };
    // Coded as nodemailer codes its own timeouts, so it is classified as a timeout at the same
    // point is: `bodySent` (set by `failure`) says whether the message may have gone out.
    const deadline = setTimeout(() => {
      if (settled) return conn.close();
      finish(
        Object.assign(
          new Error(`no complete answer from the SMTP server within ${deadlineMs} ms (smtp.deadlineMs): closed`),
          { code: "ETIMEDOUT", command: "CONN", timeoutType: "DEADLINE" },
        ),
      );
    }, deadlineMs);
    conn.once("end", () => clearTimeout(deadline));
    const onAbort = () => finish(new SendAbortedError(bodySent, { cause: signal.reason }));
    signal.addEventListener("abort", onAbort, { once: true });
    conn.on("error", (e: unknown) => finish(e)); // `on`: a second error after the first must not go unhandled
    // A net under the callbacks, deferred: on a 421 nodemailer closes first, then fails the send
    // with the server's reply, which must win (421 is "not accepted", a bare close is ambiguous).
    conn.once("end", () =>
      setImmediate(() =>
        finish(Object.assign(new Error("Connection closed unexpectedly"), { code: "ECONNECTION", command: "CONN" })),
      ),
    );

    const body = new Readable({
      read() {
        const refused = out.journal === undefined ? undefined : refusal(envelope, out.journal);
        if (refused) {
          finish(refused); // closes the connection first, so the end of DATA can never be sent
          this.destroy(); // no error and no push(null): ending the stream would end the message
          return;
        }
        bodySent = true;
        this.push(out.raw);
        this.push(null);
      },
    });
    conn.connect((error) => {
      if (error) return finish(error);
      const send = () =>
        conn.send(envelope, body, (e, info) => {
          if (e || !info) return finish(e ?? new Error("SMTP send gave no answer"));
          const rejected = info.rejected.map(String);
          const codes = info.rejectedErrors ?? [];
          return finish(null, {
            response: scrubReply(String(info.response ?? ""), content),
            accepted: info.accepted.map(String),
            rejected,
            rejectedCodes: rejected.map((r) => codes.find((c) => c.recipient === r)?.responseCode),
          });
        });
      // As nodemailer's transport does: log in when the server offers AUTH.
      if (config.auth && conn.allowsAuth)
        conn.login({ user: config.auth.user, pass: config.auth.pass }, (e) => (e ? finish(e) : send()));
      else send();
    });
  });
}

/**
 * The error a send rejects with: ours as they are (they know `bodySent`, and quote no server), nodemailer's with
 * `bodySent` set and its message and the server's reply scrubbed (`scrubReply`).
 */
function failure(error: unknown, bodySent: boolean, content: MessageContent): SendFailure {
  if (error instanceof SendAbortedError || error instanceof EnvelopeRefusedError) return error;
  const e = error instanceof Error ? error : new Error(String(error), { cause: error });
  const reply = (e as { response?: unknown }).response;
  e.message = scrubReply(e.message, content);
  if (typeof reply === "string") Object.assign(e, { response: scrubReply(reply, content) });
  return Object.assign(e, { bodySent });
}

/**
 * The envelope as nodemailer tracks it: SMTPConnection keeps its RCPT bookkeeping (`accepted`,
 * `rejectedErrors`) on the envelope object it is given. The gate reads it there, and fails closed
 * if a later nodemailer stops doing so.
 */
interface TrackedEnvelope {
  from: string;
  to: string[];
  accepted?: string[];
  rejectedErrors?: { recipient?: string; responseCode?: number }[];
}

/** Why the body must not go out, judged on the server's RCPT answers; undefined when it may. */
function refusal(envelope: TrackedEnvelope, journal: string): EnvelopeRefusedError | undefined {
  if (!Array.isArray(envelope.accepted)) {
    return new EnvelopeRefusedError(
      "cannot see which recipients the server accepted, so not sending without a known journal copy",
      undefined,
      true,
    );
  }
  const j = journal.toLowerCase();
  const refused = envelope.rejectedErrors ?? [];
  if (!envelope.accepted.some((a) => a.toLowerCase() === j)) {
    const code = refused.find((e) => e.recipient?.toLowerCase() === j)?.responseCode;
    return new EnvelopeRefusedError(
      // Not the address itself: the reason reaches the caller (an agent's model), the operator knows their journal.
      `the server refused the journal address (${code ?? "no code"}): not sent, since no journal copy could prove it later`,
      code,
      true,
    );
  }
  if (!envelope.accepted.some((a) => a.toLowerCase() !== j)) {
    // Without the journal nodemailer fails this as "all recipients were rejected" (a 4xx, if any, decides).
    const code = (refused.find((e) => (e.responseCode ?? 0) < 500) ?? refused[0])?.responseCode;
    return new EnvelopeRefusedError("the server refused every recipient but the journal: not sent", code, false);
  }
  return undefined;
}
