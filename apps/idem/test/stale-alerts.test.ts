/**
 * Defects found in review (helper-123) of the daemon's alerts, each reproduced here first: an
 * alert read after its operation moved on (checked again: running; proven not done: pending) is
 * said as a failure; a stuck run is hidden from the stuck alert by other runs below their own,
 * longer threshold.
 */
import { afterEach, describe, expect, it } from "vitest";
import { Writable } from "node:stream";
import { defineAction, type Classification, type ReconcileResult } from "@idem/core";
import { openTestLedger } from "@idem/core/testing";
import { Daemon, DaemonMetrics, alertActions, parseConfig } from "@idem/cli";
import { pino } from "pino";
import { DIALECTS, freshDatabase, scaled } from "@idem/testkit";
import { until } from "./support.js";

let n = 0;
/** Running exports: as many as the daemon's read of running rows takes (`daemon.stuck`'s 1,000). */
const EXPORTS = 1_000;
const tenant = () => `h3r${++n}-${Math.random().toString(36).slice(2, 7)}`;

/** A logger that keeps every line it writes (the log sink's alerts among them). */
function capture() {
  const lines: { level: number; msg: string; alert?: { kind: string; operationId: string; status: string } }[] = [];
  const log = pino(
    { level: "info" },
    new Writable({
      write(chunk, _encoding, done) {
        for (const line of String(chunk).split("\n").filter(Boolean)) lines.push(JSON.parse(line));
        done();
      },
    }),
  );
  return { log, lines };
}

/** A provider's refusal of a revoked key: classified by `lostNote` as permanent, alerted. */
const revoked = () => Object.assign(new Error("401 api key revoked"), { status: 401 });

/** A note whose send's answer is lost (unknown), looked up by `reconcile`. */
function lostNote(reconcile: () => Promise<ReconcileResult<{ id: string }>>) {
  return defineAction<{ to: string }, { id: string }>({
    type: "crm.note",
    capabilities: { lookup: true },
    execute: async () => {
      throw new Error("timeout after send");
    },
    classify: (e) =>
      (e as { status?: number }).status === 401
        ? { kind: "permanent", reason: "api key revoked", alert: true }
        : { kind: "ambiguous", reason: "timeout after send" },
    reconcile,
  });
}

const cleanups: (() => Promise<unknown>)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c().catch(() => {});
});

for (const dialect of DIALECTS) {
  describe(`the daemon's alerts under review (h3), ${dialect}`, () => {
    it(
      "an unknown outcome whose check was refused, read for its alert while it is checked again (running), is never alerted as 'failed on authentication or policy'",
      async () => {
        const url = await freshDatabase(dialect);
        const { log, lines } = capture();
        let lookups = 0;
        let open: () => void = () => {};
        const gate = new Promise<void>((r) => (open = r));
        // A lookup that the provider first refuses (a revoked key), then, with the key fixed, answers late.
        const mail = lostNote(async () => {
          lookups += 1;
          if (lookups === 1) throw revoked();
          await gate;
          return { found: true, receipt: { id: "note_1" } };
        });
        const config = parseConfig({ ledger: url, alerts: { log: true }, daemon: { intervalMs: 50 } });
        const ledger = await openTestLedger(url, {
          poolSize: 3,
          actions: [...alertActions(config, log), mail],
          budget: { attempts: 1 },
        });
        cleanups.push(() => ledger.close());
        const t = tenant();
        const first = await ledger.run(mail, { tenant: t, key: ["n"], args: { to: "a@example.com" } });
        expect(first).toMatchObject({ state: "unknown" });
        // The first check is refused: still unknown, its check_refused alert due.
        await ledger.daemon.settle({ tenant: t, id: first.operationId, actor: "agent" });
        expect((await ledger.get({ tenant: t, id: first.operationId })).operation).toMatchObject({
          status: "unknown",
        });
        // Another check begins (an agent's call, another replica): the row is running under its lease.
        const second = ledger.daemon.settle({ tenant: t, id: first.operationId, actor: "replica-b" });
        cleanups.push(async () => {
          open();
          await second;
        });
        await until(
          async () => (await ledger.get({ tenant: t, id: first.operationId })).operation.status === "running",
          10_000,
          "the second check to hold the row",
        );
        const daemon = new Daemon(ledger, config, log, new DaemonMetrics(ledger, 1_000), "d-h3-running");
        await daemon.tick();
        open();
        expect(await second).toMatchObject({ status: "succeeded" });
        await daemon.tick();
        const said = lines.filter((l) => l.alert?.operationId === first.operationId);
        // Before: one alert, kind auth_failure ("failed on authentication or policy") about a running operation.
        expect(
          said.map((l) => ({ kind: l.alert!.kind, status: l.alert!.status, msg: l.msg })),
          "alerts about the operation",
        ).not.toContainEqual(expect.objectContaining({ kind: "auth_failure" }));
        for (const l of said) expect(l.msg).not.toMatch(/failed on authentication or policy/);
      },
      scaled(60_000),
    );

    /**
     * An unknown outcome whose first check is refused (a revoked key) and whose next proves it
     * absent, both by agents' calls before any daemon's alert pass; the run after is refused
     * `rerun` (its error's status and its class). Then two ticks of a daemon named `name`.
     */
    async function refusedThenAbsent(
      rerun: { status: number; message: string; cls: Classification },
      expected: "pending" | "failed",
      name: string,
    ) {
      const url = await freshDatabase(dialect);
      const { log, lines } = capture();
      let lookups = 0;
      const note = defineAction<{ to: string }, { id: string }>({
        type: "crm.note",
        capabilities: { lookup: true },
        execute: async (_args, op) => {
          if (op.attempt === 1) throw new Error("timeout after send");
          throw Object.assign(new Error(rerun.message), { status: rerun.status });
        },
        classify: (e) => {
          const status = (e as { status?: number }).status;
          if (status === 401) return { kind: "permanent", reason: "api key revoked", alert: true };
          if (status === rerun.status) return rerun.cls;
          return { kind: "ambiguous", reason: "timeout after send" };
        },
        reconcile: async () => {
          lookups += 1;
          if (lookups === 1) throw Object.assign(new Error("401 api key revoked"), { status: 401 });
          return { found: false, proof: "absent", reason: "no such note" };
        },
      });
      const config = parseConfig({ ledger: url, alerts: { log: true }, daemon: { intervalMs: 50 } });
      const ledger = await openTestLedger(url, {
        poolSize: 3,
        actions: [...alertActions(config, log), note],
        budget: { attempts: 1 },
      });
      cleanups.push(() => ledger.close());
      const t = tenant();
      const first = await ledger.run(note, { tenant: t, key: ["n"], args: { to: "a@example.com" } });
      expect(first).toMatchObject({ state: "unknown" });
      // Checked by agents' calls (or another replica) before any daemon's alert pass: refused, then absent.
      await ledger.daemon.settle({ tenant: t, id: first.operationId, actor: "agent" });
      await ledger.daemon.settle({ tenant: t, id: first.operationId, actor: "agent" });
      expect((await ledger.get({ tenant: t, id: first.operationId })).operation).toMatchObject({
        status: expected,
      });
      const daemon = new Daemon(ledger, config, log, new DaemonMetrics(ledger, 1_000), name);
      await daemon.tick();
      await daemon.tick();
      return lines.filter((l) => l.alert?.operationId === first.operationId);
    }

    it(
      "an unknown outcome whose check was refused, then proven not done (pending, its run failing transiently), is never alerted as 'failed on authentication or policy'",
      async () => {
        // Each run after the proof meets a provider briefly down (503 before executing).
        const said = await refusedThenAbsent(
          { status: 503, message: "503", cls: { kind: "transient", reason: "503 before executing" } },
          "pending",
          "d-h3-pending",
        );
        // Before: "failed on authentication or policy" about an operation known not done, to be run again.
        for (const l of said) expect({ kind: l.alert!.kind, msg: l.msg }).not.toMatchObject({ kind: "auth_failure" });
        for (const l of said) expect(l.msg).not.toMatch(/failed on authentication or policy/);
      },
      scaled(60_000),
    );

    it(
      "an unknown outcome whose check was refused, then proven not done and run again to a refusal that is no credential's (failed, no alert of its own), is never alerted as 'failed on authentication or policy'",
      async () => {
        // The run after the proof is refused for its content (a 400: a validation error, no credential's).
        const said = await refusedThenAbsent(
          { status: 400, message: "400 invalid email", cls: { kind: "permanent", reason: "400 invalid email" } },
          "failed",
          "d-h7-failed",
        );
        for (const l of said) expect({ kind: l.alert!.kind, msg: l.msg }).not.toMatchObject({ kind: "auth_failure" });
      },
      scaled(60_000),
    );

    it(
      "a run past its threshold is alerted as stuck though a thousand longer runs of another action, within their own longer threshold, started before it",
      async () => {
        const url = await freshDatabase(dialect);
        const { log, lines } = capture();
        let now = Date.now();
        let release: () => void = () => {};
        const released = new Promise<void>((r) => (release = r));
        // An export takes up to an hour (its own threshold); a send should take seconds.
        const hangs = (type: string) =>
          defineAction<{ n: number }, { id: string }>({
            type,
            capabilities: {},
            execute: async () => {
              await released; // the provider does not answer (for the send), or works on (the exports)
              return { id: "done" };
            },
          });
        const exportAction = hangs("batch.export");
        const send = hangs("mail.send");
        const config = parseConfig({
          ledger: url,
          alerts: { log: true },
          thresholds: { stuckAfterMs: 60_000, perAction: { "batch.export": 3_600_000 } },
          daemon: { intervalMs: 50 },
        });
        const ledger = await openTestLedger(url, {
          clock: () => now,
          poolSize: 4,
          leaseMs: 24 * 3_600_000,
          actions: [...alertActions(config, log), exportAction, send],
        });
        const t = tenant();
        const runs: Promise<unknown>[] = [];
        cleanups.push(async () => {
          release();
          await Promise.allSettled(runs);
          await ledger.close();
        });
        for (let i = 0; i < EXPORTS; i++)
          runs.push(ledger.run(exportAction, { tenant: t, key: ["export", i], args: { n: i } }));
        await until(
          async () => (await ledger.admin.stats({ tenant: t })).unsettled.reduce((s, r) => s + r.count, 0) === EXPORTS,
          60_000,
          "the exports to run",
        );
        now += 10 * 60_000; // the exports have run 10 minutes: well within their hour
        runs.push(ledger.run(send, { tenant: t, key: ["send"], args: { n: 0 } }));
        let sendId = "";
        await until(
          async () => {
            const [op] = await ledger.admin.list({ tenant: t, action: "mail.send" });
            sendId = op?.status === "running" ? op.id : "";
            return sendId !== "";
          },
          10_000,
          "the send to run",
        );
        now += 5 * 60_000; // the send has run 5 minutes: five times its threshold
        const metrics = new DaemonMetrics(ledger, 1_000);
        const daemon = new Daemon(ledger, config, log, metrics, "d-h3-stuck");
        await daemon.tick();
        const stuck = lines.filter((l) => l.alert?.kind === "stuck").map((l) => l.alert!.operationId);
        const gauge = (await metrics.registry.getSingleMetric("idem_stuck_operations")!.get()).values[0]?.value;
        // Before: no alert and a gauge of 0: stuck() gave the oldest 1,000 running rows, all exports.
        expect({
          alerted: stuck.includes(sendId),
          exports: stuck.length - (stuck.includes(sendId) ? 1 : 0),
          gauge,
        }).toEqual({ alerted: true, exports: 0, gauge: 1 });
      },
      scaled(180_000),
    );
    it(
      "a person's retry whose look first is refused (a revoked key) is alerted, not acknowledged unsent as a row known not done",
      async () => {
        const url = await freshDatabase(dialect);
        const { log, lines } = capture();
        let lookups = 0;
        // The key is revoked after the send: every lookup is refused.
        const note = lostNote(async () => {
          lookups += 1;
          throw revoked();
        });
        const config = parseConfig({ ledger: url, alerts: { log: true }, daemon: { intervalMs: 50 } });
        const ledger = await openTestLedger(url, {
          poolSize: 3,
          actions: [...alertActions(config, log), note],
          budget: { attempts: 1 },
        });
        cleanups.push(() => ledger.close());
        const t = tenant();
        const input = { tenant: t, key: ["n"], args: { to: "a@example.com" } };
        const first = await ledger.run(note, input);
        expect(first).toMatchObject({ state: "unknown" });
        // A person found nothing and retries: the row is pending, marked to be looked up first.
        await ledger.admin.retry({ tenant: t, id: first.operationId, actor: "alice", reason: "nothing there" });
        // The caller's look first is refused for good: pending still (never run unproven), alerted.
        const again = await ledger.run(note, input);
        expect(again).toMatchObject({ state: "pending" });
        const { operation } = await ledger.get({ tenant: t, id: first.operationId });
        expect(operation).toMatchObject({ status: "pending", lookFirst: true });
        const daemon = new Daemon(ledger, config, log, new DaemonMetrics(ledger, 1_000), "d-h3-marked");
        await daemon.tick();
        // Before: no alert; the daemon acknowledged it as a row known not done, and the revoked key
        // kept every later look refused in silence.
        const said = lines.filter((l) => l.alert?.operationId === first.operationId).map((l) => l.alert!.kind);
        expect(said).toEqual(["check_refused"]);
        await daemon.tick();
        expect(lines.filter((l) => l.alert?.operationId === first.operationId)).toHaveLength(1);
        expect(lookups).toBeGreaterThan(0);
      },
      scaled(60_000),
    );
  });
}
