/** classifyEmailError over the shapes nodemailer gives its errors, one case per reason. */
import { describe, expect, it } from "vitest";
import {
  EnvelopeRefusedError,
  InvalidSenderError,
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
    // A reply still decides, body or not.
    ["552 after the body", err({ code: "EMESSAGE", responseCode: 552, command: "DATA", bodySent: true }), "permanent"],
    ["451 after the body", err({ code: "EMESSAGE", responseCode: 451, command: "DATA", bodySent: true }), "transient"],
    ["an address refused locally, no body", err({ code: "EENVELOPE", command: "API", bodySent: false }), "permanent"],
    ["a configured from without an address", new InvalidSenderError("Agent"), "permanent"],
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

  it("flags a configured from without an address for an alert: a person fixes the config", () => {
    expect(classifyEmailError(new InvalidSenderError("Agent"))).toMatchObject({ kind: "permanent", alert: true });
  });
});
