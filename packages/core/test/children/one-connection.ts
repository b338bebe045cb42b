/**
 * A process with a Postgres ledger of one connection (outage.test.ts), driven on stdin:
 *   pid   prints "pid <n>", the backend of that connection;
 *   go    makes two status reads at once (the second waits in the pool's queue for the first's
 *         connection), prints "ended <ok | name: message>" for each, then "alive".
 * Opens LEDGER_URL with a statement timeout of STATEMENT_MS (the client gives up 5 s after it) and
 * prints "ready". An uncaught exception ends the process: the parent sees it exit.
 */
import { createInterface } from "node:readline";
import { sql } from "kysely";
import { openLedger } from "@idem/core";
import { databaseOf } from "@idem/core/testing";

const ledger = await openLedger(process.env.LEDGER_URL!, {
  migrate: false,
  poolSize: 1,
  connectTimeoutMs: 20_000,
  statementTimeoutMs: Number(process.env.STATEMENT_MS ?? 20_000),
  lockTimeoutMs: 20_000,
});
console.log("ready");
for await (const line of createInterface({ input: process.stdin })) {
  if (line === "pid") {
    const { rows } = await sql<{ pid: number }>`select pg_backend_pid() as pid`.execute(databaseOf(ledger));
    console.log(`pid ${rows[0]!.pid}`);
  }
  if (line === "go") {
    const outs = await Promise.allSettled([
      ledger.status({ tenant: "t", id: "op_a" }),
      ledger.status({ tenant: "t", id: "op_b" }),
    ]);
    for (const o of outs) {
      const error = o.status === "rejected" ? (o.reason as Error) : undefined;
      console.log(`ended ${error ? `${error.name}: ${error.message}` : "ok"}`);
    }
    console.log("alive");
  }
}
await ledger.close();
