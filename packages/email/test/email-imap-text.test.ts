/**
 * What an IMAP server's text does to the ledger, and how long the look after a failed APPEND may
 * run, against the mail sandbox's smtp-server and Dovecot, with a proxy in front of Dovecot that
 * answers a SEARCH or an APPEND as a test says (loopback.ts), on each database:
 *  - a server's refusal quoting the message (a filter on APPEND quoting its subject, a refusal
 *    naming a recipient) is stored as an SMTP reply is (email-reply.ts): the code and the server's
 *    own words, never what the message says, each recipient's address as its hash; in a receipt's
 *    `copyNotFiled`, a pre-send check's failure, a lookup's;
 *  - the look for the copy after an APPEND whose answer was lost ends when the operation's signal
 *    aborts (the caller gone, the lease lost), as every other lookup does: its session closed, the
 *    copy reported as perhaps not filed, not a session left running to its deadline.
 * Messages are counted at the server.
 */
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import type { Ledger } from "@idem/core";
import { openTestLedger, type TestLedgerOptions } from "@idem/core/testing";
import { MailSandbox, SENDER } from "@idem/sandbox";
import { DIALECTS, ledgersFor, scaled } from "@idem/testkit";
import { emailActions, recipientHash, type EmailConfig, type EmailReceipt } from "@idem/email";
import { appendFaultProxy } from "./loopback.js";

let sandbox: MailSandbox;
let smtpPort: number;
let proxy: Awaited<ReturnType<typeof appendFaultProxy>>;
beforeAll(async () => {
  sandbox = new MailSandbox({ mode: "none" });
  const started = await sandbox.start();
  smtpPort = started.smtp.port;
  proxy = await appendFaultProxy(started.imap.port);
}, scaled(30_000));
afterAll(async () => {
  await proxy?.close();
  await sandbox?.close();
});
afterEach(() => {
  proxy.faults.length = 0;
  proxy.searches.length = 0;
  proxy.onHold = undefined;
  sandbox.faults.clear();
});

/** Far longer than a test waits: a session that runs to it is one the signal did not end. */
const IMAP_DEADLINE_MS = scaled(20_000);

function config(mode: "append" | "provider-saves"): EmailConfig {
  sandbox.mode = mode === "append" ? "none" : mode;
  return {
    smtp: { host: "127.0.0.1", port: smtpPort, auth: SENDER, timeoutMs: 2_500, requireTLS: false },
    imap: { host: "127.0.0.1", port: proxy.port, auth: SENDER, requireTLS: false, deadlineMs: IMAP_DEADLINE_MS },
    from: SENDER.user,
    copy: { mode },
    settleMs: 300,
  };
}

/** What a customer wrote: none of it may reach the ledger. */
const SUBJECT = "Quarterly figures for Zephyrine Holdings";
const CLIENT = "zephyrine.cfo@example.test";
const letter = { to: CLIENT, subject: SUBJECT, text: "Revenue at the Brackenfield plant fell by 12 percent." };
const CUSTOMER = ["Quarterly figures", "Zephyrine", "Brackenfield", "zephyrine.cfo"];
let n = 0;
const tenant = () => `i${++n}-${Math.random().toString(36).slice(2, 7)}`;

/** The operation's row and its events, as the ledger stores them (its args aside: the caller's to keep). */
async function stored(l: Ledger, t: string, id: string): Promise<string> {
  const { operation, events } = await l.get({ tenant: t, id });
  return JSON.stringify({ operation: { ...operation, args: undefined }, events });
}

for (const dialect of DIALECTS) {
  describe(`IMAP server texts in the ledger, on ${dialect}`, () => {
    const db = ledgersFor<Ledger, TestLedgerOptions>(dialect, openTestLedger, { defaults: { poolSize: 2 } });

    it("append: an APPEND refused by a filter quoting the subject and the recipient: the receipt keeps the code and the server's words, not the customer's; one message", async () => {
      const l = await db.open();
      const t = tenant();
      proxy.faults.push({
        kind: "no",
        answer: `NO [CANNOT] Refused by content filter: subject "${SUBJECT} [ref:x]" to <${CLIENT}>`,
      });
      const before = sandbox.count();
      const out = await l.run(emailActions(config("append")).send, { tenant: t, key: ["quarterly"], args: letter });
      expect(out).toMatchObject({ status: "succeeded", receipt: { sent: true, copyNotFiled: { refused: true } } });
      const { copyNotFiled } = (out as { receipt: EmailReceipt & { copyNotFiled: { reason: string } } }).receipt;
      // Before: `… Refused by content filter: subject "Quarterly figures for Zephyrine Holdings …"`.
      expect(copyNotFiled.reason).toMatch(/CANNOT: Refused by content filter: subject "\[…\]/);
      expect(copyNotFiled.reason).toContain(recipientHash(CLIENT));
      const row = await stored(l, t, out.operationId);
      for (const customer of CUSTOMER) expect(row).not.toContain(customer);
      expect(sandbox.count() - before).toBe(1);
    });

    it("the check before sending: a SEARCH refused with a text quoting the subject and the recipient: stored without them; nothing sent", async () => {
      const l = await db.open();
      const t = tenant();
      proxy.searches.push({
        kind: "no",
        answer: `NO [UNAVAILABLE] Index rebuilding after "${SUBJECT}" for ${CLIENT}, try again`,
      });
      const before = sandbox.count();
      const out = await l.run(emailActions(config("provider-saves")).send, {
        tenant: t,
        key: ["checked"],
        args: letter,
        budget: { attempts: 1 },
      });
      expect(out).toMatchObject({ status: "pending_verification", state: "pending" });
      const row = await stored(l, t, out.operationId);
      // Before: the reason and error_json held the server's text as it came.
      expect(row).toContain("UNAVAILABLE: Index rebuilding after");
      expect(row).toContain(recipientHash(CLIENT));
      for (const customer of CUSTOMER) expect(row).not.toContain(customer);
      expect(sandbox.count() - before).toBe(0);
    });

    it("a lookup of an unknown outcome: a SEARCH refused with a text quoting the subject: the check's reason is stored without it", async () => {
      const l = await db.open({ actions: [emailActions(config("provider-saves")).send] });
      const t = tenant();
      // The server reads the body and closes without a reply: unknown, then looked up.
      sandbox.faults.add({ kind: "drop_data" });
      proxy.searches.push(
        { kind: "pass" },
        { kind: "no", answer: `NO [SERVERBUG] Search of "${SUBJECT}" for ${CLIENT} failed` },
      );
      const mail = emailActions(config("provider-saves")).send;
      const out = await l.run(mail, { tenant: t, key: ["looked-up"], args: letter, budget: { attempts: 1 } });
      expect(out).toMatchObject({ status: "pending_verification", state: "unknown" });
      const settled = await l.daemon.settle({ tenant: t, id: out.operationId, actor: "daemon" });
      expect(settled).toMatchObject({ status: "pending_verification", state: "unknown" });
      const { events } = await l.get({ tenant: t, id: out.operationId });
      expect(events.map((e) => e.reason).join("\n")).toMatch(
        /lookup failed: .*SERVERBUG: Search of "\[…\]" for sha256:/,
      );
      const row = await stored(l, t, out.operationId);
      for (const customer of CUSTOMER) expect(row).not.toContain(customer);
    });
  });

  describe(`the look for the copy after a failed APPEND, on ${dialect}`, () => {
    const db = ledgersFor<Ledger, TestLedgerOptions>(dialect, openTestLedger, { defaults: { poolSize: 2 } });

    it("the caller gives up while it waits on a server that does not answer: its session is closed, the copy reported as perhaps not filed; one message", async () => {
      const l = await db.open();
      const t = tenant();
      const caller = new AbortController();
      // The check before sending passes; the APPEND files the copy but its OK is lost; the look
      // for it that comes next is never answered, and the caller gives up then.
      proxy.searches.push({ kind: "pass" }, { kind: "hold" });
      proxy.faults.push({ kind: "drop-after-ok" });
      proxy.onHold = () => caller.abort(new Error("the caller gave up"));
      const before = sandbox.count();
      const out = await l.run(emailActions(config("append")).send, {
        tenant: t,
        key: ["held-look"],
        args: letter,
        signal: caller.signal,
      });
      expect(caller.signal.aborted).toBe(true);
      // Sent, so succeeded, though the caller gave up; its copy may be there, and the receipt says why that is not known.
      expect(out).toMatchObject({ status: "succeeded", receipt: { sent: true, copyNotFiled: { refused: false } } });
      const { copyNotFiled } = (out as { receipt: EmailReceipt & { copyNotFiled: { reason: string } } }).receipt;
      // Before: the look ran on past the signal until imapflow's 30 s inactivity timeout closed it
      // ("after 2 tries: MailboxUnavailableError: IMAP \\Sent: Connection not available").
      expect(copyNotFiled.reason).toMatch(
        /the lookup was given up before it could answer \(the caller gave up\): closed/,
      );
      const [row] = await l.admin.list({ tenant: t });
      expect(row).toMatchObject({ status: "succeeded" });
      expect(sandbox.count() - before).toBe(1);
    });
  });
}
