/**
 * The Sent folder renamed while a send's outcome is unknown (an archive of last year's sent mail,
 * "Sent" renamed "Sent 2025"): the server makes a new, empty "Sent" (Dovecot's `auto = subscribe`,
 * as a client or a provider does) with a new UIDVALIDITY, and the copy is in the renamed one.
 * Real Dovecot, nodemailer and smtp-server; messages counted at the SMTP server.
 *
 * KNOWN, NOT FIXED: skipped, saying why, unless IDEM_KNOWN_DEFECTS=1 (then it fails: two
 * messages). Make it run always once a lookup can tell that the Sent it searches is not the one the
 * send's copy went to (its UIDVALIDITY recorded at the send, or every mailbox searched before
 * "absent").
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { MailSandbox, SENDER } from "@idem/sandbox";
import { scaled } from "@idem/testkit";
import { emailActions, type EmailConfig } from "@idem/email";
import { op } from "./operation.js";

let sandbox: MailSandbox;
let started: Awaited<ReturnType<MailSandbox["start"]>>;
beforeAll(async () => {
  sandbox = new MailSandbox({ mode: "provider-saves" });
  started = await sandbox.start();
}, scaled(30_000));
afterAll(() => sandbox?.close());

const config = (): EmailConfig => ({
  smtp: { host: "127.0.0.1", port: started.smtp.port, auth: SENDER, timeoutMs: 2_500, requireTLS: false },
  imap: { host: "127.0.0.1", port: started.imap.port, auth: SENDER, requireTLS: false },
  from: SENDER.user,
  copy: { mode: "provider-saves" },
  settleMs: 300,
});
const report = { to: "client@example.test", subject: "Weekly report", text: "Numbers." };

describe("the Sent folder renamed while a send is unknown", () => {
  const known =
    process.env.IDEM_KNOWN_DEFECTS === "1"
      ? ""
      : "a known defect, not fixed: the lookup proves absence in the new Sent and the email goes out twice (IDEM_KNOWN_DEFECTS=1 runs it)";
  if (known) console.log(`[skipped] Sent renamed while a send is unknown: ${known}`);
  it.skipIf(known !== "")(
    "the copy in the renamed folder: never proven absent, never sent again; one message",
    async () => {
      const mail = emailActions(config()).send;
      const now = Date.now();
      const first = op({ lastAttemptAt: now, now });
      const receipt = await mail.execute(report, first);
      expect(await sandbox.copies(SENDER, "Sent", receipt.messageId)).toBe(1);
      const client = sandbox.imap(SENDER);
      await client.connect();
      try {
        await client.mailboxRename("Sent", "Sent 2025");
      } finally {
        await client.logout();
      }
      const later = { ...first, now: now + 3_600_000 };
      const verdict = await mail.reconcile!(report, later);
      // Today: { found: false, proof: "absent" }, and the runner's next attempt sends it again.
      if (verdict.found === false && verdict.proof === "absent") await mail.execute(report, { ...later, attempt: 2 });
      expect(sandbox.count(receipt.messageId)).toBe(1);
      expect(verdict).not.toMatchObject({ proof: "absent" });
    },
  );
});
