/**
 * The config file's TLS trust for the email provider (`providers.email.smtp.tls`, `.imap.tls`,
 * `.journalImap.tls`): a private CA's file, read relative to the config file, handed to the
 * actions the daemon sends and settles with; the alert sink's SMTP (`alerts.email.smtp.tls`) takes
 * the same; anything that would turn verification off is refused. Against the mail sandbox serving
 * a certificate a CA made here signed (openssl), on both databases.
 */
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import { execFileSync } from "node:child_process";
import { readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { defineAction, openLedger, type Action, type Ledger, type LedgerOptions } from "@idem/core";
import { emailActions } from "@idem/email";
import { MailSandbox, SENDER } from "@idem/sandbox";
import { DIALECTS, freshDatabase, ledgersFor, scaled, tempDir } from "@idem/testkit";
import { pino } from "pino";
import { alertActions } from "../src/alerts.js";
import { ConfigError, actionsOf, loadConfig, parseConfig } from "../src/config.js";
import { Daemon } from "../src/daemon.js";
import { DaemonMetrics } from "../src/metrics.js";

/** A CA and a server certificate it signed (for 127.0.0.1), in `dir`: ca.pem, server.pem, server.key. */
function makePki(dir: string): { ca: string; cert: string; key: string } {
  const at = (name: string) => join(dir, name);
  const openssl = (args: string[]) => execFileSync("openssl", args, { stdio: "pipe" });
  const key = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"];
  openssl(
    ["req", "-x509", ...key, "-days", "2", "-subj", "/CN=idem config test CA"].concat([
      "-addext",
      "basicConstraints=critical,CA:TRUE",
      "-keyout",
      at("ca.key"),
      "-out",
      at("ca.pem"),
    ]),
  );
  openssl(["req", ...key, "-subj", "/CN=127.0.0.1", "-keyout", at("server.key"), "-out", at("server.csr")]);
  writeFileSync(at("server.ext"), "subjectAltName=IP:127.0.0.1\n");
  openssl(
    ["x509", "-req", "-in", at("server.csr"), "-CA", at("ca.pem"), "-CAkey", at("ca.key")].concat([
      "-CAcreateserial",
      "-days",
      "2",
      "-extfile",
      at("server.ext"),
      "-out",
      at("server.pem"),
    ]),
  );
  const read = (name: string) => readFileSync(at(name), "utf8");
  return { ca: read("ca.pem"), cert: read("server.pem"), key: read("server.key") };
}

let dir = "";
let ca = "";
let sandbox: MailSandbox;
let ports = { smtp: 0, imap: 0 };
beforeAll(async () => {
  dir = tempDir("idem-config-tls-");
  const pki = makePki(dir);
  ca = pki.ca;
  writeFileSync(join(dir, "not-a-cert.pem"), "ca.pem\n");
  writeFileSync(
    join(dir, "corrupt.pem"),
    "-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydGlmaWNhdGU=\n-----END CERTIFICATE-----\n",
  );
  sandbox = new MailSandbox({ tls: { cert: pki.cert, key: pki.key } });
  const s = await sandbox.start();
  ports = { smtp: s.smtp.port, imap: s.imap.port };
  process.env.IDEM_TEST_MAIL_USER = SENDER.user;
  process.env.IDEM_TEST_MAIL_PASS = SENDER.pass;
}, scaled(30_000));
afterAll(async () => {
  await sandbox?.close();
  delete process.env.IDEM_TEST_MAIL_USER;
  delete process.env.IDEM_TEST_MAIL_PASS;
});

const login = { userEnv: "IDEM_TEST_MAIL_USER", passEnv: "IDEM_TEST_MAIL_PASS" };
/** The email provider's section; `tls` for both servers (undefined: none). */
function email(tls: Record<string, unknown> | undefined, settleMs = 60_000) {
  return {
    smtp: { host: "127.0.0.1", port: ports.smtp, ...login, ...(tls && { tls }) },
    imap: { host: "127.0.0.1", port: ports.imap, ...login, ...(tls && { tls }) },
    from: SENDER.user,
    copy: "provider-saves",
    settleMs,
  };
}
const report = { to: "client@example.test", subject: "Report", text: "Numbers." };
const emailAction = async (raw: unknown, source?: string) =>
  (await actionsOf(parseConfig(raw, source))).find((a) => a.type === "email.send") as Action;

describe("providers.email TLS trust in the config", () => {
  it("refuses an option that would turn verification off, and names the field", () => {
    for (const side of ["smtp", "imap"] as const) {
      const section = email(undefined);
      const raw = {
        providers: { email: { ...section, [side]: { ...section[side], tls: { rejectUnauthorized: false } } } },
      };
      expect(() => parseConfig(raw)).toThrow(ConfigError);
      expect(() => parseConfig(raw)).toThrow(
        new RegExp(
          `providers\\.email\\.${side}\\.tls: unknown option rejectUnauthorized: the server's certificate is always verified`,
        ),
      );
    }
    // The alert sink's SMTP takes the same trust options, and refuses the same.
    const smtp = { host: "127.0.0.1", port: ports.smtp, tls: { rejectUnauthorized: false } };
    expect(() => parseConfig({ alerts: { email: { smtp, from: "a@example.test", to: ["b@example.test"] } } })).toThrow(
      /alerts\.email\.smtp\.tls: unknown option rejectUnauthorized: the server's certificate is always verified/,
    );
  });

  it("a CA file that cannot be read, or holds no certificate: a config error naming the field", async () => {
    await expect(emailAction({ providers: { email: email({ caFile: join(dir, "missing.pem") }) } })).rejects.toThrow(
      /providers\.email\.(smtp|imap)\.tls\.caFile: cannot read .*missing\.pem/,
    );
    await expect(emailAction({ providers: { email: email({ caFile: join(dir, "not-a-cert.pem") }) } })).rejects.toThrow(
      /providers\.email\.(smtp|imap)\.tls\.caFile: .*not-a-cert\.pem holds no PEM certificate/,
    );
    // Before: passed the check, then the email actions threw a TypeError (exit 1, not a config error).
    const corrupt = emailAction({ providers: { email: email({ caFile: join(dir, "corrupt.pem") }) } });
    await expect(corrupt).rejects.toBeInstanceOf(ConfigError);
    await expect(corrupt).rejects.toThrow(/tls\.caFile: .*corrupt\.pem holds a certificate that cannot be read/);
  });
});

for (const dialect of DIALECTS) {
  describe(`the config's email action on ${dialect}`, () => {
    const db = ledgersFor(dialect, openLedger, { defaults: { poolSize: 2 } as LedgerOptions });
    let n = 0;
    const tenant = () => `t${++n}-${Math.random().toString(36).slice(2, 7)}`;

    it("with caFile (relative to the config file): sent once; an unknown send is settled by the daemon's lookup through the same CA", async () => {
      const file = join(dir, `idem.config.${dialect}.json`);
      writeFileSync(file, JSON.stringify({ providers: { email: email({ caFile: "ca.pem" }, 300) } }));
      const config = await loadConfig(file);
      const action = (await actionsOf(config)).find((a) => a.type === "email.send")!;
      const l = await db.open({ actions: [action] });
      const t = tenant();
      const before = sandbox.count();
      // Before: `tls` was refused as an unknown key of providers.email.smtp.
      const sent = await l.run(action, { tenant: t, key: ["sent"], args: report });
      expect(sent).toMatchObject({ status: "succeeded", receipt: { sent: true } });
      // An agent's send (its own action, same account and CA) accepted, then its client timed
      // out: unknown. The daemon settles it with the config's action: a lookup over IMAP through
      // the CA the config file names.
      sandbox.faults.add({ kind: "hold_reply", delayMs: 5_000 });
      const agentAction = emailActions({
        smtp: { host: "127.0.0.1", port: ports.smtp, auth: SENDER, timeoutMs: 1_000, tls: { ca } },
        imap: { host: "127.0.0.1", port: ports.imap, auth: SENDER, tls: { ca } },
        from: SENDER.user,
        copy: { mode: "provider-saves" },
      }).send;
      const agent = await db.open({ budget: { attempts: 1 } });
      const unknown = await agent.run(agentAction, { tenant: t, key: ["held"], args: report });
      expect(unknown).toMatchObject({ status: "pending_verification", state: "unknown" });
      expect(await l.daemon.settle({ tenant: t, id: unknown.operationId })).toMatchObject({
        status: "succeeded",
        receipt: { foundIn: "Sent" },
      });
      expect(sandbox.count()).toBe(before + 2);
    });

    it("without caFile: refused at the handshake, failed with an alert, nothing sent", async () => {
      const action = await emailAction({ providers: { email: email(undefined) } });
      const l = await db.open({ actions: [action] });
      const before = sandbox.count();
      const out = await l.run(action, { tenant: tenant(), key: ["untrusted"], args: report });
      expect(out).toMatchObject({ status: "failed", error: { kind: "permanent", alert: true } });
      expect(sandbox.count()).toBe(before);
    });
  });
}

/** An action whose answer is always lost and that nothing can look up: each run ends in review, alerted. */
const lostAnswer = defineAction<{ note: string }, { id: string }>({
  type: "review.neither",
  capabilities: {},
  execute: async () => {
    throw new Error("socket hang up");
  },
});

for (const dialect of DIALECTS) {
  describe(`the alert sink's email through a private CA on ${dialect}`, () => {
    const silent = pino({ level: "silent" });
    const ledgers: Ledger[] = [];
    afterEach(async () => {
      for (const l of ledgers.splice(0)) await l.close();
    });

    /**
     * A daemon whose only sink is email, signing in (so over STARTTLS) trusting `tls`, on a ledger of its own (the
     * alerts due are this test's alone), and one operation waiting for a person.
     */
    async function alerting(tls: Record<string, unknown> | undefined) {
      const file = join(dir, `idem.alerts.${dialect}.json`);
      const smtp = { host: "127.0.0.1", port: ports.smtp, ...login, ...(tls && { tls }) };
      writeFileSync(
        file,
        JSON.stringify({ alerts: { log: false, email: { smtp, from: SENDER.user, to: [SENDER.user] } } }),
      );
      const config = await loadConfig(file);
      const ledger = await openLedger(await freshDatabase(dialect), {
        poolSize: 2,
        actions: alertActions(config, silent),
      });
      ledgers.push(ledger);
      const parked = await ledger.run(lostAnswer, { tenant: "acme", key: ["r"], args: { note: "x" } });
      expect(parked).toMatchObject({ status: "pending_verification", state: "needs_review" });
      const daemon = new Daemon(ledger, config, silent, new DaemonMetrics(ledger, 1_000), `d-tls-${dialect}`);
      const alerted = () => sandbox.received.filter((m) => m.subject?.includes(parked.operationId)).length;
      return { ledger, config, daemon, alerted };
    }

    it("with caFile (relative to the config file): the alert is sent over TLS, once", async () => {
      // Before: `tls` was refused as an unknown key of alerts.email.smtp.
      const { daemon, alerted } = await alerting({ caFile: "ca.pem" });
      expect(await daemon.tick()).toEqual({ failed: 0, undelivered: 0 });
      await daemon.tick();
      expect(alerted()).toBe(1);
    });

    it("without it: refused at the handshake, nothing sent, the alert kept due and the delivery not in review", async () => {
      const { ledger, config, daemon, alerted } = await alerting(undefined);
      expect(await daemon.tick()).toEqual({ failed: 0, undelivered: 1 });
      const [delivery] = await ledger.admin.list({ tenant: config.alerts.tenant });
      // Not "no answer from the SMTP server" (in review, as if it may have been sent): the config to fix.
      expect(delivery).toMatchObject({
        status: "pending",
        reason: expect.stringMatching(/certificate is not trusted/),
      });
      expect(alerted()).toBe(0);
    });
  });
}
