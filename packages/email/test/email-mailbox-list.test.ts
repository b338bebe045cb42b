/**
 * Mailboxes a LIST names that do not exist (RFC 5258 `\NonExistent`) or cannot be selected
 * (`\Noselect`): a name that only holds other mailboxes ("Archive" over "Archive/2024"), which
 * Dovecot lists `(\NonExistent \HasChildren)`, or `(\Noselect \HasChildren)` to a plain LIST.
 * Dovecot 2.3 also lists a name its config marks special-use (`mailbox "Old Sent" { special_use =
 * \Sent }`) that holds only folders as `(\NonExistent \HasChildren \Sent)`; the sandbox's Dovecot
 * config marks only its autocreated Sent, so a proxy adds the `\Sent` to the line Dovecot sends for
 * such a name. Real Dovecot, imapflow's own LIST parsing, nodemailer and smtp-server.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { JOURNAL, MailSandbox, SENDER, type MailUser } from "@idem/sandbox";
import { scaled } from "@idem/testkit";
import { classifyEmailError, emailActions, type EmailConfig } from "@idem/email";
import { listRewritingProxy } from "./loopback.js";
import { fresh } from "./operation.js";

let sandbox: MailSandbox;
let started: Awaited<ReturnType<MailSandbox["start"]>>;
let proxy: Awaited<ReturnType<typeof listRewritingProxy>>;
/** A server whose LIST names no Sent folder: its Sent listed as "Outbox", without `\\Sent`. */
let noSent: Awaited<ReturnType<typeof listRewritingProxy>>;
beforeAll(async () => {
  sandbox = new MailSandbox({ mode: "provider-saves" });
  started = await sandbox.start();
  // What Dovecot would list with "Old Sent" marked \Sent in its config: sorted before "Sent",
  // imapflow gives it the \Sent special use, and the real Sent keeps only its \Sent attribute.
  proxy = await listRewritingProxy(started.imap.port, (line) =>
    line.replace(/^\* LIST \((\\NonExistent[^)]*)\) "\/" "Old Sent"$/, '* LIST ($1 \\Sent) "/" "Old Sent"'),
  );
  noSent = await listRewritingProxy(started.imap.port, (line) =>
    line.replace(
      /^\* LIST \(([^)]*)\) "\/" "?Sent"?$/,
      (_, a: string) => `* LIST (${a.replace(/\s*\\Sent/i, "")}) "/" "Outbox"`,
    ),
  );
  await create(SENDER, "Old Sent/2024");
  await create(JOURNAL, "Archive/2024");
}, scaled(30_000));
afterAll(async () => {
  await proxy?.close();
  await noSent?.close();
  await sandbox?.close();
});

/** Creates `path` in the user's account, and with it a parent name that holds only folders. */
async function create(user: MailUser, path: string): Promise<void> {
  const client = sandbox.imap(user);
  await client.connect();
  try {
    await client.mailboxCreate(path);
  } finally {
    await client.logout();
  }
}

const imapOf = (auth: MailUser, port: number) => ({ host: "127.0.0.1", port, auth, requireTLS: false });
const smtp = () => ({ host: "127.0.0.1", port: started.smtp.port, auth: SENDER, timeoutMs: 2_500, requireTLS: false });
const report = { to: "client@example.test", subject: "Weekly report", text: "Numbers." };

/** The sender's config in provider-saves mode, its IMAP through `port`. */
const providerSaves = (port: number): EmailConfig => ({
  smtp: smtp(),
  imap: imapOf(SENDER, port),
  from: SENDER.user,
  copy: { mode: "provider-saves" },
});

/** The check before sending refused as no such mailbox (`message`), a configuration to fix, alerted; nothing sent. */
async function refusedBeforeSending(config: EmailConfig, message: RegExp): Promise<void> {
  const before = sandbox.count();
  const error = await emailActions(config)
    .send.execute(report, fresh())
    .catch((e: unknown) => e);
  expect(error).toMatchObject({ name: "MailboxRefusedError", refused: "mailbox", responseCode: "NONEXISTENT" });
  expect((error as Error).message).toMatch(message);
  expect(classifyEmailError(error)).toMatchObject({ kind: "permanent", alert: true });
  expect(sandbox.count()).toBe(before);
}

describe("the Sent folder, when the LIST also flags \\Sent a name that does not exist", () => {
  it("the check, the send and the lookup use the Sent folder that exists; one message", async () => {
    sandbox.mode = "provider-saves";
    const mail = emailActions(providerSaves(proxy.port)).send;
    const op = fresh();
    // Before: the check before sending selected "Old Sent": MailboxUnavailableError, nothing sent.
    const receipt = await mail.execute(report, op);
    expect(receipt).toMatchObject({ sent: true });
    expect(await mail.reconcile!(report, op)).toMatchObject({ found: true, receipt: { foundIn: "Sent" } });
    expect(sandbox.count(receipt.messageId)).toBe(1);
  });
});

describe("a journal mailbox the LIST names only as a folder of folders (\\NonExistent, \\Noselect)", () => {
  it("the check before sending says there is no such mailbox, a configuration to fix; nothing sent", async () => {
    sandbox.mode = "journal";
    const config: EmailConfig = {
      smtp: smtp(),
      imap: imapOf(SENDER, started.imap.port),
      from: SENDER.user,
      copy: { mode: "journal", address: JOURNAL.user, imap: imapOf(JOURNAL, started.imap.port), mailbox: "Archive" },
    };
    await refusedBeforeSending(
      config,
      /journal@idem\.test has no mailbox Archive .*holds only other mailboxes.*copy\.mailbox/,
    );
  });
});

describe("an account whose LIST names no Sent folder (no SPECIAL-USE \\Sent, none named Sent)", () => {
  it("the check before sending is refused as a configuration to fix, alerted; nothing sent", async () => {
    sandbox.mode = "provider-saves";
    // Before: MailboxUnavailableError, retried as transient every few seconds, and no one told.
    await refusedBeforeSending(providerSaves(noSent.port), /agent@idem\.test has no Sent folder .*set sentMailbox/);
  });
});
