/**
 * Maps nodemailer errors (and our pre-send check) to the failure classes of @idem/core. An SMTP
 * reply is definitive: 4xx means not accepted, try later; 5xx means refused; but a 4xx after the
 * body is no proof that nothing was queued, so the copy decides (below). Without a reply (or
 * with one that is no verdict: after the data only 250, 4yz and 5yz are), what decides is
 * whether the body was handed to the server (`bodySent`, on every error a send rejects with,
 * email-smtp.ts): before, nothing was sent whatever the error (a server drops a transaction it
 * did not finish, RFC 5321 §3.8); after, the server may have taken the message, whatever the
 * error's code says (an EHOSTUNREACH can come on an established connection, an EMESSAGE for a
 * reply that is no verdict).
 * nodemailer reports socket errors and timeouts with command "CONN" whatever the stage, so its
 * codes alone cannot tell; they decide only for errors that carry no `bodySent`.
 */
import { neverSent, type Classification } from "@idem/core";
import { MailboxRefusedError, MailboxUnavailableError } from "./email-mailbox.js";
import { CopyChangedError } from "./email-reference.js";
import {
  EnvelopeRefusedError,
  InvalidMessageError,
  InvalidSenderError,
  SendAbortedError,
  bodySentOf,
} from "./email-smtp.js";
import { tlsRefusal } from "./email-tls.js";

interface NodemailerError {
  code?: string;
  originalCode?: string;
  command?: string;
  responseCode?: number;
  response?: string;
  timeoutType?: string;
  message?: string;
}

/**
 * Whether the server would not start the TLS the send requires: STARTTLS refused (5xx: offered
 * or not, requireTLS sends it), EHLO refused (nodemailer will not fall back to HELO, which cannot
 * start TLS), or a handshake that failed on the certificate. Not a 4xx, nor a handshake cut off.
 */
function tlsRefused(e: NodemailerError): boolean {
  const code = e.responseCode;
  if (code !== undefined && code >= 500 && (e.command === "STARTTLS" || e.command === "EHLO")) return true;
  return e.code === "ETLS" && code === undefined && /certificate|altnames|CERT_|self.signed/i.test(e.message ?? "");
}

export function classifyEmailError(error: unknown): Classification {
  if (error instanceof MailboxRefusedError) {
    // The check before sending was refused (the sign-in, the account's right to read the mailbox,
    // or the server's certificate by us), so nothing was sent; every later check meets the same
    // refusal until a person fixes the config or the account, as a refused SMTP sign-in. (In a
    // lookup, the same error leaves the outcome unknown: a refusal alerted, not a verdict.)
    return {
      kind: "permanent",
      reason: `not sent: the check before sending was refused: ${error.message}`,
      alert: true,
    };
  }
  if (error instanceof MailboxUnavailableError) {
    // The check before sending failed, so nothing was sent: retry later with the same Message-ID.
    return { kind: "transient", reason: `pre-send check failed, nothing sent: ${error.message}`, retryAfterMs: 5_000 };
  }
  if (error instanceof CopyChangedError) {
    // Refused before sending: the copy config changed since the operation's first attempt. It
    // stays refused until a person restores that config or sends it under a new key.
    return { kind: "permanent", reason: error.message, alert: true };
  }
  if (error instanceof EnvelopeRefusedError) {
    // We held the body back, so nothing was sent. A 4xx may pass; otherwise the journal (or every
    // recipient) refuses for good, and a refused journal is a configuration a person must fix.
    const code = error.responseCode;
    if (code !== undefined && code >= 400 && code < 500) return { kind: "transient", reason: error.message };
    return { kind: "permanent", reason: error.message, ...(error.journalRefused && { alert: true }) };
  }
  if (error instanceof SendAbortedError) {
    // Closed before the body was handed over: the server drops the transaction. After: it may have it.
    return error.bodySent ? { kind: "ambiguous", reason: error.message } : { kind: "transient", reason: error.message };
  }
  if (error instanceof InvalidSenderError) {
    // Refused before connecting: the configured from has no address to send from.
    return { kind: "permanent", reason: error.message, alert: true };
  }
  if (error instanceof InvalidMessageError) {
    // The message could not be built from the args, before any connection: nothing left the
    // process, and the same args would fail the same way.
    return { kind: "rejected", reason: error.message };
  }
  const e = (error ?? {}) as NodemailerError;
  const what = `${e.code ?? "error"}${e.command ? ` at ${e.command}` : ""}: ${e.message ?? String(error)}`;
  // A 4xx at AUTH is the server's "not now" (454: its auth backend is down, RFC 4954; 421: it is
  // shutting down; 451: a local error): it may pass. But a 432 (a password transition is needed)
  // and any 5xx refused sign-in are credentials a person must fix.
  const code = e.responseCode;
  if (e.code === "EAUTH" && code !== undefined && code >= 400 && code < 500 && code !== 432)
    return { kind: "transient", reason: what };
  if (e.code === "EAUTH" || e.code === "ENOAUTH") return { kind: "permanent", reason: what, alert: true };
  // TLS the config requires (requireTLS) that the server would not start: no credentials and no
  // message went out. A 4xx (454, RFC 3207) is "not now"; a refusal, a server that offers no
  // STARTTLS (or a man in the middle that took it out), an EHLO refused (HELO cannot start TLS)
  // or a certificate the handshake does not trust is a person's to fix, as a refused sign-in is.
  // A connection lost during the handshake took nothing either: tried again (below).
  if (code !== undefined && code >= 400 && code < 500 && e.command === "STARTTLS")
    return { kind: "transient", reason: `TLS not started, nothing sent: ${what}` };
  if (tlsRefused(e)) return { kind: "permanent", reason: `TLS not started, nothing sent: ${what}`, alert: true };
  // A certificate we do not trust (or no TLS version in common), at STARTTLS or at the connect of
  // implicit TLS: nodemailer codes it ESOCKET, the certificate's code in originalCode. Before any
  // credential or message, and no retry meets another certificate: a configuration to fix
  // (`smtp.tls`: the server's CA, its name), or a man in the middle.
  const untrusted = tlsRefusal(error, "the SMTP server");
  if (untrusted && bodySentOf(error) !== true)
    return { kind: "permanent", reason: `not sent: ${untrusted}`, alert: true };
  if (typeof e.responseCode === "number") {
    // The server answered: 4xx (including 421) did not accept the message, 5xx refused it.
    // But a 4xx after the body is not trusted as "not accepted": RFC 5321 says it is, yet a server
    // that queued the message and then answered 451 (a before-queue filter timing out after the
    // next hop took it, a queue that committed before a local error) exists, and a retry would be
    // a second email no one hears of. The Message-ID makes the copy findable, so the outcome is
    // unknown and the copy decides: found, sent once; proven absent past the settle window, sent
    // again (greylisting after DATA waits that window, well inside any greylist's retry period);
    // where absence cannot be proven (append), a person decides. Greylisting at RCPT TO, the usual
    // kind, held the body back (`bodySent` false) and is still retried at once.
    if (e.responseCode >= 400 && e.responseCode < 500 && bodySentOf(error) === true)
      return {
        kind: "ambiguous",
        reason: `deferred by the SMTP server after the message (${what}): it may have queued it all the same, so its copy decides`,
      };
    if (e.responseCode >= 400 && e.responseCode < 500) return { kind: "transient", reason: what };
    // A 5xx after the body stays a refusal, unlike a 4xx there: it is what content filters answer
    // every message they refuse (RFC 5321 §4.2.5: no delivery is attempted after it). Read as
    // unknown, each would be sent again past the settle window, to be refused again (append: each
    // left to a person), and the agent told "pending" instead of why. A server that queued it all
    // the same leaves a ledger that says failed, not a second email: failed is final for the key.
    // A person's retry of it looks for the copy first (`mayHaveTaken`, below), within the settle
    // window: a copy the server files late is found, not sent twice (email-retry-states.test).
    // A 5xx to MAIL FROM refuses the sender (not allowed, authentication required): every send
    // from it will be, until a person fixes the config or the account. Not a 552 there: it
    // refuses this message's declared size.
    const sender = e.command === "MAIL FROM" && e.responseCode !== 552;
    // After the body, the server had the message when it refused: `mayHaveTaken`, so a person's
    // retry looks for its copy first (a server that queued it all the same files it late).
    const taken = bodySentOf(error) === true;
    if (e.responseCode >= 500)
      return { kind: "permanent", reason: what, ...(sender && { alert: true }), ...(taken && { mayHaveTaken: true }) };
  }
  // No verdict: the body decides. Handed over, the server may have it, so ambiguous whatever the
  // code: a reply lost, a socket error after the final dot, or a reply that is no verdict (after
  // the data only 250, 4yz or 5yz are, RFC 5321 §4.2, §4.3.2: nodemailer fails an "OK queued" or
  // a 354 there as EMESSAGE, which is no refusal). Not yet, the server discards the transaction,
  // so nothing was sent (a drop at EHLO, AUTH, MAIL, RCPT or DATA).
  const bodySent = bodySentOf(error);
  if (bodySent === true) {
    const said = typeof e.response === "string" ? "no verdict" : "no answer";
    return { kind: "ambiguous", reason: `${said} from the SMTP server after the message: ${what}` };
  }
  if (e.code === "EENVELOPE") return { kind: "permanent", reason: what }; // bad addresses, refused locally: no DATA was sent
  // Refused locally before any body (an empty message, one over the server's SIZE) or a bad config.
  if (e.code === "EMESSAGE" || e.code === "ESTREAM" || e.code === "ECONFIG") return { kind: "rejected", reason: what };
  if (bodySent === false)
    return { kind: "transient", reason: `not sent (no message body reached the server): ${what}` };
  // An error from elsewhere than a send: its code is all there is.
  if (neverSent(error)) return { kind: "transient", reason: `not connected: ${what}` };
  if (e.timeoutType === "CONNECT_TIMEOUT" || e.timeoutType === "GREETING_TIMEOUT")
    return { kind: "transient", reason: `no greeting: ${what}` };
  return { kind: "ambiguous", reason: `no answer from the SMTP server: ${what}` };
}
