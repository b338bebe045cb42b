/**
 * The daemon (a real process) on a SQLite ledger whose disk fails read-only between its ticks:
 * an ext4 file system on a loop device that errors as a failing disk does (disk-support.ts). It
 * keeps running, says so in one line however many ticks fail, /healthz and /metrics say the ledger
 * is not up, and it stops cleanly. Nothing is half-written: once the disk is repaired (every file
 * on it closed first, as the kernel requires), the ledger checks whole, holds what was committed
 * before and nothing of the write refused, and a daemon started again is healthy. A full disk,
 * which passes while the daemon runs, is outage.test.ts's.
 */
import { afterAll, describe, expect, it } from "vitest";
import { join } from "node:path";
import { LedgerUnavailableError, defineAction, openLedger } from "@idem/core";
import { freePort, scaled, startChild, tempDir, type Child } from "@idem/testkit";
import { databaseOf } from "@idem/core/testing";
import { failingDisk, loopMountable, type FailingDisk } from "./disk-support.js";
import { CLI, CONFIG, until } from "./support.js";

const skip = loopMountable();
if (skip) console.warn(`skipping the read-only disk test: ${skip}`);

async function scrape(port: number): Promise<{ health?: { status: number; ledger: string }; metrics?: string }> {
  try {
    const res = await fetch(`http://127.0.0.1:${port}/healthz`);
    const body = (await res.json()) as { ledger: string };
    const metrics = await (await fetch(`http://127.0.0.1:${port}/metrics`)).text();
    return { health: { status: res.status, ledger: body.ledger }, metrics };
  } catch {
    return {}; // not listening yet
  }
}
const metric = (text: string | undefined, name: string) =>
  Number(new RegExp(`^${name} (\\d+)$`, "m").exec(text ?? "")?.[1] ?? Number.NaN);

describe.skipIf(skip !== "")("the daemon on a SQLite ledger whose disk turns read-only", () => {
  const children: Child[] = [];
  let disk: FailingDisk | undefined;
  afterAll(async () => {
    for (const c of children) {
      c.proc.kill("SIGKILL"); // ended already, unless a test failed before
      await c.exited;
    }
    disk?.close();
  });

  it(
    "keeps running, says it once, /healthz 503 and idem_ledger_up 0, stops cleanly; repaired, the ledger is whole and a new daemon healthy",
    async (ctx) => {
      disk = failingDisk();
      const url = `sqlite:${join(disk.dir, "ledger.db")}`;
      const mail = defineAction({ type: "disk.mail", capabilities: {}, execute: async () => ({ id: "m1" }) });
      const agent = await openLedger(url); // migrated; an agent's ledger, in this process
      const env = { LEDGER_URL: url, EFFECT_DIR: tempDir(), WEBHOOK_URL: "http://127.0.0.1:9/hook" };
      const port = await freePort();
      const daemon = startChild(CLI, ["--config", CONFIG, "daemon", "--name", "d-ro"], {
        ...env,
        METRICS_PORT: String(port),
      });
      children.push(daemon);
      ctx.onTestFailed(() => console.error(`daemon's last lines:\n${daemon.lines.slice(-8).join("\n")}`));
      expect((await agent.run(mail, { tenant: "t", key: ["before"], args: {} })).status).toBe("succeeded");
      await until(async () => (await scrape(port)).health?.status === 200, 60_000, "the daemon to be healthy");

      disk.fail();
      const refused = await agent.run(mail, { tenant: "t", key: ["during"], args: {} }).catch((e: unknown) => e);
      expect(refused).toBeInstanceOf(LedgerUnavailableError);
      expect(refused).toMatchObject({ reopen: false }); // the same file, which may be writable again
      await until(
        async () => {
          if (daemon.proc.exitCode !== null) throw new Error(`the daemon exited: ${(await daemon.exited).stderr}`);
          const s = await scrape(port);
          return (
            s.health?.status === 503 && s.health.ledger === "unavailable" && metric(s.metrics, "idem_ledger_up") === 0
          );
        },
        60_000,
        "/healthz and /metrics to say the ledger is unavailable",
      );
      // Five more ticks fail (each counted): still one line, and no tick failure of another kind.
      const errors = metric((await scrape(port)).metrics, "idem_daemon_errors_total");
      await until(
        async () => metric((await scrape(port)).metrics, "idem_daemon_errors_total") >= errors + 5,
        60_000,
        "five more ticks to fail",
      );
      expect(daemon.proc.exitCode).toBe(null);
      const said = daemon.lines.map((l) => JSON.parse(l) as { level: number; msg: string; err?: { message: string } });
      const outage = said.filter((l) => l.msg === "the ledger database is unavailable; retrying every interval");
      expect(outage).toHaveLength(1);
      expect(outage[0]!.err?.message).toMatch(/disk I\/O error|readonly|read-only/i);
      expect(said.filter((l) => l.level >= 50 && l !== outage[0])).toEqual([]);

      // A stop during the outage is a clean stop: nothing was in flight.
      daemon.proc.kill("SIGTERM");
      const stopped = await daemon.exited;
      expect(stopped.code, stopped.stderr).toBe(0);
      await agent.close().catch(() => {}); // its checkpoint cannot be written: what is committed is in the log

      // Every file on it closed: the operator repairs the disk, and mounts it again.
      expect(disk.repair()).toBeLessThanOrEqual(1);
      const after = await openLedger(url, { migrate: false });
      try {
        // A raw statement through the ledger's own connection (kysely is core's, not this package's).
        const db = databaseOf(after);
        const pragma = { sql: "pragma integrity_check", parameters: [], query: { kind: "RawNode" } };
        const check = await db.executeQuery(pragma as unknown as Parameters<typeof db.executeQuery>[0]);
        expect(check.rows).toEqual([{ integrity_check: "ok" }]);
        const ops = await after.admin.list({ tenant: "t", limit: 10 });
        expect(ops.map((o) => o.status)).toEqual(["succeeded"]); // "before" only: nothing of "during"
        expect((await after.run(mail, { tenant: "t", key: ["before"], args: {} })).status).toBe("succeeded");
        const againPort = await freePort();
        const again = startChild(CLI, ["--config", CONFIG, "daemon", "--name", "d-ro"], {
          ...env,
          METRICS_PORT: String(againPort),
        });
        children.push(again);
        await until(
          async () => (await scrape(againPort)).health?.status === 200,
          60_000,
          "the new daemon to be healthy",
        );
        again.proc.kill("SIGTERM");
        expect((await again.exited).code).toBe(0);
      } finally {
        await after.close();
      }
    },
    scaled(180_000),
  );
});
