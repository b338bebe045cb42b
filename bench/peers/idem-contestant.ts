/** idem on Postgres: `ledger.run` of a no-op action, the key under one tenant. */
import { defineAction, openLedger } from "@idem/core";
import type { Contestant } from "./harness.js";

export async function openIdem(url: string, poolSize: number): Promise<Contestant & { close(): Promise<void> }> {
  let executions = 0;
  const noop = defineAction({
    type: "bench.noop",
    capabilities: {},
    execute: async () => {
      executions++;
      return { ok: true };
    },
  });
  const ledger = await openLedger(url, { poolSize });
  return {
    name: "idem",
    async call(key) {
      const out = await ledger.run(noop, { tenant: "peers", key: [key], args: {} });
      if (out.status !== "succeeded" || (out.receipt as { ok?: unknown } | null)?.ok !== true) {
        throw new Error(`idem answered ${JSON.stringify(out)} for ${key}`);
      }
    },
    executions: () => executions,
    close: () => ledger.close(),
  };
}
