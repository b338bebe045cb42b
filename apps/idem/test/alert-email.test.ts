/**
 * The email alert sink against a real (small) SMTP server that takes the alert for some of
 * `alerts.email.to` and refuses the others (h3): the alert reached someone, so it is not sent
 * again, but an address that never gets alerts must not pass in silence. Before, the delivery
 * succeeded with the server's last reply ("250 OK queued") and nothing anywhere named the address
 * refused: its owner was on call and heard of nothing.
 */
import { afterEach, describe, expect, it } from "vitest";
import { openLedger } from "@idem/core";
import { Daemon, DaemonMetrics, alertActions, parseConfig } from "@idem/cli";
import { DIALECTS, freshDatabase, scaled } from "@idem/testkit";
import { capturedLog, lostAnswer, smtpServer } from "./support.js";

let n = 0;
const tenant = () => `ae${++n}-${Math.random().toString(36).slice(2, 7)}`;

const cleanups: (() => Promise<unknown>)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c().catch(() => {});
});

for (const dialect of DIALECTS) {
  describe(`the email alert sink (h3), ${dialect}`, () => {
    it(
      "an alert the SMTP server takes for one address of alerts.email.to and refuses for another is sent once, and the refused address is named in the log and the delivery's receipt",
      async () => {
        // 550 5.1.1 for gone@ alone (an unknown mailbox); ops@ is taken.
        const smtp = await smtpServer(() => ({
          at: "RCPT",
          reply: "550 5.1.1 <gone@example.test>: Recipient address rejected",
          only: ["gone@example.test"],
        }));
        cleanups.push(smtp.close);
        const url = await freshDatabase(dialect);
        const { log, lines } = capturedLog();
        const config = parseConfig({
          ledger: url,
          alerts: {
            log: false,
            email: {
              smtp: { host: "127.0.0.1", port: smtp.port, requireTLS: false },
              from: "idem@example.test",
              to: ["ops@example.test", "gone@example.test"],
            },
          },
          daemon: { intervalMs: 50 },
        });
        const ledger = await openLedger(url, { poolSize: 2, actions: alertActions(config, log) });
        cleanups.push(() => ledger.close());
        const parked = await ledger.run(lostAnswer, { tenant: tenant(), key: ["r"], args: { note: "x" } });
        expect(parked).toMatchObject({ state: "needs_review" });
        const daemon = new Daemon(ledger, config, log, new DaemonMetrics(ledger, 1_000), "d-email-partial");
        for (let i = 0; i < 3; i++) await daemon.tick();
        // Taken once for the address that exists: not sent again to it.
        expect(smtp.takenFor).toEqual([["ops@example.test"]]);
        expect((await ledger.daemon.alertsDue({ limit: 100 })).some((a) => a.id === parked.operationId)).toBe(false);
        const [delivery] = await ledger.admin.list({ tenant: "idem-alerts" });
        const { result } = (await ledger.get({ tenant: "idem-alerts", id: delivery!.id })).operation;
        // Before: { delivered: true, detail: "250 OK queued" }, and no line of the log named gone@.
        expect({
          detail: (result as { detail?: string } | null)?.detail,
          warned: lines.filter((l) => l.level === 40 && l.msg.includes("gone@example.test")).length,
        }).toEqual({
          detail: expect.stringMatching(/refused for gone@example\.test/),
          warned: 1,
        });
        expect(lines.find((l) => l.msg.includes("gone@example.test"))?.msg).toMatch(/alerts\.email\.to/);
      },
      scaled(60_000),
    );
  });
}
