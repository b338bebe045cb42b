/**
 * A worker that creates one PaymentIntent through the ledger and the real SDK; the test kills it
 * with SIGKILL once the sandbox has committed the effect. Env: LEDGER_URL, TENANT, KEY,
 * STRIPE_PORT, STRIPE_KEY, LEASE_MS.
 */
import { openLedger } from "@idem/core";
import { stripeActions } from "@idem/stripe";

const env = (n: string) =>
  process.env[n] ??
  (() => {
    throw new Error(`${n} is required`);
  })();
const ledger = await openLedger(env("LEDGER_URL"), { migrate: false, poolSize: 1, leaseMs: Number(env("LEASE_MS")) });
const stripe = stripeActions({
  apiKey: env("STRIPE_KEY"),
  host: "127.0.0.1",
  port: Number(env("STRIPE_PORT")),
  protocol: "http",
  timeoutMs: 120_000,
});
console.log("sending");
const out = await ledger.run(stripe.paymentIntentsCreate, {
  tenant: env("TENANT"),
  key: [env("KEY")],
  args: {
    amount: 2000,
    currency: "usd",
    payment_method: "pm_card_visa",
    confirm: true,
    automatic_payment_methods: { enabled: true, allow_redirects: "never" },
  },
});
console.log(`result ${JSON.stringify(out)}`);
await ledger.close();
