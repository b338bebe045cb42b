/**
 * What args can put into the message's header. nodemailer writes a header value given as a
 * string with its line breaks as spaces, but one given as an object `{ prepared: true, value }`
 * exactly as it is: its CR LF start header lines of the caller's (a Bcc line every recipient
 * reads) or end the header there, the action's Message-ID, X-Idem-Key, From, To and Subject then
 * read as body. A copy without its Message-ID is one no lookup finds: past the settle window
 * "absent", and the email is sent again. Args come as JSON too (a model's tool call, the stored
 * args the daemon sends again), where the TypeScript type checks nothing. Real smtp-server and
 * Dovecot (the mail sandbox) and the ledger on each database; messages counted at the server.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { InvalidValueError, type Ledger } from "@idem/core";
import { openTestLedger, type TestLedgerOptions } from "@idem/core/testing";
import { MailSandbox, SENDER } from "@idem/sandbox";
import { DIALECTS, ledgersFor, scaled } from "@idem/testkit";
import { emailActions, type EmailArgs } from "@idem/email";

let sandbox: MailSandbox;
let ports: { smtp: number; imap: number };
beforeAll(async () => {
  sandbox = new MailSandbox({ mode: "provider-saves" });
  const s = await sandbox.start();
  ports = { smtp: s.smtp.port, imap: s.imap.port };
}, scaled(30_000));
afterAll(() => sandbox?.close());

const mail = () =>
  emailActions({
    smtp: { host: "127.0.0.1", port: ports.smtp, auth: SENDER, requireTLS: false },
    imap: { host: "127.0.0.1", port: ports.imap, auth: SENDER, requireTLS: false },
    from: SENDER.user,
    copy: { mode: "provider-saves" },
  });
const report = { to: "client@example.test", subject: "Weekly report", text: "Numbers." };

const INJECTIONS: { name: string; args: EmailArgs }[] = [
  {
    name: "a header value that ends the header (the Message-ID then body)",
    args: { ...report, headers: { "X-Trace": { prepared: true, value: "1\r\n\r\n" } as unknown as string } },
  },
  {
    name: "a header value that adds a Bcc line",
    args: {
      ...report,
      headers: { "X-Trace": { prepared: true, value: "1\r\nBcc: hidden@example.test" } as unknown as string },
    },
  },
  {
    name: "an attachment's header that adds lines to its part",
    args: {
      ...report,
      attachments: [
        {
          filename: "a.txt",
          content: "hello",
          headers: { "X-Part": { prepared: true, value: "1\r\n\r\nX-Other: 2" } },
        } as unknown as NonNullable<EmailArgs["attachments"]>[number],
      ],
    },
  },
];

for (const dialect of DIALECTS) {
  describe(`header values from args, on ${dialect}`, () => {
    const db = ledgersFor<Ledger, TestLedgerOptions>(dialect, openTestLedger, { defaults: { poolSize: 2 } });

    for (const c of INJECTIONS)
      it(`${c.name}: refused before anything is claimed, nothing sent`, async () => {
        const { send } = mail();
        const ledger = await db.open({ actions: [send] });
        const tenant = `hdr-${dialect}-${Math.random().toString(36).slice(2, 7)}`;
        const before = sandbox.count();
        const out = await ledger.run(send, { tenant, key: ["weekly"], args: c.args }).catch((e: unknown) => e);
        // Before: succeeded, the message sent with the caller's raw lines in its header.
        expect({ sent: sandbox.count() - before, out }).toMatchObject({
          sent: 0,
          out: expect.any(InvalidValueError),
        });
        expect((out as Error).message).toMatch(/headers\[".*"\] (that )?must be a string/);
        expect(await ledger.admin.list({ tenant })).toEqual([]);
      });

    it("a subject and a header value (strings) with line breaks: written on one line each, sent once, its copy found", async () => {
      const { send } = mail();
      const ledger = await db.open({ actions: [send] });
      const tenant = `hdr-${dialect}-${Math.random().toString(36).slice(2, 7)}`;
      const args = {
        ...report,
        subject: "Report\r\nBcc: hidden@example.test",
        headers: { "X-Trace": "1\r\n\r\nX: 2" },
      };
      const out = await ledger.run(send, { tenant, key: ["weekly"], args });
      expect(out).toMatchObject({ status: "succeeded", receipt: { sent: true } });
      const messageId = out.status === "succeeded" ? (out.receipt as { messageId: string }).messageId : "";
      const [received] = sandbox.received.filter((m) => m.messageId === messageId);
      const header = received!.raw.toString("latin1").split("\r\n\r\n")[0]!;
      expect(header).not.toMatch(/^Bcc:/im);
      expect(header).not.toMatch(/^X: 2/im);
      expect(await sandbox.copies(SENDER, "Sent", messageId)).toBe(1);
      // The check before a second send finds it: nothing more goes out.
      expect(await ledger.run(send, { tenant, key: ["weekly"], args })).toMatchObject({ replayed: true });
      expect(sandbox.count(messageId)).toBe(1);
    });
  });
}
