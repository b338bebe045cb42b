/**
 * A lookup records the receipt it found; then the request's own answer arrives, late. The two
 * receipts are shaped differently (a lookup reads what the provider keeps, the request's answer
 * says more: HubSpot's `new`, Stripe's request id), so compared as JSON they "differ", and one
 * effect was alerted as two (helper-98's review). An action whose provider gives each effect an
 * id of its own (`effectId`) tells them apart by it: the same id is one effect told twice, another
 * id a second effect. Without one (a Message-ID every copy of an email shares) it stays alerted.
 * A lookup that found several (answered `twice`, alerted so) gives each one's id: an answer of
 * one of them is not alerted again.
 */
import { describe, expect, it } from "vitest";
import { setTimeout as sleep } from "node:timers/promises";
import { sql } from "kysely";
import { defineAction, type Ledger } from "@idem/core";
import { databaseOf } from "@idem/core/testing";
import { DIALECTS, type TestDialect } from "@idem/testkit";
import { ledgers, uniqueTenant } from "./support/ledgers.js";

interface Receipt {
  id: string;
  /** A lookup that read every object under the key (`all`): all of their ids. */
  ids?: string[];
  new?: boolean;
  pad?: string;
}

/**
 * A provider without dedupe whose request commits, then answers late (held until `release`);
 * its lookup reads what it keeps, the first object under the key: `{ id }`, without `new`.
 */
function provider(
  type: string,
  { ids, earlier, large, all }: { ids: boolean; earlier?: string; large?: boolean; all?: boolean },
) {
  const effects: { key: string; id: string }[] = [];
  let open: () => void = () => {};
  const gate = new Promise<void>((r) => (open = r));
  const action = defineAction<{ to: string }, Receipt>({
    type,
    capabilities: { lookup: true },
    // An earlier effect under the key (one the ledger does not know of: a second one) when asked.
    execute: async (_args, op) => {
      if (earlier && effects.length === 0) effects.push({ key: op.key, id: earlier });
      const id = `obj_${effects.length + 1}`;
      effects.push({ key: op.key, id });
      await gate;
      return { id, new: true, ...(large && { pad: "x".repeat(500) }) };
    },
    reconcile: async (_args, op) => {
      const hits = effects.filter((e) => e.key === op.key);
      const hit = hits[0];
      if (!hit) return { found: false as const, proof: "absent" as const, reason: "not at the provider" };
      // `all`: every object under the key, and more than one is said (`twice`).
      if (all && hits.length > 1)
        return { found: true as const, receipt: { id: hit.id, ids: hits.map((h) => h.id) }, twice: "two objects" };
      return { found: true as const, receipt: { id: hit.id } };
    },
    // A finding of several objects gives each one's id.
    ...(ids && { effectId: (r: Receipt) => (r.ids && r.ids.length > 1 ? r.ids : r.id) }),
  });
  return { action, effects, release: () => open() };
}

async function until(cond: () => boolean, ms = 10_000): Promise<void> {
  const end = Date.now() + ms;
  while (!cond()) {
    if (Date.now() > end) throw new Error("condition not met in time");
    await sleep(5);
  }
}

/**
 * Another writer touching the tenant's settled row after each write to it, until an alert is on
 * it: every write conditioned on the row as read (`unchangedSince`) then matches nothing, as when
 * other late answers keep noting themselves on it.
 */
async function churn(ledger: Ledger, dialect: TestDialect, tenant: string): Promise<void> {
  const db = databaseOf(ledger);
  const name = `churn_${tenant.replace(/\W/g, "_")}`;
  if (dialect === "sqlite") {
    await sql
      .raw(
        `CREATE TRIGGER ${name} AFTER UPDATE ON idem_operations WHEN OLD.status = 'succeeded' AND NEW.status = 'succeeded' AND NEW.alert_pending = 0 AND NEW.tenant_id = '${tenant}' BEGIN UPDATE idem_operations SET updated_at = updated_at + 1 WHERE id = NEW.id; END`,
      )
      .execute(db);
    return;
  }
  await sql
    .raw(
      `CREATE FUNCTION ${name}() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN IF pg_trigger_depth() = 1 THEN UPDATE idem_operations SET updated_at = updated_at + 1 WHERE id = NEW.id; END IF; RETURN NULL; END $$`,
    )
    .execute(db);
  await sql
    .raw(
      `CREATE TRIGGER ${name} AFTER UPDATE ON idem_operations FOR EACH ROW WHEN (OLD.status = 'succeeded' AND NEW.status = 'succeeded' AND NEW.alert_pending = 0 AND NEW.tenant_id = '${tenant}') EXECUTE FUNCTION ${name}()`,
    )
    .execute(db);
}

for (const dialect of DIALECTS) {
  describe(`a lookup's receipt, then the request's own late answer, on ${dialect}`, () => {
    const db = ledgers(dialect);

    // `large`: the request's own receipt is too large to store (the lookup's is not).
    const cases = [
      { name: "the same id: one effect, not alerted", ids: true, alerted: false },
      {
        name: "the same id, its own receipt too large to store: one effect, not alerted",
        ids: true,
        large: true,
        alerted: false,
      },
      { name: "no effect ids (a shared Message-ID): alerted, a person checks", ids: false, alerted: true },
      { name: "no effect ids, its own receipt too large: alerted", ids: false, large: true, alerted: true },
      { name: "another id: a second effect, alerted", ids: true, earlier: "obj_0", alerted: true },
      {
        name: "another id, its own receipt too large: a second effect, alerted",
        ids: true,
        earlier: "obj_0",
        large: true,
        alerted: true,
      },
      // The lookup read both objects and said so (`twice`): alerted by it; our answer is one of them.
      {
        name: "the lookup found two (alerted), ours among them: not alerted again",
        ids: true,
        earlier: "obj_0",
        all: true,
        alerted: true,
        lateAlerted: false,
      },
      {
        name: "the lookup found two (alerted), ours among them, too large to store: not alerted again",
        ids: true,
        earlier: "obj_0",
        all: true,
        large: true,
        alerted: true,
        lateAlerted: false,
      },
    ];
    for (const c of cases)
      it(c.name, async () => {
        let now = Date.now();
        const p = provider(`late.ids.${c.ids}.${c.earlier ?? "none"}.${c.large === true}.${"all" in c}`, c);
        const ledger: Ledger = await db.open({
          clock: () => now,
          leaseMs: 30_000,
          maxResultBytes: 200,
          actions: [p.action],
        });
        const tenant = uniqueTenant();
        const first = ledger.run(p.action, { tenant, key: ["k"], args: { to: "x" } }).catch((e: unknown) => e);
        await until(() => p.effects.length > 0);
        now += 31_000; // attempt 1's request committed; its answer is still out when its lease runs out
        const [op] = await ledger.admin.list({ tenant });
        const found = await ledger.daemon.settle({ tenant, id: op!.id, actor: "daemon" });
        expect(found).toMatchObject({ status: "succeeded", receipt: { id: c.earlier ?? "obj_1" } });
        const seen = "all" in c ? { ids: [c.earlier, "obj_2"] } : {};
        p.release();
        const out = await first;
        const after = await ledger.get({ tenant, id: op!.id });
        const story = `first: ${JSON.stringify(out)}; events: ${after.events.map((e) => `${e.from}>${e.to}@${e.attempt} ${e.reason}`).join(" | ")}`;
        // The caller is told its request took effect: its own receipt, or that it was too large.
        if (c.large) expect((out as Error).name, story).toBe("PayloadTooLargeError");
        else expect(out, story).toMatchObject({ status: "succeeded", receipt: { id: c.earlier ? "obj_2" : "obj_1" } });
        expect(
          {
            status: after.operation.status,
            receipt: after.operation.result,
            alerted: (await ledger.daemon.alertsDue({ limit: 100 })).some((a) => a.id === op!.id),
            twoEffects: /two effects/.test(after.operation.reason ?? ""),
            // Said of our late answer (the request's own, or its proof), not of the lookup's finding.
            lateAlerted: after.events.some((e) => /^two effects: attempt 1's request/.test(e.reason ?? "")),
          },
          story,
        ).toEqual({
          status: "succeeded",
          // The receipt every other caller was given stays the one replayed.
          receipt: { id: c.earlier ?? "obj_1", ...seen },
          alerted: c.alerted,
          twoEffects: c.alerted,
          lateAlerted: "lateAlerted" in c ? c.lateAlerted : c.alerted,
        });
      });

    // The lookup's receipt names both (as committed), only one (its `twice` alone says the
    // second: helper-111's A), or is too large to store (B). Each alerted once, the finding said.
    for (const v of [
      { name: "naming both", shape: "both" },
      { name: "naming one, its twice telling the other", shape: "one" },
      { name: "too large to store", shape: "large" },
    ] as const)
      it(`a lookup that found two (its receipt ${v.name}), its completion fenced by the request's late answer: alerted all the same`, async () => {
        let now = Date.now();
        const effects: string[] = [];
        let release: () => void = () => {};
        const gate = new Promise<void>((r) => (release = r));
        let first: Promise<unknown> = Promise.resolve();
        const action = defineAction<{ to: string }, Receipt>({
          type: "late.fenced.twice",
          capabilities: { lookup: true },
          // An earlier object under the key (one the ledger does not know of), then this request's.
          execute: async () => {
            effects.push("obj_0", "obj_1");
            await gate;
            return { id: "obj_1", new: true };
          },
          // The lookup reads both; meanwhile the request's answer arrives and is recorded first.
          reconcile: async () => {
            release();
            await first;
            const receipt =
              v.shape === "one"
                ? { id: "obj_1" }
                : { id: "obj_0", ids: [...effects], ...(v.shape === "large" && { pad: "x".repeat(500) }) };
            return { found: true as const, receipt, twice: "two objects" };
          },
          effectId: (r: Receipt) => (r.ids && r.ids.length > 1 ? r.ids : r.id),
        });
        const ledger: Ledger = await db.open({
          clock: () => now,
          leaseMs: 30_000,
          maxResultBytes: 200,
          actions: [action],
        });
        const tenant = uniqueTenant();
        first = ledger.run(action, { tenant, key: ["k"], args: { to: "x" } }).catch((e: unknown) => e);
        await until(() => effects.length > 0);
        now += 31_000; // attempt 1's request committed; its answer is still out when its lease runs out
        const [op] = await ledger.admin.list({ tenant });
        const settled = await ledger.daemon
          .settle({ tenant, id: op!.id, actor: "daemon" })
          .catch((e: unknown) => (e as Error).name);
        // Before: the daemon's settlement replayed the row (too large: PayloadTooLargeError), no alert.
        expect(settled).toEqual(
          v.shape === "large" ? "PayloadTooLargeError" : expect.objectContaining({ status: "succeeded" }),
        );
        const after = await ledger.get({ tenant, id: op!.id });
        const story = `settled: ${JSON.stringify(settled)}; events: ${after.events.map((e) => `${e.from}>${e.to}@${e.attempt} ${e.reason}`).join(" | ")}`;
        expect(await first, story).toMatchObject({ status: "succeeded", receipt: { id: "obj_1" } });
        expect(
          {
            status: after.operation.status,
            receipt: after.operation.result,
            alerted: (await ledger.daemon.alertsDue({ limit: 100 })).some((a) => a.id === op!.id),
            reason: after.operation.reason,
            said: after.events.filter((e) => /two effects/.test(e.reason ?? "")).length,
          },
          story,
        ).toEqual({
          status: "succeeded",
          receipt: { id: "obj_1", new: true }, // the first recorded, replayed to every other caller
          alerted: true,
          reason:
            v.shape === "large"
              ? expect.stringMatching(
                  /^two effects: the lookup found the effect more than once \(two objects\); a person must check the provider; its receipt not storable \(.*\), and the operation was settled by another receipt$/,
                )
              : "two effects: the lookup found the effect more than once (two objects); a person must check the provider; attempt 2 found this after the operation was settled by another receipt",
          said: 1,
        });
      });

    // helper-111's C: two lookups of one row both find it twice (no effectId). Attempt 2's lookup
    // outlasts its lease, attempt 3 takes over, finds it twice and records it (alerted); attempt
    // 2's answer then comes back fenced: the same finding. One situation, one alert.
    it("two lookups that both found it twice, the second fenced: one 'two effects' event", async () => {
      let now = Date.now();
      let lookups = 0;
      let open: () => void = () => {};
      const gate = new Promise<void>((r) => (open = r));
      const action = defineAction<{ to: string }, Receipt>({
        type: "fenced.two.lookups",
        capabilities: { lookup: true },
        execute: async () => {
          throw new Error("timeout after send");
        },
        classify: () => ({ kind: "ambiguous", reason: "timeout after send" }),
        reconcile: async () => {
          lookups++;
          if (lookups === 1) await gate; // attempt 2's lookup is slow
          return { found: true as const, receipt: { id: "obj_1" }, twice: "obj_1 and obj_2 both carry the key" };
        },
      });
      const ledger: Ledger = await db.open({ clock: () => now, leaseMs: 30_000, actions: [action] });
      const tenant = uniqueTenant();
      // One attempt: by this clock, standing still, no retry is ever due, and the call would wait
      // out its whole budget (30 s) before answering unknown.
      const out = await ledger.run(action, { tenant, key: ["k"], args: { to: "x" }, budget: { attempts: 1 } });
      expect(out).toMatchObject({ status: "pending_verification", state: "unknown" });
      const id = out.operationId;
      now += 3_600_000; // due
      const slow = ledger.daemon.settle({ tenant, id, actor: "daemon-a" }).catch((e: unknown) => e);
      await until(() => lookups === 1);
      now += 31_000; // attempt 2's lease ran out (by the ledger's clock) while it looked
      const fast = await ledger.daemon.settle({ tenant, id, actor: "daemon-b" });
      open();
      const late = await slow;
      const row = await ledger.get({ tenant, id });
      const story = `fast: ${JSON.stringify(fast)}; slow: ${JSON.stringify(late)}; events: ${row.events.map((e) => `${e.from}>${e.to}@${e.attempt} [${e.actor}] ${e.reason}`).join(" | ")}`;
      expect(fast, story).toMatchObject({ status: "succeeded" });
      expect(row.events.filter((e) => /^two effects/.test(e.reason ?? "")).length, story).toBe(1);
      expect((await ledger.daemon.alertsDue({ limit: 100 })).some((a) => a.id === id)).toBe(true);
    });
  });

  // Each look's alert matched nothing (the row changed after it was read), and on the fifth the
  // fenced attempt gave up: the second effect was never alerted (the noticed list of stop 39).
  describe(`two effects found while the settled row keeps changing, on ${dialect}`, () => {
    const db = ledgers(dialect);
    for (const v of [
      { name: "the request's late answer, another id", several: false },
      { name: "a lookup that found two", several: true },
    ])
      it(`${v.name}: alerted on the last look`, async () => {
        let now = Date.now();
        const effects: string[] = [];
        let release: () => void = () => {};
        const gate = new Promise<void>((r) => (release = r));
        let first: Promise<unknown> = Promise.resolve();
        let churning: Promise<void> = Promise.resolve();
        const action = defineAction<{ to: string }, Receipt>({
          type: `churn.${v.several}`,
          capabilities: { lookup: true },
          execute: async () => {
            effects.push("obj_0", "obj_1");
            await gate;
            return { id: "obj_1", new: true };
          },
          reconcile: async () => {
            if (!v.several) return { found: true as const, receipt: { id: "obj_0" } };
            // The request's answer is recorded first; the lookup's finding of both comes after.
            release();
            await first;
            await churning;
            return { found: true as const, receipt: { id: "obj_0", ids: [...effects] }, twice: "two objects" };
          },
          effectId: (r: Receipt) => (r.ids && r.ids.length > 1 ? r.ids : r.id),
        });
        const ledger: Ledger = await db.open({ clock: () => now, leaseMs: 30_000, actions: [action] });
        const tenant = uniqueTenant();
        first = ledger.run(action, { tenant, key: ["k"], args: { to: "x" } }).catch((e: unknown) => e);
        await until(() => effects.length > 0);
        now += 31_000; // attempt 1's request committed; its answer is still out when its lease runs out
        const [op] = await ledger.admin.list({ tenant });
        if (v.several) churning = first.then(() => churn(ledger, dialect, tenant));
        const settled = await ledger.daemon.settle({ tenant, id: op!.id, actor: "daemon" });
        if (!v.several) {
          // The lookup recorded obj_0; the request's late answer (obj_1) is a second effect.
          await churn(ledger, dialect, tenant);
          release();
        }
        const out = await first;
        const after = await ledger.get({ tenant, id: op!.id });
        const story = `settled: ${JSON.stringify(settled)}; first: ${JSON.stringify(out)}; events: ${after.events.map((e) => `${e.from}>${e.to}@${e.attempt} ${e.reason}`).join(" | ")}`;
        expect(out, story).toMatchObject({ status: "succeeded", receipt: { id: "obj_1" } });
        // Five looks at the settled row, each noted, each alert write matching nothing but the last.
        expect(
          after.events.filter((e) => e.from === "succeeded" && /^fenced: /.test(e.reason ?? "")).length,
          story,
        ).toBe(5);
        expect(
          {
            alerted: (await ledger.daemon.alertsDue({ limit: 100 })).some((a) => a.id === op!.id),
            reason: after.operation.reason,
          },
          story,
        ).toEqual({ alerted: true, reason: expect.stringMatching(/^two effects: /) });
      });
  });
}
