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
import { createHash } from "node:crypto";
import { InvalidValueError, canonicalJson, type Json, type Ledger } from "@idem/core";
import { databaseOf, openTestLedger, type TestLedgerOptions } from "@idem/core/testing";
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

type Attachment = NonNullable<EmailArgs["attachments"]>[number];
const attach = (extra: Record<string, unknown>) => ({
  ...report,
  attachments: [{ filename: "a.txt", content: "hello", ...extra } as unknown as Attachment],
});
/** Args nodemailer would write into a header nodemailer writes itself, or a part header as it is. */
const REFUSED: { name: string; args: EmailArgs; message: RegExp }[] = [
  {
    // Before: the message went out with two Content-Type lines (the caller's, then nodemailer's).
    name: "a Content-Type header (nodemailer writes its own: the message had two)",
    args: { ...report, headers: { "content-type": "text/html" } },
    message: /headers may not set "content-type": nodemailer writes it/,
  },
  {
    // Before: written as it was, every recipient read it, and its address was a recipient too.
    name: "a Bcc header (written into the message every recipient reads)",
    args: { ...report, headers: { Bcc: "hidden@example.test" } },
    message: /headers may not set "Bcc"/,
  },
  {
    name: "a MIME-Version header (nodemailer's own is replaced by it)",
    args: { ...report, headers: { "MIME-Version": "2.0" } },
    message: /headers may not set "MIME-Version"/,
  },
  {
    name: "an attachment's Content-Type part header (the part had two)",
    args: attach({ headers: { "Content-Type": "text/html" } }),
    message: /attachments\[0\] has headers that may not set "Content-Type"/,
  },
  {
    // Before: written as it was, its CR LF adding a header line to the part.
    name: "an attachment's contentDisposition given as a prepared value",
    args: attach({ contentDisposition: { prepared: true, value: "attachment\r\nX-Injected: 1" } }),
    message: /attachments\[0\] has a contentDisposition that must be "attachment" or "inline"/,
  },
  {
    name: "an attachment's contentType given as a prepared value",
    args: attach({ contentType: { prepared: true, value: "text/plain\r\nX-Injected: 1" } }),
    message: /attachments\[0\] has a contentType that must be a string/,
  },
  {
    name: "an attachment's cid with a line break",
    args: attach({ cid: "logo\r\nBcc: hidden@example.test" }),
    message: /attachments\[0\] has a cid that must be a string .*line break/,
  },
  {
    name: "an attachment key nodemailer reads that content does not need (httpHeaders)",
    args: attach({ httpHeaders: { Authorization: "x" } }),
    message: /attachments\[0\] gives httpHeaders/,
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

    for (const c of REFUSED)
      it(`${c.name}: refused before anything is claimed, nothing sent`, async () => {
        const { send } = mail();
        const ledger = await db.open({ actions: [send] });
        const tenant = `hdr-${dialect}-${Math.random().toString(36).slice(2, 7)}`;
        const before = sandbox.count();
        const out = await ledger.run(send, { tenant, key: ["weekly"], args: c.args }).catch((e: unknown) => e);
        expect({ sent: sandbox.count() - before, out }).toMatchObject({
          sent: 0,
          out: expect.any(InvalidValueError),
        });
        expect((out as Error).message).toMatch(c.message);
        expect(await ledger.admin.list({ tenant })).toEqual([]);
      });

    it("an inline image (cid, contentDisposition inline) and a Reply-To header: sent once as given", async () => {
      const { send } = mail();
      const ledger = await db.open({ actions: [send] });
      const tenant = `hdr-${dialect}-${Math.random().toString(36).slice(2, 7)}`;
      const args = {
        ...attach({ cid: "logo@example.test", contentDisposition: "inline", contentType: "image/png" }),
        headers: { "Reply-To": "desk@example.test" },
      };
      const out = await ledger.run(send, { tenant, key: ["inline"], args });
      expect(out).toMatchObject({ status: "succeeded", receipt: { sent: true } });
      const messageId = out.status === "succeeded" ? (out.receipt as { messageId: string }).messageId : "";
      const raw = sandbox.received.find((m) => m.messageId === messageId)!.raw.toString("latin1");
      expect(raw).toMatch(/^Content-ID: <logo@example\.test>$/m);
      expect(raw).toMatch(/^Content-Disposition: inline/m);
      expect(raw).toMatch(/^Reply-To: desk@example\.test$/m);
    });

    it("an operation an earlier version stored with args now refused: the daemon fails it, nothing sent", async () => {
      // Before: the daemon sent the stored args as they were, never asking validate: the object
      // header value's CR LF ended the header before the Message-ID.
      const { send } = mail();
      const ledger = await db.open({ actions: [send], budget: { attempts: 1 } });
      const tenant = `hdr-${dialect}-${Math.random().toString(36).slice(2, 7)}`;
      sandbox.faults.add({ kind: "reject_421" });
      const first = await ledger.run(send, { tenant, key: ["stored"], args: report });
      expect(first).toMatchObject({ status: "pending_verification", state: "pending" });
      // What a version without the header check stored: a value nodemailer writes as it is.
      const old = { ...report, headers: { "X-Trace": { prepared: true, value: "1\r\n\r\n" } } };
      const json = canonicalJson(old as unknown as Json, "args");
      await databaseOf(ledger)
        .updateTable("idem_operations")
        .set({ args_json: json, args_hash: createHash("sha256").update(json).digest("hex") })
        .where("id", "=", first.operationId)
        .execute();
      const before = sandbox.count();
      const settled = await ledger.daemon.settle({ tenant, id: first.operationId, actor: "daemon" });
      expect({ sent: sandbox.count() - before, settled }).toMatchObject({
        sent: 0,
        settled: {
          status: "failed",
          error: { kind: "rejected", reason: expect.stringMatching(/headers\["X-Trace"\] must be a string/) },
        },
      });
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
