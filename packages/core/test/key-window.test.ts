/**
 * A provider keeps our key for a time from the first request that carried it (Stripe: 24 h), not
 * from the operation's creation. An operation that waited before its first request (a rate limit
 * and a spent budget, a person's retry) counts its key window from that request: a replay with
 * the key while the provider holds it, a lookup or a person once it may have forgotten it. Counting
 * from an earlier time is the safe mistake (the key thought forgotten early), never from a later
 * one (thought held when it is not: a replay makes a second effect).
 */
import { describe, expect, it } from "vitest";
import { setTimeout as sleep } from "node:timers/promises";
import { sql } from "kysely";
import { defineAction, type Ledger, type OperationEvent } from "@idem/core";
import { databaseOf } from "@idem/core/testing";
import { DIALECTS } from "@idem/testkit";
import { ledgers, uniqueTenant } from "./support/ledgers.js";
import { TestProvider } from "./support/provider.js";

const HOUR = 3_600_000;
const DEDUPE = { retentionMs: 24 * HOUR };

const story = (events: readonly OperationEvent[]) =>
  events.map((e) => `${e.from}>${e.to}@${e.attempt} ${e.reason}`).join(" | ");

class Limited extends Error {}
class Lost extends Error {}

async function until(cond: () => boolean, ms = 20_000): Promise<void> {
  const end = Date.now() + ms;
  while (!cond()) {
    if (Date.now() > end) throw new Error("condition not met in time");
    await sleep(5);
  }
}

/** The row's recorded first send, as the database holds it. */
async function firstExecutionAt(ledger: Ledger, id: string): Promise<number | null> {
  const { rows } = await sql<{ at: number | string | null }>`
    select first_execution_at as at from idem_operations where id = ${id}`.execute(databaseOf(ledger));
  return rows[0]?.at == null ? null : Number(rows[0].at);
}

for (const dialect of DIALECTS) {
  describe(`the key window counts from the key's first request (${dialect})`, () => {
    const db = ledgers(dialect);

    it("first sent a day after it was created (a rate limit before), its answer lost: replayed with the same key, not a person's question", async () => {
      let now = Date.now();
      const p = new TestProvider();
      const post = p.action("kw.post", { dedupe: DEDUPE });
      const ledger = await db.open({ clock: () => now, actions: [post], budget: { attempts: 1 } });
      const tenant = uniqueTenant();
      // Rate limited before anything ran: the provider kept nothing under the key.
      p.faults.push({ when: "before", cls: { kind: "rate_limited", reason: "429", retryAfterMs: 1_000 } });
      const first = await ledger.run(post, { tenant, key: ["k"], args: { to: "a" } });
      expect(first).toMatchObject({ status: "pending_verification", state: "pending" });

      now += 25 * HOUR; // nobody ran it for a day
      p.faults.push({ when: "after", cls: { kind: "ambiguous", reason: "socket closed after the body" } });
      const out = await ledger.run(post, { tenant, key: ["k"], args: { to: "a" } });
      const { events } = await ledger.get({ tenant, id: out.operationId });
      // Before: needs_review, "outcome unknown: key retention passed and the provider cannot be queried".
      expect(out, story(events)).toMatchObject({ status: "pending_verification", state: "unknown" });
      expect(p.effects).toHaveLength(1);

      const settled = await ledger.daemon.settle({ tenant, id: out.operationId, actor: "daemon" });
      expect(settled).toMatchObject({ status: "succeeded", receipt: { id: "obj_1", replayed: true } });
      expect(p.effects).toHaveLength(1);
    });

    it("the action reads when its key was first sent (op.firstSentAt), and a lookup past the replay counts from it", async () => {
      let now = Date.now();
      const created = now;
      const seen: { in: string; op: { createdAt: number; firstSentAt: number | undefined; now: number } }[] = [];
      const effects: string[] = [];
      let calls = 0;
      const action = defineAction<{ to: string }, { id: string }>({
        type: "kw.lookup",
        capabilities: { dedupe: DEDUPE, lookup: true },
        execute: async (_a, op) => {
          seen.push({ in: "execute", op: { createdAt: op.createdAt, firstSentAt: op.firstSentAt, now: op.now } });
          calls += 1;
          if (calls === 1) throw new Limited("429");
          effects.push(op.key);
          // The provider saved an error under the key: a replay would only repeat it.
          throw new Lost("500 saved under the key");
        },
        classify: (e) =>
          e instanceof Limited
            ? { kind: "rate_limited", reason: "429", retryAfterMs: 1_000 }
            : { kind: "ambiguous", reason: String(e), replayable: false },
        reconcile: async (_a, op) => {
          seen.push({ in: "reconcile", op: { createdAt: op.createdAt, firstSentAt: op.firstSentAt, now: op.now } });
          return effects.includes(op.key)
            ? { found: true, receipt: { id: "obj_1" } }
            : { found: false, proof: "absent", reason: "not at the provider" };
        },
      });
      const ledger = await db.open({ clock: () => now, actions: [action], budget: { attempts: 1 } });
      const tenant = uniqueTenant();
      expect(await ledger.run(action, { tenant, key: ["k"], args: { to: "a" } })).toMatchObject({ state: "pending" });
      now += 25 * HOUR;
      const sent = now;
      const out = await ledger.run(action, { tenant, key: ["k"], args: { to: "a" } });
      expect(out).toMatchObject({ status: "pending_verification", state: "unknown" });
      now += 60_000;
      expect(await ledger.daemon.settle({ tenant, id: out.operationId })).toMatchObject({
        status: "succeeded",
        receipt: { id: "obj_1" },
      });
      // Before: firstSentAt undefined everywhere.
      expect(seen).toEqual([
        { in: "execute", op: { createdAt: created, firstSentAt: created, now: created } },
        { in: "execute", op: { createdAt: created, firstSentAt: sent, now: sent } },
        { in: "reconcile", op: { createdAt: created, firstSentAt: sent, now: sent + 60_000 } },
      ]);
    });

    it("a row from before the column counts from its creation: the earlier time, never a later one", async () => {
      let now = Date.now();
      const p = new TestProvider();
      const post = p.action("kw.old", { dedupe: DEDUPE });
      const ledger = await db.open({ clock: () => now, actions: [post], budget: { attempts: 1 } });
      const tenant = uniqueTenant();
      p.faults.push({ when: "before", cls: { kind: "rate_limited", reason: "429", retryAfterMs: 1_000 } });
      await ledger.run(post, { tenant, key: ["late"], args: { to: "a" } });
      now += 25 * HOUR;
      p.faults.push({ when: "after", cls: { kind: "ambiguous", reason: "socket closed after the body" } });
      const late = await ledger.run(post, { tenant, key: ["late"], args: { to: "a" } });
      expect(late).toMatchObject({ state: "unknown" });
      expect(await firstExecutionAt(ledger, late.operationId)).toBe(now);
      // As a row written before migration 0009: no first send recorded.
      await sql`update idem_operations set first_execution_at = null where id = ${late.operationId}`.execute(
        databaseOf(ledger),
      );
      const reviewed = await ledger.daemon.settle({ tenant, id: late.operationId });
      expect(reviewed).toMatchObject({
        state: "needs_review",
        reason: expect.stringMatching(/key retention passed and the provider cannot be queried/),
      });

      // An old row replayed inside its window (from creation) keeps counting from creation.
      const seen: (number | undefined)[] = [];
      const probe = defineAction<{ to: string }, { id: string }>({
        type: "kw.old.replay",
        capabilities: { dedupe: DEDUPE },
        execute: async (_a, op) => {
          seen.push(op.firstSentAt);
          if (seen.length === 1) throw new Lost("socket closed after the body");
          return { id: "obj_1" };
        },
      });
      const replaying = await db.open({ clock: () => now, actions: [probe], budget: { attempts: 1 } });
      const created = now;
      const out = await replaying.run(probe, { tenant, key: ["old"], args: { to: "a" } });
      expect(out).toMatchObject({ state: "unknown" });
      await sql`update idem_operations set first_execution_at = null where id = ${out.operationId}`.execute(
        databaseOf(replaying),
      );
      now += HOUR;
      expect(await replaying.daemon.settle({ tenant, id: out.operationId })).toMatchObject({ status: "succeeded" });
      expect(seen).toEqual([created, created]);
      expect(await firstExecutionAt(replaying, out.operationId)).toBe(created);
    });

    it("a request deduped onto the first one inside the window counted from the first send: no 'two effects' alert", async () => {
      // Created, rate limited, and first sent a day later (attempt 2, its request slow). Its lease
      // runs out; another caller replays with the key and the provider commits that one; then
      // attempt 2's request reaches the provider, which answers it with the first effect, marked
      // as a replay. Both requests were inside the window from the first send: one effect.
      let now = Date.now();
      const effects: { key: string; id: string }[] = [];
      let calls = 0;
      let open!: () => void;
      const held = new Promise<void>((r) => (open = r));
      const action = defineAction<{ to: string }, { id: string; replayed?: boolean }>({
        type: "kw.deduped",
        capabilities: { dedupe: DEDUPE, lookup: true },
        execute: async (_a, op) => {
          calls += 1;
          if (calls === 1) throw new Limited("429");
          if (calls === 2) await held; // attempt 2's request is out; it reaches the provider when released
          const earlier = effects.find((e) => e.key === op.key);
          if (earlier) return { id: earlier.id, replayed: true };
          effects.push({ key: op.key, id: `obj_${effects.length + 1}` });
          return { id: effects.at(-1)!.id };
        },
        classify: (e) =>
          e instanceof Limited
            ? { kind: "rate_limited", reason: "429", retryAfterMs: 1_000 }
            : { kind: "ambiguous", reason: String(e) },
        reconcile: async (_a, op) => {
          const hit = effects.find((e) => e.key === op.key);
          return hit
            ? { found: true, receipt: { id: hit.id } }
            : { found: false, proof: "absent", reason: "not at the provider" };
        },
      });
      const ledger = await db.open({ clock: () => now, leaseMs: 30_000, actions: [action], budget: { attempts: 1 } });
      const tenant = uniqueTenant();
      expect(await ledger.run(action, { tenant, key: ["k"], args: { to: "a" } })).toMatchObject({ state: "pending" });
      now += 25 * HOUR;
      const second = ledger.run(action, { tenant, key: ["k"], args: { to: "a" } });
      await until(() => calls === 2);
      now += 31_000;
      const third = await ledger.run(action, { tenant, key: ["k"], args: { to: "a" } });
      expect(third).toMatchObject({ status: "succeeded", receipt: { id: "obj_1" } });
      open();
      expect(await second).toMatchObject({ status: "succeeded", receipt: { id: "obj_1" } });
      const { operation, events } = await ledger.get({ tenant, id: third.operationId });
      // Before: "two effects: attempt 2's request took effect too, and its receipt differs …", alerted.
      expect(operation.reason, story(events)).not.toMatch(/two effects/);
      expect(
        events.filter((e) => e.reason?.startsWith("two effects")),
        story(events),
      ).toEqual([]);
      expect(effects).toHaveLength(1);
    });

    it("an earlier attempt's late end brings the count back to its first send, though the operation was run again since", async () => {
      // Attempt 1's request is out past its lease; a day later a lookup finds nothing (pending),
      // attempt 3 runs again and its answer is lost. Then attempt 1's request ends without an
      // answer: it may have taken effect under a key sent a day before attempt 3's. A replay until
      // a day after attempt 3 could land after the provider forgot attempt 1's key: the count
      // goes back to attempt 1's first send, and the effect is looked up.
      let now = Date.now();
      const created = now;
      const seen: (number | undefined)[] = [];
      let calls = 0;
      let open!: () => void;
      const held = new Promise<void>((r) => (open = r));
      const action = defineAction<{ to: string }, { id: string }>({
        type: "kw.late",
        capabilities: { dedupe: DEDUPE, lookup: true },
        execute: async () => {
          calls += 1;
          if (calls === 1) await held;
          throw new Lost("socket closed after the body");
        },
        classify: (e) => ({ kind: "ambiguous", reason: String(e) }),
        reconcile: async (_a, op) => {
          seen.push(op.firstSentAt);
          return { found: false, proof: "absent", reason: "not at the provider" };
        },
      });
      const ledger = await db.open({ clock: () => now, leaseMs: 30_000, actions: [action], budget: { attempts: 1 } });
      const tenant = uniqueTenant();
      const first = ledger.run(action, { tenant, key: ["k"], args: { to: "a" } });
      await until(() => calls === 1);
      now += 24 * HOUR;
      const [op] = await ledger.admin.list({ tenant });
      // The lookup finds nothing (pending); attempt 3 runs and its answer is lost.
      const third = await ledger.daemon.settle({ tenant, id: op!.id });
      expect(third).toMatchObject({ state: "unknown", attempt: 3 });
      const rerun = now;
      expect(await firstExecutionAt(ledger, op!.id)).toBe(rerun);
      open();
      expect(await first).toMatchObject({ status: "pending_verification" });
      expect(await firstExecutionAt(ledger, op!.id)).toBe(created);
      now += 60_000;
      await ledger.daemon.settle({ tenant, id: op!.id });
      const { events } = await ledger.get({ tenant, id: op!.id });
      // Looked up (counted from attempt 1's send), not replayed (from attempt 3's).
      expect(seen, story(events)).toEqual([created, created]);
    });
  });
}
