/**
 * A copy moved after its send, while the send's outcome is unknown: the Sent folder renamed (an
 * archive of last year's sent mail, "Sent" renamed "Sent 2025": the server makes a new, empty
 * "Sent", Dovecot's `auto = subscribe`, as a client or a provider does), a rule that files sent mail
 * into an archive, an archiver that drains the journal mailbox. Past the settle window a "not found"
 * sends again, so the lookup then searches every mailbox of the account: before, it searched only
 * the one of today's name, proved the copy absent and the email went out twice. Real Dovecot (its
 * ACL plugin for a mailbox the account may not read), nodemailer, imapflow and smtp-server;
 * messages counted at the SMTP server; through the ledger on SQLite and Postgres too.
 */
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import { once } from "node:events";
import type { Ledger } from "@idem/core";
import { openTestLedger, type TestLedgerOptions } from "@idem/core/testing";
import { JOURNAL, MailSandbox, SENDER, type MailUser } from "@idem/sandbox";
import { DIALECTS, ledgersFor, scaled } from "@idem/testkit";
import { classifyEmailError, emailActions, MailboxRefusedError, type EmailConfig } from "@idem/email";
import { op } from "./operation.js";

let sandbox: MailSandbox;
let started: Awaited<ReturnType<MailSandbox["start"]>>;
beforeAll(async () => {
  sandbox = new MailSandbox({ mode: "provider-saves", acl: true });
  started = await sandbox.start();
}, scaled(30_000));
afterAll(() => sandbox?.close());
afterEach(() => {
  sandbox.releaseHeldReplies();
  sandbox.faults.clear();
  sandbox.dovecot.rights([]);
});

const imapOf = (auth: MailUser) => ({ host: "127.0.0.1", port: started.imap.port, auth, requireTLS: false });
function config(mode: "provider-saves" | "journal", extra: Partial<EmailConfig> = {}): EmailConfig {
  sandbox.mode = mode;
  return {
    smtp: { host: "127.0.0.1", port: started.smtp.port, auth: SENDER, timeoutMs: scaled(60_000), requireTLS: false },
    imap: imapOf(SENDER),
    from: SENDER.user,
    copy: mode === "journal" ? { mode, address: JOURNAL.user, imap: imapOf(JOURNAL) } : { mode },
    settleMs: 300,
    ...extra,
  };
}
const report = { to: "client@example.test", subject: "Weekly report", text: "Numbers." };

/** Moves every copy of `messageId` from `from` into `to` (created if need be). */
const move = (user: MailUser, from: string, to: string, messageId: string) =>
  sandbox.asUser(user, async (client) => {
    await client.mailboxCreate(to).catch(() => undefined);
    const lock = await client.getMailboxLock(from);
    try {
      await client.messageMove({ header: { "message-id": messageId } }, to);
    } finally {
      lock.release();
    }
  });

const CASES = [
  {
    name: "the Sent folder renamed (a new, empty Sent made in its place)",
    mode: "provider-saves",
    moved: async (id: string) => {
      await sandbox.asUser(SENDER, (c) => c.mailboxRename("Sent", "Sent 2025"));
      expect(await sandbox.copies(SENDER, "Sent", id)).toBe(0);
    },
    foundIn: "Sent 2025",
  },
  {
    name: "the Sent folder renamed to a name the wire spells in modified UTF-7",
    mode: "provider-saves",
    moved: (id: string) => move(SENDER, "Sent", "Отправленные/Gesendet 2025 & Co", id),
    foundIn: "Отправленные/Gesendet 2025 & Co",
  },
  {
    name: "a rule that files sent mail into an archive",
    mode: "provider-saves",
    moved: (id: string) => move(SENDER, "Sent", "Archive/Sent", id),
    foundIn: "Archive/Sent",
  },
  {
    name: "an archiver that drains the journal mailbox",
    mode: "journal",
    moved: (id: string) => move(JOURNAL, "INBOX", "Journal 2025", id),
    foundIn: "Journal 2025",
  },
] as const;

describe("a copy moved after its send, the outcome unknown: looked up past the window", () => {
  for (const c of CASES)
    it(`${c.name}: found where it went, never proven absent, never sent again; one message`, async () => {
      const mail = emailActions(config(c.mode)).send;
      const now = Date.now();
      const first = op({ lastAttemptAt: now, now });
      const receipt = await mail.execute(report, first);
      expect(sandbox.count(receipt.messageId)).toBe(1);
      await c.moved(receipt.messageId);
      const later = { ...first, now: now + 3_600_000 };
      const verdict = await mail.reconcile!(report, later);
      // Before: { found: false, proof: "absent" }, and the runner's next attempt sent it again.
      if (verdict.found === false && verdict.proof === "absent") await mail.execute(report, { ...later, attempt: 2 });
      expect(sandbox.count(receipt.messageId)).toBe(1);
      expect(verdict).toMatchObject({ found: true, receipt: { messageId: receipt.messageId, foundIn: c.foundIn } });
    });

  it("a send the server never took is still proven absent past the window, the other mailboxes searched named", async () => {
    await sandbox.asUser(SENDER, (client) => client.mailboxCreate("Archive/Old").catch(() => undefined));
    const mail = emailActions(config("provider-saves")).send;
    const now = Date.now();
    const never = op({ lastAttemptAt: now, now: now + 3_600_000 });
    const verdict = await mail.reconcile!(report, never);
    expect(verdict).toMatchObject({
      found: false,
      proof: "absent",
      reason: expect.stringMatching(/after the settle window, nor in the account's \d+ other mailboxes/),
    });
  });

  it("the copy moved by the account's own client into a mailbox it may file into, not read: never proven absent, the lookup refused until a person gives the right; one message", async () => {
    await sandbox.asUser(SENDER, (client) => client.mailboxCreate("Private").catch(() => undefined));
    const mail = emailActions(config("provider-saves")).send;
    const now = Date.now();
    const first = op({ lastAttemptAt: now, now });
    const receipt = await mail.execute(report, first);
    // May see "Private" and file into it (COPY, MOVE: RFC 4314's insert), not read it: its SELECT
    // is answered NO [NOPERM].
    sandbox.dovecot.rights([`Private user=${SENDER.user} li`]);
    await move(SENDER, "Sent", "Private", receipt.messageId);
    const later = { ...first, now: now + 3_600_000 };
    const verdict = await mail.reconcile!(report, later).catch((error: unknown) => error as Error);
    // Before: { found: false, proof: "absent" } ("not searched, the account may not read them: Private"), sent again.
    if (!(verdict instanceof Error) && verdict.found === false && verdict.proof === "absent")
      await mail.execute(report, { ...later, attempt: 2 });
    expect(sandbox.count(receipt.messageId)).toBe(1);
    expect(verdict).toBeInstanceOf(MailboxRefusedError);
    expect(verdict).toMatchObject({ responseCode: "NOPERM", message: expect.stringMatching(/may not read Private/) });
    expect(classifyEmailError(verdict)).toMatchObject({ alert: true });
    // Given the right to read it, the next check settles by the copy there.
    sandbox.dovecot.rights([]);
    expect(await mail.reconcile!(report, later)).toMatchObject({ found: true, receipt: { foundIn: "Private" } });
  });

  it("within the window only where the copy is filed is searched: not found is inconclusive, as before", async () => {
    const mail = emailActions(config("provider-saves", { settleMs: 600_000 })).send;
    const now = Date.now();
    const verdict = await mail.reconcile!(report, op({ lastAttemptAt: now, now: now + 1_000 }));
    expect(verdict).toMatchObject({ found: false, proof: "inconclusive" });
    expect((verdict as { reason: string }).reason).not.toMatch(/other mailboxes/);
  });
});

for (const dialect of DIALECTS) {
  describe(`the Sent folder renamed while a send's answer is late, the daemon settling it, on ${dialect}`, () => {
    const db = ledgersFor<Ledger, TestLedgerOptions>(dialect, openTestLedger, { defaults: { poolSize: 2 } });

    it("settled by the copy in the renamed folder; the late answer is the same send; one message", async () => {
      let now = Date.now();
      const mail = emailActions(config("provider-saves"));
      const ledger = await db.open({ clock: () => now, leaseMs: 30_000, actions: [mail.send] });
      const t = `moved-${dialect}-${Math.random().toString(36).slice(2, 7)}`;
      // The server takes the message and files its copy, then holds the 250.
      sandbox.faults.add({ kind: "hold_reply", delayMs: scaled(120_000) });
      const accepted = once(sandbox.events, "accepted");
      const first = ledger.run(mail.send, { tenant: t, key: ["renamed"], args: report });
      await accepted;
      const [row] = await ledger.admin.list({ tenant: t });
      const messageId = row!.providerReference!.split(" ")[0]!;
      await sandbox.asUser(SENDER, async (client) => {
        await client.mailboxDelete(`Sent ${dialect}`).catch(() => undefined);
        await client.mailboxRename("Sent", `Sent ${dialect}`);
      });
      // Its lease runs out by the database clock, past the settle window: the daemon looks it up.
      now += 31_000;
      const settled = await ledger.daemon.settle({ tenant: t, id: row!.id, actor: "daemon" });
      expect(settled).toMatchObject({ status: "succeeded", receipt: { messageId, foundIn: `Sent ${dialect}` } });
      expect(sandbox.releaseHeldReplies()).toBe(1);
      expect(await first).toMatchObject({ status: "succeeded", replayed: false, receipt: { sent: true } });
      expect(sandbox.count(messageId)).toBe(1);
      const again = await ledger.run(mail.send, { tenant: t, key: ["renamed"], args: report });
      expect(again).toMatchObject({ status: "succeeded", replayed: true });
      expect(sandbox.count(messageId)).toBe(1);
    });

    it("the copy moved into a mailbox the account may file into, not read: stays unknown (the lookup refused, alerted), never sent again; one message", async () => {
      let now = Date.now();
      const mail = emailActions(config("provider-saves"));
      const ledger = await db.open({ clock: () => now, leaseMs: 30_000, actions: [mail.send] });
      const t = `unread-${dialect}-${Math.random().toString(36).slice(2, 7)}`;
      await sandbox.asUser(SENDER, (client) => client.mailboxCreate("Private").catch(() => undefined));
      sandbox.faults.add({ kind: "hold_reply", delayMs: scaled(120_000) });
      const accepted = once(sandbox.events, "accepted");
      const first = ledger.run(mail.send, { tenant: t, key: ["unread"], args: report });
      await accepted;
      const [row] = await ledger.admin.list({ tenant: t });
      const messageId = row!.providerReference!.split(" ")[0]!;
      sandbox.dovecot.rights([`Private user=${SENDER.user} li`]);
      await move(SENDER, "Sent", "Private", messageId);
      now += 31_000;
      // Before: proven absent ("not searched, the account may not read them: Private") and sent again.
      const settled = await ledger.daemon.settle({ tenant: t, id: row!.id, actor: "daemon" });
      expect(settled).toMatchObject({ status: "pending_verification" });
      expect(sandbox.count(messageId)).toBe(1);
      const [after] = await ledger.admin.list({ tenant: t });
      expect(after).toMatchObject({ status: "unknown" });
      sandbox.releaseHeldReplies();
      await first.catch(() => undefined);
      expect(sandbox.count(messageId)).toBe(1);
    });
  });
}
