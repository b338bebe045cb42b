/** classifyEmailError over the shapes nodemailer gives its errors, one case per reason. */
import { describe, expect, it } from "vitest";
import {
  EnvelopeRefusedError,
  InvalidMessageError,
  InvalidSenderError,
  MailboxRefusedError,
  MailboxUnavailableError,
  SendAbortedError,
  classifyEmailError,
} from "@idem/email";

const err = (fields: Record<string, unknown>) => Object.assign(new Error("m"), fields);

describe("classifyEmailError", () => {
  it.each([
    ["the pre-send IMAP check failed", new MailboxUnavailableError("down"), "transient"],
    ["authentication refused", err({ code: "EAUTH", responseCode: 535, command: "AUTH PLAIN" }), "permanent"],
    [
      "authentication temporarily failing (454)",
      err({ code: "EAUTH", responseCode: 454, command: "AUTH PLAIN" }),
      "transient",
    ],
    // Any other 4xx at AUTH is the server's "not now" too: shutting down (421), a local error (451).
    ["421 at AUTH", err({ code: "EAUTH", responseCode: 421, command: "AUTH PLAIN" }), "transient"],
    ["451 at AUTH", err({ code: "EAUTH", responseCode: 451, command: "AUTH PLAIN" }), "transient"],
    // But a password that must be changed first (RFC 4954) waits for a person.
    ["432 password transition needed", err({ code: "EAUTH", responseCode: 432, command: "AUTH PLAIN" }), "permanent"],
    ["421 at MAIL FROM", err({ code: "EENVELOPE", responseCode: 421, command: "MAIL FROM" }), "transient"],
    ["450 at RCPT TO", err({ code: "EENVELOPE", responseCode: 450, command: "RCPT TO" }), "transient"],
    ["550 at RCPT TO", err({ code: "EENVELOPE", responseCode: 550, command: "RCPT TO" }), "permanent"],
    ["552 after the message", err({ code: "EMESSAGE", responseCode: 552, command: "DATA" }), "permanent"],
    ["an invalid address refused locally", err({ code: "EENVELOPE", command: "API" }), "permanent"],
    ["connection refused", err({ code: "ESOCKET", originalCode: "ECONNREFUSED", command: "CONN" }), "transient"],
    ["no greeting", err({ code: "ETIMEDOUT", timeoutType: "GREETING_TIMEOUT", command: "CONN" }), "transient"],
    [
      "a socket timeout, stage unknown",
      err({ code: "ETIMEDOUT", timeoutType: "SOCKET_TIMEOUT", command: "CONN" }),
      "ambiguous",
    ],
    ["the connection closed unexpectedly", err({ code: "ECONNECTION", command: "CONN" }), "ambiguous"],
    ["anything else", new Error("weird"), "ambiguous"],
    ["journal refused for now (450), body held back", new EnvelopeRefusedError("m", 450, true), "transient"],
    ["journal refused for good (550), body held back", new EnvelopeRefusedError("m", 550, true), "permanent"],
    ["every recipient but the journal refused (550)", new EnvelopeRefusedError("m", 550, false), "permanent"],
    ["aborted before the body was sent", new SendAbortedError(false, { cause: null }), "transient"],
    ["aborted after the body was sent", new SendAbortedError(true, { cause: null }), "ambiguous"],
    // A send's errors say whether the body left (bodySent): without a reply, that decides.
    [
      "EHOSTUNREACH after the body was sent (an ICMP error on an established connection)",
      err({ code: "ESOCKET", originalCode: "EHOSTUNREACH", command: "CONN", bodySent: true }),
      "ambiguous",
    ],
    [
      "ENETUNREACH after the body was sent",
      err({ code: "ESOCKET", originalCode: "ENETUNREACH", command: "CONN", bodySent: true }),
      "ambiguous",
    ],
    [
      "connection refused, nothing sent",
      err({ code: "ESOCKET", originalCode: "ECONNREFUSED", command: "CONN", bodySent: false }),
      "transient",
    ],
    [
      "the connection closed at EHLO, AUTH, MAIL, RCPT or DATA, before any body",
      err({ code: "ECONNECTION", command: "CONN", bodySent: false }),
      "transient",
    ],
    [
      "a socket timeout before any body",
      err({ code: "ETIMEDOUT", timeoutType: "SOCKET_TIMEOUT", command: "CONN", bodySent: false }),
      "transient",
    ],
    [
      "the connection closed after the body",
      err({ code: "ECONNECTION", command: "CONN", bodySent: true }),
      "ambiguous",
    ],
    // A refusal still decides, body or not; a 4xx after the body is no proof nothing was queued
    // (a server that queued it, then answered 451): the copy decides. Before: transient, sent again.
    ["552 after the body", err({ code: "EMESSAGE", responseCode: 552, command: "DATA", bodySent: true }), "permanent"],
    ["451 after the body", err({ code: "EMESSAGE", responseCode: 451, command: "DATA", bodySent: true }), "ambiguous"],
    ["421 after the body", err({ code: "EMESSAGE", responseCode: 421, command: "DATA", bodySent: true }), "ambiguous"],
    [
      "451 to DATA, no body",
      err({ code: "EMESSAGE", responseCode: 451, command: "DATA", bodySent: false }),
      "transient",
    ],
    ["an address refused locally, no body", err({ code: "EENVELOPE", command: "API", bodySent: false }), "permanent"],
    ["a configured from without an address", new InvalidSenderError("Agent"), "permanent"],
    // After the body only 250, 4yz or 5yz is a verdict (RFC 5321 §4.2, §4.3.2); nodemailer fails
    // anything else with EMESSAGE. Before: "rejected" (failed, replayed) though the server may have it.
    [
      'a reply after the body with no code ("OK queued")',
      err({ code: "EMESSAGE", response: "OK queued", command: "DATA", bodySent: true }),
      "ambiguous",
    ],
    [
      "a 354 after the body",
      err({ code: "EMESSAGE", responseCode: 354, command: "DATA", bodySent: true }),
      "ambiguous",
    ],
    ["an empty message, refused locally", err({ code: "EMESSAGE", command: "API", bodySent: false }), "rejected"],
    [
      "a message that could not be built (nothing left the process)",
      new InvalidMessageError(new Error("x")),
      "rejected",
    ],
    // TLS the config requires (requireTLS): nothing was sent, no credentials either.
    [
      "the server would not start TLS (STARTTLS answered 502)",
      err({ code: "ETLS", responseCode: 502, command: "STARTTLS", bodySent: false }),
      "permanent",
    ],
    [
      "TLS not available for now (454)",
      err({ code: "ETLS", responseCode: 454, command: "STARTTLS", bodySent: false }),
      "transient",
    ],
    [
      "EHLO refused, and HELO cannot start the TLS required",
      err({ code: "ECONNECTION", responseCode: 500, command: "EHLO", bodySent: false }),
      "permanent",
    ],
    [
      "a certificate the TLS handshake does not trust",
      err({
        code: "ETLS",
        command: "STARTTLS",
        message: "Error initiating TLS - self-signed certificate",
        bodySent: false,
      }),
      "permanent",
    ],
    // As nodemailer reports a certificate the handshake refused (STARTTLS or implicit TLS): a
    // socket error, the certificate's code kept in originalCode. Before: transient, no alert.
    [
      "a certificate not trusted, as nodemailer reports it (ESOCKET, the code in originalCode)",
      err({
        code: "ESOCKET",
        originalCode: "UNABLE_TO_VERIFY_LEAF_SIGNATURE",
        command: "CONN",
        message: "unable to verify the first certificate",
        bodySent: false,
      }),
      "permanent",
    ],
    [
      "no TLS version in common (minVersion above the server's)",
      err({ code: "ESOCKET", originalCode: "ERR_SSL_TLSV1_ALERT_PROTOCOL_VERSION", command: "CONN", bodySent: false }),
      "permanent",
    ],
    [
      "the connection lost during the TLS handshake",
      err({ code: "ETLS", command: "STARTTLS", message: "Error initiating TLS - read ECONNRESET", bodySent: false }),
      "transient",
    ],
  ])("%s: %s", (_what, error, kind) => {
    expect(classifyEmailError(error).kind).toBe(kind);
  });

  it("flags refused authentication for an alert", () => {
    expect(classifyEmailError(err({ code: "EAUTH", responseCode: 535 }))).toMatchObject({ alert: true });
  });

  it("flags a sender refused for good (5xx at MAIL FROM) for an alert, not a message too large for it", () => {
    // Every send from this address is refused until a person fixes the config or the account.
    for (const code of [530, 550, 553, 554])
      expect(
        classifyEmailError(err({ code: "EENVELOPE", responseCode: code, command: "MAIL FROM" })),
        String(code),
      ).toMatchObject({ kind: "permanent", alert: true });
    // 552 at MAIL FROM refuses this message's declared size: the caller's data.
    expect(classifyEmailError(err({ code: "EENVELOPE", responseCode: 552, command: "MAIL FROM" }))).not.toHaveProperty(
      "alert",
    );
    expect(classifyEmailError(err({ code: "EENVELOPE", responseCode: 550, command: "RCPT TO" }))).not.toHaveProperty(
      "alert",
    );
  });

  it("flags a journal address refused for good for an alert, not refused recipients", () => {
    expect(classifyEmailError(new EnvelopeRefusedError("m", 550, true))).toMatchObject({ alert: true });
    expect(classifyEmailError(new EnvelopeRefusedError("m", 550, false))).not.toHaveProperty("alert");
  });

  it("flags TLS the config requires that the server would not start for an alert (a config to fix, or a man in the middle)", () => {
    for (const error of [
      err({ code: "ETLS", responseCode: 502, command: "STARTTLS", bodySent: false }),
      err({ code: "ECONNECTION", responseCode: 502, command: "EHLO", bodySent: false }),
      err({
        code: "ETLS",
        command: "STARTTLS",
        message: "Error initiating TLS - self-signed certificate",
        bodySent: false,
      }),
    ])
      expect(classifyEmailError(error), (error as Error).message).toMatchObject({ kind: "permanent", alert: true });
    expect(classifyEmailError(err({ code: "ETLS", responseCode: 454, command: "STARTTLS" }))).not.toHaveProperty(
      "alert",
    );
  });

  it("flags a server certificate not trusted for an alert, as nodemailer reports it (ESOCKET at CONN, the code in originalCode)", () => {
    for (const originalCode of ["UNABLE_TO_VERIFY_LEAF_SIGNATURE", "ERR_TLS_CERT_ALTNAME_INVALID", "CERT_HAS_EXPIRED"])
      expect(
        classifyEmailError(err({ code: "ESOCKET", originalCode, command: "CONN", bodySent: false })),
        originalCode,
      ).toMatchObject({ kind: "permanent", alert: true, reason: expect.stringContaining(originalCode) });
    // A socket error that is no refusal of ours stays what it was: nothing sent, tried again.
    expect(
      classifyEmailError(err({ code: "ESOCKET", originalCode: "ECONNRESET", command: "CONN", bodySent: false })),
    ).toMatchObject({ kind: "transient" });
  });

  it("flags an IMAP refusal (sign-in, certificate) at the check before sending for an alert: nothing sent, a configuration to fix", () => {
    for (const refused of ["sign-in", "tls"] as const)
      expect(classifyEmailError(new MailboxRefusedError("m", refused)), refused).toMatchObject({
        kind: "permanent",
        alert: true,
      });
    expect(classifyEmailError(new MailboxUnavailableError("down"))).not.toHaveProperty("alert");
  });

  it("flags a configured from without an address for an alert: a person fixes the config", () => {
    expect(classifyEmailError(new InvalidSenderError("Agent"))).toMatchObject({ kind: "permanent", alert: true });
  });
});
