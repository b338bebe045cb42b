/**
 * Append mode: the client files its own copy in Sent after the server accepted the message. An
 * APPEND that fails for a reason that may pass (a NO [INUSE] or [UNAVAILABLE], the connection lost
 * as the server's OK came back) is tried again, a few times, after looking whether the failed one
 * filed the copy after all; one that still fails is in the receipt as not filed, with why. The
 * message is never sent again for it. Real nodemailer, smtp-server, imapflow and Dovecot, with a
 * proxy in front of Dovecot that fails APPENDs (loopback.ts).
 */
import { afterAll, beforeAll, beforeEach, describe, expect, it } from "vitest";
import { MailSandbox, SENDER } from "@idem/sandbox";
import { openLedger, type LedgerOptions } from "@idem/core";
import { DIALECTS, ledgersFor, scaled } from "@idem/testkit";
import {
  emailActions,
  emailReceiptSchema,
  MailboxRefusedError,
  MailboxUnavailableError,
  type EmailReceipt,
} from "@idem/email";
import { appendMayPass } from "../src/email-append.js";
import { appendFaultProxy } from "./loopback.js";
import { fresh } from "./operation.js";

let sandbox: MailSandbox;
let started: Awaited<ReturnType<MailSandbox["start"]>>;
let proxy: Awaited<ReturnType<typeof appendFaultProxy>>;
beforeAll(async () => {
  sandbox = new MailSandbox({ mode: "none" });
  started = await sandbox.start();
  proxy = await appendFaultProxy(started.imap.port);
}, scaled(30_000));
afterAll(async () => {
  await proxy?.close();
  await sandbox?.close();
});
beforeEach(() => {
  proxy.faults.length = 0;
  proxy.appends = 0;
  proxy.refuseSelects = 0;
});

const mail = () =>
  emailActions({
    smtp: { host: "127.0.0.1", port: started.smtp.port, auth: SENDER, timeoutMs: 2_500, requireTLS: false },
    imap: { host: "127.0.0.1", port: proxy.port, auth: SENDER, requireTLS: false },
    from: SENDER.user,
    copy: { mode: "append" },
  }).send;
const report = { to: "client@example.test", subject: "Weekly report", text: "Numbers." };

describe("append mode, an APPEND that fails for now", () => {
  it("answered NO [INUSE] once: tried again, one copy filed, one message sent", async () => {
    proxy.faults.push({ kind: "no", answer: "NO [INUSE] Mailbox is locked, try again" });
    const receipt = await mail().execute(report, fresh());
    // Before: copyNotFiled { refused: false } and no copy in Sent.
    expect(receipt).toMatchObject({ sent: true });
    expect(receipt).not.toHaveProperty("copyNotFiled");
    expect(sandbox.count(receipt.messageId)).toBe(1);
    expect(await sandbox.copies(SENDER, "Sent", receipt.messageId)).toBe(1);
    expect(proxy.appends).toBe(2);
  });

  it("the connection lost as the server's OK came back (the copy filed): found, not filed twice; one message", async () => {
    proxy.faults.push({ kind: "drop-after-ok" });
    const receipt = await mail().execute(report, fresh());
    expect(receipt).not.toHaveProperty("copyNotFiled");
    expect(sandbox.count(receipt.messageId)).toBe(1);
    expect(await sandbox.copies(SENDER, "Sent", receipt.messageId)).toBe(1);
    expect(proxy.appends).toBe(1);
  });

  it("the copy filed though the answer was lost, then the look for it answered NO [INUSE]: looked for again, never filed twice", async () => {
    proxy.faults.push({ kind: "drop-after-ok" });
    proxy.refuseSelects = 1;
    const receipt = await mail().execute(report, fresh());
    // Before: the second try's failed look was taken for the last failure, and the third APPENDed
    // without looking: two copies in Sent.
    expect(receipt).not.toHaveProperty("copyNotFiled");
    expect(sandbox.count(receipt.messageId)).toBe(1);
    expect(await sandbox.copies(SENDER, "Sent", receipt.messageId)).toBe(1);
    expect(proxy.appends).toBe(1);
    expect(proxy.refuseSelects).toBe(0); // the look was refused once
  });

  it("answered NO [UNAVAILABLE] every time: a bounded number of tries, then not filed, with the reason; one message", async () => {
    for (let i = 0; i < 10; i++) proxy.faults.push({ kind: "no", answer: "NO [UNAVAILABLE] Try again later" });
    const receipt = await mail().execute(report, fresh());
    expect(receipt).toMatchObject({
      sent: true,
      copyNotFiled: {
        refused: false,
        responseCode: "UNAVAILABLE",
        reason: expect.stringMatching(/after 3 tries.*UNAVAILABLE.*Try again later/),
      },
    });
    expect(emailReceiptSchema["~standard"].validate(receipt)).toMatchObject({ value: receipt });
    expect(proxy.appends).toBe(3);
    expect(sandbox.count(receipt.messageId)).toBe(1);
    expect(await sandbox.copies(SENDER, "Sent", receipt.messageId)).toBe(0);
  });

  it("the operation aborted while waiting to try again: no further APPEND, not filed, with the last failure; one message", async () => {
    proxy.faults.push({ kind: "no", answer: "NO [INUSE] Mailbox is locked, try again" });
    // The signal aborts in the pause between the tries, exactly: once the NO came back, its first
    // read (whether to try again) finds it live, every later one (the next try's) aborted. A
    // timer racing the pause could not say which of the two checks stopped the retry.
    const signal = new AbortController().signal;
    let readsSinceNo = 0;
    Object.defineProperty(signal, "aborted", { get: () => proxy.appends > 0 && readsSinceNo++ > 0 });
    const receipt = await mail().execute(report, fresh(signal));
    // Before aba6e21 the next try ran after the pause whatever the signal said: two APPENDs.
    expect(readsSinceNo).toBe(2);
    expect(proxy.appends).toBe(1);
    expect(receipt).toMatchObject({
      sent: true,
      copyNotFiled: { refused: false, responseCode: "INUSE", reason: expect.stringMatching(/locked/) },
    });
    expect(sandbox.count(receipt.messageId)).toBe(1);
    expect(await sandbox.copies(SENDER, "Sent", receipt.messageId)).toBe(0);
  });

  it("the operation aborted during the pause before a third try: answered at once, not at the pause's end; one message", async () => {
    proxy.faults.push(
      { kind: "no", answer: "NO [INUSE] Mailbox is locked, try again" },
      { kind: "no", answer: "NO [UNAVAILABLE] Try again later" },
    );
    // The second pause is 400 to 800 ms. The abort lands inside it: the first read of the signal
    // once the second NO came back is whether to try again, and the pause begins in the same run
    // of microtasks; setImmediate fires after them, with the pause's timer pending.
    const controller = new AbortController();
    const signal = controller.signal;
    const aborted = Object.getOwnPropertyDescriptor(AbortSignal.prototype, "aborted")!.get!;
    let abortedAt: number | undefined;
    Object.defineProperty(signal, "aborted", {
      get: () => {
        if (proxy.appends === 2 && abortedAt === undefined) {
          abortedAt = Number.NaN; // scheduled once
          setImmediate(() => {
            abortedAt = performance.now();
            controller.abort(new Error("the caller gave up"));
          });
        }
        return aborted.call(signal) as boolean;
      },
    });
    const receipt = await mail().execute(report, fresh(signal));
    const waited = performance.now() - abortedAt!;
    // Before: answered once the pause ran out, 400 ms or more after the abort.
    expect(waited).toBeLessThan(scaled(75)); // at most 300 ms, under the shortest pause
    expect(proxy.appends).toBe(2);
    expect(receipt).toMatchObject({
      sent: true,
      copyNotFiled: {
        refused: false,
        responseCode: "UNAVAILABLE",
        reason: expect.stringMatching(/after 2 tries.*later/),
      },
    });
    expect(sandbox.count(receipt.messageId)).toBe(1);
    expect(await sandbox.copies(SENDER, "Sent", receipt.messageId)).toBe(0);
  });

  it("refused (NO [NOPERM]): not tried again, not filed, with the refusal; one message", async () => {
    proxy.faults.push({ kind: "no", answer: "NO [NOPERM] Permission denied" });
    const receipt = await mail().execute(report, fresh());
    expect(receipt).toMatchObject({ copyNotFiled: { refused: true, responseCode: "NOPERM" } });
    expect(proxy.appends).toBe(1);
    expect(sandbox.count(receipt.messageId)).toBe(1);
  });

  // A tagged NO that trying again gets again filed nothing: before, `refused: false` read "the
  // copy may or may not be there" (helper-115).
  for (const code of ["TOOBIG", "LIMIT", "CONTACTADMIN"])
    it(`answered NO [${code}]: not tried again, refused (nothing filed); one message`, async () => {
      proxy.faults.push({ kind: "no", answer: `NO [${code}] Not filed` });
      const receipt = await mail().execute(report, fresh());
      expect(receipt).toMatchObject({ copyNotFiled: { refused: true, responseCode: code } });
      expect(proxy.appends).toBe(1);
      expect(sandbox.count(receipt.messageId)).toBe(1);
      expect(await sandbox.copies(SENDER, "Sent", receipt.messageId)).toBe(0);
    });
});

for (const dialect of DIALECTS) {
  describe(`through the ledger on ${dialect}`, () => {
    const db = ledgersFor(dialect, openLedger, { defaults: { poolSize: 2 } as LedgerOptions });

    it("the first APPEND's answer lost (the copy filed): succeeded, one copy, replayed as is; one message", async () => {
      const t = `t-${Math.random().toString(36).slice(2, 9)}`;
      proxy.faults.push({ kind: "drop-after-ok" });
      const l = await db.open();
      const out = await l.run(mail(), { tenant: t, key: ["append-dropped"], args: report });
      expect(out).toMatchObject({ status: "succeeded", receipt: { sent: true } });
      const receipt = (out as { receipt: EmailReceipt }).receipt;
      expect(receipt).not.toHaveProperty("copyNotFiled");
      const again = await l.run(mail(), { tenant: t, key: ["append-dropped"], args: report });
      expect(again).toMatchObject({ status: "succeeded", replayed: true });
      expect(sandbox.count(receipt.messageId)).toBe(1);
      expect(await sandbox.copies(SENDER, "Sent", receipt.messageId)).toBe(1);
    });
  });
}

describe("appendMayPass", () => {
  const failed = (cause: object) => new MailboxUnavailableError("IMAP Sent: Command failed", { cause });
  it("tries again a NO that may pass, a lost connection, a session that did not open", () => {
    expect(appendMayPass(failed({ responseStatus: "NO", serverResponseCode: "INUSE" }))).toBe(true);
    expect(appendMayPass(failed({ responseStatus: "NO", serverResponseCode: "UNAVAILABLE" }))).toBe(true);
    expect(appendMayPass(failed({ responseStatus: "NO" }))).toBe(true); // no code: not said to be for good
    expect(appendMayPass(failed({ code: "NoConnection" }))).toBe(true);
    expect(appendMayPass(new MailboxUnavailableError("IMAP 127.0.0.1:1 unreachable: ECONNREFUSED"))).toBe(true);
  });
  it("not a refusal, a BAD, or a NO that says the same message will fail again", () => {
    expect(appendMayPass(new MailboxRefusedError("may not file into Sent", "mailbox", "NOPERM"))).toBe(false);
    expect(appendMayPass(new MailboxRefusedError("refused the sign-in", "sign-in", "AUTHENTICATIONFAILED"))).toBe(
      false,
    );
    expect(appendMayPass(failed({ responseStatus: "BAD" }))).toBe(false);
    expect(appendMayPass(failed({ responseStatus: "NO", serverResponseCode: "TOOBIG" }))).toBe(false);
    expect(appendMayPass(failed({ responseStatus: "NO", serverResponseCode: "CANNOT" }))).toBe(false);
    expect(appendMayPass(new TypeError("a bug"))).toBe(false);
  });
});
