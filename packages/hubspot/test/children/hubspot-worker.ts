/**
 * A worker that creates one contact through the ledger; the test SIGKILLs it once the sandbox
 * has written the record. Env: LEDGER_URL, TENANT, KEY, BASE_PATH, TOKEN, LEASE_MS, EMAIL.
 */
import { openLedger } from "@idem/core";
import { hubspotActions } from "@idem/hubspot";

const env = (n: string) =>
  process.env[n] ??
  (() => {
    throw new Error(`${n} is required`);
  })();
const ledger = await openLedger(env("LEDGER_URL"), { migrate: false, poolSize: 1, leaseMs: Number(env("LEASE_MS")) });
const crm = hubspotActions({ accessToken: env("TOKEN"), basePath: env("BASE_PATH") });
const out = await ledger.run(crm.create("contacts"), {
  tenant: env("TENANT"),
  key: [env("KEY")],
  args: { properties: { email: env("EMAIL"), firstname: "Ada" } },
});
console.log(`result ${JSON.stringify(out)}`);
await ledger.close();
