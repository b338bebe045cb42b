/**
 * A person's verdict "failed" contradicted by a late answer, past the cases operations.test.ts
 * covers (a plain receipt): a receipt whose action's `attention` says the effect was not done in
 * full, and a receipt that settles an effect known before without its receipt (a proof on the row,
 * from an earlier attempt whose receipt could not be stored). The person may have acted on their
 * verdict (told the customer, done the work by hand): they must hear that it was contradicted, and
 * the provider keeps one effect. Also two requests whose identical receipts name no effect (found
 * by helper-222's review: a second effect settled in silence). Both databases.
 */
import { describe, expect, it } from "vitest";
import { sql } from "kysely";
import { defineAction, isVerdictOverruled, type Ledger } from "@idem/core";
import { databaseOf } from "@idem/core/testing";
import { DIALECTS } from "@idem/testkit";
import { ledgers, uniqueTenant } from "./support/ledgers.js";

interface Receipt {
  readonly id: string;
  readonly partly?: string;
  readonly padding?: string;
}

const HOUR = 3_600_000;

/**
 * A provider that makes one effect per key (a request with a key it has seen is answered with that
 * effect when `dedupe` is declared) and holds each request until the test releases it. `answer`
 * shapes the receipt of the nth request (1-based).
 */
function provider(
  type: string,
  capabilities: { dedupe?: { retentionMs: number } },
  answer: (n: number, id: string) => Receipt,
) {
  const effects: { key: string; id: string }[] = [];
  const entered: (() => void)[] = [];
  const releases: (() => void)[] = [];
  const gates: Promise<void>[] = [];
  const sent: Promise<void>[] = [];
  for (let i = 0; i < 4; i++) {
    gates.push(new Promise<void>((r) => releases.push(r)));
    sent.push(new Promise<void>((r) => entered.push(r)));
  }
  let calls = 0;
  const action = defineAction<{ to: string }, Receipt>({
    type,
    capabilities,
    execute: async (_args, op) => {
      const n = ++calls;
      entered[n - 1]!();
      await gates[n - 1];
      const earlier = capabilities.dedupe ? effects.find((e) => e.key === op.key) : undefined;
      const id = earlier?.id ?? `obj_${effects.length + 1}`;
      if (!earlier) effects.push({ key: op.key, id });
      return answer(n, id);
    },
    attention: (r) => (r.partly ? `done, but ${r.partly}` : undefined),
  });
  return {
    action,
    effects,
    /** Resolves once the nth request is out (its attempt holds the operation). */
    sent: (n: number) => sent[n - 1]!,
    release: (n: number) => releases[n - 1]!(),
  };
}

/** The row's status, alert flag and reason as stored, read in SQL. */
async function stored(ledger: Ledger, id: string) {
  const { rows } = await sql<{
    status: string;
    alert_pending: number;
    reason: string | null;
  }>`select status, alert_pending, reason from idem_operations where id = ${id}`.execute(databaseOf(ledger));
  return { status: rows[0]!.status, alertPending: Number(rows[0]!.alert_pending), reason: rows[0]!.reason ?? "" };
}

const due = async (ledger: Ledger, tenant: string) =>
  (await ledger.daemon.alertsDue({ limit: 1_000 })).filter((a) => a.tenant === tenant);

for (const dialect of DIALECTS) {
  describe(`a person's "failed" overruled by a late answer on ${dialect}`, () => {
    const db = ledgers(dialect);

    it("a late receipt that needs attention: the person hears both that their verdict is overruled and what was not done", async () => {
      const p = provider("overruled.attention", {}, (_n, id) => ({ id, partly: "the copy was not filed" }));
      const tenant = uniqueTenant();
      const worker = await db.open({ actions: [p.action] });
      // An hour on: attempt 1's lease ran out; nothing can check it, so it goes to a person.
      const later = await db.open({ clock: () => Date.now() + HOUR, actions: [p.action] });
      const first = worker.run(p.action, { tenant, key: ["late"], args: { to: "x" } });
      await p.sent(1);
      const [row] = await later.admin.list({ tenant });
      expect(await later.daemon.settle({ tenant, id: row!.id, actor: "daemon" })).toMatchObject({
        state: "needs_review",
      });
      await later.admin.resolve({
        tenant,
        id: row!.id,
        outcome: "failed",
        reason: "checked: nothing there yet",
        actor: "ann",
      });
      p.release(1); // attempt 1's answer arrives, late: done, but not in full
      expect(await first).toMatchObject({
        status: "succeeded",
        receipt: { id: "obj_1", partly: "the copy was not filed" },
        replayed: false,
      });
      const after = await stored(later, row!.id);
      expect(after).toMatchObject({ status: "succeeded", alertPending: 1 });
      // The overruled verdict first (the daemon tells its alert by it), the attention after it.
      expect(isVerdictOverruled(after.reason)).toBe(true);
      expect(after.reason).toMatch(
        /^a person's verdict "failed" is overruled: attempt 1's receipt proves the effect happened; a person must check whether anything was done on that verdict; done, but the copy was not filed$/,
      );
      const alerts = await due(later, tenant);
      expect(alerts).toMatchObject([
        { id: row!.id, status: "succeeded", attention: "done, but the copy was not filed", resolution: null },
      ]);
      expect(p.effects).toHaveLength(1);
    });

    it("a late receipt that settles an effect known before without its receipt: the person who said failed hears of it", async () => {
      // The provider dedupes on our key for a day; the ledger counts an hour's margin, so at 23.5
      // hours it no longer replays (a person decides), while a request sent then is still answered
      // with the first effect (`dedupedOntoFirst`): one effect, not two.
      const p = provider("overruled.proof", { dedupe: { retentionMs: 24 * HOUR } }, (n, id) =>
        n === 1 ? { id, padding: "x".repeat(4_000) } : { id },
      );
      const tenant = uniqueTenant();
      // Attempt 1's receipt cannot be stored by its ledger (over maxResultBytes): a proof instead.
      const worker = await db.open({ actions: [p.action], maxResultBytes: 1_000 });
      const later = await db.open({ clock: () => Date.now() + 23.5 * HOUR, leaseMs: 30_000, actions: [p.action] });
      const latest = await db.open({ clock: () => Date.now() + 23.5 * HOUR + 60_000, actions: [p.action] });
      const first = worker.run(p.action, { tenant, key: ["proof"], args: { to: "x" } });
      await p.sent(1);
      const [row] = await later.admin.list({ tenant });
      const id = row!.id;
      expect(await later.daemon.settle({ tenant, id, actor: "daemon" })).toMatchObject({ state: "needs_review" });
      // The person found nothing and runs it again; that request is out too when its lease runs out.
      await later.admin.retry({ tenant, id, reason: "not at the provider", actor: "ann" });
      const second = later.run(p.action, { tenant, key: ["proof"], args: { to: "x" } });
      await p.sent(2);
      expect(await latest.daemon.settle({ tenant, id, actor: "daemon" })).toMatchObject({ state: "needs_review" });
      await latest.admin.resolve({ tenant, id, outcome: "failed", reason: "checked: nothing there yet", actor: "ann" });
      // Attempt 1's answer: the effect happened, its receipt too large to store (the row reopened with the proof).
      p.release(1);
      await expect(first).rejects.toMatchObject({ name: "PayloadTooLargeError" });
      const proven = await stored(latest, id);
      expect(proven).toMatchObject({ status: "needs_review", alertPending: 1 });
      // Attempt 2's answer: the provider deduped it onto attempt 1's effect, so its receipt is that effect's.
      p.release(2);
      expect(await second).toMatchObject({ status: "succeeded", receipt: { id: "obj_1" }, replayed: false });
      const after = await stored(latest, id);
      expect(after.reason).toMatch(/the effect known before without its receipt \(attempt 1's request: /);
      // The person said "failed" and may have acted on it: settled quietly, they would never hear.
      expect({
        status: after.status,
        alertPending: after.alertPending,
        overruled: isVerdictOverruled(after.reason),
      }).toEqual({
        status: "succeeded",
        alertPending: 1,
        overruled: true,
      });
      expect((await due(latest, tenant)).map((a) => a.id)).toEqual([id]);
      expect(p.effects).toHaveLength(1);
    });

    it("a late receipt identical to a rerun's, naming no effect (a provider without dedupe or ids): alerted as possibly two effects", async () => {
      // A webhook's "HTTP 200", say: two requests answered alike are not one effect. Attempt 1 is
      // out; a person's retry (attempt 3) sends again and settles with the same receipt; attempt 1's
      // answer then arrives. Before: one effect said, no alert, two at the provider.
      const p = provider("same.receipt", {}, () => ({ id: "ok" }));
      const tenant = uniqueTenant();
      const worker = await db.open({ actions: [p.action] });
      const later = await db.open({ clock: () => Date.now() + HOUR, leaseMs: 30_000, actions: [p.action] });
      const first = worker.run(p.action, { tenant, key: ["same"], args: { to: "x" } });
      await p.sent(1);
      const [row] = await later.admin.list({ tenant });
      const id = row!.id;
      expect(await later.daemon.settle({ tenant, id, actor: "daemon" })).toMatchObject({ state: "needs_review" });
      await later.admin.retry({ tenant, id, reason: "not at the provider", actor: "ann" });
      const second = later.run(p.action, { tenant, key: ["same"], args: { to: "x" } });
      await p.sent(2);
      p.release(2);
      expect(await second).toMatchObject({ status: "succeeded", attempt: 3, replayed: false });
      p.release(1);
      expect(await first).toMatchObject({ status: "succeeded", receipt: { id: "ok" }, attempt: 1, replayed: false });
      const after = await stored(later, id);
      expect(after).toMatchObject({ status: "succeeded", alertPending: 1 });
      expect(after.reason).toMatch(/^possibly two effects: .*attempt 3 ran the operation again/);
      expect((await due(later, tenant)).map((a) => a.id)).toEqual([id]);
      expect(p.effects).toHaveLength(2);
    });

    it("a late receipt after a rerun and a person's failed: the possibly-two reason says the verdict is overruled too", async () => {
      const p = provider("overruled.rerun", {}, (_n, id) => ({ id }));
      const tenant = uniqueTenant();
      const worker = await db.open({ actions: [p.action] });
      const later = await db.open({ clock: () => Date.now() + HOUR, leaseMs: 30_000, actions: [p.action] });
      const latest = await db.open({ clock: () => Date.now() + HOUR + 60_000, actions: [p.action] });
      const first = worker.run(p.action, { tenant, key: ["rerun"], args: { to: "x" } });
      await p.sent(1);
      const [row] = await later.admin.list({ tenant });
      const id = row!.id;
      expect(await later.daemon.settle({ tenant, id, actor: "daemon" })).toMatchObject({ state: "needs_review" });
      await later.admin.retry({ tenant, id, reason: "not at the provider", actor: "ann" });
      const second = later.run(p.action, { tenant, key: ["rerun"], args: { to: "x" } });
      await p.sent(2);
      expect(await latest.daemon.settle({ tenant, id, actor: "daemon" })).toMatchObject({ state: "needs_review" });
      await latest.admin.resolve({ tenant, id, outcome: "failed", reason: "checked: nothing there yet", actor: "ann" });
      p.release(1); // attempt 1's receipt: the effect happened, after a rerun and the person's "failed"
      expect(await first).toMatchObject({ status: "succeeded", receipt: { id: "obj_1" }, attempt: 1, replayed: false });
      const after = await stored(latest, id);
      expect(after).toMatchObject({ status: "succeeded", alertPending: 1 });
      expect(after.reason).toMatch(/^possibly two effects: /);
      expect(after.reason).toContain(`a person's verdict "failed" is overruled`);
      p.release(2);
      await second.catch(() => {}); // attempt 3's answer: fenced, whatever it says
    });

    it("a late receipt of a second effect after the proof of the first: the person who said failed hears of both", async () => {
      // As above, with a provider that does not dedupe: attempt 2's request, sent on the person's
      // retry (attempt 3), makes a second effect (helper-217's note: alerted as two effects, the verdict unsaid).
      const p = provider("overruled.twice", {}, (n, id) => (n === 1 ? { id, padding: "x".repeat(4_000) } : { id }));
      const tenant = uniqueTenant();
      const worker = await db.open({ actions: [p.action], maxResultBytes: 1_000 });
      const later = await db.open({ clock: () => Date.now() + HOUR, leaseMs: 30_000, actions: [p.action] });
      const latest = await db.open({ clock: () => Date.now() + HOUR + 60_000, actions: [p.action] });
      const first = worker.run(p.action, { tenant, key: ["twice"], args: { to: "x" } });
      await p.sent(1);
      const [row] = await later.admin.list({ tenant });
      const id = row!.id;
      expect(await later.daemon.settle({ tenant, id, actor: "daemon" })).toMatchObject({ state: "needs_review" });
      await later.admin.retry({ tenant, id, reason: "not at the provider", actor: "ann" });
      const second = later.run(p.action, { tenant, key: ["twice"], args: { to: "x" } });
      await p.sent(2);
      expect(await latest.daemon.settle({ tenant, id, actor: "daemon" })).toMatchObject({ state: "needs_review" });
      await latest.admin.resolve({ tenant, id, outcome: "failed", reason: "checked: nothing there yet", actor: "ann" });
      p.release(1); // attempt 1's effect, its receipt too large to store: the row reopened with the proof
      await expect(first).rejects.toMatchObject({ name: "PayloadTooLargeError" });
      p.release(2); // attempt 3's request took effect too
      expect(await second).toMatchObject({ status: "succeeded", receipt: { id: "obj_2" }, replayed: false });
      const after = await stored(latest, id);
      expect(after).toMatchObject({ status: "succeeded", alertPending: 1 });
      // Two effects first (the daemon's alert kind), and the verdict they overrule said too.
      expect(after.reason).toMatch(/^two effects: attempt 3's request took effect, and so did attempt 1's/);
      expect(after.reason).toContain(`a person's verdict "failed" is overruled`);
      expect((await due(latest, tenant)).map((a) => a.id)).toEqual([id]);
      expect(p.effects).toHaveLength(2);
    });
  });
}
