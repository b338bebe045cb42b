/**
 * The SMTP side against a scripted server on loopback (loopback.ts), for what the mail sandbox's
 * smtp-server cannot be made to say: a reply after the body that is no verdict, a recipient
 * deferred (4xx) among others, and a server that offers no STARTTLS (or a man in the middle that
 * took it out of the EHLO reply). The pre-send check and the copies go to the sandbox's Dovecot.
 */
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import { openLedger, type LedgerOptions } from "@idem/core";
import { MailSandbox, SENDER } from "@idem/sandbox";
import { DIALECTS, ledgersFor } from "@idem/testkit";
import {
  MailboxUnavailableError,
  classifyEmailError,
  emailActions,
  emailTools,
  recipientHash,
  type EmailConfig,
  type SentEmailReceipt,
} from "@idem/email";
import { recordingProxy, scriptedSmtp, type ScriptedSmtp } from "./loopback.js";
import { fresh } from "./operation.js";

let smtp: ScriptedSmtp;
let sandbox: MailSandbox;
let imapPort = 0;
beforeAll(async () => {
  smtp = await scriptedSmtp();
  sandbox = new MailSandbox({ mode: "none" });
  imapPort = (await sandbox.start()).imap.port;
}, 30_000);
afterAll(async () => {
  await smtp?.close();
  await sandbox?.close();
});
afterEach(() => smtp.reset());

/**
 * Append mode, the sandbox's IMAP for Sent. Neither loopback server offers TLS, so the config
 * says `requireTLS: false` on both sides, as a config for such a server must.
 */
const config = (): EmailConfig => ({
  smtp: { host: "127.0.0.1", port: smtp.port, auth: SENDER, timeoutMs: 2_500, requireTLS: false },
  imap: { host: "127.0.0.1", port: imapPort, auth: SENDER, requireTLS: false },
  from: SENDER.user,
  copy: { mode: "append" },
});
const mailer = (c: EmailConfig = config()) => emailActions(c);
/** `c` with `requireTLS` left to its default on one side. */
function byDefault(side: "smtp" | "imap", c: EmailConfig = config()): EmailConfig {
  const { requireTLS: _, ...rest } = c[side];
  return { ...c, [side]: rest };
}
const report = { to: "client@example.test", subject: "Weekly report", text: "Numbers." };

describe("a reply after the body that is no verdict (RFC 5321 §4.2, §4.3.2: only 250, 4yz or 5yz)", () => {
  // Before: nodemailer's EMESSAGE was read "rejected" (failed, replayed) though the server held
  // the message: the body had reached it, and the reply said neither yes nor no.
  for (const final of ["OK queued", " 250 queued", "354 again?"]) {
    it(`${JSON.stringify(final)}: the server holds the body, so it may have been sent: ambiguous, never failed`, async () => {
      smtp.script = { final };
      const error = await mailer()
        .send.execute(report, fresh())
        .catch((e: unknown) => e);
      expect(smtp.bodies).toHaveLength(1);
      expect(error).toMatchObject({ code: "EMESSAGE", bodySent: true });
      expect(classifyEmailError(error)).toMatchObject({ kind: "ambiguous" });
    });
  }

  it("a 5yz after the body still refuses (permanent); a 4yz may have been queued all the same (ambiguous: the copy decides)", async () => {
    for (const [final, kind] of [
      ["554 5.6.0 refused", "permanent"],
      ["451 4.3.0 try later", "ambiguous"],
    ] as const) {
      smtp.script = { final };
      const error = await mailer()
        .send.execute(report, fresh())
        .catch((e: unknown) => e);
      expect(classifyEmailError(error), final).toMatchObject({ kind });
    }
  });

  for (const dialect of DIALECTS) {
    describe(`through the ledger on ${dialect}`, () => {
      const db = ledgersFor(dialect, openLedger, { defaults: { poolSize: 2 } as LedgerOptions });
      it("append mode: unknown, and a person decides (its copy cannot prove absence); never failed, never sent twice", async () => {
        smtp.script = { final: "OK queued" };
        const l = await db.open();
        const out = await l.run(mailer().send, { tenant: "t", key: ["no-verdict"], args: report });
        expect(out).toMatchObject({ status: "pending_verification", state: "needs_review" });
        expect(smtp.bodies).toHaveLength(1);
      });
    });
  }
});

describe("recipients that did not take the message", () => {
  it("one deferred (450) and one refused (550) among accepted: sent, the receipt says which was which (hashed); the tool reads partially sent", async () => {
    // Before: `rejected` listed both alike, and the tool's summary read as a plain success.
    smtp.script = {
      rcpt: (a) =>
        a.startsWith("later") ? "450 4.2.1 mailbox busy" : a.startsWith("gone") ? "550 5.1.1 no such user" : "250 ok",
    };
    const to = ["client@example.test", "later@example.test", "gone@example.test"];
    const receipt = (await mailer().send.execute({ ...report, to }, fresh())) as SentEmailReceipt;
    expect(smtp.bodies).toHaveLength(1);
    expect(receipt).toMatchObject({
      sent: true,
      accepted: [recipientHash("client@example.test")],
      rejected: [recipientHash("later@example.test"), recipientHash("gone@example.test")],
      rejections: [
        { recipient: recipientHash("later@example.test"), kind: "deferred", code: 450 },
        { recipient: recipientHash("gone@example.test"), kind: "refused", code: 550 },
      ],
    });
    expect(JSON.stringify(receipt)).not.toContain("@example.test");
    const tool = emailTools(mailer()).send;
    expect(tool.summarize(receipt)).toEqual({
      messageId: receipt.messageId,
      delivery: expect.stringMatching(/^partially sent: 2 recipients did not take it \(1 deferred .*1 refused/),
    });
    // Everyone took it: the summary is the Message-ID alone, as before.
    const whole = (await mailer().send.execute(report, fresh())) as SentEmailReceipt;
    expect(whole.rejections).toEqual([]);
    expect(tool.summarize(whole)).toEqual({ messageId: whole.messageId });
  });
});

describe("credentials only over TLS", () => {
  it("SMTP, signing in without implicit TLS, the server offers no STARTTLS: no AUTH on the wire, nothing sent; failed with an alert", async () => {
    // Before: `secure: false` meant STARTTLS only when offered, so AUTH PLAIN (the password in
    // base64) went out in clear text to this server, or to a man in the middle.
    const mail = mailer(byDefault("smtp"));
    const error = await mail.send.execute(report, fresh()).catch((e: unknown) => e);
    expect(smtp.lines.filter((l) => /^AUTH/i.test(l))).toEqual([]);
    expect(smtp.bodies).toHaveLength(0);
    expect(error).toMatchObject({ bodySent: false });
    expect(classifyEmailError(error)).toMatchObject({ kind: "permanent", alert: true });
  });

  it("SMTP, requireTLS: false (a server on loopback): signs in without TLS, as configured", async () => {
    await mailer().send.execute(report, fresh());
    expect(smtp.lines.some((l) => /^AUTH PLAIN/i.test(l))).toBe(true);
    expect(smtp.bodies).toHaveLength(1);
  });

  it("IMAP, signing in without implicit TLS, the server offers no STARTTLS: no login on the wire; the check before sending is refused, nothing sent; failed with an alert", async () => {
    // Before: imapflow upgraded only when offered, so LOGIN went out in clear text.
    const proxy = await recordingProxy(imapPort);
    try {
      const viaProxy: EmailConfig = { ...config(), imap: { ...config().imap, port: proxy.port } };
      const mail = mailer(byDefault("imap", viaProxy));
      const error = await mail.send.execute(report, fresh()).catch((e: unknown) => e);
      expect(error).toBeInstanceOf(MailboxUnavailableError);
      expect(error).toMatchObject({
        name: "MailboxRefusedError",
        refused: "tls",
        message: expect.stringContaining("would not start TLS (requireTLS), no login sent"),
      });
      // As SMTP's: no check can pass until a person changes the config (or the man in the
      // middle is gone). Before: transient, retried with no alert.
      expect(classifyEmailError(error)).toMatchObject({ kind: "permanent", alert: true });
      expect(proxy.written.join("")).not.toMatch(/\b(LOGIN|AUTHENTICATE)\b/i);
      expect(proxy.written.join("")).not.toContain(SENDER.pass);
      expect(smtp.bodies).toHaveLength(0);
      // Said off, it signs in (the sandbox's Dovecot has no TLS): the same check passes.
      const off = mailer(viaProxy);
      expect(await off.send.execute(report, fresh())).toMatchObject({ sent: true });
      expect(proxy.written.join("")).toMatch(/\b(LOGIN|AUTHENTICATE)\b/i);
    } finally {
      await proxy.close();
    }
  });
});
