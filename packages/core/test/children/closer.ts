/**
 * A process that closes its ledger (outage.test.ts): opens LEDGER_URL, runs one call (so a pooled connection is idle), prints
 * "ready", waits for "close" on stdin, closes the ledger and prints "closed". Nothing else keeps
 * the process alive: it should then exit on its own.
 */
import { createInterface } from "node:readline";
import { defineAction, openLedger } from "@idem/core";

const ledger = await openLedger(process.env.LEDGER_URL!, {
  connectTimeoutMs: 1_000,
  statementTimeoutMs: 1_000,
  lockTimeoutMs: 1_000,
  poolSize: 2,
});
const action = defineAction<{ n: number }, { ok: true }>({
  type: "closer.noop",
  capabilities: {},
  execute: async () => ({ ok: true }),
  classify: () => ({ kind: "ambiguous", reason: "?" }),
});
await ledger.run(action, { tenant: "t", key: [`k-${process.pid}-${Date.now()}`], args: { n: 1 } });
console.log("ready");
const lines = createInterface({ input: process.stdin });
for await (const line of lines) if (line === "close") break;
lines.close();
process.stdin.destroy();
const t0 = performance.now();
await ledger.close();
console.log(`closed ${Math.round(performance.now() - t0)}`);
// For the report: what keeps the process alive once the ledger is closed.
setTimeout(() => console.log(`alive ${JSON.stringify(process.getActiveResourcesInfo())}`), 3_000).unref();
