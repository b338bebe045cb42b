/**
 * A person's retry (`admin.retry`) of an email operation in each state a send can leave, with the
 * server filing its copy late (`copyDelayMs`: the copy is not there when the person looks, nor
 * when the next run checks), and two callers at once on a row whose copy has not landed yet.
 * Against the mail sandbox's smtp-server and Dovecot, on each database. Counted at the target:
 * messages the server received with the operation's Message-ID, and copies in the mailbox.
 * Covered elsewhere: provider-saves, unknown (email-retry-late-copy.test.ts); provider-saves,
 * 554 with the copy already filed (email-replies.test.ts). Not here: a retry of a failed
 * operation (a 5xx after the body) is run as known not sent, with one look before sending and no
 * settle window, so a copy filed late is not waited for (README, "a person's retry"). Each test
 * waits for the late copy, so the sandbox files it with no fault.
 */
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import type { Ledger } from "@idem/core";
import { openTestLedger, type TestLedgerOptions } from "@idem/core/testing";
import { JOURNAL, MailSandbox, SENDER, type CopyMode } from "@idem/sandbox";
import { DIALECTS, ledgersFor, scaled } from "@idem/testkit";
import { emailActions, type EmailConfig } from "@idem/email";

/** How long after taking a message the server files its copy: well past a retry and its run. */
const COPY_DELAY_MS = scaled(4_000);

let sandbox: MailSandbox;
let ports: { smtp: number; imap: number };
beforeAll(async () => {
  sandbox = new MailSandbox({ copyDelayMs: COPY_DELAY_MS });
  const s = await sandbox.start();
  ports = { smtp: s.smtp.port, imap: s.imap.port };
}, scaled(30_000));
afterAll(() => sandbox?.close());
afterEach(() => sandbox.faults.clear());

type Mode = Exclude<CopyMode, "none">;
const imapOf = (user: typeof SENDER) => ({ host: "127.0.0.1", port: ports.imap, auth: user, requireTLS: false });
// The settle window is longer than the server's delay in filing copies, as it must be.
const config = (mode: Mode): EmailConfig => ({
  smtp: { host: "127.0.0.1", port: ports.smtp, auth: SENDER, timeoutMs: 2_500, requireTLS: false },
  imap: imapOf(SENDER),
  from: SENDER.user,
  copy: mode === "journal" ? { mode, address: JOURNAL.user, imap: imapOf(JOURNAL) } : { mode },
  settleMs: 120_000,
});
const letter = { to: "client@example.test", subject: "Invoice 7", text: "Attached." };
const where = (mode: Mode) =>
  mode === "journal" ? { user: JOURNAL, mailbox: "INBOX" } : { user: SENDER, mailbox: "Sent" };
let n = 0;
const tenant = () => `rs${++n}-${Math.random().toString(36).slice(2, 7)}`;

/** Waits (polling over IMAP) until the server has filed the copy of `messageId` where `mode` files it. */
async function filed(mode: Mode, messageId: string): Promise<void> {
  const until = Date.now() + scaled(30_000);
  const { user, mailbox } = where(mode);
  while ((await sandbox.copies(user, mailbox, messageId)) === 0) {
    if (Date.now() > until) throw new Error(`no copy of ${messageId} in ${mailbox}`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

for (const dialect of DIALECTS) {
  describe(`a person's retry while the copy has not landed yet, on ${dialect}`, () => {
    const db = ledgersFor<Ledger, TestLedgerOptions>(dialect, openTestLedger, { defaults: { poolSize: 4 } });
    let mode: Mode = "provider-saves";
    afterEach(() => {
      sandbox.mode = "provider-saves";
    });

    /** Opens a ledger and the mailer of `m`, the sandbox filing copies as `m` does. */
    async function open(m: Mode) {
      mode = m;
      sandbox.mode = m;
      const mail = emailActions(config(m)).send;
      const l = await db.open({ budget: { attempts: 1, baseDelayMs: 10 }, actions: [mail] });
      const t = tenant();
      const run = () => l.run(mail, { tenant: t, key: ["invoice-7"], args: letter });
      const messageIdOf = async (id: string) =>
        (await l.get({ tenant: t, id })).operation.providerReference!.split(" ")[0]!;
      return { l, t, run, messageIdOf };
    }

    /** At the target: the messages the server received, and the copies filed, of `messageId`. */
    async function atTarget(messageId: string) {
      const { user, mailbox } = where(mode);
      return { received: sandbox.count(messageId), copies: await sandbox.copies(user, mailbox, messageId) };
    }

    // provider-saves: email-retry-late-copy.test.ts.
    it("journal: unknown after a lost answer, retried by a person before the copy landed: looked for first, pending; then found, one message", async () => {
      const m = "journal";
      const { l, t, run, messageIdOf } = await open(m);
      sandbox.faults.add({ kind: "hold_reply", delayMs: scaled(20_000) });
      const out = await run();
      expect(out).toMatchObject({ status: "pending_verification", state: "unknown" });
      const messageId = await messageIdOf(out.operationId);
      expect(sandbox.count(messageId)).toBe(1); // the server took it
      await l.admin.retry({ tenant: t, id: out.operationId, actor: "ops", reason: "nothing in the mailbox" });
      expect(await run()).toMatchObject({ status: "pending_verification", state: "pending" });
      expect(sandbox.count(messageId)).toBe(1);
      await filed(m, messageId);
      expect(await l.daemon.settle({ tenant: t, id: out.operationId, actor: "daemon" })).toMatchObject({
        status: "succeeded",
        receipt: { sent: true },
      });
      expect(await atTarget(messageId)).toEqual({ received: 1, copies: 1 });
    });

    for (const m of ["provider-saves", "journal"] as const) {
      it(`${m}: needs_review after a lost answer, retried by a person before the copy landed: looked for first, then found, one message`, async () => {
        const { l, t, run, messageIdOf } = await open(m);
        sandbox.faults.add({ kind: "hold_reply", delayMs: scaled(20_000) });
        const out = await run();
        expect(out).toMatchObject({ status: "pending_verification", state: "unknown" });
        // The daemon's limits reached: to a person, alerted.
        const escalated = await l.daemon.settle({
          tenant: t,
          id: out.operationId,
          actor: "daemon",
          escalate: { maxChecks: 0, maxAgeMs: 3_600_000 },
        });
        expect(escalated).toMatchObject({ status: "pending_verification", state: "needs_review" });
        const messageId = await messageIdOf(out.operationId);
        await l.admin.retry({ tenant: t, id: out.operationId, actor: "ops", reason: "nothing in the mailbox" });
        expect(await run()).toMatchObject({ status: "pending_verification", state: "pending" });
        expect(sandbox.count(messageId)).toBe(1);
        await filed(m, messageId);
        expect(await l.daemon.settle({ tenant: t, id: out.operationId, actor: "daemon" })).toMatchObject({
          status: "succeeded",
          receipt: { sent: true },
        });
        expect(await atTarget(messageId)).toEqual({ received: 1, copies: 1 });
      });

      it(`${m}: failed after a 554 to a body the server queued all the same, retried by a person before the copy landed: one message, or a person told`, async () => {
        const { l, t, run, messageIdOf } = await open(m);
        sandbox.faults.add({ kind: "defer_taken", status: 554 });
        const out = await run();
        expect(out).toMatchObject({ status: "failed", error: { kind: "permanent" } });
        const messageId = await messageIdOf(out.operationId);
        expect(sandbox.count(messageId)).toBe(1);
        await l.admin.retry({ tenant: t, id: out.operationId, actor: "ops", reason: "the filter was fixed" });
        const retried = await run();
        await filed(m, messageId);
        const { operation } = await l.get({ tenant: t, id: out.operationId });
        const sent = sandbox.count(messageId);
        // Never two in silence: a second message is alerted for a person to see.
        if (sent > 1) expect({ retried, status: operation.status }).toMatchObject({ status: "needs_review" });
        expect({ sent, retried: retried.status }).toEqual({ sent: 1, retried: "pending_verification" });
        expect(await l.daemon.settle({ tenant: t, id: out.operationId, actor: "daemon" })).toMatchObject({
          status: "succeeded",
        });
        expect(await atTarget(messageId)).toEqual({ received: 1, copies: 1 });
      });

      it(`${m}: two callers at once on an unknown row whose copy has not landed: neither sends; then found, one message`, async () => {
        const { l, t, run, messageIdOf } = await open(m);
        sandbox.faults.add({ kind: "hold_reply", delayMs: scaled(20_000) });
        const out = await run();
        expect(out).toMatchObject({ status: "pending_verification", state: "unknown" });
        const messageId = await messageIdOf(out.operationId);
        const both = await Promise.all([run(), run()]);
        for (const b of both) expect(b).toMatchObject({ status: "pending_verification" });
        expect(sandbox.count(messageId)).toBe(1);
        await filed(m, messageId);
        // The daemon settles it (a caller's run is answered from the row until its next check is due).
        const settled = await l.daemon.settle({ tenant: t, id: out.operationId, actor: "daemon" });
        expect(settled).toMatchObject({ status: "succeeded", receipt: { sent: true } });
        const after = await Promise.all([run(), run()]);
        for (const a of after) expect(a).toMatchObject({ status: "succeeded", replayed: true });
        expect(await atTarget(messageId)).toEqual({ received: 1, copies: 1 });
      });

      it(`${m}: two callers at once on a person's retry (pending, looked for first) whose copy has not landed: neither sends; then found, one message`, async () => {
        const { l, t, run, messageIdOf } = await open(m);
        sandbox.faults.add({ kind: "hold_reply", delayMs: scaled(20_000) });
        const out = await run();
        const messageId = await messageIdOf(out.operationId);
        await l.admin.retry({ tenant: t, id: out.operationId, actor: "ops", reason: "nothing in the mailbox" });
        const both = await Promise.all([run(), run()]);
        for (const b of both) expect(b).toMatchObject({ status: "pending_verification" });
        expect(sandbox.count(messageId)).toBe(1);
        await filed(m, messageId);
        // The daemon settles it (a caller's run is answered from the row until its next check is due).
        const settled = await l.daemon.settle({ tenant: t, id: out.operationId, actor: "daemon" });
        expect(settled).toMatchObject({ status: "succeeded", receipt: { sent: true } });
        const after = await Promise.all([run(), run()]);
        for (const a of after) expect(a).toMatchObject({ status: "succeeded", replayed: true });
        expect(await atTarget(messageId)).toEqual({ received: 1, copies: 1 });
      });
    }
  });
}
