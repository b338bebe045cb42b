/**
 * A replay refused for good made the operation "failed", and its callers were told so; then an
 * earlier attempt's request, still out, landed and its receipt proved the effect. The row succeeds
 * with it, and the daemon says so (`failure_overruled`), once, not as `two_effects` (the ledger saw
 * one effect): a caller (a model) told "failed" may have sent the same work again under another
 * key. Through the log sink, on SQLite and Postgres. Failed first: not alerted at all.
 */
import { afterEach, describe, expect, it, vi } from "vitest";
import { defineAction } from "@idem/core";
import { openTestLedger } from "@idem/core/testing";
import { Daemon, DaemonMetrics, alertActions, parseConfig } from "@idem/cli";
import { DIALECTS, freshDatabase, scaled } from "@idem/testkit";
import { capturedLog } from "./support.js";

const HOUR = 3_600_000;
class Refused extends Error {}

const cleanups: (() => Promise<unknown>)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c().catch(() => {});
});

for (const dialect of DIALECTS) {
  describe(`a "failed" told to callers, contradicted by a late receipt, alerted by the daemon on ${dialect}`, () => {
    it(
      "is said as failure_overruled, once",
      async () => {
        const url = await freshDatabase(dialect);
        const { log, lines } = capturedLog<{ msg: string; alert?: { kind: string; operationId: string } }>();
        const config = parseConfig({ ledger: url, alerts: { log: true }, daemon: { intervalMs: 50 } });
        let calls = 0;
        let open: () => void = () => {};
        const out = new Promise<void>((r) => (open = r));
        // A provider that dedupes on our key: the replay arrives first and is refused (validation).
        const charge = defineAction<{ amount: number }, { id: string }>({
          type: "charge.late",
          capabilities: { dedupe: { retentionMs: 24 * HOUR } },
          execute: async () => {
            if (++calls > 1) throw new Refused("validation: refused");
            await out; // attempt 1's request is out until released, then lands
            return { id: "ch_1" };
          },
          classify: (e) =>
            e instanceof Refused ? { kind: "permanent", reason: e.message } : { kind: "ambiguous", reason: String(e) },
        });
        let now = Date.now();
        const ledger = await openTestLedger(url, {
          poolSize: 2,
          clock: () => now,
          leaseMs: 30_000,
          actions: [...alertActions(config, log), charge],
        });
        cleanups.push(() => ledger.close());
        const tenant = `fo-${Math.random().toString(36).slice(2, 8)}`;
        const input = { tenant, key: ["k"], args: { amount: 100 } };
        const first = ledger.run(charge, input);
        await vi.waitFor(() => expect(calls).toBe(1), { timeout: scaled(10_000) });
        now += HOUR; // attempt 1's lease ran out; its request is still out, the key still retained
        expect(await ledger.run(charge, input)).toMatchObject({ status: "failed", attempt: 2 });
        open(); // attempt 1's request lands, and its receipt arrives
        expect(await first).toMatchObject({ status: "succeeded", receipt: { id: "ch_1" } });
        const daemon = new Daemon(ledger, config, log, new DaemonMetrics(ledger, 1_000), "d-failure-overruled");
        await daemon.tick();
        await daemon.tick();
        const [op] = await ledger.admin.list({ tenant });
        const said = lines.filter((l) => l.alert?.operationId === op!.id);
        expect(said.map((l) => l.alert!.kind)).toEqual(["failure_overruled"]);
        expect(said[0]!.msg).toMatch(
          /failed, and was replayed as "failed" to any caller since, but took effect after all: .*\): a "failed" replayed to its callers is overruled: attempt 1's receipt proves the effect happened, after attempt 2 failed/,
        );
        expect(calls).toBe(2);
      },
      scaled(60_000),
    );

    it(
      "a late receipt that names two effects, too large to store: said as two_effects, not only 'needs a person's review'",
      async () => {
        const url = await freshDatabase(dialect);
        const { log, lines } = capturedLog<{ msg: string; alert?: { kind: string; operationId: string } }>();
        const config = parseConfig({ ledger: url, alerts: { log: true }, daemon: { intervalMs: 50 } });
        let calls = 0;
        let open: () => void = () => {};
        const out = new Promise<void>((r) => (open = r));
        // As above, but attempt 1's request is answered with the two effects made under its key (its
        // ids name ch_1 and ch_2), in a receipt too large to store: the row goes to a person, its
        // reason saying callers were told "failed" first, then "attempt 1: two effects: …".
        const charge = defineAction<{ amount: number }, { ids: string[]; pad: string }>({
          type: "charge.late.two",
          capabilities: { dedupe: { retentionMs: 24 * HOUR } },
          execute: async () => {
            if (++calls > 1) throw new Refused("validation: refused");
            await out;
            return { ids: ["ch_1", "ch_2"], pad: "x".repeat(200) };
          },
          classify: (e) =>
            e instanceof Refused ? { kind: "permanent", reason: e.message } : { kind: "ambiguous", reason: String(e) },
          effectId: (r) => r.ids,
        });
        let now = Date.now();
        const ledger = await openTestLedger(url, {
          poolSize: 2,
          clock: () => now,
          leaseMs: 30_000,
          maxResultBytes: 100,
          actions: [...alertActions(config, log), charge],
        });
        cleanups.push(() => ledger.close());
        const tenant = `fo-${Math.random().toString(36).slice(2, 8)}`;
        const input = { tenant, key: ["k"], args: { amount: 100 } };
        const first = ledger.run(charge, input);
        await vi.waitFor(() => expect(calls).toBe(1), { timeout: scaled(10_000) });
        now += HOUR;
        expect(await ledger.run(charge, input)).toMatchObject({ status: "failed", attempt: 2 });
        open();
        await expect(first).rejects.toMatchObject({ name: "PayloadTooLargeError" });
        const [op] = await ledger.admin.list({ tenant });
        expect(op).toMatchObject({ status: "needs_review" });
        expect(op!.reason).toMatch(
          /^a "failed" replayed to its callers is overruled: attempt 1: two effects: the receipt names 2 effects \(ch_1, ch_2\)/,
        );
        const daemon = new Daemon(ledger, config, log, new DaemonMetrics(ledger, 1_000), "d-failure-two");
        await daemon.tick();
        await daemon.tick();
        const said = lines.filter((l) => l.alert?.operationId === op!.id);
        // Before: ["needs_review"], "needs a person's review: …": two effects told, not said as such.
        expect(said.map((l) => l.alert!.kind)).toEqual(["two_effects"]);
        expect(said[0]!.msg).toMatch(
          /took effect twice .*: a "failed" replayed to its callers is overruled: attempt 1: two effects/,
        );
        expect(calls).toBe(2);
      },
      scaled(60_000),
    );

    it(
      "reopened for a person by an abandoned request, that alert delivered: the late receipt is said as failure_overruled after it",
      async () => {
        const url = await freshDatabase(dialect);
        const { log, lines } = capturedLog<{ msg: string; alert?: { kind: string; operationId: string } }>();
        const config = parseConfig({ ledger: url, alerts: { log: true }, daemon: { intervalMs: 50 } });
        let calls = 0;
        let open: () => void = () => {};
        const out = new Promise<void>((r) => (open = r));
        const charge = defineAction<{ amount: number }, { id: string }>({
          type: "charge.late.reopened",
          capabilities: { dedupe: { retentionMs: 24 * HOUR } },
          execute: async () => {
            if (++calls > 1) throw new Refused("validation: refused");
            await out; // attempt 1's request is out, its signal ignored, until released
            return { id: "ch_1" };
          },
          classify: (e) =>
            e instanceof Refused ? { kind: "permanent", reason: e.message } : { kind: "ambiguous", reason: String(e) },
        });
        let now = Date.now();
        const ledger = await openTestLedger(url, {
          poolSize: 2,
          clock: () => now,
          leaseMs: 30_000,
          actions: [...alertActions(config, log), charge],
        });
        cleanups.push(() => ledger.close());
        const tenant = `fo-${Math.random().toString(36).slice(2, 8)}`;
        const input = { tenant, key: ["k"], args: { amount: 100 } };
        const gaveUp = new AbortController();
        const first = ledger.run(charge, { ...input, signal: gaveUp.signal });
        await vi.waitFor(() => expect(calls).toBe(1), { timeout: scaled(10_000) });
        now += HOUR;
        expect(await ledger.run(charge, input)).toMatchObject({ status: "failed", attempt: 2 });
        // Attempt 1's caller gives up; its request is abandoned: it may have committed after the
        // operation failed, so a person decides, and hears so.
        gaveUp.abort(new Error("the agent's turn ended"));
        expect(await first).toMatchObject({ status: "pending_verification", state: "needs_review" });
        const daemon = new Daemon(ledger, config, log, new DaemonMetrics(ledger, 1_000), "d-failure-reopened");
        await daemon.tick();
        const [op] = await ledger.admin.list({ tenant });
        const said = () => lines.filter((l) => l.alert?.operationId === op!.id);
        expect(said().map((l) => l.alert!.kind)).toEqual(["needs_review"]);
        expect(said()[0]!.msg).toMatch(/still in flight when the operation failed, may have committed/);
        open(); // attempt 1's request lands; its late answer is recorded
        await vi.waitFor(
          async () => expect((await ledger.admin.list({ tenant }))[0]).toMatchObject({ status: "succeeded" }),
          { timeout: scaled(30_000) },
        );
        await daemon.tick();
        await daemon.tick();
        // Before: ["needs_review"] only: the person heard "may have committed", never that it did,
        // nor that the callers told "failed" were told wrong.
        expect(said().map((l) => l.alert!.kind)).toEqual(["needs_review", "failure_overruled"]);
        expect(said()[1]!.msg).toMatch(
          /: a "failed" replayed to its callers is overruled: attempt 1's receipt proves the effect happened, after attempt 2 failed/,
        );
        expect(calls).toBe(2);
      },
      scaled(60_000),
    );
  });
}
