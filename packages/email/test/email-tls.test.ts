/**
 * TLS with a private CA, and sign-ins Dovecot refuses. The mail sandbox serves a certificate that a
 * CA made for this file signed (certificates.ts): SMTP with STARTTLS and on an implicit-TLS port,
 * Dovecot the same. A client trusts it only when given that CA (`tls.ca`); verification is never
 * off. What is sent, how each refusal is classified, and what the ledger does with it.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { openLedger, type LedgerOptions } from "@idem/core";
import { Dovecot, MailSandbox, SENDER } from "@idem/sandbox";
import { DIALECTS, ledgersFor, scaled } from "@idem/testkit";
import {
  MailboxUnavailableError,
  classifyEmailError,
  emailActions,
  type EmailConfig,
  type ImapConfig,
  type SmtpConfig,
} from "@idem/email";
// The adapter's own IMAP client, to look at a mailbox the way its lookups do (not exported).
import { Mailbox } from "../src/email-mailbox.js";
import { testPki, type TestPki } from "./certificates.js";
import { fresh } from "./operation.js";

let pki: TestPki;
let sandbox: MailSandbox;
let ports: { smtp: number; smtps: number; imap: number; imaps: number };
beforeAll(async () => {
  pki = testPki();
  sandbox = new MailSandbox({ tls: { cert: pki.cert, key: pki.key } });
  const s = await sandbox.start();
  ports = { smtp: s.smtp.port, smtps: s.smtps!.port, imap: s.imap.port, imaps: s.imaps!.port };
}, scaled(30_000));
afterAll(async () => {
  await sandbox?.close();
  pki?.remove();
});

const host = "127.0.0.1";
const wrong = { user: SENDER.user, pass: "not-the-password" };
/** SMTP on the STARTTLS port, trusting the sandbox's CA; `over` replaces fields (`tls: undefined` drops it). */
function smtp(over: Partial<Record<keyof SmtpConfig, unknown>> = {}): SmtpConfig {
  return dropUndefined({ host, port: ports.smtp, auth: SENDER, timeoutMs: 5_000, tls: { ca: pki.ca }, ...over });
}
function imap(over: Partial<Record<keyof ImapConfig, unknown>> = {}): ImapConfig {
  return dropUndefined({ host, port: ports.imap, auth: SENDER, tls: { ca: pki.ca }, ...over });
}
function dropUndefined<T>(o: Record<string, unknown>): T {
  return Object.fromEntries(Object.entries(o).filter(([, v]) => v !== undefined)) as T;
}
function config(over: Partial<EmailConfig> = {}): EmailConfig {
  return { smtp: smtp(), imap: imap(), from: SENDER.user, copy: { mode: "provider-saves" }, settleMs: 300, ...over };
}
const report = { to: "client@example.test", subject: "Weekly report", text: "Numbers." };

describe("trust options", () => {
  it("refuses what would not do what it says: an option to turn verification off, a CA's file name for its contents, TLS below 1.2, a name with a space", () => {
    // Before: the config held no TLS options; anything given was dropped without a word.
    expect(() => emailActions(config({ smtp: smtp({ tls: { rejectUnauthorized: false } }) }))).toThrow(
      /smtp\.tls: unknown option rejectUnauthorized; the server's certificate is always verified/,
    );
    expect(() => emailActions(config({ imap: imap({ tls: { ca: pki.caFile } }) }))).toThrow(
      /imap\.tls\.ca: must hold PEM certificates .*not its name/,
    );
    const journal = {
      mode: "journal" as const,
      address: "journal@idem.test",
      imap: imap({ tls: { minVersion: "TLSv1" } }),
    };
    expect(() => emailActions(config({ copy: journal }))).toThrow(/copy\.imap\.tls\.minVersion/);
    expect(() => emailActions(config({ smtp: smtp({ tls: { servername: "mail example" } }) }))).toThrow(
      /smtp\.tls\.servername: must be a host name/,
    );
    expect(() => emailActions(config({ smtp: smtp({ tls: { ca: [] } }) }))).toThrow(/smtp\.tls\.ca/);
    // A CA's certificate, a list of them, the name and version: taken.
    const taken = { ca: [pki.ca, pki.otherCa], servername: "localhost", minVersion: "TLSv1.3" };
    expect(() => emailActions(config({ smtp: smtp({ tls: taken }), imap: imap({ tls: taken }) }))).not.toThrow();
  });
});

describe("SMTP with a private CA", () => {
  for (const [name, secure] of [
    ["STARTTLS", false],
    ["implicit TLS", true],
  ] as const) {
    const at = () => (secure ? { port: ports.smtps, secure: true } : {});

    it(`${name}, the CA not given (or another CA): the handshake refuses the certificate; nothing sent, a configuration to fix (failed, alerted)`, async () => {
      for (const tls of [undefined, { ca: pki.otherCa }]) {
        const before = sandbox.count();
        const mail = emailActions(config({ smtp: smtp({ ...at(), tls }) }));
        const error = await mail.send.execute(report, fresh()).catch((e: unknown) => e);
        expect(error, String(error)).toMatchObject({ bodySent: false });
        // Before: "transient: not sent" (nodemailer codes it ESOCKET, the certificate's code in
        // originalCode): retried for ever, and nobody heard that no send could ever pass.
        expect(classifyEmailError(error)).toMatchObject({
          kind: "permanent",
          alert: true,
          reason: expect.stringMatching(
            /^not sent: the SMTP server.s certificate is not trusted \(UNABLE_TO_VERIFY_LEAF_SIGNATURE/,
          ),
        });
        expect(sandbox.count()).toBe(before);
      }
    });

    it(`${name}, trusting the CA: sent once`, async () => {
      const before = sandbox.count();
      // Before: `tls` was not handed to nodemailer, so the same refusal as without it.
      const out = await emailActions(config({ smtp: smtp(at()) }))
        .send.execute(report, fresh())
        .catch((e: unknown) => e);
      expect(out, String(out)).toMatchObject({ sent: true });
      expect(sandbox.count()).toBe(before + 1);
    });
  }

  it("the certificate must carry `servername` when one is given: one it does not carry is refused, its own passes", async () => {
    const other = await emailActions(config({ smtp: smtp({ tls: { ca: pki.ca, servername: "mail.other.test" } }) }))
      .send.execute(report, fresh())
      .catch((e: unknown) => e);
    expect(classifyEmailError(other)).toMatchObject({
      kind: "permanent",
      alert: true,
      reason: expect.stringContaining("ERR_TLS_CERT_ALTNAME_INVALID"),
    });
    const own = await emailActions(config({ smtp: smtp({ tls: { ca: pki.ca, servername: "localhost" } }) }))
      .send.execute(report, fresh())
      .catch((e: unknown) => e);
    expect(own, String(own)).toMatchObject({ sent: true });
  });
});

describe("IMAP with a private CA", () => {
  for (const [name, secure] of [
    ["STARTTLS", false],
    ["implicit TLS", true],
  ] as const) {
    const at = () => (secure ? { port: ports.imaps, secure: true } : {});

    it(`${name}, the CA not given: the check before sending is refused; nothing sent, failed with an alert`, async () => {
      for (const tls of [undefined, { ca: pki.otherCa }]) {
        const before = sandbox.count();
        const mail = emailActions(config({ imap: imap({ ...at(), tls }) }));
        const error = await mail.send.execute(report, fresh()).catch((e: unknown) => e);
        expect(error).toBeInstanceOf(MailboxUnavailableError);
        // Before: "IMAP … unreachable", classified transient: retried for ever, no alert.
        expect(error).toMatchObject({
          name: "MailboxRefusedError",
          refused: "tls",
          message: expect.stringMatching(/the server's certificate is not trusted \(UNABLE_TO_VERIFY_LEAF_SIGNATURE/),
        });
        expect(classifyEmailError(error)).toMatchObject({ kind: "permanent", alert: true });
        expect(sandbox.count()).toBe(before);
      }
    });

    it(`${name}, trusting the CA: the check runs, sent once`, async () => {
      const before = sandbox.count();
      const out = await emailActions(config({ imap: imap(at()) }))
        .send.execute(report, fresh())
        .catch((e: unknown) => e);
      expect(out, String(out)).toMatchObject({ sent: true });
      expect(sandbox.count()).toBe(before + 1);
    });
  }

  it("a pinned self-signed certificate: trusted when given as the CA, refused otherwise", async () => {
    const own = new Dovecot([SENDER], { tls: pki.selfSigned });
    const { port } = await own.start();
    try {
      const pinned = new Mailbox(imap({ port, tls: { ca: pki.selfSigned.cert } }), "\\Sent");
      expect(await pinned.find("<nothing@idem.test>")).toBeUndefined();
      const other = new Mailbox(imap({ port, tls: { ca: pki.ca } }), "\\Sent");
      await expect(other.find("<nothing@idem.test>")).rejects.toMatchObject({
        name: "MailboxRefusedError",
        refused: "tls",
      });
    } finally {
      await own.stop();
    }
  });
});

describe("a sign-in Dovecot refuses", () => {
  it("at the check before sending: nothing sent, failed with an alert (a credential to fix), not retried for ever", async () => {
    const before = sandbox.count();
    const error = await emailActions(config({ imap: imap({ auth: wrong }) }))
      .send.execute(report, fresh())
      .catch((e: unknown) => e);
    // Before: "IMAP … unreachable: Command failed", transient.
    expect(error).toMatchObject({
      name: "MailboxRefusedError",
      refused: "sign-in",
      responseCode: "AUTHENTICATIONFAILED",
      message: expect.stringContaining("refused the sign-in of agent@idem.test (AUTHENTICATIONFAILED"),
    });
    expect((error as Error).message).not.toContain(wrong.pass);
    expect(classifyEmailError(error)).toMatchObject({ kind: "permanent", alert: true });
    expect(sandbox.count()).toBe(before);
  });

  it("at a lookup (reconcile): the refusal is said as such and classified for an alert; the lookup proves nothing", async () => {
    for (const over of [{ auth: wrong }, { tls: undefined }]) {
      const mail = emailActions(config({ imap: imap(over) }));
      const error = await Promise.resolve()
        .then(() => mail.send.reconcile!(report, fresh()))
        .catch((e: unknown) => e);
      expect(error).toMatchObject({ name: "MailboxRefusedError" });
      expect(classifyEmailError(error)).toMatchObject({ alert: true });
    }
  });
});

for (const dialect of DIALECTS) {
  describe(`through the ledger on ${dialect}`, () => {
    const db = ledgersFor(dialect, openLedger, { defaults: { poolSize: 2 } as LedgerOptions });
    let n = 0;
    const tenant = () => `t${++n}-${Math.random().toString(36).slice(2, 7)}`;

    it("SMTP without the CA: failed, not sent, alerted; the same key with the CA after a person's retry: sent once", async () => {
      const l = await db.open();
      const t = tenant();
      const before = sandbox.count();
      const refused = await l.run(emailActions(config({ smtp: smtp({ tls: undefined }) })).send, {
        tenant: t,
        key: ["tls"],
        args: report,
      });
      expect(refused).toMatchObject({ status: "failed", error: { kind: "permanent", alert: true } });
      expect((await l.daemon.alertsDue({ limit: 1_000 })).map((o) => o.id)).toContain(refused.operationId);
      expect(sandbox.count()).toBe(before);
      const trusted = await l.run(emailActions(config()).send, { tenant: t, key: ["tls-fixed"], args: report });
      expect(trusted).toMatchObject({ status: "succeeded", receipt: { sent: true } });
      expect(sandbox.count()).toBe(before + 1);
    });

    it("IMAP sign-in refused before sending: failed, not sent, alerted", async () => {
      const l = await db.open();
      const t = tenant();
      const before = sandbox.count();
      const out = await l.run(emailActions(config({ imap: imap({ auth: wrong }) })).send, {
        tenant: t,
        key: ["sign-in"],
        args: report,
      });
      expect(out).toMatchObject({ status: "failed", error: { kind: "permanent", alert: true } });
      expect((await l.daemon.alertsDue({ limit: 1_000 })).map((o) => o.id)).toContain(out.operationId);
      expect(sandbox.count()).toBe(before);
    });

    for (const [what, over] of [
      ["the sign-in refused (a password changed)", { auth: wrong }],
      ["the certificate not trusted (the CA left out)", { tls: undefined }],
    ] as const) {
      it(`a lookup of an unknown send refused, ${what}: stays unknown, alerted; fixed, found; one message`, async () => {
        const t = tenant();
        // Accepted, then the client timed out: unknown (the agent's budget: no lookup of its own).
        sandbox.faults.add({ kind: "hold_reply", delayMs: 5_000 });
        const agent = await db.open({ budget: { attempts: 1 } });
        const sending = emailActions(config({ smtp: smtp({ timeoutMs: 1_000 }) })).send;
        const out = await agent.run(sending, { tenant: t, key: ["held", what], args: report });
        expect(out).toMatchObject({ status: "pending_verification", state: "unknown" });
        const sent = sandbox.count();
        // The daemon's config: its IMAP refused. Each check stays unknown (nothing is known of the
        // send), and the refusal asks for an alert. Before: "lookup failed", unknown, no alert.
        const refusing = await db.open({ actions: [emailActions(config({ imap: imap(over) })).send] });
        for (let check = 0; check < 2; check++) {
          const settled = await refusing.daemon.settle({ tenant: t, id: out.operationId });
          expect(settled).toMatchObject({ status: "pending_verification", state: "unknown" });
          const alerts = (await refusing.daemon.alertsDue({ limit: 1_000 })).filter((a) => a.tenant === t);
          expect(alerts).toMatchObject([
            {
              id: out.operationId,
              status: "unknown",
              reason: expect.stringMatching(/MailboxRefusedError: .*(refused the sign-in|certificate is not trusted)/),
            },
          ]);
        }
        // Fixed: the lookup finds the copy; nothing was sent again.
        const fixed = await db.open({ actions: [sending] });
        expect(await fixed.daemon.settle({ tenant: t, id: out.operationId })).toMatchObject({
          status: "succeeded",
          receipt: { foundIn: "Sent" },
        });
        expect(sandbox.count()).toBe(sent);
      });
    }
  });
}
