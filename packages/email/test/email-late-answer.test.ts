/**
 * A send whose 250 comes late: its lease ran out meanwhile (by the database clock), and the daemon
 * looked its copy up and settled the operation with the copy as its receipt. Then the request's
 * own answer arrives. Every attempt's message has the same Message-ID, so that alone cannot tell
 * this send's copy from another's: the copy's `X-Idem-Attempt` can (`sendOf`, the action's
 * effectId). Before it, every such late answer was alerted as "two effects" for one message.
 * Counted at the target: the messages the SMTP server accepted.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { Ledger } from "@idem/core";
import { openTestLedger, type TestLedgerOptions } from "@idem/core/testing";
import { MailSandbox, SENDER } from "@idem/sandbox";
import { DIALECTS, ledgersFor, scaled } from "@idem/testkit";
import { emailActions, type EmailConfig } from "@idem/email";

let sandbox: MailSandbox;
let ports: { smtp: number; imap: number };
beforeAll(async () => {
  sandbox = new MailSandbox({ mode: "provider-saves" });
  const s = await sandbox.start();
  ports = { smtp: s.smtp.port, imap: s.imap.port };
}, scaled(30_000));
afterAll(() => sandbox?.close());

// The client waits far longer than the test: the reply comes when the test releases it.
const config = (): EmailConfig => ({
  smtp: { host: "127.0.0.1", port: ports.smtp, auth: SENDER, timeoutMs: scaled(60_000), requireTLS: false },
  imap: { host: "127.0.0.1", port: ports.imap, auth: SENDER, requireTLS: false },
  from: SENDER.user,
  copy: { mode: "provider-saves" },
  settleMs: 300,
});
const report = { to: "client@example.test", subject: "Weekly report", text: "Numbers." };
let n = 0;
const tenant = () => `late${++n}-${Math.random().toString(36).slice(2, 7)}`;

async function until(cond: () => boolean, what: string): Promise<void> {
  const end = Date.now() + scaled(20_000);
  while (!cond()) {
    if (Date.now() > end) throw new Error(`${what}: not in time`);
    await new Promise((r) => setTimeout(r, 10));
  }
}

/** A copy of another send of this operation, one the ledger does not know of: in Sent, naming attempt 7. */
async function otherSendsCopy(messageId: string): Promise<void> {
  const client = sandbox.imap(SENDER);
  await client.connect();
  try {
    const raw = [
      `From: ${SENDER.user}`,
      "To: client@example.test",
      "Subject: Weekly report",
      `Message-ID: ${messageId}`,
      "X-Idem-Attempt: 7",
      "",
      "Numbers.",
      "",
    ].join("\r\n");
    await client.append("Sent", Buffer.from(raw), ["\\Seen"]);
  } finally {
    await client.logout();
  }
}

for (const dialect of DIALECTS) {
  describe(`a late SMTP answer after the daemon found its copy, on ${dialect}`, () => {
    const db = ledgersFor<Ledger, TestLedgerOptions>(dialect, openTestLedger, { defaults: { poolSize: 2 } });

    for (const other of [false, true])
      it(
        other
          ? "another attempt's copy is found too (a send the ledger did not know of): alerted as two effects"
          : "the copy found is this send's: one message, one effect, not alerted",
        async () => {
          let now = Date.now();
          const mail = emailActions(config());
          const ledger = await db.open({ clock: () => now, leaseMs: 30_000, actions: [mail.send] });
          const t = tenant();
          const before = sandbox.count();
          sandbox.faults.add({ kind: "hold_reply", delayMs: scaled(120_000) });
          // Attempt 1 sends; the server takes the message and files its copy, then holds the 250.
          const first = ledger.run(mail.send, { tenant: t, key: ["held"], args: report });
          await until(() => sandbox.count() === before + 1, "the message accepted");
          const [op] = await ledger.admin.list({ tenant: t });
          // The reference starts with the Message-ID (then how the copy is made: email-reference.ts).
          const messageId = op!.providerReference!.split(" ")[0]!;
          if (other) await otherSendsCopy(messageId);
          // Its lease runs out by the database clock; the daemon looks the copy up and settles it.
          now += 31_000;
          const settled = await ledger.daemon.settle({ tenant: t, id: op!.id, actor: "daemon" });
          expect(settled).toMatchObject({
            status: "succeeded",
            receipt: { messageId, foundIn: "Sent", attempts: other ? [1, 7] : [1] },
          });
          // The 250 arrives: the caller gets its own request's answer, never a second send.
          expect(sandbox.releaseHeldReplies()).toBe(1);
          const out = await first;
          expect(out).toMatchObject({ status: "succeeded", replayed: false, receipt: { sent: true, attempt: 1 } });
          const { operation, events } = await ledger.get({ tenant: t, id: op!.id });
          const story = events.map((e) => `${e.from}>${e.to}@${e.attempt} ${e.reason}`).join(" | ");
          expect(
            {
              sent: sandbox.count(messageId),
              status: operation.status,
              twoEffects: events.filter((e) => e.reason?.startsWith("two effects")).length,
              alerted: (await ledger.daemon.alertsDue({ limit: 100 })).some((a) => a.id === op!.id),
            },
            story,
          ).toEqual({ sent: 1, status: "succeeded", twoEffects: other ? 1 : 0, alerted: other });
          // The row keeps the receipt every other caller is replayed: the copy found.
          const again = await ledger.run(mail.send, { tenant: t, key: ["held"], args: report });
          expect(again).toMatchObject({ status: "succeeded", replayed: true, receipt: { foundIn: "Sent" } });
          expect(sandbox.count(messageId)).toBe(1);
        },
      );
  });
}
