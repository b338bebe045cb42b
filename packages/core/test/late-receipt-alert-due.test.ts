/**
 * An earlier attempt's late receipt that lands on a row whose alert is still due (alert_pending:
 * the daemon has not delivered it yet). The receipt is recorded without an alert of its own unless
 * it tells of something a person must hear, and the daemon words an alert from the row's reason as
 * it is then: so the receipt clears the alert due. Right when the receipt answers what the alert
 * was about (a person asked to decide whether it happened, a lookup refused while the outcome was
 * unknown: it happened, once). Wrong when the alert told of a second effect the receipt does not
 * undo: that alert stays due, and the reason keeps its words first (the daemon's alert kind); and
 * when the alert told that an operation its callers were told "failed" may have committed after
 * all: the receipt proves it did, and a person hears that "failed" is overruled (a person's own
 * "failed" as their verdict overruled); the same when that receipt is too large to store: the row
 * stays with a person, its reason still saying callers were told "failed". Both databases.
 */
import { describe, expect, it, vi } from "vitest";
import { sql } from "kysely";
import { defineAction, isFailureOverruled, isVerdictOverruled, type Ledger } from "@idem/core";
import { databaseOf } from "@idem/core/testing";
import { DIALECTS } from "@idem/testkit";
import { ledgers, uniqueTenant } from "./support/ledgers.js";

const HOUR = 3_600_000;
/** How the reason starts: the daemon tells its alert (`failure_overruled`) by it. */
const FAILURE_OVERRULED = 'a "failed" replayed to its callers is overruled: ';
/** What a person hears of the callers told "failed" (fence.ts CALLER_TOLD_FAILED). */
const CALLER_TOLD_FAILED =
  'a caller told "failed" may have acted on it (the same work sent again under another key, say)';

class RevokedKey extends Error {}
class Refused extends Error {}

/**
 * An action whose first request holds until released, then takes effect (answered `first`);
 * `later` answers every other.
 */
function provider<R>(
  type: string,
  capabilities: Parameters<typeof defineAction>[0]["capabilities"],
  later: () => R,
  first: () => { id: string; pad?: string } = () => ({ id: "obj_1" }),
) {
  let out!: () => void;
  const sent = new Promise<void>((r) => (out = r));
  let release!: () => void;
  const gate = new Promise<void>((r) => (release = r));
  let calls = 0;
  let finds = false;
  const action = defineAction<{ to: string }, { id?: string; ids?: string[]; pad?: string }>({
    type,
    capabilities,
    execute: async () => {
      if (++calls > 1) return later() as { id?: string; ids?: string[]; pad?: string };
      out();
      await gate;
      return first();
    },
    // The lookup's credential was revoked (a person must hear of it, the outcome stays unknown),
    // until `fixKey`: then it finds attempt 1's effect.
    reconcile: async () => {
      if (!finds) throw new RevokedKey("the API key was revoked");
      return { found: true as const, receipt: { id: "obj_1" } };
    },
    classify: (e) =>
      e instanceof RevokedKey
        ? { kind: "permanent", reason: e.message, alert: true }
        : e instanceof Refused
          ? { kind: "permanent", reason: e.message }
          : { kind: "ambiguous", reason: String(e) },
    effectId: (r) => r.ids ?? r.id,
  });
  return { action, sent, release, fixKey: () => (finds = true) };
}

async function stored(ledger: Ledger, id: string) {
  const { rows } = await sql<{ status: string; alert_pending: number; reason: string | null }>`
    select status, alert_pending, reason from idem_operations where id = ${id}`.execute(databaseOf(ledger));
  return { status: rows[0]!.status, alertPending: Number(rows[0]!.alert_pending), reason: rows[0]!.reason ?? "" };
}

async function due(ledger: Ledger, id: string): Promise<boolean> {
  return (await ledger.daemon.alertsDue({ limit: 1_000 })).some((a) => a.id === id);
}

for (const dialect of DIALECTS) {
  describe(`a late receipt onto a row whose alert is still due on ${dialect}`, () => {
    const db = ledgers(dialect);

    it("parked for a person (no dedupe, no lookup), alert due: the receipt settles it and clears the alert (nothing left to decide)", async () => {
      const p = provider("due.review", {}, () => {
        throw new Error("nothing runs it again");
      });
      const tenant = uniqueTenant();
      const worker = await db.open({ actions: [p.action] });
      // An hour on: attempt 1's lease ran out, and the action can neither dedupe nor be looked up.
      const later = await db.open({ clock: () => Date.now() + HOUR, actions: [p.action] });
      const input = { tenant, key: ["review"], args: { to: "x" } };
      const first = worker.run(p.action, input);
      await p.sent;
      expect(await later.run(p.action, input)).toMatchObject({
        status: "pending_verification",
        state: "needs_review",
      });
      const [row] = await later.admin.list({ tenant });
      expect(await due(later, row!.id)).toBe(true);
      p.release(); // attempt 1's request took effect; its answer arrives
      expect(await first).toMatchObject({ status: "succeeded", receipt: { id: "obj_1" } });
      expect(await stored(later, row!.id)).toEqual({
        status: "succeeded",
        alertPending: 0,
        reason: "attempt 1's receipt proves the effect happened",
      });
      expect(await due(later, row!.id)).toBe(false);
    });

    it("unknown with its lookup refused (check_refused due): the receipt settles it and clears the alert (it happened, once)", async () => {
      const p = provider("due.refused", { lookup: true }, () => {
        throw new Error("nothing runs it again");
      });
      const tenant = uniqueTenant();
      const worker = await db.open({ actions: [p.action] });
      const later = await db.open({ clock: () => Date.now() + HOUR, actions: [p.action] });
      const input = { tenant, key: ["refused"], args: { to: "x" } };
      const first = worker.run(p.action, input);
      await p.sent;
      expect(await later.run(p.action, input)).toMatchObject({ status: "pending_verification", state: "unknown" });
      const [row] = await later.admin.list({ tenant });
      expect(await stored(later, row!.id)).toMatchObject({ status: "unknown", alertPending: 1 });
      expect(await due(later, row!.id)).toBe(true);
      p.release();
      expect(await first).toMatchObject({ status: "succeeded", receipt: { id: "obj_1" } });
      expect(await stored(later, row!.id)).toEqual({
        status: "succeeded",
        alertPending: 0,
        reason: "attempt 1's receipt proves the effect happened",
      });
      expect(await due(later, row!.id)).toBe(false);
    });

    it("unknown with its lookup refused (check_refused due), taken over by a later call whose lookup finds it: the success clears the alert", async () => {
      const p = provider("due.found", { lookup: true }, () => {
        throw new Error("nothing runs it again");
      });
      const tenant = uniqueTenant();
      const worker = await db.open({ actions: [p.action] });
      const later = await db.open({ clock: () => Date.now() + HOUR, actions: [p.action] });
      const input = { tenant, key: ["found"], args: { to: "x" } };
      const first = worker.run(p.action, input);
      await p.sent;
      expect(await later.run(p.action, input)).toMatchObject({ status: "pending_verification", state: "unknown" });
      const [row] = await later.admin.list({ tenant });
      expect(await due(later, row!.id)).toBe(true);
      // The key fixed, a day on (its next check due): the caller's own lookup finds the effect,
      // recorded on the row it took over (runner.ts complete), the alert still due on it.
      p.fixKey();
      const dayOn = await db.open({ clock: () => Date.now() + 24 * HOUR, actions: [p.action] });
      expect(await dayOn.run(p.action, input)).toMatchObject({ status: "succeeded", receipt: { id: "obj_1" } });
      expect(await stored(dayOn, row!.id)).toMatchObject({ status: "succeeded", alertPending: 0 });
      expect(await due(dayOn, row!.id)).toBe(false);
      p.release();
      expect(await first).toMatchObject({ status: "succeeded", receipt: { id: "obj_1" } });
      expect(await due(dayOn, row!.id)).toBe(false);
    });

    it("parked for a person, alert due: their verdict clears it (they are who it was for), and a late receipt after it raises none", async () => {
      const p = provider("due.resolved", {}, () => {
        throw new Error("nothing runs it again");
      });
      const tenant = uniqueTenant();
      const worker = await db.open({ actions: [p.action] });
      const later = await db.open({ clock: () => Date.now() + HOUR, actions: [p.action] });
      const input = { tenant, key: ["resolved"], args: { to: "x" } };
      const first = worker.run(p.action, input);
      await p.sent;
      expect(await later.run(p.action, input)).toMatchObject({ state: "needs_review" });
      const [row] = await later.admin.list({ tenant });
      expect(await due(later, row!.id)).toBe(true);
      await later.admin.resolve({
        tenant,
        id: row!.id,
        outcome: "succeeded",
        actor: "ops",
        reason: "seen in the provider's dashboard",
      });
      expect(await stored(later, row!.id)).toMatchObject({ status: "succeeded", alertPending: 0 });
      expect(await due(later, row!.id)).toBe(false);
      p.release(); // the receipt agrees with the verdict: recorded with it, nothing for anyone to hear
      expect(await first).toMatchObject({ status: "succeeded", receipt: { id: "obj_1" } });
      expect(await stored(later, row!.id)).toMatchObject({ status: "succeeded", alertPending: 0 });
      expect(await due(later, row!.id)).toBe(false);
    });

    it("parked with two effects told (a receipt naming two, too large to store), alert due: a late receipt of one of them keeps the alert and its words", async () => {
      // The provider dedupes on our key: attempt 2's replay is answered with the effects made
      // under it, two of them (its ids name obj_1 and obj_2), in a receipt too large to store.
      const p = provider("due.two", { dedupe: { retentionMs: 24 * HOUR } }, () => ({
        ids: ["obj_1", "obj_2"],
        pad: "x".repeat(2_000),
      }));
      const tenant = uniqueTenant();
      const worker = await db.open({ actions: [p.action] });
      const later = await db.open({ clock: () => Date.now() + HOUR, actions: [p.action], maxResultBytes: 1_000 });
      const input = { tenant, key: ["two"], args: { to: "x" } };
      const first = worker.run(p.action, input);
      await p.sent;
      await expect(later.run(p.action, input)).rejects.toThrow(/result/);
      const [row] = await later.admin.list({ tenant });
      const parked = await stored(later, row!.id);
      expect(parked).toMatchObject({ status: "needs_review", alertPending: 1 });
      expect(parked.reason).toMatch(/^two effects: the receipt names 2 effects \(obj_1, obj_2\)/);
      p.release(); // attempt 1's receipt names obj_1 only: the effect the provider deduped attempt 2 onto
      expect(await first).toMatchObject({ status: "succeeded", receipt: { id: "obj_1" } });
      // Before: succeeded, "attempt 1's receipt proves the effect happened; the effect known before
      // without its receipt (…) is taken to be this one", its alert cleared: obj_2 told of to no one.
      const after = await stored(later, row!.id);
      expect(after).toMatchObject({ status: "succeeded", alertPending: 1 });
      expect(after.reason).toMatch(/^two effects: the receipt names 2 effects \(obj_1, obj_2\)/);
      expect(after.reason).toContain("attempt 1's receipt proves the effect happened");
      expect(await due(later, row!.id)).toBe(true);
      expect(await later.run(p.action, input)).toMatchObject({
        status: "succeeded",
        receipt: { id: "obj_1" },
        replayed: true,
      });
    });

    it('a "failed" told to callers, reopened for a person by an abandoned request (alert due): its late receipt is alerted as the failure overruled', async () => {
      // The provider dedupes on our key: attempt 2's replay is refused at once (validation),
      // before attempt 1's request, still out, commits.
      const p = provider("due.failed", { dedupe: { retentionMs: 24 * HOUR } }, () => {
        throw new Refused("validation: refused");
      });
      const tenant = uniqueTenant();
      const worker = await db.open({ actions: [p.action] });
      const later = await db.open({ clock: () => Date.now() + HOUR, actions: [p.action] });
      const input = { tenant, key: ["failed"], args: { to: "x" } };
      const gaveUp = new AbortController();
      const first = worker.run(p.action, { ...input, signal: gaveUp.signal });
      await p.sent;
      expect(await later.run(p.action, input)).toMatchObject({ status: "failed", attempt: 2 });
      expect(await later.run(p.action, input)).toMatchObject({ status: "failed", replayed: true });
      // Attempt 1's caller gives up; its request, ignoring its signal, is abandoned (a second
      // later): it may have committed after the operation failed, so a person decides.
      gaveUp.abort(new Error("the agent's turn ended"));
      expect(await first).toMatchObject({
        status: "pending_verification",
        state: "needs_review",
        reason: "attempt 1 may have committed after the operation failed; a person decides",
      });
      const [row] = await later.admin.list({ tenant });
      const parked = await stored(later, row!.id);
      expect(parked).toMatchObject({ alertPending: 1 });
      expect(parked.reason).toMatch(/^attempt 1, still in flight when the operation failed, may have committed/);
      p.release(); // attempt 1's request commits; its late answer is recorded
      await vi.waitFor(async () => expect(await stored(later, row!.id)).toMatchObject({ status: "succeeded" }), {
        timeout: 30_000,
      });
      // Before: "attempt 1's receipt proves the effect happened", its alert cleared: the callers
      // told "failed" were never said to be wrong, to anyone.
      expect(await stored(later, row!.id)).toEqual({
        status: "succeeded",
        alertPending: 1,
        reason: `${FAILURE_OVERRULED}attempt 1's receipt proves the effect happened, after attempt 2 failed; a caller told "failed" may have acted on it (the same work sent again under another key, say): a person must check the provider`,
      });
      expect(isFailureOverruled((await stored(later, row!.id)).reason)).toBe(true);
      expect(await due(later, row!.id)).toBe(true);
    });

    it('a "failed" told to callers, reopened for a person by an abandoned request (alert due): its late receipt, too large to store, keeps that callers were told "failed"', async () => {
      const p = provider(
        "due.failed.unstorable",
        { dedupe: { retentionMs: 24 * HOUR } },
        () => {
          throw new Refused("validation: refused");
        },
        () => ({ id: "obj_1", pad: "x".repeat(2_000) }),
      );
      const tenant = uniqueTenant();
      // Attempt 1's ledger cannot store its receipt (over maxResultBytes): a proof of the effect instead.
      const worker = await db.open({ actions: [p.action], maxResultBytes: 1_000 });
      const later = await db.open({ clock: () => Date.now() + HOUR, actions: [p.action] });
      const input = { tenant, key: ["failed-unstorable"], args: { to: "x" } };
      const gaveUp = new AbortController();
      const first = worker.run(p.action, { ...input, signal: gaveUp.signal });
      await p.sent;
      expect(await later.run(p.action, input)).toMatchObject({ status: "failed", attempt: 2 });
      gaveUp.abort(new Error("the agent's turn ended"));
      expect(await first).toMatchObject({ status: "pending_verification", state: "needs_review" });
      const [row] = await later.admin.list({ tenant });
      const parked = await stored(later, row!.id);
      expect(parked).toMatchObject({ alertPending: 1 });
      expect(parked.reason).toMatch(/^attempt 1, still in flight when the operation failed, may have committed/);
      p.release(); // attempt 1's request commits; its late answer cannot be stored
      await vi.waitFor(async () => expect((await stored(later, row!.id)).reason).toMatch(/receipt cannot be stored/), {
        timeout: 30_000,
      });
      // Before: "attempt 1: the effect happened but its receipt cannot be stored: …", the reopen's
      // words replaced, and with them the only word that callers were told "failed".
      const after = await stored(later, row!.id);
      expect(after).toMatchObject({ status: "needs_review", alertPending: 1 });
      expect(
        after.reason.startsWith(`${FAILURE_OVERRULED}attempt 1: the effect happened but its receipt cannot be stored`),
      ).toBe(true);
      expect(after.reason).toContain(`, after attempt 2 failed; ${CALLER_TOLD_FAILED}`);
      expect(await due(later, row!.id)).toBe(true);
    });

    it('a person\'s "failed", reopened by an abandoned request (alert due): its late receipt is alerted as their verdict overruled', async () => {
      const p = provider("due.person", {}, () => {
        throw new Error("nothing runs it again");
      });
      const tenant = uniqueTenant();
      const worker = await db.open({ actions: [p.action] });
      const later = await db.open({ clock: () => Date.now() + HOUR, actions: [p.action] });
      const input = { tenant, key: ["person"], args: { to: "x" } };
      const gaveUp = new AbortController();
      const first = worker.run(p.action, { ...input, signal: gaveUp.signal });
      await p.sent;
      expect(await later.run(p.action, input)).toMatchObject({ state: "needs_review" });
      const [row] = await later.admin.list({ tenant });
      await later.admin.resolve({
        tenant,
        id: row!.id,
        outcome: "failed",
        actor: "ops",
        reason: "nothing at the provider",
      });
      gaveUp.abort(new Error("the agent's turn ended"));
      expect(await first).toMatchObject({ status: "pending_verification", state: "needs_review" });
      const parked = await stored(later, row!.id);
      expect(parked).toMatchObject({ status: "needs_review", alertPending: 1 });
      expect(parked.reason).toMatch(/^attempt 1, still in flight when the operation failed, may have committed/);
      p.release(); // attempt 1's request commits; its late answer is recorded
      await vi.waitFor(async () => expect(await stored(later, row!.id)).toMatchObject({ status: "succeeded" }), {
        timeout: 30_000,
      });
      // A person said "failed" (the reopen voided their verdict, its error still says so): they
      // hear that the receipt overrules it, not that callers were replayed a provider's "failed".
      const after = await stored(later, row!.id);
      expect(after).toMatchObject({ alertPending: 1 });
      expect(isVerdictOverruled(after.reason)).toBe(true);
      expect(after.reason).toContain("a person must check whether anything was done on that verdict");
      expect(await due(later, row!.id)).toBe(true);
    });

    it('a "failed" told to callers, reopened for a person, that alert delivered ("may have committed"): its late receipt is still alerted as the failure overruled', async () => {
      const p = provider("heard.failed", { dedupe: { retentionMs: 24 * HOUR } }, () => {
        throw new Refused("validation: refused");
      });
      const tenant = uniqueTenant();
      const worker = await db.open({ actions: [p.action] });
      const later = await db.open({ clock: () => Date.now() + HOUR, actions: [p.action] });
      const input = { tenant, key: ["heard-failed"], args: { to: "x" } };
      const gaveUp = new AbortController();
      const first = worker.run(p.action, { ...input, signal: gaveUp.signal });
      await p.sent;
      expect(await later.run(p.action, input)).toMatchObject({ status: "failed", attempt: 2 });
      gaveUp.abort(new Error("the agent's turn ended"));
      expect(await first).toMatchObject({ status: "pending_verification", state: "needs_review" });
      // The daemon delivers the reopen's alert: a person heard it "may have committed", no more.
      const [row] = await later.admin.list({ tenant });
      await later.daemon.ackAlert(row!);
      expect(await stored(later, row!.id)).toMatchObject({ status: "needs_review", alertPending: 0 });
      p.release(); // attempt 1's request commits; its late answer is recorded
      await vi.waitFor(async () => expect(await stored(later, row!.id)).toMatchObject({ status: "succeeded" }), {
        timeout: 30_000,
      });
      // Before: "attempt 1's receipt proves the effect happened", no alert: the callers told
      // "failed" were never said to be wrong, only that it may have committed.
      expect(await stored(later, row!.id)).toEqual({
        status: "succeeded",
        alertPending: 1,
        reason: `${FAILURE_OVERRULED}attempt 1's receipt proves the effect happened, after attempt 2 failed; ${CALLER_TOLD_FAILED}: a person must check the provider`,
      });
      expect(await due(later, row!.id)).toBe(true);
    });

    it('a "failed" told to callers, reopened for a person, that alert delivered: its late receipt, too large to store, still says callers were told "failed"', async () => {
      const p = provider(
        "heard.failed.unstorable",
        { dedupe: { retentionMs: 24 * HOUR } },
        () => {
          throw new Refused("validation: refused");
        },
        () => ({ id: "obj_1", pad: "x".repeat(2_000) }),
      );
      const tenant = uniqueTenant();
      const worker = await db.open({ actions: [p.action], maxResultBytes: 1_000 });
      const later = await db.open({ clock: () => Date.now() + HOUR, actions: [p.action] });
      const input = { tenant, key: ["heard-unstorable"], args: { to: "x" } };
      const gaveUp = new AbortController();
      const first = worker.run(p.action, { ...input, signal: gaveUp.signal });
      await p.sent;
      expect(await later.run(p.action, input)).toMatchObject({ status: "failed", attempt: 2 });
      gaveUp.abort(new Error("the agent's turn ended"));
      expect(await first).toMatchObject({ status: "pending_verification", state: "needs_review" });
      const [row] = await later.admin.list({ tenant });
      await later.daemon.ackAlert(row!);
      p.release(); // attempt 1's request commits; its late answer cannot be stored
      await vi.waitFor(async () => expect((await stored(later, row!.id)).reason).toMatch(/receipt cannot be stored/), {
        timeout: 30_000,
      });
      const after = await stored(later, row!.id);
      expect(after).toMatchObject({ status: "needs_review", alertPending: 1 });
      expect(
        after.reason.startsWith(`${FAILURE_OVERRULED}attempt 1: the effect happened but its receipt cannot be stored`),
      ).toBe(true);
      expect(after.reason).toContain(`, after attempt 2 failed; ${CALLER_TOLD_FAILED}`);
    });

    it('a person\'s "failed", reopened by an abandoned request, that alert delivered: its late receipt is still alerted as their verdict overruled', async () => {
      const p = provider("heard.person", {}, () => {
        throw new Error("nothing runs it again");
      });
      const tenant = uniqueTenant();
      const worker = await db.open({ actions: [p.action] });
      const later = await db.open({ clock: () => Date.now() + HOUR, actions: [p.action] });
      const input = { tenant, key: ["heard-person"], args: { to: "x" } };
      const gaveUp = new AbortController();
      const first = worker.run(p.action, { ...input, signal: gaveUp.signal });
      await p.sent;
      expect(await later.run(p.action, input)).toMatchObject({ state: "needs_review" });
      const [row] = await later.admin.list({ tenant });
      await later.admin.resolve({
        tenant,
        id: row!.id,
        outcome: "failed",
        actor: "ops",
        reason: "nothing at the provider",
      });
      gaveUp.abort(new Error("the agent's turn ended"));
      expect(await first).toMatchObject({ status: "pending_verification", state: "needs_review" });
      const [reopened] = await later.admin.list({ tenant });
      await later.daemon.ackAlert(reopened!);
      expect(await stored(later, row!.id)).toMatchObject({ status: "needs_review", alertPending: 0 });
      p.release();
      await vi.waitFor(async () => expect(await stored(later, row!.id)).toMatchObject({ status: "succeeded" }), {
        timeout: 30_000,
      });
      // Before: succeeded, no alert: the person heard "may have committed", never that it did.
      const after = await stored(later, row!.id);
      expect(after).toMatchObject({ alertPending: 1 });
      expect(isVerdictOverruled(after.reason)).toBe(true);
      expect(after.reason).toContain("a person must check whether anything was done on that verdict");
      expect(await due(later, row!.id)).toBe(true);
    });
  });
}
