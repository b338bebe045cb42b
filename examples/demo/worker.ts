/**
 * The demo's agent process, killed with SIGKILL on purpose by demo.ts. DEMO_MODE:
 *  naive-send          send the email with nodemailer, no ledger; CRASH=1 hangs after the send
 *  naive-ledger-send   a ledger alone: skip if recorded done, else send, then record; CRASH=1 hangs in between
 *  idem-send           the email through idem (COPY_MODE provider-saves | append)
 *  idem-charge         a Stripe PaymentIntent through idem
 * The crash points of the idem modes are set at the servers (the answer is held; demo.ts kills
 * this process once the server committed).
 */
import { existsSync, readFileSync, writeFileSync } from "node:fs";
import nodemailer from "nodemailer";
import { openLedger } from "@idem/core";
import { emailActions } from "@idem/email";
import { stripeActions } from "@idem/stripe";

const env = process.env as Record<string, string>;
const auth = { user: env.MAIL_USER!, pass: env.MAIL_PASS! };
const job = { to: "ops@client-42.example", subject: env.SUBJECT!, text: "This week's numbers." };
const hang = () => new Promise(() => {});

switch (env.DEMO_MODE) {
  case "naive-send": {
    await nodemailer
      .createTransport({ host: "127.0.0.1", port: Number(env.SMTP_PORT), auth })
      .sendMail({ from: auth.user, ...job });
    console.log("sent");
    if (env.CRASH === "1") await hang();
    break;
  }
  case "naive-ledger-send": {
    const done: string[] = existsSync(env.DONE_FILE!) ? JSON.parse(readFileSync(env.DONE_FILE!, "utf8")) : [];
    if (!done.includes(env.KEY!)) {
      await nodemailer
        .createTransport({ host: "127.0.0.1", port: Number(env.SMTP_PORT), auth })
        .sendMail({ from: auth.user, ...job });
      console.log("sent");
      if (env.CRASH === "1") await hang(); // the crash: after the send, before the ledger records it
      writeFileSync(env.DONE_FILE!, JSON.stringify([...done, env.KEY!]));
    }
    break;
  }
  case "idem-send":
  case "idem-charge": {
    const ledger = await openLedger(env.LEDGER_URL!, { migrate: false, poolSize: 1, leaseMs: Number(env.LEASE_MS) });
    const action =
      env.DEMO_MODE === "idem-send"
        ? emailActions({
            smtp: { host: "127.0.0.1", port: Number(env.SMTP_PORT), auth, timeoutMs: 120_000, requireTLS: false },
            imap: { host: "127.0.0.1", port: Number(env.IMAP_PORT), auth, requireTLS: false },
            from: auth.user,
            copy: { mode: env.COPY_MODE as "append" },
          }).send
        : stripeActions({
            apiKey: env.STRIPE_KEY!,
            host: "127.0.0.1",
            port: Number(env.STRIPE_PORT),
            protocol: "http",
            timeoutMs: 120_000,
          }).paymentIntentsCreate;
    const args =
      env.DEMO_MODE === "idem-send"
        ? job
        : {
            amount: 4200,
            currency: "usd",
            payment_method: "pm_card_visa",
            confirm: true,
            automatic_payment_methods: { enabled: true, allow_redirects: "never" },
          };
    await ledger.run(action as never, {
      tenant: "demo",
      key: JSON.parse(env.KEY!),
      args: args as never,
      actor: `demo-worker-${process.pid}`,
    });
    await ledger.close();
    break;
  }
}
