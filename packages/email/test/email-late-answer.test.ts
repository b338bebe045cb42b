/**
 * A send whose 250 comes late: its lease ran out meanwhile (by the database clock), and the daemon
 * looked its copy up and settled the operation with the copy as its receipt. Then the request's
 * own answer arrives. Every attempt's message has the same Message-ID, so that alone cannot tell
 * this send's copy from another's: the copy's `X-Idem-Attempt` can (`sendOf`, the action's
 * effectId). Before it, every such late answer was alerted as "two effects" for one message.
 * Counted at the target: the messages the SMTP server accepted.
 */
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import { once } from "node:events";
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

/**
 * A copy in Sent with the operation's Message-ID that is not attempt 1's send: another operation's
 * under the same key (one pruned and run again) naming its own send, or one sent by a version
 * before X-Idem-Attempt (no header), which could be any send.
 */
async function anotherCopy(messageId: string, attemptHeader: string | undefined): Promise<void> {
  const client = sandbox.imap(SENDER);
  await client.connect();
  try {
    const raw = [
      `From: ${SENDER.user}`,
      "To: client@example.test",
      "Subject: Weekly report",
      `Message-ID: ${messageId}`,
      ...(attemptHeader === undefined ? [] : [`X-Idem-Attempt: ${attemptHeader}`]),
      "",
      "Numbers.",
      "",
    ].join("\r\n");
    await client.append("Sent", Buffer.from(raw), ["\\Seen"]);
  } finally {
    await client.logout();
  }
}

/** What is in Sent besides attempt 1's own copy, what the lookup then knows, and what is alerted. */
const CASES = [
  {
    name: "only this send's copy: one message, one effect, not alerted",
    other: null,
    lookupAlerts: false,
    lateAlerts: false,
  },
  {
    name: "a copy of another operation's send too (one pruned and run again under the key): the lookup alerts two effects, the late answer (one of them) nothing more",
    other: "op_other/1",
    lookupAlerts: true,
    lateAlerts: false,
  },
  {
    name: "a copy from a version without X-Idem-Attempt too: which sends is not known, so the late answer is alerted",
    other: undefined,
    lookupAlerts: false,
    lateAlerts: true,
  },
] as const;

afterEach(() => {
  // A test that failed before releasing its reply does not leave a client waiting for it.
  sandbox.releaseHeldReplies();
  sandbox.faults.clear();
});

for (const dialect of DIALECTS) {
  describe(`a late SMTP answer after the daemon found its copy, on ${dialect}`, () => {
    const db = ledgersFor<Ledger, TestLedgerOptions>(dialect, openTestLedger, { defaults: { poolSize: 2 } });

    for (const c of CASES)
      it(c.name, async () => {
        let now = Date.now();
        const mail = emailActions(config());
        const ledger = await db.open({ clock: () => now, leaseMs: 30_000, actions: [mail.send] });
        const t = tenant();
        sandbox.faults.add({ kind: "hold_reply", delayMs: scaled(120_000) });
        // Attempt 1 sends; the server takes the message and files its copy ("accepted"), then holds the 250.
        const accepted = once(sandbox.events, "accepted");
        const first = ledger.run(mail.send, { tenant: t, key: ["held"], args: report });
        await accepted;
        const [op] = await ledger.admin.list({ tenant: t });
        // The reference starts with the Message-ID (then how the copy is made: email-reference.ts).
        const messageId = op!.providerReference!.split(" ")[0]!;
        const mine = `${op!.id}/1`;
        if (c.other !== null) await anotherCopy(messageId, c.other);
        // Its lease runs out by the database clock; the daemon looks the copy up and settles it.
        now += 31_000;
        const settled = await ledger.daemon.settle({ tenant: t, id: op!.id, actor: "daemon" });
        const sends = c.other === null ? [mine] : c.other === undefined ? undefined : [mine, c.other].sort();
        expect(settled).toMatchObject({ status: "succeeded", receipt: { messageId, foundIn: "Sent" } });
        expect(settled.status === "succeeded" && (settled.receipt as { sends?: string[] }).sends).toEqual(
          sends ?? undefined,
        );
        const lookupAlerted = (await ledger.daemon.alertsDue({ limit: 100 })).some((a) => a.id === op!.id);
        // The 250 arrives: the caller gets its own request's answer, never a second send.
        expect(sandbox.releaseHeldReplies()).toBe(1);
        const out = await first;
        expect(out).toMatchObject({ status: "succeeded", replayed: false, receipt: { sent: true, send: mine } });
        const { operation, events } = await ledger.get({ tenant: t, id: op!.id });
        const story = events.map((e) => `${e.from}>${e.to}@${e.attempt} ${e.reason}`).join(" | ");
        expect(
          {
            sent: sandbox.count(messageId),
            status: operation.status,
            lookupAlerted,
            lookupSaysTwice: events.some((e) => e.reason?.startsWith("two effects: the lookup found")),
            lateSaysTwice: events.some((e) => e.reason?.startsWith("two effects: attempt 1's request")),
            alerted: (await ledger.daemon.alertsDue({ limit: 100 })).some((a) => a.id === op!.id),
          },
          story,
        ).toEqual({
          sent: 1,
          status: "succeeded",
          lookupAlerted: c.lookupAlerts,
          lookupSaysTwice: c.lookupAlerts,
          lateSaysTwice: c.lateAlerts,
          alerted: c.lookupAlerts || c.lateAlerts,
        });
        // The row keeps the receipt every other caller is replayed: the copy found.
        const again = await ledger.run(mail.send, { tenant: t, key: ["held"], args: report });
        expect(again).toMatchObject({ status: "succeeded", replayed: true, receipt: { foundIn: "Sent" } });
        expect(sandbox.count(messageId)).toBe(1);
      });
  });
}
