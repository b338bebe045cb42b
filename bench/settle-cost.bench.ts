/**
 * The cost of one settle of an operation that has been settled many times (pnpm bench:settle):
 * 10,000 inconclusive checks of one unknown operation, the time of the first 100 against the last
 * 100, as a ratio. Before migration 0003 every transition rewrote the whole history (an unknown
 * outcome checked 1,000 times held 8,006 events and one settle took 380 ms instead of 17); the
 * history now keeps its first 10 and last 90 events, so the ratio should stay near 1.
 * SQLite with synchronous=NORMAL (the growth is what is measured, not fsync); Postgres when
 * DATABASE_URL is set.
 */
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { defineAction, openLedger } from "@idem/core";

const SETTLES = 10_000;
const WINDOW = 100;

const mail = defineAction({
  type: "bench.mail",
  capabilities: { lookup: true },
  execute: async (): Promise<{ id: string }> => {
    throw new Error("timeout after DATA");
  },
  reconcile: async () => ({ found: false, proof: "inconclusive", reason: "not yet" }) as const,
});

async function measure(url: string, durable: boolean): Promise<{ first: number; last: number; events: number }> {
  const ledger = await openLedger(url, { actions: [mail], budget: { attempts: 1 }, durable });
  try {
    const tenant = `bench-${Date.now()}`;
    const out = await ledger.run(mail, { tenant, key: ["settle-cost"], args: {} });
    const times: number[] = [];
    for (let i = 0; i < SETTLES; i++) {
      const t0 = process.hrtime.bigint();
      await ledger.daemon.settle({ tenant, id: out.operationId, actor: "bench" });
      times.push(Number(process.hrtime.bigint() - t0) / 1e6);
    }
    const sum = (xs: number[]) => xs.reduce((a, b) => a + b, 0);
    const { events } = await ledger.get({ tenant, id: out.operationId });
    return {
      first: sum(times.slice(0, WINDOW)) / WINDOW,
      last: sum(times.slice(-WINDOW)) / WINDOW,
      events: events.length,
    };
  } finally {
    await ledger.close();
  }
}

const dir = mkdtempSync(join(tmpdir(), "idem-settle-"));
const rows: string[] = [];
try {
  const targets: [string, string, boolean][] = [["sqlite", `sqlite:${join(dir, "ledger.db")}`, false]];
  if (process.env.DATABASE_URL) targets.push(["postgres", process.env.DATABASE_URL, true]);
  for (const [name, url, durable] of targets) {
    const r = await measure(url, durable);
    rows.push(
      `| ${name} | ${SETTLES} | ${r.first.toFixed(3)} ms | ${r.last.toFixed(3)} ms | ${(r.last / r.first).toFixed(2)}x | ${r.events} |`,
    );
  }
} finally {
  rmSync(dir, { recursive: true, force: true });
}
console.log("| ledger | settles of one row | first 100, mean | last 100, mean | last / first | events kept |");
console.log("| --- | --- | --- | --- | --- | --- |");
for (const r of rows) console.log(r);
