/**
 * A worker process for race and crash tests. Environment: LEDGER_URL, TENANT, KEY, EFFECT_FILE,
 * KIND (dedupe | lookup | neither), LEASE_MS, MODE (race | crash).
 *  race: prints "ready", waits for "go" on stdin, runs the action (the effect takes 100 ms),
 *        prints "result <json>" and exits.
 *  crash: runs the action, prints "effect-done" after the effect and hangs there until killed.
 *  flight: 64 callers in this process call the action on keys KEY-<caller>-<n> without end
 *        (their claims and completions share commits on SQLite); prints "flying" after the
 *        200th effect and goes on until killed; each answer is a line in EFFECT_FILE.answered.
 */
import { appendFileSync } from "node:fs";
import { createInterface } from "node:readline";
import { setTimeout as sleep } from "node:timers/promises";
import { openLedger } from "@idem/core";
import { fileAction, type ProviderKind } from "../support/file-provider.js";

const env = (name: string): string => {
  const v = process.env[name];
  if (!v) throw new Error(`${name} is required`);
  return v;
};
const mode = env("MODE");
const ledger = await openLedger(env("LEDGER_URL"), {
  migrate: false,
  poolSize: 1,
  leaseMs: Number(env("LEASE_MS")),
  waitMs: 60_000,
});
const action = fileAction(env("KIND") as ProviderKind, env("EFFECT_FILE"), async () => {
  if (mode === "crash") {
    console.log("effect-done");
    await new Promise(() => {}); // hold here until SIGKILL
  }
  await sleep(100);
});

if (mode === "flight") {
  let effects = 0;
  const flying = fileAction(env("KIND") as ProviderKind, env("EFFECT_FILE"), async () => {
    effects += 1;
    if (effects === 200) console.log("flying");
  });
  await Promise.all(
    Array.from({ length: 64 }, async (_, caller) => {
      for (let n = 0; ; n++) {
        const out = await ledger.run(flying, {
          tenant: env("TENANT"),
          key: [`${env("KEY")}-${caller}-${n}`],
          args: { note: "x" },
        });
        // What the caller was told, where the parent can read it after the kill.
        appendFileSync(`${env("EFFECT_FILE")}.answered`, `${out.operationId} ${out.status}\n`);
      }
    }),
  );
}

if (mode === "race") {
  console.log("ready");
  const lines = createInterface({ input: process.stdin });
  for await (const line of lines) if (line === "go") break;
  lines.close();
}
const out = await ledger.run(action, {
  tenant: env("TENANT"),
  key: [env("KEY")],
  args: { note: "x" },
  actor: `worker-${process.pid}`,
});
console.log(`result ${JSON.stringify(out)}`);
await ledger.close();
