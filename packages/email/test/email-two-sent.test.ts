/**
 * An account whose server flags two selectable mailboxes `\Sent` (RFC 6154 §2: a server may give
 * one special use to several mailboxes; Dovecot's stock 15-mailboxes.conf marks both "Sent" and
 * "Sent Messages", and a German client creates "Gesendet"). imapflow hands its `specialUse` to one
 * of them (by name), while the provider files its copies into the other. The sandbox's Dovecot
 * marks only its "Sent", so a proxy adds `\Sent` to the line it sends for "Gesendet". Real Dovecot,
 * imapflow's own LIST parsing, nodemailer and smtp-server; messages counted at the SMTP server.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { MailSandbox, SENDER } from "@idem/sandbox";
import { scaled } from "@idem/testkit";
import { emailActions, type EmailConfig } from "@idem/email";
import { listRewritingProxy } from "./loopback.js";
import { op } from "./operation.js";

let sandbox: MailSandbox;
let started: Awaited<ReturnType<MailSandbox["start"]>>;
let proxy: Awaited<ReturnType<typeof listRewritingProxy>>;
beforeAll(async () => {
  sandbox = new MailSandbox({ mode: "provider-saves", acl: true });
  started = await sandbox.start();
  // What Dovecot lists with "Gesendet" marked \Sent in its config too: both are real mailboxes.
  proxy = await listRewritingProxy(started.imap.port, (line) =>
    line.replace(/^\* LIST \(([^)]*)\) "\/" "?Gesendet"?$/, '* LIST ($1 \\Sent) "/" Gesendet'),
  );
  const client = sandbox.imap(SENDER);
  await client.connect();
  try {
    await client.mailboxCreate("Gesendet");
  } finally {
    await client.logout();
  }
}, scaled(30_000));
afterAll(async () => {
  await proxy?.close();
  await sandbox?.close();
});

const config = (): EmailConfig => ({
  smtp: { host: "127.0.0.1", port: started.smtp.port, auth: SENDER, timeoutMs: 2_500, requireTLS: false },
  imap: { host: "127.0.0.1", port: proxy.port, auth: SENDER, requireTLS: false },
  from: SENDER.user,
  copy: { mode: "provider-saves" },
  settleMs: 300,
});
const report = { to: "client@example.test", subject: "Weekly report", text: "Numbers." };

describe("two mailboxes the server flags \\Sent, the provider filing into one of them", () => {
  it("a send whose answer was lost is never proven absent past the window, nor sent again; one message", async () => {
    const mail = emailActions(config()).send;
    const now = Date.now();
    // The first send: accepted, its copy filed in "Sent" by the provider (its answer then lost).
    const first = op({ lastAttemptAt: now, now });
    const receipt = await mail.execute(report, first);
    expect(sandbox.count(receipt.messageId)).toBe(1);
    expect(await sandbox.copies(SENDER, "Sent", receipt.messageId)).toBe(1);
    // Looked up well past the settle window, as the daemon does for an unknown outcome.
    // Before: only "Gesendet" (imapflow's pick) was searched: "absent", and the runner sent again.
    const later = { ...first, now: now + 3_600_000 };
    const verdict = await mail.reconcile!(report, later);
    expect(verdict).not.toMatchObject({ proof: "absent" });
    expect(verdict).toMatchObject({ found: true, receipt: { foundIn: "Sent" } });
    // The next attempt's check before sending finds it too: nothing sent.
    const again = await mail.execute(report, { ...later, attempt: 2 });
    expect(again).toMatchObject({ sent: false, foundIn: "Sent" });
    expect(sandbox.count(receipt.messageId)).toBe(1);
  });

  it("copies of two sends, one in each: the lookup reads both and says it went out twice", async () => {
    const mail = emailActions(config()).send;
    const now = Date.now();
    const first = op({ lastAttemptAt: now, now });
    const receipt = await mail.execute(report, first);
    expect(await sandbox.copies(SENDER, "Sent", receipt.messageId)).toBe(1);
    // Another send's copy of the same message (another operation under the key, pruned and run
    // again), filed in the other \Sent mailbox.
    const raw = [
      `From: ${SENDER.user}`,
      "To: client@example.test",
      "Subject: Weekly report",
      `Message-ID: ${receipt.messageId}`,
      "X-Idem-Attempt: op_other/1",
      "",
      "Numbers.",
      "",
    ].join("\r\n");
    await sandbox.file(SENDER, "Gesendet", Buffer.from(raw));
    // Before: the lookup stopped at the first mailbox with a copy, read one send, and said nothing.
    const verdict = await mail.reconcile!(report, { ...first, now: now + 3_600_000 });
    expect(verdict).toMatchObject({
      found: true,
      receipt: { sends: [`${first.id}/1`, "op_other/1"].sort() },
      twice: expect.stringContaining("from 2 sends"),
    });
  });

  it("a copy found in one, the other not readable by the account: the copy found counts, not a failed lookup", async () => {
    // helper-144's review of d1478a7: every \\Sent mailbox is read for the copies in each, and one
    // the account may not read failed a lookup that had found the copy.
    const mail = emailActions(config()).send;
    const now = Date.now();
    const first = op({ lastAttemptAt: now, now });
    const receipt = await mail.execute(report, first);
    await sandbox.asUser(SENDER, async (client) => {
      const lock = await client.getMailboxLock("Sent");
      try {
        await client.messageMove({ header: { "message-id": receipt.messageId } }, "Gesendet");
      } finally {
        lock.release();
      }
    });
    sandbox.dovecot.rights([`Sent user=${SENDER.user} li`]);
    try {
      const verdict = await mail.reconcile!(report, { ...first, now: now + 3_600_000 });
      expect(verdict).toMatchObject({ found: true, receipt: { foundIn: "Gesendet" } });
    } finally {
      sandbox.dovecot.rights([]);
    }
    expect(sandbox.count(receipt.messageId)).toBe(1);
  });
});

/** A copy of `messageId` naming `send` (its X-Idem-Attempt), as the provider files one. */
function copyOf(messageId: string, send: string): Buffer {
  return Buffer.from(
    [
      `From: ${SENDER.user}`,
      "To: client@example.test",
      "Subject: Weekly report",
      `Message-ID: ${messageId}`,
      `X-Idem-Attempt: ${send}`,
      "",
      "Numbers.",
      "",
    ].join("\r\n"),
  );
}

describe("what a lookup over both \\Sent mailboxes says", () => {
  it("absent past the window: the reason counts every mailbox searched besides the one named, the other \\Sent among them", async () => {
    const mail = emailActions(config()).send;
    const now = Date.now();
    // Never sent: no copy anywhere.
    const verdict = await mail.reconcile!(report, op({ lastAttemptAt: now, now: now + 3_600_000 }));
    let selectable = 0;
    await sandbox.asUser(SENDER, async (client) => {
      for (const box of await client.list())
        if (![...box.flags].some((f) => /^\\(NonExistent|Noselect)$/i.test(f))) selectable++;
    });
    expect(selectable).toBeGreaterThan(2);
    // Before: "nor in the account's N other mailboxes", N leaving out "Gesendet", searched too.
    expect(verdict).toMatchObject({
      found: false,
      proof: "absent",
      reason: expect.stringContaining(`nor in the account's ${selectable - 1} other mailboxes`),
    });
    // And names the other \Sent mailbox (imapflow's pick is one of the two, by name; the other is "also").
    expect((verdict as { reason: string }).reason).toMatch(/ \((Sent|Gesendet), flagged \\Sent too, among them\)$/);
  });

  it("copies of one send in both, more than MAX_COPIES together but each read: one send, not 'twice'", async () => {
    const mail = emailActions(config()).send;
    const now = Date.now();
    const first = op({ lastAttemptAt: now, now });
    const receipt = await mail.execute(report, first);
    const send = `${first.id}/1`;
    // 11 in each (with the provider's own in Sent): 22, more than 20, every one read, every one
    // naming the one send (a rule that copies sent mail, a client that saves its own as well).
    for (let i = 0; i < 10; i++) await sandbox.file(SENDER, "Sent", copyOf(receipt.messageId, send));
    for (let i = 0; i < 11; i++) await sandbox.file(SENDER, "Gesendet", copyOf(receipt.messageId, send));
    const verdict = await mail.reconcile!(report, { ...first, now: now + 3_600_000 });
    // Before: twice "Sent holds 22 copies …, more than 20: it went out more than once".
    expect(verdict).toMatchObject({ found: true, receipt: { sends: [send] } });
    expect(verdict).not.toHaveProperty("twice");
    expect((verdict as { receipt: object }).receipt).not.toHaveProperty("copies");
    expect(sandbox.count(receipt.messageId)).toBe(1);
  });

  it("more than MAX_COPIES in one of them (some not read), naming one send: still said to have gone out more than once", async () => {
    const mail = emailActions(config()).send;
    const now = Date.now();
    const first = op({ lastAttemptAt: now, now });
    const receipt = await mail.execute(report, first);
    const send = `${first.id}/1`;
    for (let i = 0; i < 20; i++) await sandbox.file(SENDER, "Sent", copyOf(receipt.messageId, send));
    await sandbox.file(SENDER, "Gesendet", copyOf(receipt.messageId, send));
    const verdict = await mail.reconcile!(report, { ...first, now: now + 3_600_000 });
    expect(verdict).toMatchObject({
      found: true,
      receipt: { copies: 22 },
      twice: expect.stringMatching(/holds 22 copies of .*, more than 20: it went out more than once$/),
    });
  });
});
