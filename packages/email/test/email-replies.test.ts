/**
 * What an SMTP server's reply after the message body does to the ledger, against the mail
 * sandbox's smtp-server and Dovecot, on each database:
 *  - what is stored of a refusal: the reply code, the enhanced status code and the server's own
 *    words, never the message's subject or text a content filter quotes back;
 *  - a 4xx after the body: the server may have queued the message all the same (a before-queue
 *    filter timing out after the next hop took it), so the outcome is unknown and the copy decides,
 *    never a second send in silence; greylisting (at RCPT TO, or a 4xx after a body taken by
 *    nobody) is still sent once.
 * Messages are counted at the server.
 */
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import type { Ledger } from "@idem/core";
import { openTestLedger, type TestLedgerOptions } from "@idem/core/testing";
import { MailSandbox, SENDER, type CopyMode } from "@idem/sandbox";
import { DIALECTS, ledgersFor, scaled } from "@idem/testkit";
import { emailActions, type CopyConfig, type EmailConfig } from "@idem/email";

let sandbox: MailSandbox;
let ports: { smtp: number; imap: number };
beforeAll(async () => {
  sandbox = new MailSandbox();
  const s = await sandbox.start();
  ports = { smtp: s.smtp.port, imap: s.imap.port };
}, scaled(30_000));
afterAll(() => sandbox?.close());
afterEach(() => sandbox.faults.clear()); // a fault the test did not reach must not leak into the next

type Mode = Exclude<CopyConfig["mode"], "journal">;
const SERVER_MODE: Record<Mode, CopyMode> = { "provider-saves": "provider-saves", append: "none" };

// The sandbox offers no TLS: `requireTLS: false` on both sides, as a config for such a server must.
function config(mode: Mode): EmailConfig {
  sandbox.mode = SERVER_MODE[mode];
  return {
    smtp: { host: "127.0.0.1", port: ports.smtp, auth: SENDER, timeoutMs: 2_500, requireTLS: false },
    imap: { host: "127.0.0.1", port: ports.imap, auth: SENDER, requireTLS: false },
    from: SENDER.user,
    copy: { mode },
    settleMs: 300,
  };
}
/** What a customer wrote: none of it may reach the ledger. */
const SUBJECT = "Quarterly figures for Zephyrine Holdings";
const LINE = "Revenue at the Brackenfield plant fell by 12 percent.";
const letter = { to: "client@example.test", subject: SUBJECT, text: `${LINE}\nMore below.` };
let n = 0;
const tenant = () => `r${++n}-${Math.random().toString(36).slice(2, 7)}`;

async function stored(l: Ledger, t: string, id: string): Promise<string> {
  const { operation, events } = await l.get({ tenant: t, id });
  return JSON.stringify({ operation: { ...operation, args: undefined }, events });
}

for (const dialect of DIALECTS) {
  describe(`SMTP replies after the body, on ${dialect}`, () => {
    const db = ledgersFor<Ledger, TestLedgerOptions>(dialect, openTestLedger, { defaults: { poolSize: 2 } });

    for (const status of [554, 451] as const) {
      it(`a ${status} quoting the subject and a line of the text: the ledger keeps the code, the enhanced code and the server's words, not the customer's`, async () => {
        // Before: the reason held nodemailer's message, the server's reply as it came:
        // `Message failed: 554 5.7.1 Message refused by policy: subject "Quarterly figures …"`.
        const l = await db.open();
        const mail = emailActions(config("provider-saves"));
        const t = tenant();
        sandbox.faults.add({ kind: "refuse_data", status });
        const out = await l.run(mail.send, { tenant: t, key: ["quarterly"], args: letter, storeArgs: false });
        // A 554 refuses; a 451 after the body leaves the outcome to its copy.
        expect(out.status).toBe(status === 554 ? "failed" : "pending_verification");
        const row = await stored(l, t, out.operationId);
        expect(row).toContain(`${status} ${status === 554 ? "5.7.1" : "4.3.0"}`);
        expect(row).toContain("Message refused by policy");
        for (const customer of ["Quarterly figures", "Zephyrine", "Brackenfield", "Revenue at", "12 percent"])
          expect(row).not.toContain(customer);
        if (out.status === "failed")
          expect(out.error.reason).toMatch(/554 5\.7\.1 Message refused by policy: subject "\[…\]" and text "\[…\]"/);
      });
    }

    it("append: the server queued the message, then answered 451: unknown, a person decides; never a second send", async () => {
      // Before: the 451 was read "not accepted", the operation retried at once, the check before
      // it found no copy (append files its own, after a 250) and the message went out twice.
      const l = await db.open({ budget: { baseDelayMs: 10 } });
      const mail = emailActions(config("append"));
      const t = tenant();
      const before = sandbox.count();
      sandbox.faults.add({ kind: "defer_taken" });
      const out = await l.run(mail.send, { tenant: t, key: ["queued-451"], args: letter });
      expect({ sent: sandbox.count() - before, out }).toMatchObject({
        sent: 1,
        out: { status: "pending_verification", state: "needs_review" },
      });
      const { events } = await l.get({ tenant: t, id: out.operationId });
      expect(events.map((e) => e.to)).toContain("unknown");
      expect(events.find((e) => e.to === "unknown")?.reason).toMatch(/after the message .*451 4\.3\.0/);
    });

    it("provider-saves: the server queued and filed the message, then answered 451: found by its copy, sent by this attempt, one message", async () => {
      // Before: retried as not sent; its check before sending found the copy and read it as an
      // earlier send's (`sent: false`, "already done earlier") though this very attempt sent it.
      const l = await db.open({ budget: { baseDelayMs: 10 } });
      const mail = emailActions(config("provider-saves"));
      const t = tenant();
      const before = sandbox.count();
      sandbox.faults.add({ kind: "defer_taken" });
      const out = await l.run(mail.send, { tenant: t, key: ["queued-451"], args: letter });
      expect(out).toMatchObject({ status: "succeeded", receipt: { sent: true, foundIn: "Sent" } });
      expect(sandbox.count() - before).toBe(1);
    });

    // Left failed on purpose (a 4xx after the body is not): RFC 5321 §4.2.5 has a server that
    // answers 5yz after the data make no attempt to deliver, and content filters answer so for
    // every message they refuse; read as unknown, each refusal would be looked up, sent again
    // past the settle window and refused again (append: sent to a person), and the agent would
    // hear "pending" instead of "refused by policy". A server that queues anyway costs a ledger
    // that says failed, not a second email: failed is final for the key, and a person's retry
    // first looks for the copy.
    it("provider-saves: a server that queued and filed the message, then answered 554: failed and replayed, never sent again; a person's retry finds the copy", async () => {
      const l = await db.open({ budget: { baseDelayMs: 10 } });
      const mail = emailActions(config("provider-saves"));
      const t = tenant();
      const before = sandbox.count();
      sandbox.faults.add({ kind: "defer_taken", status: 554 });
      const out = await l.run(mail.send, { tenant: t, key: ["queued-554"], args: letter });
      expect(out).toMatchObject({ status: "failed", error: { kind: "permanent" } });
      const again = await l.run(mail.send, { tenant: t, key: ["queued-554"], args: letter });
      expect(again).toMatchObject({ status: "failed", replayed: true });
      await l.admin.retry({ tenant: t, id: out.operationId, actor: "ops", reason: "the filter was fixed" });
      // The 554 came after the body (mayHaveTaken): the retry looks first, and its lookup finds the
      // copy: the message went out (by the first attempt), as its receipt says.
      const retried = await l.run(mail.send, { tenant: t, key: ["queued-554"], args: letter });
      expect(retried).toMatchObject({ status: "succeeded", receipt: { sent: true, foundIn: "Sent" } });
      expect(sandbox.count() - before).toBe(1);
    });

    it("greylisting at RCPT TO (450): not sent, retried with the same Message-ID, sent once; never unknown", async () => {
      const l = await db.open({ budget: { baseDelayMs: 10 } });
      const mail = emailActions(config("append"));
      const t = tenant();
      const before = sandbox.count();
      sandbox.faults.add({ kind: "reject_rcpt", status: 450, match: { path: "client@example.test" } });
      const out = await l.run(mail.send, { tenant: t, key: ["greylisted"], args: letter });
      expect(out).toMatchObject({ status: "succeeded", attempt: 2, receipt: { sent: true } });
      expect(sandbox.count() - before).toBe(1);
      const { events } = await l.get({ tenant: t, id: out.operationId });
      expect(events.map((e) => e.to)).not.toContain("unknown");
    });

    it("provider-saves: a 451 after a body the server did not take (greylisting after DATA): unknown, proven absent past the settle window, sent once", async () => {
      // The database clock, moved past the settle window instead of waiting it out.
      let shift = 0;
      const mail = emailActions(config("provider-saves"));
      const l = await db.open({ budget: { baseDelayMs: 10 }, clock: () => Date.now() + shift, actions: [mail.send] });
      const t = tenant();
      const before = sandbox.count();
      sandbox.faults.add({ kind: "refuse_data", status: 451 });
      const out = await l.run(mail.send, { tenant: t, key: ["greylisted-data"], args: letter });
      // Inside the window nothing proves the server dropped it: verification continues.
      expect(out).toMatchObject({ status: "pending_verification", state: "unknown" });
      expect(sandbox.count() - before).toBe(0);
      shift = 3_600_000;
      const settled = await l.daemon.settle({ tenant: t, id: out.operationId, actor: "daemon" });
      expect(settled).toMatchObject({ status: "succeeded", receipt: { sent: true } });
      expect(sandbox.count() - before).toBe(1);
      const { events } = await l.get({ tenant: t, id: out.operationId });
      expect(events.map((e) => e.to)).toEqual(expect.arrayContaining(["unknown", "pending", "succeeded"]));
    });
  });
}
