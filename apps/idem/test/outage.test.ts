/**
 * The daemon and three agents, real processes, on a private Postgres that goes away under them:
 * an immediate shutdown held until the daemon reports it, then quick immediate restarts. The
 * daemon must keep running, say so on /healthz and resume by itself; the agents must survive and
 * go on; every job must end done exactly once at the target (effects are lines in a file). And a
 * daemon started before its database listens on its Unix socket waits for it, and one whose SQLite
 * ledger's disk fills (reads still pass, writes fail) says so on /healthz as for an outage; one
 * whose SQLite ledger is deleted and made anew under it is no outage: it exits for a restart. A
 * frozen database makes /healthz unhealthy within 10 s, a settlement in flight or not (the ledger
 * "unknown" until the client's read timeout says "unavailable"); a connection cut between the open
 * and its schema check is waited through as during the open.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { execFileSync } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { createConnection, createServer, type Server } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { LedgerUnavailableError, defineAction, openLedger } from "@idem/core";
import {
  freePort,
  freshDatabase,
  kill9,
  pgProxy,
  scaled,
  startChild,
  startPgServer,
  tempDir,
  whileLocked,
  within,
  type Child,
  type PgServer,
} from "@idem/testkit";
import { fileAction, lines } from "./fixtures/file-actions.js";
import { CLI, CONFIG, idem, until, webhookReceiver } from "./support.js";

const AGENT = fileURLToPath(new URL("./fixtures/agent.ts", import.meta.url));

interface Health {
  status: number;
  ok: boolean;
  ledger: string;
}
async function health(port: number): Promise<Health | undefined> {
  try {
    const res = await fetch(`http://127.0.0.1:${port}/healthz`);
    return { status: res.status, ...((await res.json()) as { ok: boolean; ledger: string }) };
  } catch {
    return undefined; // not listening yet
  }
}

/** A Unix socket at `<dir>/.s.PGSQL.5432` that forwards to a server's TCP port: the server listening there. */
async function socketFor(dir: string, port: number): Promise<Server> {
  const socket = createServer((inbound) => {
    const outbound = createConnection({ host: "127.0.0.1", port });
    inbound.pipe(outbound).pipe(inbound);
    inbound.on("error", () => outbound.destroy());
    outbound.on("error", () => inbound.destroy());
  });
  await new Promise<void>((r) => socket.listen(join(dir, ".s.PGSQL.5432"), r));
  return socket;
}

/** Rejects when `p` has not settled in time, naming what was awaited. */
describe("the daemon and agents through Postgres restarts", () => {
  let server: PgServer;
  let url = "";
  let hook: Awaited<ReturnType<typeof webhookReceiver>>;
  const children: Child[] = [];

  beforeAll(async () => {
    server = await startPgServer();
    url = await server.database();
    await (await openLedger(url)).close(); // migrated: agents and daemon open without migrating
    hook = await webhookReceiver();
  }, scaled(180_000));
  afterAll(async () => {
    for (const c of children) if (c.proc.exitCode === null && c.proc.signalCode === null) await kill9(c);
    await hook?.close();
    await server?.close();
  }, scaled(120_000));

  it(
    "keeps running, reports the outage on /healthz and resumes; every job is done once",
    async (ctx) => {
      ctx.onTestFailed(() => {
        for (const c of children) console.error(`--- pid ${c.proc.pid} last lines:\n${c.lines.slice(-8).join("\n")}`);
      });
      const dir = tempDir();
      const tenant = `outage-${process.pid}`;
      const metricsPort = await freePort();
      const daemon = startChild(CLI, ["--config", CONFIG, "daemon", "--name", "d-outage"], {
        LEDGER_URL: url,
        EFFECT_DIR: dir,
        WEBHOOK_URL: hook.url,
        METRICS_PORT: String(metricsPort),
      });
      children.push(daemon);
      const agents = Array.from({ length: 3 }, () =>
        startChild(AGENT, [], { LEDGER_URL: url, TENANT: tenant, EFFECT_DIR: dir, LEASE_MS: "3000" }),
      );
      children.push(...agents);
      await Promise.all(agents.map((a) => a.waitFor(/^ready$/, 60_000)));
      await until(async () => (await health(metricsPort))?.ok === true, 60_000, "the daemon to be healthy");

      const done = () => agents.reduce((n, a) => n + a.lines.filter((l) => l.startsWith("done ")).length, 0);
      const progress = async (more: number, what: string) => {
        const from = done();
        await until(() => done() >= from + more, 60_000, what);
      };
      const alive = (c: Child) => c.proc.exitCode === null && c.proc.signalCode === null;

      await progress(20, "the agents to do jobs");
      // A long outage, while every process holds a connection: the table is locked, so the daemon's
      // and the agents' statements wait on checked-out clients when the server goes (the socket
      // error pg emits on such a client was uncaught and took the process down). The daemon
      // reports the outage while the server is down, and stays up.
      await whileLocked(url, "idem_operations", 4, () =>
        within(60_000, "the server to stop", server.stop("immediate")),
      );
      await until(
        async () => {
          if (!alive(daemon)) throw new Error(`the daemon died: ${(await daemon.exited).stderr.slice(-600)}`);
          const h = await health(metricsPort);
          return h?.status === 503 && h.ledger === "unavailable";
        },
        60_000,
        "/healthz to report the ledger unavailable",
      );
      expect(alive(daemon)).toBe(true);
      // The scrape still answers, saying the ledger is down.
      const scrape = await fetch(`http://127.0.0.1:${metricsPort}/metrics`);
      expect(scrape.status).toBe(200);
      expect(await scrape.text()).toMatch(/^idem_ledger_up 0$/m);
      await within(90_000, "the server to start", server.start());
      await until(async () => (await health(metricsPort))?.ok === true, 60_000, "/healthz to report the ledger back");
      await progress(20, "the agents to go on after the first outage");
      // Two quick immediate restarts, as a failover does.
      for (let i = 0; i < 2; i++) {
        await within(120_000, "the server to restart", server.restart("immediate"));
        await progress(10, `the agents to go on after restart ${i + 1}`);
      }
      await until(async () => (await health(metricsPort))?.ok === true, 60_000, "the daemon to be healthy again");

      for (const a of agents) a.send("stop");
      const exits = await within(
        60_000,
        `the agents to stop; last lines: ${agents.map((a) => a.lines.slice(-3).join(" | ")).join(" || ")}`,
        Promise.all(agents.map((a) => a.exited)),
      );
      for (const e of exits) expect(e.code, e.stderr).toBe(0);
      expect(alive(daemon), daemon.lines.slice(-5).join("\n")).toBe(true);

      // The daemon settles what the outages left running or unknown; then each job is done once.
      const ledger = await openLedger(url, { migrate: false, poolSize: 1 });
      try {
        await until(
          async () => (await ledger.admin.list({ tenant, limit: 10_000 })).every((op) => op.status === "succeeded"),
          90_000,
          "every operation to be settled",
        );
        const ops = await ledger.admin.list({ tenant, limit: 10_000 });
        const effects = lines(`${dir}/effects`);
        const perKey = new Map<string, number>();
        for (const [key] of effects) perKey.set(key!, (perKey.get(key!) ?? 0) + 1);
        expect(ops.length).toBeGreaterThanOrEqual(50);
        expect([...perKey.values()].filter((n) => n !== 1)).toEqual([]); // never two effects for one key
        expect(perKey.size).toBe(ops.length); // and none lost: one effect per operation
        for (const op of ops) expect(perKey.get(op.key)).toBe(1);
      } finally {
        await ledger.close();
      }

      const logs = daemon.lines.join("\n");
      expect(logs).toMatch(/the ledger database is unavailable; retrying every interval/);
      expect(logs).toMatch(/the ledger database is reachable again/);
      daemon.proc.kill("SIGTERM");
      const { code, stderr } = await within(60_000, "the daemon to stop", daemon.exited);
      expect(code, stderr).toBe(0);
    },
    scaled(420_000),
  );

  it(
    "started while the database is down: waits for it (a stop meanwhile ends it, exit 0), starts once it is up; `idem ls` meanwhile exits 1",
    async (ctx) => {
      const env = (metricsPort: number) => ({
        LEDGER_URL: url,
        EFFECT_DIR: tempDir(),
        WEBHOOK_URL: hook.url,
        METRICS_PORT: String(metricsPort),
      });
      ctx.onTestFailed(() => {
        for (const c of children) console.error(`--- pid ${c.proc.pid} last lines:\n${c.lines.slice(-8).join("\n")}`);
      });
      await within(60_000, "the server to stop", server.stop("fast"));
      const waiting = /the ledger database is unreachable; waiting for it/;

      // Stopped while it waits: a clean exit, not a failure.
      const stopped = startChild(CLI, ["--config", CONFIG, "daemon", "--name", "d-early-stop"], env(await freePort()));
      children.push(stopped);
      await stopped.waitFor(waiting, 60_000);
      stopped.proc.kill("SIGTERM");
      const early = await within(60_000, "the waiting daemon to stop", stopped.exited);
      expect(early.code, early.stderr).toBe(0);

      const metricsPort = await freePort();
      const daemon = startChild(CLI, ["--config", CONFIG, "daemon", "--name", "d-late-db"], env(metricsPort));
      children.push(daemon);
      await daemon.waitFor(waiting, 60_000);
      // A probe meanwhile hears that the daemon is up and waiting, not nothing at all.
      const meanwhile = await health(metricsPort);
      expect(meanwhile).toMatchObject({ status: 503, ok: false, ledger: "unavailable" });
      // An operator's command meanwhile: the database is unreachable, not the config wrong (2).
      const ls = await idem(["--config", CONFIG, "ls", "--tenant", "t"], env(await freePort()));
      expect(ls.code, ls.stderr).toBe(1);
      expect(ls.stderr).toMatch(/cannot connect to Postgres ledger/);

      await within(90_000, "the server to start", server.start());
      await until(async () => (await health(metricsPort))?.ok === true, 90_000, "the late daemon to be healthy");
      expect(daemon.lines.join("\n")).toMatch(/the ledger database is reachable/);
      daemon.proc.kill("SIGTERM");
      const { code, stderr } = await within(60_000, "the daemon to stop", daemon.exited);
      expect(code, stderr).toBe(0);
    },
    scaled(300_000),
  );

  it(
    "a frozen database: /healthz 503 within 10 s of the last tick (ledger unknown, not up; idem_ledger_up 0), and the ledger unavailable once the client's read timeout (statement timeout + 5 s) ends the tick",
    async () => {
      const metricsPort = await freePort();
      const daemon = startChild(CLI, ["--config", CONFIG, "daemon", "--name", "d-frozen"], {
        LEDGER_URL: url,
        EFFECT_DIR: tempDir(),
        WEBHOOK_URL: hook.url,
        METRICS_PORT: String(metricsPort),
      });
      children.push(daemon);
      const seen: { at: number; status: number; ledger: string }[] = [];
      // One scrape while the ledger is unknown (a scrape waits up to 5 s for the frozen count).
      let upWhileUnknown: string | undefined;
      const up = async () =>
        /^idem_ledger_up (\d)$/m.exec(await (await fetch(`http://127.0.0.1:${metricsPort}/metrics`)).text())?.[1];
      try {
        await until(async () => (await health(metricsPort))?.ok === true, 60_000, "the daemon to be healthy");
        await server.freeze();
        const frozenAt = performance.now();
        await until(
          async () => {
            const h = await health(metricsPort);
            if (h) seen.push({ at: Math.round(performance.now() - frozenAt), status: h.status, ledger: h.ledger });
            if (h?.ledger === "unknown" && upWhileUnknown === undefined) upWhileUnknown = await up();
            return h?.ledger === "unavailable";
          },
          90_000,
          "/healthz to say the ledger is unavailable",
        );
        // Measured: 503 after 9.8 s (the last tick 10 s old), "unavailable" after 35 s (the
        // heartbeat's statement failing at the client's read timeout, 30 s + 5 s). Before, the body
        // said "ledger":"up" with each 503 between the two.
        const first503 = seen.find((s) => s.status === 503)!;
        expect(first503.at).toBeLessThan(scaled(12_000));
        expect(seen.at(-1)!.at).toBeLessThan(scaled(40_000));
        expect(seen.filter((s) => s.status === 503 && s.ledger === "up")).toEqual([]);
        expect(seen.filter((s) => s.status === 503).map((s) => s.ledger)).toContain("unknown");
        // Before: idem_ledger_up 1 while "unknown", until the tick's statement failed (35 s).
        expect(upWhileUnknown).toBe("0");
      } finally {
        await server.thaw();
        daemon.proc.kill("SIGKILL");
        await daemon.exited;
      }
    },
    scaled(240_000),
  );

  it(
    "a database that freezes while a settlement is in flight: /healthz 503 within 10 s (idem_ledger_up 0), not healthy for the settlement's claim",
    async () => {
      const dir = tempDir();
      const tenant = `frozen-settle-${process.pid}`;
      // Work known not done, for the daemon to run: its request (a provider that answers 30 s
      // after the effect) is in flight at the freeze.
      const agent = await openLedger(url, { poolSize: 1, budget: { attempts: 1 } });
      try {
        const refused = {
          ...fileAction("neither", dir),
          execute: async () => {
            throw new Error("503 before the provider executed");
          },
          classify: () => ({ kind: "transient", reason: "503", retryAfterMs: 0 }) as const,
        };
        const out = await agent.run(refused, { tenant, key: ["k"], args: { note: "x" } });
        expect(out).toMatchObject({ state: "pending" });
      } finally {
        await agent.close();
      }
      const metricsPort = await freePort();
      const daemon = startChild(CLI, ["--config", CONFIG, "daemon", "--name", "d-frozen-settle"], {
        LEDGER_URL: url,
        EFFECT_DIR: dir,
        WEBHOOK_URL: hook.url,
        METRICS_PORT: String(metricsPort),
        EXECUTE_DELAY_MS: "30000",
      });
      children.push(daemon);
      const up = async () =>
        /^idem_ledger_up (\d)$/m.exec(await (await fetch(`http://127.0.0.1:${metricsPort}/metrics`)).text())?.[1];
      // Each answer with when its request was sent: the daemon heard it no earlier.
      const seen: { sent: number; status: number; ledger: string }[] = [];
      let upLate: string | undefined; // idem_ledger_up scraped 10 s after the freeze
      try {
        await until(async () => (await health(metricsPort))?.ok === true, 60_000, "the daemon to be healthy");
        await until(() => lines(join(dir, "effects")).length >= 1, 60_000, "the daemon's run to start");
        await server.freeze();
        const frozenAt = performance.now();
        await until(
          async () => {
            const sent = Math.round(performance.now() - frozenAt);
            const h = await health(metricsPort);
            if (h) seen.push({ sent, status: h.status, ledger: h.ledger });
            if (sent >= 10_000 && h?.ledger !== "unavailable") upLate ??= await up();
            return h?.ledger === "unavailable";
          },
          90_000,
          "/healthz to say the ledger is unavailable",
        );
        // Nothing reached the ledger since the freeze: asked 10 s after it, the daemon is unhealthy.
        // Before: 200 and "ledger":"up" for as long as the run was in flight (30 s, up to claimMs),
        // counted as progress every interval though none of its statements (the lease's) came back.
        expect(seen.filter((s) => s.sent >= 10_000 && s.status !== 503)).toEqual([]);
        expect(seen.filter((s) => s.status === 503 && s.ledger === "up")).toEqual([]);
        expect(upLate).toBe("0");
      } finally {
        await server.thaw();
        daemon.proc.kill("SIGKILL");
        await daemon.exited;
      }
    },
    scaled(240_000),
  );

  it(
    "a stop on a frozen database exits within daemon.stopTimeoutMs (20 s), inside Kubernetes' 30 s grace, not at the client's read timeout",
    async () => {
      const metricsPort = await freePort();
      // A statement timeout of 60 s: the client's read timeout (65 s) is well past the grace, as
      // the default 35 s is past it for a stop that comes as a statement begins.
      const daemon = startChild(CLI, ["--config", CONFIG, "daemon", "--name", "d-frozen-stop"], {
        LEDGER_URL: `${url}?statement_timeout=60000`,
        EFFECT_DIR: tempDir(),
        WEBHOOK_URL: hook.url,
        METRICS_PORT: String(metricsPort),
      });
      children.push(daemon);
      try {
        await until(async () => (await health(metricsPort))?.ok === true, 60_000, "the daemon to be healthy");
        await server.freeze();
        // A tick waits on the frozen database: 503 with the ledger unknown (its statement not back).
        await until(
          async () => (await health(metricsPort))?.ledger === "unknown",
          60_000,
          "/healthz to say a tick has not come back",
        );
        const stoppedAt = performance.now();
        daemon.proc.kill("SIGTERM");
        const { code, stderr } = await within(scaled(120_000), "the daemon to stop", daemon.exited);
        const tookMs = performance.now() - stoppedAt;
        // Before: 55 s and more, the stop waiting for the frozen statement's read timeout (65 s
        // after it began): a supervisor's grace (30 s) ended first, and it was killed.
        expect(tookMs, stderr).toBeLessThan(30_000);
        expect(code).toBe(1); // not a graceful stop: the work in flight was left to its lease
        expect(daemon.lines.join("\n")).toMatch(/the work in flight did not end within 20000 ms of the stop: exiting/);
      } finally {
        await server.thaw();
        daemon.proc.kill("SIGKILL");
        await daemon.exited;
      }
    },
    scaled(240_000),
  );

  it(
    "started before its database listens on its Unix socket: waits for it (not exit 2), starts once it does",
    async () => {
      const dir = tempDir(); // the socket's directory; the server that would make the socket is not there
      const tcp = new URL(url);
      const socketUrl = `postgres://${tcp.username}:${tcp.password}@/${tcp.pathname.slice(1)}?host=${encodeURIComponent(dir)}`;
      const metricsPort = await freePort();
      const daemon = startChild(CLI, ["--config", CONFIG, "daemon", "--name", "d-socket"], {
        LEDGER_URL: socketUrl,
        EFFECT_DIR: tempDir(),
        WEBHOOK_URL: hook.url,
        METRICS_PORT: String(metricsPort),
      });
      children.push(daemon);
      let socket: Server | undefined;
      try {
        // Before: "connect ENOENT …/.s.PGSQL.5432" read as a wrong config, and exit 2.
        const first = await Promise.race([
          daemon.waitFor(/the ledger database is unreachable; waiting for it/, 60_000).then(() => "waiting"),
          daemon.exited.then((e) => `exited ${e.code}: ${e.stderr.trim().split("\n").pop()}`),
        ]);
        expect(first).toBe("waiting");
        socket = await socketFor(dir, server.port); // the server starts
        await until(async () => (await health(metricsPort))?.ok === true, 60_000, "the daemon to be healthy");
        daemon.proc.kill("SIGTERM");
        const { code, stderr } = await within(60_000, "the daemon to stop", daemon.exited);
        expect(code, stderr).toBe(0);
      } finally {
        daemon.proc.kill("SIGKILL"); // stopped already, unless the test failed before
        await daemon.exited;
        if (socket) await new Promise((r) => socket!.close(r));
      }
    },
    scaled(180_000),
  );
});

/** Mounting a tmpfs needs root; elsewhere the full disk test is skipped, saying why. */
const mountable = (() => {
  if (process.getuid?.() !== 0) return "mounting a tmpfs needs root";
  const probe = mkdtempSync(join(tmpdir(), "idem-mount-probe-"));
  try {
    execFileSync("mount", ["-t", "tmpfs", "-o", "size=64k", "tmpfs", probe], { stdio: "pipe" });
    execFileSync("umount", [probe], { stdio: "pipe" });
    return "";
  } catch (e) {
    return `cannot mount a tmpfs here: ${(e as Error).message.split("\n")[0]}`;
  } finally {
    rmSync(probe, { recursive: true, force: true });
  }
})();
if (mountable) console.warn(`skipping the full disk test: ${mountable}`);

describe.skipIf(mountable !== "")("the daemon on a SQLite ledger whose disk fills", () => {
  it(
    "reports the ledger unavailable (/healthz 503, idem_ledger_up 0) while it takes no writes, and healthy once it does",
    async () => {
      const dir = mkdtempSync(join(tmpdir(), "idem-full-"));
      execFileSync("mount", ["-t", "tmpfs", "-o", "size=8m", "tmpfs", dir]);
      const url = `sqlite:${join(dir, "ledger.db")}`;
      const mail = defineAction({ type: "outage.mail", capabilities: {}, execute: async () => ({ id: "m1" }) });
      const ledger = await openLedger(url); // migrated; an agent's ledger
      const metricsPort = await freePort();
      const daemon = startChild(CLI, ["--config", CONFIG, "daemon", "--name", "d-full"], {
        LEDGER_URL: url,
        EFFECT_DIR: tempDir(),
        WEBHOOK_URL: "http://127.0.0.1:9/hook", // no alert is raised here
        METRICS_PORT: String(metricsPort),
      });
      const up = async () =>
        /^idem_ledger_up (\d)$/m.exec(await (await fetch(`http://127.0.0.1:${metricsPort}/metrics`)).text())?.[1];
      try {
        expect((await ledger.run(mail, { tenant: "t", key: ["before"], args: {} })).status).toBe("succeeded");
        await until(async () => (await health(metricsPort))?.ok === true, 60_000, "the daemon to be healthy");
        try {
          execFileSync("dd", ["if=/dev/zero", `of=${join(dir, "filler")}`, "bs=4k"], { stdio: "pipe" });
        } catch {
          /* dd stops with ENOSPC: the disk is full, as wanted */
        }
        // Every agent's call fails now: the ledger cannot take a claim.
        const refused = await ledger.run(mail, { tenant: "t", key: ["during"], args: {} }).catch((e: unknown) => e);
        expect(refused).toBeInstanceOf(LedgerUnavailableError);
        expect(refused).toMatchObject({ reopen: false }); // an outage that may pass: waited out
        // Before: 200 and idem_ledger_up 1, its reads passing and its claims matching no row.
        await until(
          async () => (await health(metricsPort))?.status === 503 && (await up()) === "0",
          60_000,
          "/healthz to report the ledger unavailable",
        );
        expect(await health(metricsPort)).toMatchObject({ ok: false, ledger: "unavailable" });
        rmSync(join(dir, "filler"));
        await until(
          async () => (await health(metricsPort))?.ok === true && (await up()) === "1",
          60_000,
          "/healthz to report the ledger back",
        );
        expect((await ledger.run(mail, { tenant: "t", key: ["after"], args: {} })).status).toBe("succeeded");
        expect(daemon.lines.join("\n")).toMatch(/the ledger database is unavailable; retrying every interval/);
        daemon.proc.kill("SIGTERM");
        const { code, stderr } = await within(60_000, "the daemon to stop", daemon.exited);
        expect(code, stderr).toBe(0);
      } finally {
        daemon.proc.kill("SIGKILL"); // stopped already, unless the test failed before
        await daemon.exited;
        await ledger.close();
        try {
          execFileSync("umount", [dir], { stdio: "pipe" });
        } catch {
          execFileSync("umount", ["-l", dir], { stdio: "pipe" });
        }
        rmSync(dir, { recursive: true, force: true });
      }
    },
    scaled(180_000),
  );
});

describe("the daemon on a SQLite ledger deleted and made anew under it", () => {
  it(
    "exits non-zero saying the file was replaced (not an outage to wait out), and started again runs on the new file",
    async () => {
      const path = join(tempDir(), "ledger.db");
      const url = `sqlite:${path}`;
      await (await openLedger(url)).close(); // migrated
      const env = { LEDGER_URL: url, EFFECT_DIR: tempDir(), WEBHOOK_URL: "http://127.0.0.1:9/hook" };
      const metricsPort = await freePort();
      const first = startChild(CLI, ["--config", CONFIG, "daemon", "--name", "d-replaced"], {
        ...env,
        METRICS_PORT: String(metricsPort),
      });
      let again: Child | undefined;
      try {
        await until(async () => (await health(metricsPort))?.ok === true, 60_000, "the daemon to be healthy");
        // An operator's reset: the ledger deleted, then made anew at its path (idem migrate, an agent).
        for (const suffix of ["", "-wal", "-shm"]) rmSync(path + suffix, { force: true });
        const fresh = await openLedger(url);
        const mail = defineAction({ type: "outage.mail", capabilities: {}, execute: async () => ({ id: "m1" }) });
        try {
          expect((await fresh.run(mail, { tenant: "t", key: ["after-reset"], args: {} })).status).toBe("succeeded");
        } finally {
          await fresh.close();
        }
        // Before: it never exited, retrying the lost file every interval (/healthz 503 for ever).
        const { code, stderr } = await within(scaled(30_000), "the daemon to exit", first.exited);
        expect(code, stderr).toBe(1);
        expect(stderr).toMatch(/since the ledger opened it/);
        const said = first.lines.map((l) => JSON.parse(l) as { level: number; msg: string });
        expect(said).toContainEqual(
          expect.objectContaining({
            level: 60,
            msg: expect.stringMatching(
              /^the ledger must be opened again \(the SQLite .* was (replaced|deleted) since the ledger opened it/,
            ),
          }),
        );
        expect(said.map((l) => l.msg)).not.toContain("the ledger database is unavailable; retrying every interval");
        // Its supervisor starts it again: it opens the file now at the path, and works there.
        const port = await freePort();
        again = startChild(CLI, ["--config", CONFIG, "daemon", "--name", "d-replaced"], {
          ...env,
          METRICS_PORT: String(port),
        });
        await until(async () => (await health(port))?.ok === true, 60_000, "the restarted daemon to be healthy");
        again.proc.kill("SIGTERM");
        const stopped = await within(scaled(30_000), "the restarted daemon to stop", again.exited);
        expect(stopped.code, stopped.stderr).toBe(0);
      } finally {
        for (const child of [first, again]) {
          child?.proc.kill("SIGKILL"); // ended already, unless the test failed before
          await child?.exited;
        }
      }
    },
    scaled(180_000),
  );
});

describe("the daemon whose Postgres blips right after the open", () => {
  it(
    "the schema check that follows the open is waited through as the open is (not exit 1)",
    async (ctx) => {
      const url = await freshDatabase("postgres");
      await (await openLedger(url)).close(); // migrated: the daemon opens without migrating
      // In front of the database: the connection carrying the second read of the schema's version
      // (the daemon's check for pending migrations, right after its open read it) is cut, as a
      // restart or a failover would cut it; every other statement passes.
      let reads = 0;
      const proxy = await pgProxy(new URL(url), (client, upstream) => {
        client.on("data", (chunk: Buffer) => {
          if (chunk.includes("idem_migration")) reads += 1;
          if (reads === 2 && chunk.includes("idem_migration")) return void client.destroy();
          upstream.write(chunk);
        });
        upstream.pipe(client);
      });
      const metricsPort = await freePort();
      const daemon = startChild(CLI, ["--config", CONFIG, "daemon", "--name", "d-blip"], {
        LEDGER_URL: proxy.url,
        EFFECT_DIR: tempDir(),
        WEBHOOK_URL: "http://127.0.0.1:9/hook",
        METRICS_PORT: String(metricsPort),
      });
      ctx.onTestFailed(() =>
        console.error(`reads ${reads}; daemon's last lines:\n${daemon.lines.slice(-8).join("\n")}`),
      );
      try {
        // Before: "cannot read the ledger's schema version: Connection terminated unexpectedly", exit 1.
        const first = await Promise.race([
          until(async () => (await health(metricsPort))?.ok === true, 60_000, "the daemon to be healthy").then(
            () => "healthy",
          ),
          daemon.exited.then((e) => `exited ${e.code}: ${e.stderr.trim().split("\n").pop()}`),
        ]);
        expect(first).toBe("healthy");
        expect(reads).toBeGreaterThanOrEqual(3); // the cut read, then the open tried again
        expect(daemon.lines.join("\n")).toMatch(/the ledger database is unreachable; waiting for it/);
        daemon.proc.kill("SIGTERM");
        const { code, stderr } = await within(scaled(30_000), "the daemon to stop", daemon.exited);
        expect(code, stderr).toBe(0);
      } finally {
        daemon.proc.kill("SIGKILL"); // stopped already, unless the test failed before
        await daemon.exited;
        await proxy.close();
      }
    },
    scaled(120_000),
  );
});
