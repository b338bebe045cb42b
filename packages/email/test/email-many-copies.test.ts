/**
 * Copies of one Message-ID from more sends than a lookup reads (MAX_COPIES, 20). It read no
 * header at all past 20 (`sendsOf` answered none), so the copies of 21 sends read as one send:
 * found, no `twice`, no alert (helper-115). Now the first 20 are read, and more than 20 copies
 * are said to have gone out more than once whatever those name.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { operationKey } from "@idem/core";
import { openTestLedger } from "@idem/core/testing";
import { MailSandbox, SENDER } from "@idem/sandbox";
import { scaled } from "@idem/testkit";
import { emailActions, messageIdFor } from "@idem/email";
import { op } from "./operation.js";

let sandbox: MailSandbox;
let ports: { smtp: number; imap: number };
beforeAll(async () => {
  sandbox = new MailSandbox({ mode: "provider-saves" });
  const s = await sandbox.start();
  ports = { smtp: s.smtp.port, imap: s.imap.port };
}, scaled(30_000));
afterAll(() => sandbox?.close());

const mail = () =>
  emailActions({
    smtp: { host: "127.0.0.1", port: ports.smtp, auth: SENDER, requireTLS: false },
    imap: { host: "127.0.0.1", port: ports.imap, auth: SENDER, requireTLS: false },
    from: SENDER.user,
    copy: { mode: "provider-saves" },
  });
const report = { to: "client@example.test", subject: "Weekly report", text: "Numbers." };

/** Files a copy of `messageId` in Sent for each of `sends` (its X-Idem-Attempt). */
async function fileCopies(messageId: string, sends: readonly string[]): Promise<void> {
  for (const send of sends) {
    const raw = [
      `From: ${SENDER.user}`,
      "To: client@example.test",
      "Subject: Weekly report",
      `Message-ID: ${messageId}`,
      `X-Idem-Attempt: ${send}`,
      "",
      "Numbers.",
      "",
    ].join("\r\n");
    await sandbox.file(SENDER, "Sent", Buffer.from(raw));
  }
}

describe("copies of many sends", () => {
  for (const c of [
    { copies: 2, sends: 2, twice: /^Sent holds copies of .* from 2 sends \(/ },
    { copies: 20, sends: 20, twice: /^Sent holds copies of .* from 20 sends \(/ },
    { copies: 21, sends: 21, twice: /^Sent holds copies of .* from 20 or more sends \(/ },
    // One send's copies, more than are read: it went out more than once all the same.
    { copies: 21, sends: 1, twice: /^Sent holds 21 copies of .*, more than 20: it went out more than once$/ },
  ])
    it(`${c.copies} copies of ${c.sends} send(s): the lookup says the message went out more than once`, async () => {
      const o = op({ lastAttemptAt: Date.now(), now: Date.now() + 3_600_000 });
      const messageId = messageIdFor(o.key, "idem.test");
      await fileCopies(
        messageId,
        Array.from({ length: c.copies }, (_, i) => `op_s${i % c.sends}/1`),
      );
      const found = await mail().send.reconcile!(report, o);
      expect(found).toMatchObject({ found: true, twice: expect.stringMatching(c.twice) });
    });
});

/**
 * The check before sending finds the copies (a key that comes again after its operation was
 * pruned: a new operation, whose earlier sends are in Sent). It sends nothing more, and the
 * ledger alerts when the receipt names more than one send (the action's effectId). Before, 21
 * copies whose first 20 name one send read as that one send: no alert, where the lookup said
 * "it went out more than once" (helper-120).
 */
describe("copies of many sends, found by the check before sending", () => {
  for (const c of [
    { copies: 1, sends: 1, alerted: false },
    { copies: 2, sends: 2, alerted: true },
    { copies: 21, sends: 1, alerted: true },
  ])
    it(`${c.copies} copies of ${c.sends} send(s): not sent again, ${c.alerted ? "" : "not "}alerted`, async () => {
      const { send } = mail();
      const ledger = await openTestLedger("sqlite::memory:", { actions: [send] });
      try {
        const tenant = `many-${c.copies}-${c.sends}-${Math.random().toString(36).slice(2, 7)}`;
        const key = operationKey({ tenant, action: send.type, parts: ["weekly"] });
        const messageId = messageIdFor(key.hash, SENDER.user.split("@")[1]!);
        await fileCopies(
          messageId,
          Array.from({ length: c.copies }, (_, i) => `op_pruned${i % c.sends}/1`),
        );
        const out = await ledger.run(send, { tenant, key, args: report });
        expect(out).toMatchObject({ status: "succeeded", receipt: { messageId, foundIn: "Sent", sent: false } });
        const alerted = (await ledger.daemon.alertsDue({ limit: 100 })).some((a) => a.id === out.operationId);
        expect({ sentNow: sandbox.count(messageId), alerted }).toEqual({ sentNow: 0, alerted: c.alerted });
      } finally {
        await ledger.close();
      }
    });
});
