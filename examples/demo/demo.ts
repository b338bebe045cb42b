/**
 * Why idem exists, in one command (pnpm demo): agents that retry, against real local servers
 * (an SMTP server filing into a real Dovecot, a Stripe sandbox), with real child processes
 * killed by SIGKILL. Each scenario counts effects at the target and prints them against what is
 * expected; the demo exits non-zero if any differs. Afterwards:
 *   pnpm idem --ledger sqlite:examples/.idem/demo/idem.db ls --tenant demo
 */
import { mkdirSync, rmSync } from "node:fs";
import { resolve } from "node:path";
import { createServer } from "node:http";
import type { AddressInfo } from "node:net";
import { fileURLToPath } from "node:url";
import { spawn } from "node:child_process";
import { createInterface } from "node:readline";
import { setTimeout as sleep } from "node:timers/promises";
import { pino } from "pino";
import { openLedger, operationKey } from "@idem/core";
import { emailActions } from "@idem/email";
import { stripeActions } from "@idem/stripe";
import { MailSandbox, SENDER, StripeSandbox } from "@idem/sandbox";
import { Daemon, DaemonMetrics, parseConfig } from "@idem/cli";

const started = Date.now();
const dir = resolve(".idem/demo");
rmSync(dir, { recursive: true, force: true });
mkdirSync(dir, { recursive: true });
const LEDGER = `sqlite:${dir}/idem.db`;
const WORKER = fileURLToPath(new URL("./worker.ts", import.meta.url));
const LEASE_MS = 1_500;

// ---- the local world: mail (SMTP + Dovecot), Stripe, a webhook that receives alerts ----
const mail = new MailSandbox();
const stripe = new StripeSandbox();
const [m, s] = await Promise.all([mail.start(), stripe.start()]);
const alerts: { kind: string; operationId: string }[] = [];
const hook = createServer((req, res) => {
  let body = "";
  req
    .on("data", (c) => (body += c))
    .on("end", () => {
      alerts.push(JSON.parse(body));
      res.end("ok");
    });
});
await new Promise<void>((r) => hook.listen(0, "127.0.0.1", r));
const auth = { user: SENDER.user, pass: SENDER.pass };
const mailer = (copy: "provider-saves" | "append") =>
  emailActions({
    smtp: { host: "127.0.0.1", port: m.smtp.port, auth, timeoutMs: 1_000, requireTLS: false }, // the local sandbox has no TLS
    imap: { host: "127.0.0.1", port: m.imap.port, auth, requireTLS: false },
    from: auth.user,
    copy: { mode: copy },
  });
const charges = stripeActions({
  apiKey: s.apiKey,
  host: "127.0.0.1",
  port: s.port,
  protocol: "http",
  timeoutMs: 2_000,
});
// The agents' ledger and the daemon's: the daemon settles stored operations with these actions.
const ledger = await openLedger(LEDGER, { leaseMs: LEASE_MS, actions: [charges.paymentIntentsCreate] });
const daemonConfig = parseConfig({
  ledger: LEDGER,
  actions: [charges.paymentIntentsCreate],
  alerts: { log: false, webhook: { url: `http://127.0.0.1:${(hook.address() as AddressInfo).port}/alerts` } },
  thresholds: { stuckAfterMs: 1_000 },
});
const daemon = new Daemon(ledger, daemonConfig, pino({ level: "silent" }), new DaemonMetrics(ledger, 1_000), "demo");
const env = {
  LEDGER_URL: LEDGER,
  LEASE_MS: String(LEASE_MS),
  SMTP_PORT: String(m.smtp.port),
  IMAP_PORT: String(m.imap.port),
  MAIL_USER: auth.user,
  MAIL_PASS: auth.pass,
  STRIPE_PORT: String(s.port),
  STRIPE_KEY: s.apiKey,
};

/** Runs a worker; resolves when it exits, or kills it (SIGKILL) when `killWhen` resolves first. */
async function worker(vars: Record<string, string>, killWhen?: Promise<unknown>): Promise<"exited" | "killed"> {
  const p = spawn(process.execPath, ["--conditions=idem-source", "--import", "tsx", WORKER], {
    env: { ...process.env, ...env, ...vars },
    stdio: ["ignore", "pipe", "inherit"],
  });
  createInterface({ input: p.stdout! }).on("line", () => {});
  const exited = new Promise<"exited">((r) => p.on("exit", () => r("exited")));
  if (!killWhen) return exited;
  const killed = killWhen.then(() => {
    p.kill("SIGKILL");
    return new Promise<"killed">((r) => p.on("exit", () => r("killed")));
  });
  return Promise.race([exited, killed]);
}
const emailsWith = (subject: string) => mail.received.filter((r) => r.subject?.startsWith(subject)).length;
const accepted = () => new Promise((r) => mail.events.once("accepted", r));

/**
 * C2 and C3: a worker sends through idem and is killed while the server holds its reply (the mail
 * was accepted); after the lease, the job runs again here with the same key. The server files a
 * copy in Sent only when the client does not append one itself.
 */
async function crashedSendThenReplay(scenario: "C2" | "C3", copy: "provider-saves" | "append") {
  mail.mode = copy === "provider-saves" ? "provider-saves" : "none";
  const input = {
    tenant: "demo",
    key: ["weekly-report", "client-42", "2026-W48", scenario],
    args: { to: "ops@client-42.example", subject: `[${scenario}] Weekly report`, text: "This week's numbers." },
  };
  mail.faults.add({ kind: "hold_reply", delayMs: 30_000 });
  await worker(
    { DEMO_MODE: "idem-send", COPY_MODE: copy, SUBJECT: input.args.subject, KEY: JSON.stringify(input.key) },
    accepted(),
  );
  await sleep(LEASE_MS + 200);
  return ledger.run(mailer(copy).send, input);
}
const committed = () => new Promise((r) => stripe.events.once("commit", r));
const untilTrue = async (check: () => Promise<boolean>, what: string) => {
  const end = Date.now() + 30_000;
  while (!(await check())) {
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await daemon.tick();
    await sleep(100);
  }
};

const rows: { id: string; what: string; expected: string; observed: string }[] = [];
function report(id: string, what: string, expected: string, observed: string) {
  rows.push({ id, what, expected, observed });
  console.log(`${expected === observed ? "ok  " : "FAIL"} ${id}  ${what}: expected ${expected}, observed ${observed}`);
}

try {
  // A: the problem. No ledger; the worker crashes after sending; the job is retried.
  mail.mode = "none";
  const a = { DEMO_MODE: "naive-send", SUBJECT: "[A] Weekly report" };
  await worker({ ...a, CRASH: "1" }, new Promise((r) => mail.events.once("accepted", () => setTimeout(r, 200))));
  await worker(a);
  report("A", "no ledger, retry after a crash after the send", "2 emails", `${emailsWith("[A]")} emails`);

  // B: with the ledger, the whole job re-run after it finished.
  mail.mode = "provider-saves";
  const b = {
    tenant: "demo",
    key: ["weekly-report", "client-42", "2026-W48", "B"],
    args: { to: "ops@client-42.example", subject: "[B] Weekly report", text: "numbers" },
  };
  await ledger.run(mailer("provider-saves").send, b);
  const again = await ledger.run(mailer("provider-saves").send, b);
  report(
    "B",
    "ledger, the job re-run after it finished",
    "1 email, 2nd answered from the ledger",
    `${emailsWith("[B]")} email${emailsWith("[B]") === 1 ? "" : "s"}, 2nd ${again.status === "succeeded" && again.replayed ? "answered from the ledger" : "sent again"}`,
  );

  // C: crash after the send, before the ledger records it; then a replay.
  mail.mode = "none";
  const c1 = {
    DEMO_MODE: "naive-ledger-send",
    SUBJECT: "[C1] Weekly report",
    KEY: "C1",
    DONE_FILE: `${dir}/naive-ledger.json`,
  };
  await worker({ ...c1, CRASH: "1" }, new Promise((r) => mail.events.once("accepted", () => setTimeout(r, 200))));
  await worker(c1);
  report(
    "C1",
    "a ledger alone, crash between send and record",
    "2 emails (the problem)",
    `${emailsWith("[C1]")} emails${emailsWith("[C1]") === 2 ? " (the problem)" : ""}`,
  );

  const c2out = await crashedSendThenReplay("C2", "provider-saves");
  report(
    "C2",
    "idem, copy in Sent: replay after the crash",
    "1 email, found by Message-ID",
    `${emailsWith("[C2]")} email${emailsWith("[C2]") === 1 ? "" : "s"}${c2out.status === "succeeded" && c2out.receipt!.foundIn ? ", found by Message-ID" : `, ${c2out.status}`}`,
  );

  const c3out = await crashedSendThenReplay("C3", "append");
  await untilTrue(async () => alerts.some((x) => x.operationId === c3out.operationId), "the needs_review alert");
  const c3alerts = alerts.filter((x) => x.operationId === c3out.operationId).length;
  report(
    "C3",
    "idem, client appends to Sent: replay after the crash",
    "1 email, needs_review, 1 alert",
    `${emailsWith("[C3]")} email${emailsWith("[C3]") === 1 ? "" : "s"}, ${c3out.status === "pending_verification" ? c3out.state : c3out.status}, ${c3alerts} alert${c3alerts === 1 ? "" : "s"}`,
  );

  // D: the key passed to a provider that dedupes on it.
  const d = {
    tenant: "demo",
    key: ["order", "o-1001", "charge"],
    args: {
      amount: 4200,
      currency: "usd",
      payment_method: "pm_card_visa",
      confirm: true,
      automatic_payment_methods: { enabled: true, allow_redirects: "never" },
    },
  };
  let pis = stripe.count("payment_intents");
  stripe.faults.add({ kind: "delay_after_commit", delayMs: 30_000 });
  await worker({ DEMO_MODE: "idem-charge", KEY: JSON.stringify(d.key) }, committed());
  await sleep(LEASE_MS + 200);
  const dout = await ledger.run(charges.paymentIntentsCreate, d);
  report(
    "D",
    "Stripe with our idempotency key, crash after the charge",
    "1 charge, replayed by Stripe",
    `${stripe.count("payment_intents") - pis} charge${dout.status === "succeeded" && dout.receipt!.replayed ? ", replayed by Stripe" : ""}`,
  );

  // E: key stability.
  const week48 = operationKey({
    tenant: "demo",
    action: "email.send",
    parts: ["weekly-report", "client-42", "2026-W48"],
  }).hash;
  const week48again = operationKey({
    tenant: "demo",
    action: "email.send",
    parts: ["weekly-report", "client-42", "2026-W48"],
  }).hash;
  const week49 = operationKey({
    tenant: "demo",
    action: "email.send",
    parts: ["weekly-report", "client-42", "2026-W49"],
  }).hash;
  report(
    "E",
    "same identity, same key; next week, another",
    "same, different",
    `${week48 === week48again ? "same" : "different"}, ${week49 === week48 ? "same" : "different"}`,
  );

  // F: a charge whose answer is lost after Stripe committed it.
  pis = stripe.count("payment_intents");
  stripe.faults.add({ kind: "drop_after_commit", times: 2 }); // stripe-node retries a closed connection once itself
  const f = { tenant: "demo", key: ["order", "o-1002", "charge"], args: d.args, budget: { attempts: 1 } };
  const fout = await ledger.run(charges.paymentIntentsCreate, f);
  await untilTrue(
    async () => (await ledger.get({ tenant: "demo", id: fout.operationId })).operation.status === "succeeded",
    "the daemon to reconcile F",
  );
  const fagain = await ledger.run(charges.paymentIntentsCreate, f);
  report(
    "F",
    "Stripe answer lost after commit, the daemon reconciles",
    "unknown, then 1 charge and its id",
    `${fout.status === "pending_verification" ? fout.state : fout.status}, then ${stripe.count("payment_intents") - pis} charge${fagain.status === "succeeded" && fagain.receipt!.id.startsWith("pi_") ? " and its id" : ""}`,
  );

  // G: a worker killed mid-operation leaves a started row; the daemon alerts once and settles it.
  pis = stripe.count("payment_intents");
  const g = { key: ["order", "o-1003", "charge"] };
  stripe.faults.add({ kind: "delay_after_commit", delayMs: 30_000 });
  await worker({ DEMO_MODE: "idem-charge", KEY: JSON.stringify(g.key), LEASE_MS: "4000" }, committed());
  const [gRow] = await ledger.admin.list({ tenant: "demo", status: "running" });
  await untilTrue(
    async () => (await ledger.get({ tenant: "demo", id: gRow!.id })).operation.status === "succeeded",
    "the daemon to settle G",
  );
  for (let i = 0; i < 5; i++) await daemon.tick();
  const gAlerts = alerts.filter((x) => x.operationId === gRow!.id).map((x) => x.kind);
  report(
    "G",
    "worker killed mid-operation, the daemon takes over",
    "1 stuck alert, settled, 1 charge",
    `${gAlerts.length} ${gAlerts[0] ?? ""} alert${gAlerts.length === 1 ? "" : "s"}, ${(await ledger.get({ tenant: "demo", id: gRow!.id })).operation.status === "succeeded" ? "settled" : "not settled"}, ${stripe.count("payment_intents") - pis} charge${stripe.count("payment_intents") - pis === 1 ? "" : "s"}`,
  );
} finally {
  await ledger.close();
  await Promise.all([mail.close(), stripe.close(), new Promise((r) => hook.close(r))]);
}

const w = (k: "id" | "what" | "expected" | "observed") => Math.max(k.length, ...rows.map((r) => r[k].length));
console.log(`\n${"".padEnd(5)}${"SCENARIO".padEnd(w("what") + 2)}${"EXPECTED".padEnd(w("expected") + 2)}OBSERVED`);
for (const r of rows)
  console.log(
    `${r.id.padEnd(5)}${r.what.padEnd(w("what") + 2)}${r.expected.padEnd(w("expected") + 2)}${r.observed}${r.expected === r.observed ? "" : "   <-- differs"}`,
  );
const bad = rows.filter((r) => r.expected !== r.observed).length;
console.log(
  `\n${bad ? `${bad} scenario(s) differ` : "every scenario as expected"} in ${((Date.now() - started) / 1000).toFixed(1)} s.`,
);
console.log(
  `See what happened: pnpm idem --ledger sqlite:${dir}/idem.db ls --tenant demo   (then: idem show <id> --tenant demo)`,
);
process.exitCode = bad ? 1 : 0;
