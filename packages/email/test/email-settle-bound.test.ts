/**
 * A settlement's time bound (`ledger.daemon.settle`'s `timeoutMs`) reaching a send under way as
 * `op.signal`: core aborts it at the bound and stops awaiting an execute that has not answered a
 * second later (unknown: it may have been sent). Both ends of a send must answer for it:
 *  - the APPEND of the Sent copy (append mode), after the server accepted the message: an IMAP
 *    server holding its answer to it must not turn a message sent into "may have been sent", so
 *    the APPEND is given up and the send succeeds, its receipt saying the copy is not filed;
 *  - the SMTP server holding its answer to the body (DATA): unknown at about the bound, with the
 *    connection closed, and found by the next settlement's lookup.
 * Real Dovecot and smtp-server (the mail sandbox); a scripted SMTP server and a proxy that
 * withholds the APPEND's tagged answer (loopback.ts) for the first. Messages counted at the servers.
 */
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import { once } from "node:events";
import type { Ledger } from "@idem/core";
import { openTestLedger, type TestLedgerOptions } from "@idem/core/testing";
import { MailSandbox, SENDER } from "@idem/sandbox";
import { DIALECTS, ledgersFor, scaled } from "@idem/testkit";
import { emailActions, type EmailConfig } from "@idem/email";
import { scriptedSmtp, tricklingProxy, type ScriptedSmtp } from "./loopback.js";

let sandbox: MailSandbox;
let started: Awaited<ReturnType<MailSandbox["start"]>>;
let smtp: ScriptedSmtp;
let imap: Awaited<ReturnType<typeof tricklingProxy>>;
beforeAll(async () => {
  sandbox = new MailSandbox({ mode: "provider-saves" });
  started = await sandbox.start();
  smtp = await scriptedSmtp();
  imap = await tricklingProxy(started.imap.port);
}, scaled(30_000));
afterAll(async () => {
  await smtp?.close();
  await imap?.close();
  await sandbox?.close();
});
afterEach(() => {
  smtp.reset();
  imap.hold.length = 0;
  imap.held = 0;
  // A test that failed before its reply came does not leave a client waiting for it.
  sandbox.releaseHeldReplies();
  sandbox.faults.clear();
});

/** The settlement's bound: far inside every deadline and timeout of the clients, so only it ends the send. */
const BOUND_MS = scaled(2_000);
/** Every client deadline and inactivity timeout: well past the bound and the second core waits after it. */
const PATIENT_MS = scaled(60_000);
const report = { to: "client@example.test", subject: "Weekly report", text: "Numbers." };

/** Append mode through the scripted SMTP server and the withholding proxy in front of Dovecot. */
const appendConfig = (): EmailConfig => ({
  smtp: { host: "127.0.0.1", port: smtp.port, timeoutMs: PATIENT_MS, deadlineMs: PATIENT_MS, requireTLS: false },
  imap: { host: "127.0.0.1", port: imap.port, auth: SENDER, requireTLS: false, deadlineMs: PATIENT_MS },
  from: SENDER.user,
  copy: { mode: "append" },
});

/** The sandbox's own servers; the SMTP server files the copy in Sent as it accepts the message. */
const savedConfig = (): EmailConfig => ({
  smtp: {
    host: "127.0.0.1",
    port: started.smtp.port,
    auth: SENDER,
    timeoutMs: PATIENT_MS,
    deadlineMs: PATIENT_MS,
    requireTLS: false,
  },
  imap: { host: "127.0.0.1", port: started.imap.port, auth: SENDER, requireTLS: false },
  from: SENDER.user,
  copy: { mode: "provider-saves" },
});

for (const dialect of DIALECTS) {
  describe(`a settlement's time bound reaches the send, on ${dialect}`, () => {
    const db = ledgersFor<Ledger, TestLedgerOptions>(dialect, openTestLedger, { defaults: { poolSize: 2 } });
    const tenant = () => `bound-${dialect}-${Math.random().toString(36).slice(2, 7)}`;

    /** The operation's events, one line each, for a failure message. */
    async function story(ledger: Ledger, t: string, id: string): Promise<string> {
      const { events } = await ledger.get({ tenant: t, id });
      return events.map((e) => `${e.from}>${e.to}@${e.attempt} ${e.reason}`).join(" | ");
    }

    it(
      "append mode, the IMAP server holding its answer to the APPEND: the APPEND is given up at the bound, and the message sent is succeeded (its copy said not filed), not unknown",
      async () => {
        const mail = emailActions(appendConfig());
        const ledger = await db.open({ actions: [mail.send], budget: { attempts: 1 } });
        const t = tenant();
        // The first attempt is greylisted at RCPT TO: the body held back, nothing sent, pending.
        smtp.script = { rcpt: () => "451 4.7.1 greylisted, try again later" };
        const first = await ledger.run(mail.send, { tenant: t, key: ["held-append"], args: report });
        expect(first).toMatchObject({ status: "pending_verification", state: "pending" });
        expect(smtp.bodies).toHaveLength(0);
        smtp.script = {};
        imap.hold.push("APPEND");
        const began = performance.now();
        const settled = await ledger.daemon.settle({
          tenant: t,
          id: first.operationId!,
          actor: "daemon",
          timeoutMs: BOUND_MS,
        });
        const tookMs = performance.now() - began;
        const why = await story(ledger, t, first.operationId!);
        expect(imap.held, why).toBe(1);
        expect(smtp.bodies, why).toHaveLength(1);
        // Before: unknown, "no answer within … nor 1000 ms after its signal aborted": the APPEND
        // took no signal, so the execute went on waiting for it after the message went out.
        expect(settled, why).toMatchObject({
          status: "succeeded",
          receipt: {
            sent: true,
            copyNotFiled: {
              refused: false,
              reason: expect.stringMatching(/the APPEND was given up .*the settlement's time bound/),
            },
          },
        });
        expect(tookMs).toBeLessThan(BOUND_MS + scaled(5_000));
        const [row] = await ledger.admin.list({ tenant: t });
        expect(row).toMatchObject({ status: "succeeded" });
        // An operator hears of it, once (before: no alert): without its copy no lookup finds the send.
        const alerted = (await ledger.daemon.alertsDue({ limit: 1_000 })).filter((a) => a.tenant === t);
        expect(alerted, why).toMatchObject([
          {
            id: first.operationId,
            status: "succeeded",
            reason: expect.stringMatching(
              /^sent, but its Sent copy was not filed, given up \(no response code\): the copy may or may not be there; if it is not, no lookup can find this send: .*APPEND was given up/,
            ),
          },
        ]);
        await ledger.daemon.ackAlert(alerted[0]!);
        // Settled: every later call replays it, nothing is sent again, nor alerted.
        const again = await ledger.run(mail.send, { tenant: t, key: ["held-append"], args: report });
        expect(again).toMatchObject({ status: "succeeded", replayed: true });
        expect(smtp.bodies).toHaveLength(1);
        expect((await ledger.daemon.alertsDue({ limit: 1_000 })).filter((a) => a.tenant === t)).toEqual([]);
      },
      scaled(30_000),
    );

    it(
      "the SMTP server holding its answer to the body, past the bound and inside smtp.deadlineMs: unknown at about the bound, the connection closed; the next settlement finds the message, one sent",
      async () => {
        const mail = emailActions(savedConfig());
        const ledger = await db.open({ actions: [mail.send], budget: { attempts: 1 } });
        const t = tenant();
        // The first attempt loses its connection at MAIL FROM: nothing sent, pending.
        sandbox.faults.add({ kind: "drop_at", match: { method: "MAIL" } });
        const first = await ledger.run(mail.send, { tenant: t, key: ["held-data"], args: report });
        expect(first).toMatchObject({ status: "pending_verification", state: "pending" });
        // The server takes the message and files its copy, then holds its 250 far past the bound.
        sandbox.faults.add({ kind: "hold_reply", delayMs: scaled(120_000) });
        const accepted = once(sandbox.events, "accepted");
        const began = performance.now();
        const settled = await ledger.daemon.settle({
          tenant: t,
          id: first.operationId!,
          actor: "daemon",
          timeoutMs: BOUND_MS,
        });
        const tookMs = performance.now() - began;
        await accepted;
        const why = await story(ledger, t, first.operationId!);
        expect(settled, why).toMatchObject({ status: "pending_verification", state: "unknown" });
        // The send's own answer to its signal (the connection closed), not core's giving up on it.
        const [row] = await ledger.admin.list({ tenant: t });
        expect(row, why).toMatchObject({ status: "unknown" });
        expect(row!.reason, why).toMatch(/send aborted after the message was handed to the server/);
        expect(tookMs).toBeGreaterThanOrEqual(BOUND_MS - 50);
        expect(tookMs).toBeLessThan(BOUND_MS + scaled(5_000));
        // Nothing held on our side: the reply still held has no client left to take it.
        const messageId = row!.providerReference!.split(" ")[0]!;
        const found = await ledger.daemon.settle({ tenant: t, id: first.operationId!, actor: "daemon" });
        expect(found, await story(ledger, t, first.operationId!)).toMatchObject({
          status: "succeeded",
          receipt: { messageId, foundIn: "Sent" },
        });
        expect(sandbox.count(messageId)).toBe(1);
      },
      scaled(30_000),
    );
  });
}
