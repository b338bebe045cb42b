/**
 * DBOS Transact: one workflow of one no-op step, its workflow ID the idempotency key. DBOS keeps
 * its state in a system database of its own on the same Postgres server as idem's ledger.
 * Calling a completed workflow's ID again returns the recorded result without running the step.
 */
import { DBOS } from "@dbos-inc/dbos-sdk";
import type { Contestant } from "./harness.js";

export async function launchDbos(
  systemDatabaseUrl: string,
  poolSize: number,
): Promise<Contestant & { close(): Promise<void> }> {
  let executions = 0;
  const step = DBOS.registerStep(
    async () => {
      executions++;
      return { ok: true };
    },
    { name: "noop" },
  );
  const workflow = DBOS.registerWorkflow(async () => step(), { name: "bench.noop" });
  DBOS.setConfig({
    name: "idem-bench-peers",
    systemDatabaseUrl,
    systemDatabasePoolSize: poolSize,
    logLevel: "error",
  });
  await DBOS.launch();
  return {
    name: "DBOS",
    async call(key) {
      const out = await DBOS.withNextWorkflowID(key, () => workflow());
      if (out?.ok !== true) throw new Error(`DBOS answered ${JSON.stringify(out)} for ${key}`);
    },
    executions: () => executions,
    close: () => DBOS.shutdown(),
  };
}
