/**
 * The search of every mailbox of the account that a lookup makes past the settle window, before
 * "not found" sends again (email-copy-moved.test: why): what it costs the account and the lookup.
 * An account of many mailboxes on a server far away outlasts the session's deadline, which
 * bounds a server that does not answer, not how many mailboxes the account has: every lookup
 * failed, and the send never settled. Each mailbox is opened read-only (EXAMINE): a SELECT of
 * each would take the \Recent mark off the new mail in every one of the person's mailboxes. A
 * mailbox listed and gone by its SELECT (renamed meanwhile) fails the lookup as unavailable, to
 * be tried again, not as a refusal a person must fix. Real Dovecot, imapflow and smtp-server;
 * proxies on loopback for a slow server (slowProxy) and a LIST that names a mailbox gone since
 * (listRewritingProxy); messages counted at the SMTP server.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { Ledger } from "@idem/core";
import { openTestLedger, type TestLedgerOptions } from "@idem/core/testing";
import { MailSandbox, SENDER } from "@idem/sandbox";
import { DIALECTS, ledgersFor, scaled } from "@idem/testkit";
import {
  classifyEmailError,
  emailActions,
  MailboxRefusedError,
  MailboxUnavailableError,
  type EmailConfig,
} from "@idem/email";
import { listRewritingProxy, slowProxy } from "./loopback.js";
import { op } from "./operation.js";

/**
 * Each SELECT or EXAMINE held for 7.5 % of DEADLINE_MS: 40 mailboxes take three deadlines, each
 * well inside one. Both scale with the machine's load, so a loaded machine's pause of a second
 * (measured: one mailbox past a fixed 1,000 ms with three suites running) keeps inside the deadline.
 */
const DEADLINE_MS = scaled(1_000);
const ROUND_TRIP_MS = Math.round(DEADLINE_MS * 0.075);
const MAILBOXES = 40;

let sandbox: MailSandbox;
let started: Awaited<ReturnType<MailSandbox["start"]>>;
let slow: Awaited<ReturnType<typeof slowProxy>>;
/** Lists a "Sent 2024" that is not there: renamed between the LIST and its SELECT. */
let gone: Awaited<ReturnType<typeof listRewritingProxy>>;
beforeAll(async () => {
  sandbox = new MailSandbox({ mode: "provider-saves" });
  started = await sandbox.start();
  slow = await slowProxy(started.imap.port, ROUND_TRIP_MS);
  gone = await listRewritingProxy(started.imap.port, (line) =>
    /^\* LIST \([^)]*\) "\/" "?Sent"?$/.test(line) ? `${line}\r\n* LIST (\\HasNoChildren) "/" "Sent 2024"` : line,
  );
}, scaled(30_000));
afterAll(async () => {
  await slow?.close();
  await gone?.close();
  await sandbox?.close();
});

function config(imapPort: number, extra: Partial<EmailConfig["imap"]> = {}): EmailConfig {
  return {
    smtp: { host: "127.0.0.1", port: started.smtp.port, auth: SENDER, timeoutMs: scaled(60_000), requireTLS: false },
    imap: { host: "127.0.0.1", port: imapPort, auth: SENDER, requireTLS: false, ...extra },
    from: SENDER.user,
    copy: { mode: "provider-saves" },
    settleMs: 300,
  };
}
const report = { to: "client@example.test", subject: "Weekly report", text: "Numbers." };

describe("the search of every mailbox past the settle window", () => {
  it(
    "an account of many mailboxes on a slow server: the search outlasts imap.deadlineMs, every mailbox answering in time, and still settles; one message",
    async () => {
      const last = `Archive/${MAILBOXES - 1}`;
      await sandbox.asUser(SENDER, async (client) => {
        for (let i = 0; i < MAILBOXES; i++) await client.mailboxCreate(`Archive/${i}`);
      });
      try {
        const mail = emailActions(config(slow.port, { deadlineMs: DEADLINE_MS })).send;
        const now = Date.now();
        const first = op({ lastAttemptAt: now, now });
        const receipt = await mail.execute(report, first);
        await sandbox.asUser(SENDER, async (client) => {
          const lock = await client.getMailboxLock("Sent");
          try {
            await client.messageMove({ header: { "message-id": receipt.messageId } }, last);
          } finally {
            lock.release();
          }
        });
        // Before: "no complete answer within 1000 ms (imap.deadlineMs)", at every check.
        const verdict = await mail.reconcile!(report, { ...first, now: now + 3_600_000 });
        expect(verdict).toMatchObject({ found: true, receipt: { messageId: receipt.messageId, foundIn: last } });
        expect(sandbox.count(receipt.messageId)).toBe(1);
      } finally {
        await sandbox.asUser(SENDER, async (client) => {
          for (let i = 0; i < MAILBOXES; i++) await client.mailboxDelete(`Archive/${i}`);
          await client.mailboxDelete("Archive").catch(() => undefined);
        });
      }
    },
    scaled(30_000),
  );

  it("each mailbox is opened read-only: the person's new mail keeps its \\Recent mark", async () => {
    await sandbox.asUser(SENDER, (client) => client.mailboxCreate("Clients"));
    await sandbox.file(
      SENDER,
      "Clients",
      Buffer.from("Subject: hello\r\nMessage-ID: <new@example.test>\r\n\r\nNew.\r\n"),
    );
    const mail = emailActions(config(started.imap.port)).send;
    const now = Date.now();
    const verdict = await mail.reconcile!(report, op({ lastAttemptAt: now, now: now + 3_600_000 }));
    expect(verdict).toMatchObject({ found: false, proof: "absent" });
    let recent: number | undefined;
    await sandbox.asUser(SENDER, async (client) => {
      const status = await client.status("Clients", { recent: true });
      recent = status ? status.recent : undefined;
    });
    // Before: 0, the lookup's SELECT took it.
    expect(recent).toBe(1);
  });

  it("a mailbox listed and gone by its SELECT (renamed meanwhile): the lookup fails as unavailable, tried again, no person alerted", async () => {
    const mail = emailActions(config(gone.port)).send;
    const now = Date.now();
    const failed = await mail.reconcile!(report, op({ lastAttemptAt: now, now: now + 3_600_000 })).then(
      (verdict) => verdict,
      (error: unknown) => error,
    );
    expect(failed).toBeInstanceOf(MailboxUnavailableError);
    // Before: MailboxRefusedError NONEXISTENT, "check sentMailbox … or create the mailbox", alerted.
    expect(failed).not.toBeInstanceOf(MailboxRefusedError);
    expect(classifyEmailError(failed)).not.toMatchObject({ alert: true });
    expect((failed as Error).message).toMatch(/Sent 2024/);
  });
});

/**
 * The scan has no deadline as a whole (each mailbox has its own), so only the caller's bound can
 * end it: a settlement's `timeoutMs`, reaching the lookup as `op.signal`. Before, nothing reached
 * it: the settlement gave up on time (core stops awaiting a lookup past its bound), but the
 * session went on searching every mailbox, and a lookup called with a signal that aborted
 * answered "absent" once it was through.
 */
describe("the settlement's bound reaches the scan of every mailbox", () => {
  let scan: Awaited<ReturnType<typeof slowProxy>>;
  /** Aborts the lookup when the scan EXAMINEs its fifth mailbox (set by a test; cleared after). */
  let atFifth: (() => void) | undefined;
  beforeAll(async () => {
    scan = await slowProxy(started.imap.port, ROUND_TRIP_MS, (n) => {
      if (n === 5) atFifth?.();
    });
    await sandbox.asUser(SENDER, async (client) => {
      for (let i = 0; i < MAILBOXES; i++) await client.mailboxCreate(`Deep/${i}`);
    });
  }, scaled(30_000));
  afterAll(async () => {
    await scan?.close();
    await sandbox.asUser(SENDER, async (client) => {
      for (let i = 0; i < MAILBOXES; i++) await client.mailboxDelete(`Deep/${i}`).catch(() => undefined);
      await client.mailboxDelete("Deep").catch(() => undefined);
    });
  });

  it(
    "a lookup whose signal aborts mid-scan fails at once, unavailable, its session closed: never 'absent' from a part",
    async () => {
      const mail = emailActions(config(scan.port, { deadlineMs: DEADLINE_MS })).send;
      const controller = new AbortController();
      atFifth = () => controller.abort(new Error("the settlement's time bound"));
      scan.selects = 0;
      try {
        const now = Date.now();
        // Never sent: no copy anywhere, so the lookup scans every mailbox past the window.
        const verdict = await mail.reconcile!(
          report,
          op({ lastAttemptAt: now, now: now + 3_600_000 }, controller.signal),
        ).then(
          (v) => v,
          (error: unknown) => error,
        );
        // Before: { found: false, proof: "absent" }, once the whole account was searched.
        expect(verdict).toBeInstanceOf(MailboxUnavailableError);
        expect((verdict as Error).message).toMatch(/given up .*the settlement's time bound/);
        await scan.idle();
        expect(scan.selects).toBeLessThan(MAILBOXES);
      } finally {
        atFifth = undefined;
      }
    },
    scaled(30_000),
  );

  for (const dialect of DIALECTS) {
    describe(`on ${dialect}`, () => {
      const db = ledgersFor<Ledger, TestLedgerOptions>(dialect, openTestLedger, { defaults: { poolSize: 2 } });

      it(
        "a settlement with timeoutMs returns unknown within it, and its lookup's session ends with it; nothing sent",
        async () => {
          let now = Date.now();
          const mail = emailActions(config(scan.port, { deadlineMs: DEADLINE_MS }));
          const ledger = await db.open({ clock: () => now, actions: [mail.send] });
          const t = `bound-${dialect}-${Math.random().toString(36).slice(2, 7)}`;
          // The server reads the body and closes without a reply, taking nothing: unknown.
          sandbox.faults.add({ kind: "drop_data" });
          const out = await ledger.run(mail.send, {
            tenant: t,
            key: ["bounded"],
            args: report,
            budget: { attempts: 1 },
          });
          expect(out).toMatchObject({ status: "pending_verification", state: "unknown" });
          const [row] = await ledger.admin.list({ tenant: t });
          const messageId = row!.providerReference!.split(" ")[0]!;
          await scan.idle();
          scan.selects = 0;
          // Past the settle window by the database clock: not found would be searched for everywhere.
          now += 3_600_000;
          const settled = await ledger.daemon.settle({ tenant: t, id: row!.id, actor: "daemon", timeoutMs: 1_000 });
          // Core gave up on the lookup at its bound, before the scan (40 mailboxes of ROUND_TRIP_MS each) was through.
          const atReturn = scan.selects;
          expect(atReturn).toBeLessThan(MAILBOXES);
          expect(settled).toMatchObject({ status: "pending_verification", state: "unknown" });
          const [after] = await ledger.admin.list({ tenant: t });
          expect(after).toMatchObject({ status: "unknown" });
          // Before: the session went on EXAMINEing every mailbox after the settlement returned.
          await scan.idle();
          expect(scan.selects).toBeLessThan(MAILBOXES);
          expect(sandbox.count(messageId)).toBe(0);
        },
        scaled(30_000),
      );
    });
  }
});
