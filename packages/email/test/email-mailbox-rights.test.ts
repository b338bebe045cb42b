/**
 * A journal mailbox or Sent folder the account may not read: Dovecot's ACL plugin (the sandbox's
 * `acl` option) answers its SELECT `NO [NOPERM]`. That is a configuration to fix, permanent until someone does,
 * as a refused sign-in is: the check before sending fails with an alert and nothing is sent; a
 * lookup leaves the outcome unknown and alerts (the daemon's check_refused). Real nodemailer,
 * imapflow, smtp-server and Dovecot, through the ledger on SQLite and Postgres.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { randomBytes } from "node:crypto";
import { openLedger, type LedgerOptions, type OperationContext } from "@idem/core";
import { JOURNAL, MailSandbox, SENDER } from "@idem/sandbox";
import { DIALECTS, ledgersFor, scaled } from "@idem/testkit";
import { classifyEmailError, emailActions, type EmailConfig } from "@idem/email";

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

const imapOf = (auth: { user: string; pass: string }) => ({
  host: "127.0.0.1",
  port: started.imap.port,
  auth,
  requireTLS: false,
});
function config(mode: "journal" | "provider-saves", extra: Partial<EmailConfig> = {}): EmailConfig {
  sandbox.mode = mode;
  return {
    smtp: { host: "127.0.0.1", port: started.smtp.port, auth: SENDER, timeoutMs: 2_500, requireTLS: false },
    imap: imapOf(SENDER),
    from: SENDER.user,
    copy: mode === "journal" ? { mode, address: JOURNAL.user, imap: imapOf(JOURNAL) } : { mode },
    settleMs: 300,
    ...extra,
  };
}
const report = { to: "client@example.test", subject: "Weekly report", text: "Numbers." };

function fresh(): OperationContext {
  const key = randomBytes(32).toString("hex");
  const now = Date.now();
  return {
    id: `op_${key.slice(0, 8)}`,
    tenant: "t",
    key,
    keyLabel: null,
    attempt: 1,
    createdAt: now,
    lastAttemptAt: now,
    now,
    providerReference: null,
    signal: new AbortController().signal,
  };
}

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
  });
}
