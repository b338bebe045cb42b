/**
 * A person's retry of an email whose send may have gone out (`admin.retry` of an unknown
 * operation), against the mail sandbox's smtp-server and Dovecot, on each database. The server
 * queued the message and answered 451, and files its copy in Sent only later (`copyDelayMs`): the
 * person looks at Sent, finds nothing, and retries. The next run looks for the copy first, its
 * settle window counted from the send, instead of sending at once: before, the check before
 * sending found no copy yet and a second message went out. Messages are counted at the server.
 */
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import type { Ledger } from "@idem/core";
import { openTestLedger, type TestLedgerOptions } from "@idem/core/testing";
import { MailSandbox, SENDER } from "@idem/sandbox";
import { DIALECTS, ledgersFor, scaled } from "@idem/testkit";
import { emailActions, type EmailConfig } from "@idem/email";

/** How long after taking a message the server files its copy in Sent. */
const COPY_DELAY_MS = 3_000;

let sandbox: MailSandbox;
let ports: { smtp: number; imap: number };
beforeAll(async () => {
  sandbox = new MailSandbox({ copyDelayMs: COPY_DELAY_MS });
  const s = await sandbox.start();
  ports = { smtp: s.smtp.port, imap: s.imap.port };
}, scaled(30_000));
afterAll(() => sandbox?.close());
afterEach(() => sandbox.faults.clear());

// The settle window is longer than the server's delay in filing copies, as it must be.
const config = (): EmailConfig => ({
  smtp: { host: "127.0.0.1", port: ports.smtp, auth: SENDER, timeoutMs: 2_500, requireTLS: false },
  imap: { host: "127.0.0.1", port: ports.imap, auth: SENDER, requireTLS: false },
  from: SENDER.user,
  copy: { mode: "provider-saves" },
  settleMs: 60_000,
});
const letter = { to: "client@example.test", subject: "Invoice 7", text: "Attached." };
let n = 0;
const tenant = () => `lc${++n}-${Math.random().toString(36).slice(2, 7)}`;

/** Waits (polling Sent over IMAP) until the server has filed the copy of `messageId`. */
async function filed(messageId: string): Promise<void> {
  const until = Date.now() + scaled(30_000);
  const client = sandbox.imap(SENDER);
  await client.connect();
  try {
    for (;;) {
      const lock = await client.getMailboxLock("Sent");
      try {
        const found = await client.search({ header: { "message-id": messageId } });
        if (Array.isArray(found) && found.length > 0) return;
      } finally {
        lock.release();
      }
      if (Date.now() > until) throw new Error(`no copy of ${messageId} in Sent`);
      await new Promise((r) => setTimeout(r, 100));
    }
  } finally {
    await client.logout();
  }
}

for (const dialect of DIALECTS) {
  describe(`a person's retry of a send that may have gone out, on ${dialect}`, () => {
    const db = ledgersFor<Ledger, TestLedgerOptions>(dialect, openTestLedger, { defaults: { poolSize: 2 } });

    it("the message lands in Sent after the person looked: the run after the retry finds it, one message", async () => {
      const mail = emailActions(config());
      const l = await db.open({ budget: { attempts: 1, baseDelayMs: 10 }, actions: [mail.send] });
      const t = tenant();
      const before = sandbox.count();
      sandbox.faults.add({ kind: "defer_taken" });
      const out = await l.run(mail.send, { tenant: t, key: ["invoice-7"], args: letter });
      expect(out).toMatchObject({ status: "pending_verification", state: "unknown" });
      expect(sandbox.count() - before).toBe(1); // the server took it
      // The person looks at Sent: nothing yet. They retry.
      await l.admin.retry({ tenant: t, id: out.operationId, actor: "ops", reason: "nothing in Sent" });
      const again = await l.run(mail.send, { tenant: t, key: ["invoice-7"], args: letter });
      expect({ sent: sandbox.count() - before, again }).toMatchObject({
        sent: 1, // before: 2, the check before sending found no copy yet
        again: { status: "pending_verification", state: "pending" },
      });
      // The reference names the Message-ID first, then where its copy is looked for.
      const reference = (await l.get({ tenant: t, id: out.operationId })).operation.providerReference!;
      const messageId = reference.split(" ")[0]!;
      await filed(messageId);
      const settled = await l.daemon.settle({ tenant: t, id: out.operationId, actor: "daemon" });
      expect(settled).toMatchObject({ status: "succeeded", receipt: { sent: true, foundIn: "Sent" } });
      expect(sandbox.count() - before).toBe(1);
    });
  });
}
