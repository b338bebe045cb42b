/**
 * The interleaving of interleavings.test.ts's seed 154, without its schedule: attempt 1's request is
 * out past its lease; attempt 2 replays it under the same key (the provider dedupes), reaches the
 * provider first and is refused for good, so the operation fails and its callers are told "failed"
 * (a replay too); then attempt 1's request commits and its receipt arrives. The receipt proves
 * the effect: the operation succeeds with it, one effect at the provider, and a person is alerted
 * that a "failed" its callers were told is overruled: a caller (a model) may have acted on it,
 * sending the same work again under another key. Before: settled silently (helper-226's finding).
 * A person's "failed" overruled is its own alert (verdict-overruled-late.test.ts). The same when
 * attempt 1's receipt is too large to store: the row goes to a person with the proof, its reason
 * saying callers were told "failed", and a later receipt that settles it is alerted as overruled
 * (before: a plain needs_review, then a plain success). When what lands after it is a second
 * effect, or a receipt told two effects, those words come first (the daemon's `two_effects`) and
 * the "failed" overruled after them (before: settled as one effect, or the callers unsaid). Both
 * databases.
 */
import { describe, expect, it } from "vitest";
import { sql } from "kysely";
import { defineAction, isFailureOverruled, twoEffectsTold, type Ledger } from "@idem/core";
import { databaseOf } from "@idem/core/testing";
import { DIALECTS } from "@idem/testkit";
import { ledgers, uniqueTenant } from "./support/ledgers.js";

const HOUR = 3_600_000;
/** How the reason starts: the daemon tells its alert (`failure_overruled`) by it. */
const FAILURE_OVERRULED = 'a "failed" replayed to its callers is overruled: ';
/** What a person hears of the callers told "failed" (fence.ts CALLER_TOLD_FAILED). */
const CALLER_TOLD_FAILED =
  'a caller told "failed" may have acted on it (the same work sent again under another key, say)';

class Refused extends Error {}

/**
 * A provider that dedupes on our key: the first request holds until released, then commits (or is
 * answered the key's effect); the second is refused at once (validation), having found no effect.
 */
function provider(type: string, receiptOf: (id: string) => { id: string } = (id) => ({ id })) {
  const effects: { key: string; id: string }[] = [];
  let out!: () => void;
  const sent = new Promise<void>((r) => (out = r));
  let release!: () => void;
  const gate = new Promise<void>((r) => (release = r));
  let calls = 0;
  const action = defineAction<{ to: string }, { id: string }>({
    type,
    capabilities: { dedupe: { retentionMs: 24 * HOUR } },
    execute: async (_args, op) => {
      if (++calls > 1) {
        if (effects.some((e) => e.key === op.key)) throw new Error("the test refuses only before the effect");
        throw new Refused("validation: refused");
      }
      out();
      await gate;
      const id = effects.find((e) => e.key === op.key)?.id ?? `obj_${effects.length + 1}`;
      if (!effects.some((e) => e.id === id)) effects.push({ key: op.key, id });
      return receiptOf(id);
    },
    classify: (e) =>
      e instanceof Refused ? { kind: "permanent", reason: e.message } : { kind: "ambiguous", reason: String(e) },
  });
  return { action, effects, sent, release };
}

async function stored(ledger: Ledger, id: string) {
  const { rows } = await sql<{ status: string; alert_pending: number; reason: string | null }>`
    select status, alert_pending, reason from idem_operations where id = ${id}`.execute(databaseOf(ledger));
  return { status: rows[0]!.status, alertPending: Number(rows[0]!.alert_pending), reason: rows[0]!.reason ?? "" };
}

for (const dialect of DIALECTS) {
  describe(`a provider's "failed" overruled by an earlier attempt's late receipt on ${dialect}`, () => {
    const db = ledgers(dialect);

    it("the replay refused before the earlier request committed: told failed, then the receipt settles it, one effect, alerted", async () => {
      const p = provider("failed.overruled.late");
      const tenant = uniqueTenant();
      const worker = await db.open({ actions: [p.action] });
      // An hour on: attempt 1's lease ran out; the provider still retains the key, so it is replayed.
      const later = await db.open({ clock: () => Date.now() + HOUR, actions: [p.action] });
      const input = { tenant, key: ["late"], args: { to: "x" } };
      const first = worker.run(p.action, input);
      await p.sent;
      expect(await later.run(p.action, input)).toMatchObject({
        status: "failed",
        error: { kind: "permanent", reason: "validation: refused" },
        replayed: false,
        attempt: 2,
      });
      expect(await later.run(p.action, input)).toMatchObject({ status: "failed", replayed: true, attempt: 2 });
      p.release(); // attempt 1's request commits, and its answer arrives
      expect(await first).toMatchObject({ status: "succeeded", receipt: { id: "obj_1" }, attempt: 1 });
      const [row] = await later.admin.list({ tenant });
      expect(await stored(later, row!.id)).toEqual({
        status: "succeeded",
        alertPending: 1,
        reason: `${FAILURE_OVERRULED}attempt 1's receipt proves the effect happened, after attempt 2 failed; a caller told "failed" may have acted on it (the same work sent again under another key, say): a person must check the provider`,
      });
      expect((await later.daemon.alertsDue({ limit: 10 })).map((a) => a.id)).toContain(row!.id);
      expect(await later.run(p.action, input)).toMatchObject({
        status: "succeeded",
        receipt: { id: "obj_1" },
        replayed: true,
      });
      expect(p.effects).toHaveLength(1);
      expect(isFailureOverruled((await stored(later, row!.id)).reason)).toBe(true);
    });

    it("the earlier request's receipt too large to store: the person the row goes to hears that callers were told failed", async () => {
      const p = provider("failed.overruled.unstorable", (id) => ({ id, padding: "x".repeat(4_000) }));
      const tenant = uniqueTenant();
      // Attempt 1's ledger cannot store its receipt (over maxResultBytes): a proof of the effect instead.
      const worker = await db.open({ actions: [p.action], maxResultBytes: 1_000 });
      const later = await db.open({ clock: () => Date.now() + HOUR, actions: [p.action] });
      const input = { tenant, key: ["unstorable"], args: { to: "x" } };
      const first = worker.run(p.action, input);
      await p.sent;
      expect(await later.run(p.action, input)).toMatchObject({ status: "failed", replayed: false, attempt: 2 });
      expect(await later.run(p.action, input)).toMatchObject({ status: "failed", replayed: true, attempt: 2 });
      p.release(); // attempt 1's request commits; its answer cannot be stored
      await expect(first).rejects.toMatchObject({ name: "PayloadTooLargeError" });
      const [row] = await later.admin.list({ tenant });
      const after = await stored(later, row!.id);
      expect({
        status: after.status,
        alertPending: after.alertPending,
        overruled: isFailureOverruled(after.reason),
      }).toEqual({
        status: "needs_review",
        alertPending: 1,
        overruled: true,
      });
      expect(after.reason).toContain(`a caller told "failed" may have acted on it`);
      expect(after.reason).toContain("the effect happened but its receipt cannot be stored");
      expect((await later.daemon.alertsDue({ limit: 10 })).map((a) => a.id)).toContain(row!.id);
      // No longer settled: a caller is not replayed "failed" any more.
      expect(await later.run(p.action, input)).toMatchObject({ status: "pending_verification", state: "needs_review" });
      expect(p.effects).toHaveLength(1);
    });

    it("then a later request's receipt, deduped onto that effect, settles it: alerted as a failure overruled", async () => {
      // Attempts 1 and 2 are out (the provider dedupes on our key: one effect), attempt 3 is refused
      // at once, so callers are told "failed"; attempt 1's receipt cannot be stored (the row goes to a
      // person with the proof), then attempt 2's arrives and settles the row.
      const effects: string[] = [];
      const sent: (() => void)[] = [];
      const out = [0, 1].map((i) => new Promise<void>((r) => (sent[i] = r)));
      const gates: (() => void)[] = [];
      const open = [0, 1].map((i) => new Promise<void>((r) => (gates[i] = r)));
      let calls = 0;
      const action = defineAction<{ to: string }, { id: string; padding?: string }>({
        type: "failed.overruled.proof",
        capabilities: { dedupe: { retentionMs: 24 * HOUR } },
        execute: async () => {
          const n = calls++;
          if (n === 2) throw new Refused("validation: refused");
          sent[n]!();
          await open[n];
          if (effects.length === 0) effects.push("obj_1");
          return n === 0 ? { id: "obj_1", padding: "x".repeat(4_000) } : { id: "obj_1" };
        },
        classify: (e) =>
          e instanceof Refused ? { kind: "permanent", reason: e.message } : { kind: "ambiguous", reason: String(e) },
      });
      const tenant = uniqueTenant();
      const input = { tenant, key: ["proof"], args: { to: "x" } };
      const worker = await db.open({ actions: [action], maxResultBytes: 1_000 });
      const later = await db.open({ clock: () => Date.now() + HOUR, actions: [action] });
      const latest = await db.open({ clock: () => Date.now() + 2 * HOUR, actions: [action] });
      const first = worker.run(action, input);
      await out[0];
      const second = later.run(action, input);
      await out[1];
      expect(await latest.run(action, input)).toMatchObject({ status: "failed", replayed: false, attempt: 3 });
      gates[0]!();
      await expect(first).rejects.toMatchObject({ name: "PayloadTooLargeError" });
      const [row] = await latest.admin.list({ tenant });
      expect(await stored(latest, row!.id)).toMatchObject({ status: "needs_review", alertPending: 1 });
      gates[1]!();
      expect(await second).toMatchObject({ status: "succeeded", receipt: { id: "obj_1" }, replayed: false });
      const after = await stored(latest, row!.id);
      expect({
        status: after.status,
        alertPending: after.alertPending,
        overruled: isFailureOverruled(after.reason),
      }).toEqual({
        status: "succeeded",
        alertPending: 1,
        overruled: true,
      });
      expect(after.reason).toContain("the effect known before without its receipt (attempt 1's request");
      expect(effects).toHaveLength(1);
    });

    it("a receipt naming two effects, too large to store, then a later request's receipt deduped onto them: two effects said first, and the failure overruled after", async () => {
      // As above, but attempt 1's receipt names two effects (obj_1 and obj_2): the row goes to a
      // person saying callers were told "failed", then "two effects". Attempt 2's receipt, deduped
      // onto obj_1, settles the row as one effect unless those words are found after that start.
      const sent: (() => void)[] = [];
      const out = [0, 1].map((i) => new Promise<void>((r) => (sent[i] = r)));
      const gates: (() => void)[] = [];
      const open = [0, 1].map((i) => new Promise<void>((r) => (gates[i] = r)));
      let calls = 0;
      const action = defineAction<{ to: string }, { id?: string; ids?: string[]; padding?: string }>({
        type: "failed.overruled.several",
        capabilities: { dedupe: { retentionMs: 24 * HOUR } },
        execute: async () => {
          const n = calls++;
          if (n === 2) throw new Refused("validation: refused");
          sent[n]!();
          await open[n];
          return n === 0 ? { ids: ["obj_1", "obj_2"], padding: "x".repeat(4_000) } : { id: "obj_1" };
        },
        classify: (e) =>
          e instanceof Refused ? { kind: "permanent", reason: e.message } : { kind: "ambiguous", reason: String(e) },
        effectId: (r) => r.ids ?? r.id,
      });
      const tenant = uniqueTenant();
      const input = { tenant, key: ["several"], args: { to: "x" } };
      const worker = await db.open({ actions: [action], maxResultBytes: 1_000 });
      const later = await db.open({ clock: () => Date.now() + HOUR, actions: [action] });
      const latest = await db.open({ clock: () => Date.now() + 2 * HOUR, actions: [action] });
      const first = worker.run(action, input);
      await out[0];
      const second = later.run(action, input);
      await out[1];
      expect(await latest.run(action, input)).toMatchObject({ status: "failed", attempt: 3 });
      gates[0]!();
      await expect(first).rejects.toMatchObject({ name: "PayloadTooLargeError" });
      const [row] = await latest.admin.list({ tenant });
      const parked = await stored(latest, row!.id);
      expect(parked).toMatchObject({ status: "needs_review", alertPending: 1 });
      expect(parked.reason.startsWith(`${FAILURE_OVERRULED}attempt 1: two effects: the receipt names 2 effects`)).toBe(
        true,
      );
      // The daemon reads those words where they are (its two_effects alert), as the ledger does.
      expect(twoEffectsTold(parked.reason)).toMatch(/^two effects: the receipt names 2 effects \(obj_1, obj_2\)/);
      gates[1]!();
      expect(await second).toMatchObject({ status: "succeeded", receipt: { id: "obj_1" } });
      // Before: "a "failed" replayed … overruled: attempt 2's receipt proves the effect happened;
      // the effect known before … is taken to be this one": obj_2 told of to no one.
      const after = await stored(latest, row!.id);
      expect(after).toMatchObject({ status: "succeeded", alertPending: 1 });
      expect(after.reason).toMatch(/^two effects: the receipt names 2 effects \(obj_1, obj_2\)/);
      expect(after.reason).toContain(`; ${FAILURE_OVERRULED}attempt 2's receipt proves the effect happened`);
      expect((await latest.daemon.alertsDue({ limit: 10 })).map((a) => a.id)).toContain(row!.id);
    });

    it("a receipt naming two effects, too large to store, then a later request's receipt naming the same two, too large too: the callers told failed still said", async () => {
      // As above, but attempt 2's replay, deduped, is answered with the same two effects, too large
      // to store as well: nothing new to say (the same two effects), and the words that callers
      // were told "failed" must not be replaced by those two effects said again.
      const sent: (() => void)[] = [];
      const out = [0, 1].map((i) => new Promise<void>((r) => (sent[i] = r)));
      const gates: (() => void)[] = [];
      const open = [0, 1].map((i) => new Promise<void>((r) => (gates[i] = r)));
      let calls = 0;
      const action = defineAction<{ to: string }, { ids: string[]; padding: string }>({
        type: "failed.overruled.several.again",
        capabilities: { dedupe: { retentionMs: 24 * HOUR } },
        execute: async () => {
          const n = calls++;
          if (n === 2) throw new Refused("validation: refused");
          sent[n]!();
          await open[n];
          return { ids: ["obj_1", "obj_2"], padding: "x".repeat(4_000) };
        },
        classify: (e) =>
          e instanceof Refused ? { kind: "permanent", reason: e.message } : { kind: "ambiguous", reason: String(e) },
        effectId: (r) => r.ids,
      });
      const tenant = uniqueTenant();
      const input = { tenant, key: ["several-again"], args: { to: "x" } };
      const worker = await db.open({ actions: [action], maxResultBytes: 1_000 });
      const later = await db.open({ clock: () => Date.now() + HOUR, actions: [action], maxResultBytes: 1_000 });
      const latest = await db.open({ clock: () => Date.now() + 2 * HOUR, actions: [action] });
      const first = worker.run(action, input);
      await out[0];
      const second = later.run(action, input);
      await out[1];
      expect(await latest.run(action, input)).toMatchObject({ status: "failed", attempt: 3 });
      gates[0]!();
      await expect(first).rejects.toMatchObject({ name: "PayloadTooLargeError" });
      const [row] = await latest.admin.list({ tenant });
      const parked = await stored(latest, row!.id);
      expect(parked.reason.startsWith(`${FAILURE_OVERRULED}attempt 1: two effects: the receipt names 2 effects`)).toBe(
        true,
      );
      gates[1]!();
      await expect(second).rejects.toMatchObject({ name: "PayloadTooLargeError" });
      // Before: "two effects: the receipt names 2 effects …; the effect happened but its receipt
      // cannot be stored": the same two effects said again, and the callers told "failed" unsaid.
      const after = await stored(latest, row!.id);
      expect(after).toEqual({ ...parked, status: "needs_review", alertPending: 1 });
    });

    it("reopened by a receipt too large to store, then another attempt's own receipt, a second effect: two effects said first, and the failure overruled after", async () => {
      // Attempt 1's request is out past its lease; a lookup proves nothing there yet, attempt 2
      // sends and is out too; a later call is refused at once (callers told "failed"). Attempt 1's
      // receipt cannot be stored (the row goes to a person), then attempt 2's arrives: another effect.
      const sent: (() => void)[] = [];
      const out = [0, 1].map((i) => new Promise<void>((r) => (sent[i] = r)));
      const gates: (() => void)[] = [];
      const open = [0, 1].map((i) => new Promise<void>((r) => (gates[i] = r)));
      let calls = 0;
      const action = defineAction<{ to: string }, { id: string; padding?: string }>({
        type: "failed.overruled.second",
        capabilities: { lookup: true },
        execute: async () => {
          const n = calls++;
          if (n === 2) throw new Refused("validation: refused");
          sent[n]!();
          await open[n];
          return n === 0 ? { id: "obj_1", padding: "x".repeat(4_000) } : { id: "obj_2" };
        },
        reconcile: async () => ({ found: false as const, proof: "absent" as const, reason: "not there" }),
        classify: (e) =>
          e instanceof Refused ? { kind: "permanent", reason: e.message } : { kind: "ambiguous", reason: String(e) },
        effectId: (r) => r.id,
      });
      const tenant = uniqueTenant();
      const input = { tenant, key: ["second"], args: { to: "x" } };
      const worker = await db.open({ actions: [action], maxResultBytes: 1_000 });
      const later = await db.open({ clock: () => Date.now() + HOUR, actions: [action] });
      const latest = await db.open({ clock: () => Date.now() + 2 * HOUR, actions: [action] });
      const first = worker.run(action, input);
      await out[0];
      const second = later.run(action, input);
      await out[1];
      expect(await latest.run(action, input)).toMatchObject({ status: "failed" });
      gates[0]!();
      await expect(first).rejects.toMatchObject({ name: "PayloadTooLargeError" });
      const [row] = await latest.admin.list({ tenant });
      expect(isFailureOverruled((await stored(latest, row!.id)).reason)).toBe(true);
      gates[1]!();
      expect(await second).toMatchObject({ status: "succeeded", receipt: { id: "obj_2" } });
      // Before: "two effects: …; a person must check the provider", the callers told "failed" said
      // to no one any more.
      const after = await stored(latest, row!.id);
      expect(after).toMatchObject({ status: "succeeded", alertPending: 1 });
      expect(after.reason).toMatch(/^two effects: attempt \d+'s request took effect, and so did attempt 1's/);
      expect(after.reason).toContain(`; ${FAILURE_OVERRULED}${CALLER_TOLD_FAILED}`);
    });
  });
}
