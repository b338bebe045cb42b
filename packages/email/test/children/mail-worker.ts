/**
 * A worker that sends one email through the ledger in append mode; the test SIGKILLs it after
 * the SMTP server accepted the message and before the reply (so before its APPEND to Sent).
 * The sandbox offers no TLS, so both sides say `requireTLS: false`.
 * Env: LEDGER_URL, TENANT, KEY, SMTP_PORT, IMAP_PORT, USER, PASS, LEASE_MS.
 */
import { openLedger } from "@idem/core";
import { emailActions } from "@idem/email";

const env = (n: string) =>
  process.env[n] ??
  (() => {
    throw new Error(`${n} is required`);
  })();
const auth = { user: env("USER"), pass: env("PASS") };
const ledger = await openLedger(env("LEDGER_URL"), { migrate: false, poolSize: 1, leaseMs: Number(env("LEASE_MS")) });
const mail = emailActions({
  smtp: { host: "127.0.0.1", port: Number(env("SMTP_PORT")), auth, timeoutMs: 120_000, requireTLS: false },
  imap: { host: "127.0.0.1", port: Number(env("IMAP_PORT")), auth, requireTLS: false },
  from: auth.user,
  copy: { mode: "append" },
});
const out = await ledger.run(mail.send, {
  tenant: env("TENANT"),
  key: [env("KEY")],
  args: { to: "client@example.test", subject: "Weekly report", text: "Numbers." },
});
console.log(`result ${JSON.stringify(out)}`);
await ledger.close();
