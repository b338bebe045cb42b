/**
 * A journal mailbox or Sent folder the account may not read: Dovecot's ACL plugin (the sandbox's
 * `acl` option) answers its SELECT `NO [NOPERM]`; or one the config names that the server does
 * not have (a misspelt name: Dovecot answers its SELECT `NO`, and its LIST lists no such mailbox).
 * That is a configuration to fix, permanent until someone does, as a refused sign-in is: the check
 * before sending fails with an alert and nothing is sent; a lookup leaves the outcome unknown and
 * alerts (the daemon's check_refused). In append mode, a Sent folder that refuses the copy (no
 * insert right: APPEND answered `NO [NOPERM]`) after the message went out: the receipt says so.
 * Real nodemailer, imapflow, smtp-server and Dovecot, through the ledger on SQLite and Postgres.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { openLedger, type LedgerOptions } from "@idem/core";
import { JOURNAL, MailSandbox, SENDER } from "@idem/sandbox";
import { DIALECTS, ledgersFor, scaled } from "@idem/testkit";
import { classifyEmailError, emailActions, emailReceiptSchema, type EmailConfig } from "@idem/email";
import { fresh } from "./operation.js";

let sandbox: MailSandbox;
let started: Awaited<ReturnType<MailSandbox["start"]>>;
beforeAll(async () => {
  sandbox = new MailSandbox({ mode: "journal", acl: true });
  started = await sandbox.start();
}, scaled(30_000));
afterAll(() => sandbox?.close());

/** May see the mailbox and file into it (a delivery, the provider's copy), not read it. */
const JOURNAL_UNREADABLE = `INBOX user=${JOURNAL.user} li`;
const SENT_UNREADABLE = `Sent user=${SENDER.user} li`;
/** May read Sent and change flags, not file into it (no `i`): an APPEND is answered NO [NOPERM]. */
const SENT_UNWRITABLE = `Sent user=${SENDER.user} lrws`;

const imapOf = (auth: { user: string; pass: string }) => ({
  host: "127.0.0.1",
  port: started.imap.port,
  auth,
  requireTLS: false,
});
function config(
  mode: "journal" | "provider-saves" | "append",
  extra: Partial<EmailConfig> = {},
  journalMailbox?: string,
): EmailConfig {
  sandbox.mode = mode === "append" ? "none" : mode;
  const journal = {
    mode,
    address: JOURNAL.user,
    imap: imapOf(JOURNAL),
    ...(journalMailbox && { mailbox: journalMailbox }),
  };
  return {
    smtp: { host: "127.0.0.1", port: started.smtp.port, auth: SENDER, timeoutMs: 2_500, requireTLS: false },
    imap: imapOf(SENDER),
    from: SENDER.user,
    copy: mode === "journal" ? (journal as EmailConfig["copy"]) : { mode },
    settleMs: 300,
    ...extra,
  };
}
const report = { to: "client@example.test", subject: "Weekly report", text: "Numbers." };

describe("a mailbox Dovecot answers NO [NOPERM]", () => {
  it("the journal, at the check before sending: nothing sent, failed with an alert (a configuration to fix)", async () => {
    sandbox.dovecot.rights([JOURNAL_UNREADABLE]);
    const before = sandbox.count();
    const error = await emailActions(config("journal"))
      .send.execute(report, fresh())
      .catch((e: unknown) => e);
    // Before: MailboxUnavailableError "IMAP INBOX: Command failed", transient: retried for ever, no alert.
    expect(error).toMatchObject({
      name: "MailboxRefusedError",
      refused: "mailbox",
      responseCode: "NOPERM",
      message: expect.stringMatching(/journal@idem\.test may not read INBOX \(NOPERM: Permission denied/),
    });
    expect((error as Error).message).not.toContain(JOURNAL.pass);
    expect(classifyEmailError(error)).toMatchObject({ kind: "permanent", alert: true });
    expect(sandbox.count()).toBe(before);
  });

  it("the Sent folder, at a lookup: the refusal is said as such and classified for an alert; it proves nothing", async () => {
    sandbox.dovecot.rights([SENT_UNREADABLE]);
    const error = await Promise.resolve()
      .then(() => emailActions(config("provider-saves")).send.reconcile!(report, fresh()))
      .catch((e: unknown) => e);
    expect(error).toMatchObject({ name: "MailboxRefusedError", refused: "mailbox", responseCode: "NOPERM" });
    expect((error as Error).message).toMatch(/agent@idem\.test may not read Sent/);
    expect(classifyEmailError(error)).toMatchObject({ alert: true });
  });
});

describe("a mailbox the config names that Dovecot does not have", () => {
  it("the journal's mailbox misspelt, at the check before sending: nothing sent, failed with an alert (a configuration to fix)", async () => {
    sandbox.dovecot.rights([]);
    const before = sandbox.count();
    const error = await emailActions(config("journal", {}, "Jornal"))
      .send.execute(report, fresh())
      .catch((e: unknown) => e);
    // Before: MailboxUnavailableError "IMAP Jornal: Command failed", transient: retried for ever, no alert.
    expect(error).toMatchObject({
      name: "MailboxRefusedError",
      refused: "mailbox",
      responseCode: "NONEXISTENT",
      message: expect.stringMatching(/journal@idem\.test has no mailbox Jornal .*copy\.mailbox/),
    });
    expect(classifyEmailError(error)).toMatchObject({ kind: "permanent", alert: true });
    expect(sandbox.count()).toBe(before);
  });

  it("a sentMailbox that does not exist, at a lookup: refused, said as such, alerted; it proves nothing", async () => {
    sandbox.dovecot.rights([]);
    const error = await Promise.resolve()
      .then(() =>
        emailActions(config("provider-saves", { sentMailbox: "Sent Items" })).send.reconcile!(report, fresh()),
      )
      .catch((e: unknown) => e);
    expect(error).toMatchObject({ name: "MailboxRefusedError", refused: "mailbox", responseCode: "NONEXISTENT" });
    expect((error as Error).message).toMatch(/agent@idem\.test has no mailbox Sent Items .*sentMailbox/);
    expect(classifyEmailError(error)).toMatchObject({ alert: true });
  });

  it("a search the server refuses says how (its response code and text), and stays something that may pass", async () => {
    sandbox.dovecot.rights([]);
    sandbox.faults.add({ kind: "refuse_search", times: 1 });
    try {
      const error = await emailActions(config("provider-saves"))
        .send.execute(report, fresh())
        .catch((e: unknown) => e);
      // Before: "the server refused the search for <…>", with nothing of what it said.
      expect(error).toMatchObject({
        name: "MailboxUnavailableError",
        message: expect.stringMatching(/refused the search .*\(UNAVAILABLE: search temporarily unavailable\)/),
      });
      expect(classifyEmailError(error)).toMatchObject({ kind: "transient" });
    } finally {
      sandbox.faults.clear();
    }
  });
});

describe("append mode, a Sent folder that refuses the copy (APPEND answered NO [NOPERM])", () => {
  it("the message goes out once, and its receipt says its copy was not filed, and why", async () => {
    sandbox.dovecot.rights([SENT_UNWRITABLE]);
    const before = sandbox.count();
    const receipt = await emailActions(config("append")).send.execute(report, fresh());
    expect(sandbox.count()).toBe(before + 1);
    // Before: a receipt like any other; the refusal was swallowed.
    expect(receipt).toMatchObject({
      sent: true,
      copyNotFiled: {
        refused: true,
        responseCode: "NOPERM",
        reason: expect.stringMatching(/agent@idem\.test may not file into Sent \(NOPERM: Permission denied/),
      },
    });
    expect(JSON.stringify(receipt)).not.toContain(report.to);
    // A person may record such a receipt too.
    expect(emailReceiptSchema["~standard"].validate(receipt)).toMatchObject({ value: receipt });
  });
});

for (const dialect of DIALECTS) {
  describe(`through the ledger on ${dialect}`, () => {
    const db = ledgersFor(dialect, openLedger, { defaults: { poolSize: 2 } as LedgerOptions });
    let n = 0;
    const tenant = () => `t${++n}-${Math.random().toString(36).slice(2, 7)}`;

    it("a lookup of an unknown journal send, the journal's read right taken away: stays unknown, alerted; given back, found; one message", async () => {
      sandbox.dovecot.rights([]);
      const t = tenant();
      // Accepted, then the client timed out: unknown (the agent's budget: no lookup of its own).
      sandbox.faults.add({ kind: "hold_reply", delayMs: 5_000 });
      const agent = await db.open({ budget: { attempts: 1 } });
      const sending = emailActions(config("journal", { smtp: { ...config("journal").smtp, timeoutMs: 1_000 } })).send;
      const out = await agent.run(sending, { tenant: t, key: ["held"], args: report });
      expect(out).toMatchObject({ status: "pending_verification", state: "unknown" });
      const sent = sandbox.count();
      // The journal account may no longer read its mailbox. Each check stays unknown (nothing is
      // known of the send) and asks for an alert. Before: "lookup failed", unknown, no alert.
      sandbox.dovecot.rights([JOURNAL_UNREADABLE]);
      const daemon = await db.open({ actions: [sending] });
      for (let check = 0; check < 2; check++) {
        const settled = await daemon.daemon.settle({ tenant: t, id: out.operationId });
        expect(settled).toMatchObject({ status: "pending_verification", state: "unknown" });
        const alerts = (await daemon.daemon.alertsDue({ limit: 1_000 })).filter((a) => a.tenant === t);
        expect(alerts).toMatchObject([
          { id: out.operationId, status: "unknown", reason: expect.stringMatching(/MailboxRefusedError: .*NOPERM/) },
        ]);
      }
      // Fixed: the lookup finds the journal copy; nothing was sent again.
      sandbox.dovecot.rights([]);
      expect(await daemon.daemon.settle({ tenant: t, id: out.operationId })).toMatchObject({
        status: "succeeded",
        receipt: { foundIn: "INBOX" },
      });
      expect(sandbox.count()).toBe(sent);
    });

    it("a sentMailbox that does not exist: the send fails before anything is sent, alerted, and the failure is replayed", async () => {
      sandbox.dovecot.rights([]);
      const t = tenant();
      const before = sandbox.count();
      const l = await db.open();
      const mail = emailActions(config("provider-saves", { sentMailbox: "sent" })).send;
      const out = await l.run(mail, { tenant: t, key: ["misnamed"], args: report });
      // Before: pending_verification (transient, retried), no alert.
      expect(out).toMatchObject({
        status: "failed",
        error: { kind: "permanent", alert: true, reason: expect.stringMatching(/has no mailbox sent .*sentMailbox/) },
      });
      expect((await l.daemon.alertsDue({ limit: 1_000 })).filter((a) => a.tenant === t)).toHaveLength(1);
      expect(await l.run(mail, { tenant: t, key: ["misnamed"], args: report })).toMatchObject({ status: "failed" });
      expect(sandbox.count()).toBe(before);
    });

    it("append, Sent refusing the copy: succeeded with the refusal in its receipt, replayed as is; one message", async () => {
      sandbox.dovecot.rights([SENT_UNWRITABLE]);
      const t = tenant();
      const before = sandbox.count();
      const l = await db.open();
      const mail = emailActions(config("append")).send;
      const out = await l.run(mail, { tenant: t, key: ["copy-refused"], args: report });
      expect(out).toMatchObject({
        status: "succeeded",
        receipt: { sent: true, copyNotFiled: { refused: true, responseCode: "NOPERM" } },
      });
      // An operator hears of it (before: no alert): every later copy is refused too, and no lookup
      // can find this send.
      const alerted = (await l.daemon.alertsDue({ limit: 1_000 })).filter((a) => a.tenant === t);
      expect(alerted).toMatchObject([
        {
          id: out.operationId,
          status: "succeeded",
          reason: expect.stringMatching(
            /^sent, but its Sent copy was not filed, refused by the server \(NOPERM\): every later copy will be refused until the account is fixed; no lookup can find this send: .*may not file into Sent/,
          ),
        },
      ]);
      await l.daemon.ackAlert(alerted[0]!);
      const again = await l.run(mail, { tenant: t, key: ["copy-refused"], args: report });
      expect(again).toMatchObject({
        status: "succeeded",
        replayed: true,
        receipt: { copyNotFiled: { responseCode: "NOPERM" } },
      });
      expect(sandbox.count()).toBe(before + 1);
      expect((await l.daemon.alertsDue({ limit: 1_000 })).filter((a) => a.tenant === t)).toEqual([]);
    });

    it("append, Sent refusing copies, accepted then the client timed out: not found proves nothing; a person decides, never a second send", async () => {
      sandbox.dovecot.rights([SENT_UNWRITABLE]);
      const t = tenant();
      sandbox.faults.add({ kind: "hold_reply", delayMs: 5_000 });
      try {
        const l = await db.open({ budget: { attempts: 1 } });
        const mail = emailActions(config("append", { smtp: { ...config("append").smtp, timeoutMs: 1_000 } })).send;
        const out = await l.run(mail, { tenant: t, key: ["held-append"], args: report });
        expect(out).toMatchObject({ status: "pending_verification", state: "unknown" });
        const sent = sandbox.count();
        const daemon = await db.open({ actions: [mail] });
        expect(await daemon.daemon.settle({ tenant: t, id: out.operationId })).toMatchObject({
          status: "pending_verification",
          state: "needs_review",
          reason: expect.stringMatching(/no copy of .* in Sent, but .*it may have been sent/),
        });
        expect(sandbox.count()).toBe(sent);
      } finally {
        sandbox.faults.clear();
      }
    });
  });
}
