/**
 * An effect that happened but not in full (a sent mail whose Sent copy was not filed): the
 * action's `attention` says what a person must hear. The operation succeeds and its receipt is
 * replayed unchanged, and the row is alerted once, the attention as its reason. Failed first: no
 * alert (the email README said "there is no alert for it yet").
 */
import { describe, expect, it } from "vitest";
import { setTimeout as sleep } from "node:timers/promises";
import { defineAction, type Ledger } from "@idem/core";
import { DIALECTS } from "@idem/testkit";
import { ledgers, uniqueTenant } from "./support/ledgers.js";

interface Receipt {
  readonly id: string;
  readonly ids?: readonly string[];
  readonly partly?: string;
}

/** A provider that makes each effect once, looked up by key; `hold` keeps the next request out until released. */
function provider(type: string) {
  const effects: { key: string; id: string }[] = [];
  let calls = 0;
  let gate: Promise<void> | undefined;
  let open: () => void = () => {};
  let answer: (id: string) => Receipt = (id) => ({ id, partly: "the copy was not filed" });
  const action = defineAction<{ to: string }, Receipt>({
    type,
    capabilities: { lookup: true },
    execute: async (_args, op) => {
      calls += 1;
      const g = gate;
      gate = undefined;
      if (g) await g;
      const id = `obj_${effects.length + 1}`;
      effects.push({ key: op.key, id });
      return answer(id);
    },
    reconcile: async (_args, op) => {
      const hit = effects.find((e) => e.key === op.key);
      return hit
        ? { found: true as const, receipt: { id: hit.id } }
        : { found: false as const, proof: "absent" as const, reason: "not at the provider" };
    },
    effectId: (r) => (r.ids && r.ids.length > 1 ? r.ids : r.id),
    attention: (r) => (r.partly ? `done, but ${r.partly}` : undefined),
  });
  return {
    action,
    effects,
    calls: () => calls,
    hold: () => {
      gate = new Promise<void>((r) => (open = r));
    },
    release: () => open(),
    answer: (f: (id: string) => Receipt) => {
      answer = f;
    },
  };
}

async function until(cond: () => boolean, ms = 10_000): Promise<void> {
  const end = Date.now() + ms;
  while (!cond()) {
    if (Date.now() > end) throw new Error("condition not met in time");
    await sleep(5);
  }
}

const due = async (ledger: Ledger, tenant: string) =>
  (await ledger.daemon.alertsDue({ limit: 1_000 })).filter((a) => a.tenant === tenant);

for (const dialect of DIALECTS) {
  describe(`an effect that needs a person's attention on ${dialect}`, () => {
    const db = ledgers(dialect);

    it("succeeds with its receipt as given, alerted once with the attention as its reason; a replay does not alert again", async () => {
      const p = provider("attention.run");
      const ledger = await db.open({ actions: [p.action] });
      const tenant = uniqueTenant();
      const out = await ledger.run(p.action, { tenant, key: ["a"], args: { to: "x" } });
      expect(out).toEqual({
        status: "succeeded",
        receipt: { id: "obj_1", partly: "the copy was not filed" },
        replayed: false,
        operationId: expect.any(String),
        attempt: 1,
      });
      const alerts = await due(ledger, tenant);
      expect(alerts).toMatchObject([
        {
          id: out.operationId,
          status: "succeeded",
          reason: "done, but the copy was not filed",
          attention: "done, but the copy was not filed",
        },
      ]);
      await ledger.daemon.ackAlert(alerts[0]!);
      const again = await ledger.run(p.action, { tenant, key: ["a"], args: { to: "x" } });
      expect(again).toMatchObject({
        status: "succeeded",
        replayed: true,
        receipt: out.status === "succeeded" && out.receipt,
      });
      expect(await due(ledger, tenant)).toEqual([]);
      expect(p.effects).toHaveLength(1);
    });

    it("a receipt that says nothing needs attention is not alerted", async () => {
      const p = provider("attention.none");
      p.answer((id) => ({ id }));
      const ledger = await db.open({ actions: [p.action] });
      const tenant = uniqueTenant();
      const out = await ledger.run(p.action, { tenant, key: ["a"], args: { to: "x" } });
      expect(out).toMatchObject({ status: "succeeded", receipt: { id: "obj_1" } });
      expect(await due(ledger, tenant)).toEqual([]);
      expect((await ledger.get({ tenant, id: out.operationId })).operation.attention).toBeUndefined();
    });

    it("a late receipt that settles a row proven absent meanwhile (through the fence) is alerted too", async () => {
      let now = Date.now();
      const p = provider("attention.late");
      const ledger = await db.open({ clock: () => now, leaseMs: 30_000, actions: [p.action], budget: { attempts: 1 } });
      const tenant = uniqueTenant();
      p.hold();
      const first = ledger.run(p.action, { tenant, key: ["late"], args: { to: "x" } });
      await until(() => p.calls() === 1);
      now += 31_000; // attempt 1's lease ran out by the database clock; its request is still out
      const [op] = await ledger.admin.list({ tenant });
      const stop = new AbortController();
      stop.abort(); // a stopping daemon: it looks up, sends nothing
      expect(await ledger.daemon.settle({ tenant, id: op!.id, actor: "daemon", stop: stop.signal })).toMatchObject({
        state: "pending",
      });
      p.release();
      expect(await first).toMatchObject({ status: "succeeded", receipt: { partly: "the copy was not filed" } });
      const alerts = await due(ledger, tenant);
      expect(alerts).toMatchObject([
        {
          id: op!.id,
          status: "succeeded",
          attempt: 2,
          reason: expect.stringMatching(/^done, but the copy was not filed; attempt 1's receipt proves the effect/),
          attention: "done, but the copy was not filed",
        },
      ]);
      expect(p.effects).toHaveLength(1);
    });

    it("a receipt that names two effects is alerted as two effects first, the attention said after", async () => {
      const p = provider("attention.twice");
      p.answer((id) => ({ id, ids: [id, "obj_0"], partly: "the copy was not filed" }));
      const ledger = await db.open({ actions: [p.action] });
      const tenant = uniqueTenant();
      const out = await ledger.run(p.action, { tenant, key: ["a"], args: { to: "x" } });
      expect(out).toMatchObject({ status: "succeeded" });
      expect(await due(ledger, tenant)).toMatchObject([
        {
          reason: expect.stringMatching(/^two effects: .*; done, but the copy was not filed$/),
          attention: "done, but the copy was not filed",
        },
      ]);
    });

    it("a person's resolve with a receipt that needs attention is not alerted (they know)", async () => {
      const neither = defineAction<{ to: string }, Receipt>({
        type: "attention.review",
        capabilities: {},
        execute: async () => {
          throw new Error("socket hang up");
        },
        attention: (r) => (r.partly ? `done, but ${r.partly}` : undefined),
        receipt: { "~standard": { version: 1, vendor: "test", validate: (value) => ({ value: value as Receipt }) } },
      });
      const ledger = await db.open({ actions: [neither] });
      const tenant = uniqueTenant();
      const out = await ledger.run(neither, { tenant, key: ["a"], args: { to: "x" } });
      expect(out).toMatchObject({ status: "pending_verification", state: "needs_review" });
      for (const a of await due(ledger, tenant)) await ledger.daemon.ackAlert(a);
      await ledger.admin.resolve({
        tenant,
        id: out.operationId,
        outcome: "succeeded",
        actor: "ops",
        reason: "found it",
        receipt: { id: "obj_9", partly: "the copy was not filed" },
      });
      expect(await due(ledger, tenant)).toEqual([]);
    });
  });
}
