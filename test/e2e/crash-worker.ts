/**
 * A worker of the crash matrix: runs one operation and is SIGKILLed at its crash point.
 * Env: LEDGER_URL, TENANT, KEY, ADAPTER, POINT, LEASE_MS, PORTS (JSON).
 */
import { openLedger } from "@idem/core";
import { actionFor, argsFor, withCrashPoint, type Adapter, type CrashPoint } from "./adapters.js";

const env = process.env as Record<string, string>;
const ledger = await openLedger(env.LEDGER_URL!, { migrate: false, poolSize: 1, leaseMs: Number(env.LEASE_MS) });
const adapter = env.ADAPTER as Adapter;
const action = withCrashPoint(actionFor(adapter, JSON.parse(env.PORTS!)), env.POINT as CrashPoint, async () => {
  console.log("crash-point");
  return new Promise<never>(() => {});
});
const out = await ledger.run(action, {
  tenant: env.TENANT!,
  key: [env.KEY!],
  args: argsFor(adapter, env.TENANT!) as never,
});
console.log(`result ${JSON.stringify(out)}`);
await ledger.close();
