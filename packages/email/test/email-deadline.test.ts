/**
 * A server that keeps talking and never answers: an SMTP server writing one more `250-`
 * continuation line every 300 ms and never the last one, an IMAP server writing untagged `* OK`
 * lines and never the tagged answer. Every line resets the inactivity timeouts (nodemailer's and
 * imapflow's socketTimeout), so before the deadlines (`smtp.deadlineMs`, `imap.deadlineMs`) such a
 * send never ended: the operation stayed `running` under a lease its heartbeat kept renewing, and
 * `run` never returned. Now the deadline closes the connection and the send fails as a timeout at
 * that point does. Scripted SMTP and a trickling proxy in front of the sandbox's Dovecot
 * (loopback.ts); deadlines of about 1.5 s, inactivity timeouts of 1 s.
 */
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import { openLedger, type LedgerOptions } from "@idem/core";
import { MailSandbox, SENDER } from "@idem/sandbox";
import { DIALECTS, ledgersFor, scaled } from "@idem/testkit";
import { emailActions, type EmailConfig } from "@idem/email";
import { scriptedSmtp, tricklingProxy, type ScriptedSmtp } from "./loopback.js";

let smtp: ScriptedSmtp;
let sandbox: MailSandbox;
let imap: Awaited<ReturnType<typeof tricklingProxy>>;
beforeAll(async () => {
  smtp = await scriptedSmtp();
  sandbox = new MailSandbox({ mode: "none" });
  imap = await tricklingProxy((await sandbox.start()).imap.port);
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
});

/** Each deadline: well past the 1 s inactivity timeout a trickle every 300 ms never trips. */
const DEADLINE_MS = scaled(1_500);
const config = (copy: EmailConfig["copy"]): EmailConfig => ({
  smtp: { host: "127.0.0.1", port: smtp.port, timeoutMs: 1_000, deadlineMs: DEADLINE_MS, requireTLS: false },
  imap: { host: "127.0.0.1", port: imap.port, auth: SENDER, requireTLS: false, deadlineMs: DEADLINE_MS },
  from: SENDER.user,
  copy,
});
const report = { to: "client@example.test", subject: "Weekly report", text: "Numbers." };
const within = new RegExp(`no complete answer .*within ${DEADLINE_MS} ms`);

for (const dialect of DIALECTS) {
  describe(`a server that keeps talking and never answers, on ${dialect}`, () => {
    const db = ledgersFor(dialect, openLedger, { defaults: { poolSize: 2 } as LedgerOptions });
    let n = 0;
    const tenant = () => `deadline${++n}-${Math.random().toString(36).slice(2, 7)}`;

    /**
     * Runs one send (one execution: what the deadline ends, not the runner's retries) and returns
     * its outcome, the row and how long it took.
     */
    async function sendOnce(copy: EmailConfig["copy"]) {
      const ledger = await db.open({ budget: { attempts: 1 } });
      const t = tenant();
      const began = performance.now();
      const out = await ledger.run(emailActions(config(copy)).send, { tenant: t, key: ["trickle"], args: report });
      const tookMs = performance.now() - began;
      const [row] = await ledger.admin.list({ tenant: t });
      return { out, row, tookMs };
    }

    it(
      "SMTP, continuation lines to EHLO for good: ends at the deadline, nothing sent (pending, tried again later)",
      async () => {
        smtp.script = { trickle: "EHLO" };
        // Before: still running after 15 s (the hunt), the row running.
        const { out, row, tookMs } = await sendOnce({ mode: "provider-saves" });
        expect(smtp.lines.some((l) => /^EHLO/i.test(l))).toBe(true);
        expect(smtp.bodies).toHaveLength(0);
        expect(out).toMatchObject({ status: "pending_verification", state: "pending" });
        expect(row).toMatchObject({ status: "pending" });
        expect(JSON.stringify(row?.error)).toMatch(within);
        expect(tookMs).toBeGreaterThanOrEqual(DEADLINE_MS - 50);
      },
      scaled(20_000),
    );

    it(
      "SMTP, continuation lines after the final dot for good: ends at the deadline, the server holds the body: unknown",
      async () => {
        smtp.script = { trickle: "final" };
        const { out, row, tookMs } = await sendOnce({ mode: "provider-saves" });
        expect(smtp.bodies).toHaveLength(1);
        expect(out).toMatchObject({ status: "pending_verification", state: "unknown" });
        expect(row).toMatchObject({ status: "unknown" });
        expect(JSON.stringify(row?.error)).toMatch(within);
        expect(tookMs).toBeGreaterThanOrEqual(DEADLINE_MS - 50);
      },
      scaled(20_000),
    );

    it(
      "IMAP, untagged '* OK' lines to the check's SEARCH for good: ends at the deadline, nothing sent (pending)",
      async () => {
        imap.hold.push("SEARCH");
        // Before: still running after 45 s (the hunt), the row running.
        const { out, row, tookMs } = await sendOnce({ mode: "provider-saves" });
        expect(imap.held).toBe(1);
        expect(smtp.lines.filter((l) => /^MAIL FROM/i.test(l))).toHaveLength(0);
        expect(smtp.bodies).toHaveLength(0);
        expect(out).toMatchObject({ status: "pending_verification", state: "pending" });
        expect(row).toMatchObject({ status: "pending" });
        expect(JSON.stringify(row?.error)).toMatch(/MailboxUnavailableError|pre-send check failed/);
        expect(JSON.stringify(row?.error)).toMatch(within);
        expect(tookMs).toBeGreaterThanOrEqual(DEADLINE_MS - 50);
      },
      scaled(20_000),
    );

    it(
      "IMAP, the APPEND of the Sent copy filed but its tagged answer never comes: may have filed, so looked for first; one copy, sent once",
      async () => {
        imap.hold.push("APPEND");
        const { out, row } = await sendOnce({ mode: "append" });
        expect(imap.held).toBe(1);
        expect(smtp.bodies).toHaveLength(1);
        expect(out).toMatchObject({ status: "succeeded", receipt: { sent: true } });
        expect(out.status === "succeeded" && out.receipt).not.toHaveProperty("copyNotFiled");
        expect(row).toMatchObject({ status: "succeeded" });
        const messageId = row!.providerReference!.split(" ")[0]!;
        expect(await sandbox.copies(SENDER, "Sent", messageId)).toBe(1);
      },
      scaled(20_000),
    );
  });
}

describe("deadlines in the config", () => {
  it("one no timer can keep (not a whole number of ms from 1 to 2^31 - 1) is refused when the actions are made, naming the field", () => {
    // Node fires a timer over 2^31 - 1 ms at once: every send would end as it starts.
    for (const bad of [0, -5, 1.5, Number.NaN, 2 ** 31]) {
      const c = config({ mode: "provider-saves" });
      expect(() => emailActions({ ...c, smtp: { ...c.smtp, deadlineMs: bad } })).toThrow(/smtp\.deadlineMs must be/);
      expect(() => emailActions({ ...c, imap: { ...c.imap, deadlineMs: bad } })).toThrow(/imap\.deadlineMs must be/);
    }
  });
});
