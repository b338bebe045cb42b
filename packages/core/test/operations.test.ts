import { describe, expect, it } from "vitest";
import { Migrator, PostgresDialect, SqliteDialect, sql } from "kysely";
import { z } from "zod";
import {
  ArgsMismatchError,
  GuardrailError,
  InvalidTransitionError,
  InvalidValueError,
  LedgerConfigError,
  OperationNotFoundError,
  PayloadTooLargeError,
  UnknownActionError,
  defineAction,
  isEscalation,
  isVerdictOverruled,
  openLedger,
  type Ledger,
} from "@idem/core";
import { databaseOf, openTestLedger } from "@idem/core/testing";
import { DIALECTS, freshDatabase, type TestDialect } from "@idem/testkit";
import * as m0001 from "../src/migrations/0001-init.js";
import { migrationProvider } from "../src/migrations/index.js";
import { ledgers, uniqueTenant } from "./support/ledgers.js";
import { TestProvider } from "./support/provider.js";

/** Rows and audit events (kept in each row's history) stored for the tenant, counted in SQL. */
async function countRows(
  ledger: Ledger,
  dialect: TestDialect,
  tenant: string,
): Promise<{ ops: number; events: number }> {
  const length = dialect === "postgres" ? sql`jsonb_array_length(history)` : sql`json_array_length(history)`;
  const { rows } = await sql<{
    ops: number;
    events: number | null;
  }>`select count(*) as ops, sum(${length}) as events from idem_operations where tenant_id = ${tenant}`.execute(
    databaseOf(ledger),
  );
  return { ops: Number(rows[0]!.ops), events: Number(rows[0]!.events ?? 0) };
}

/** What an SMS provider answers: the message's id. Its schema is what a person's receipt must match. */
const HOUR = 3_600_000;

const SmsReceipt = z.object({ id: z.string().startsWith("SM") });

/**
 * An SMS action that names its message before sending (the provider reference) and whose every
 * answer is lost after the request left: each operation ends in needs_review, with `sent` holding
 * what reached the provider. `receipt` gives the action a receipt schema.
 */
function lostSms(sent: string[], receipt?: typeof SmsReceipt) {
  return defineAction<{ to: string }, { id: string }>({
    type: "sms.lost",
    capabilities: {},
    ...(receipt && { receipt }),
    providerReference: (_args, op) => `SM-${op.key.slice(0, 12)}`,
    async execute(_args, op) {
      sent.push(op.key);
      throw new Error("socket closed after the request was sent");
    },
  });
}

/**
 * A send whose answer is lost after DATA, and whose lookups find nothing yet: each lookup's
 * settle-window start (`op.lastAttemptAt`) goes to `seen`.
 */
function windowAction(type: string, seen: number[]) {
  return defineAction({
    type,
    capabilities: { lookup: true },
    execute: async () => {
      throw new Error("timeout after DATA");
    },
    reconcile: async (_a: unknown, op) => {
      seen.push(op.lastAttemptAt);
      return { found: false, proof: "inconclusive", reason: "not yet", retryAfterMs: 0 } as const;
    },
  });
}

for (const dialect of DIALECTS) {
  describe(`operators' view on ${dialect}`, () => {
    const db = ledgers(dialect);

    async function parked(ledger: Awaited<ReturnType<typeof db.open>>, tenant: string, key: string) {
      const p = new TestProvider();
      p.faults.push({ when: "after", cls: { kind: "ambiguous", reason: "timeout" } });
      const out = await ledger.run(p.action("sms", {}), { tenant, key: [key], args: { to: "x" } });
      expect(out).toMatchObject({ status: "pending_verification", state: "needs_review" });
      return { id: out.operationId, provider: p };
    }

    it("keeps tenants apart: no read, list, resolve, retry or prune across them", async () => {
      const ledger = await db.open({ retentionMs: 0 });
      const a = uniqueTenant();
      const b = uniqueTenant();
      const { id } = await parked(ledger, a, "k");
      const done = await ledger.run(new TestProvider().action("mail", {}), {
        tenant: a,
        key: ["done"],
        args: { to: "x" },
      });
      await expect(ledger.get({ tenant: b, id })).rejects.toBeInstanceOf(OperationNotFoundError);
      expect(await ledger.admin.list({ tenant: b })).toEqual([]);
      await expect(
        ledger.admin.resolve({ tenant: b, id, outcome: "succeeded", reason: "seen in provider", actor: "ops-b" }),
      ).rejects.toBeInstanceOf(OperationNotFoundError);
      await expect(ledger.admin.retry({ tenant: b, id, reason: "x", actor: "ops-b" })).rejects.toBeInstanceOf(
        OperationNotFoundError,
      );
      expect(await ledger.admin.prune({ tenant: b })).toBe(0);
      expect((await ledger.get({ tenant: a, id })).operation.status).toBe("needs_review");
      expect((await ledger.get({ tenant: a, id: done.operationId })).operation.status).toBe("succeeded");
      // the same key under another tenant is another operation
      const p = new TestProvider();
      await ledger.run(p.action("sms", {}), { tenant: b, key: ["k"], args: { to: "x" } });
      expect(p.effects).toHaveLength(1);
    });

    it("resolves needs_review with the person's verdict and records the actor", async () => {
      const ledger = await db.open();
      const tenant = uniqueTenant();
      const { id, provider } = await parked(ledger, tenant, "r1");
      const op = await ledger.admin.resolve({
        tenant,
        id,
        outcome: "succeeded",
        reason: "found in the SMS console",
        actor: "ops:alice",
      });
      expect(op).toMatchObject({
        status: "succeeded",
        result: null,
        error: null,
        resolution: { outcome: "succeeded", actor: "ops:alice", reason: "found in the SMS console", evidence: null },
      });
      const { events } = await ledger.get({ tenant, id });
      expect(events.at(-1)).toMatchObject({ from: "needs_review", to: "succeeded", actor: "ops:alice" });
      expect(events.at(-1)!.reason).toMatch(/found in the SMS console/);
      // a later call gets the resolution, and nothing is sent again
      const again = await ledger.run(provider.action("sms", {}), { tenant, key: ["r1"], args: { to: "x" } });
      expect(again).toEqual({
        status: "succeeded",
        receipt: null,
        replayed: true,
        operationId: id,
        attempt: op.attempt,
        resolution: op.resolution,
      });
      expect(provider.effects).toHaveLength(1);
    });

    it("resolves as succeeded with evidence: the provider reference stays, no receipt, and later calls replay the verdict", async () => {
      const ledger = await db.open();
      const tenant = uniqueTenant();
      const sent: string[] = [];
      const sms = lostSms(sent);
      const parkedOut = await ledger.run(sms, { tenant, key: ["e1"], args: { to: "x" } });
      expect(parkedOut).toMatchObject({ status: "pending_verification", state: "needs_review" });
      const id = parkedOut.operationId;
      const reference = (await ledger.get({ tenant, id })).operation.providerReference;
      expect(reference).toMatch(/^SM-/);

      const op = await ledger.admin.resolve({
        tenant,
        id,
        outcome: "succeeded",
        reason: "delivered per the console",
        actor: "ops:alice",
        evidence: "SM9f2 in the SMS console",
      });
      const resolution = {
        outcome: "succeeded",
        actor: "ops:alice",
        reason: "delivered per the console",
        evidence: "SM9f2 in the SMS console",
        at: op.completedAt,
      };
      expect(op).toMatchObject({
        status: "succeeded",
        providerReference: reference,
        result: null,
        error: null,
        resolution,
      });
      expect(op.completedAt).toEqual(expect.any(Number));
      const { operation, events } = await ledger.get({ tenant, id });
      expect(operation).toEqual(op);
      expect(events.at(-1)).toMatchObject({
        from: "needs_review",
        to: "succeeded",
        actor: "ops:alice",
        providerReference: reference,
      });

      const replay = {
        status: "succeeded",
        receipt: null,
        replayed: true,
        operationId: id,
        attempt: op.attempt,
        resolution,
      };
      expect(await ledger.run(sms, { tenant, key: ["e1"], args: { to: "x" } })).toEqual(replay);
      expect(await ledger.status({ tenant, id })).toEqual(replay);
      expect(sent).toHaveLength(1);
    });

    it("resolves as failed with the verdict kept apart from the error; later calls replay both", async () => {
      const ledger = await db.open();
      const tenant = uniqueTenant();
      const sent: string[] = [];
      const sms = lostSms(sent);
      const { operationId: id } = await ledger.run(sms, { tenant, key: ["f1"], args: { to: "x" } });
      const op = await ledger.admin.resolve({
        tenant,
        id,
        outcome: "failed",
        reason: "not in the console",
        actor: "ops:bob",
        evidence: "console search, 0 hits",
      });
      const resolution = {
        outcome: "failed",
        actor: "ops:bob",
        reason: "not in the console",
        evidence: "console search, 0 hits",
        at: op.completedAt,
      };
      expect(op).toMatchObject({ status: "failed", result: null, error: { kind: "permanent" }, resolution });
      expect(await ledger.run(sms, { tenant, key: ["f1"], args: { to: "x" } })).toMatchObject({
        status: "failed",
        replayed: true,
        operationId: id,
        error: { kind: "permanent" },
        resolution,
      });
      expect(sent).toHaveLength(1);
    });

    it("stores and replays a receipt a person gives when the registered action's receipt schema accepts it", async () => {
      const sent: string[] = [];
      const sms = lostSms(sent, SmsReceipt);
      const ledger = await db.open({ actions: [sms] });
      const tenant = uniqueTenant();
      const { operationId: id } = await ledger.run(sms, { tenant, key: ["s1"], args: { to: "x" } });
      const reference = (await ledger.get({ tenant, id })).operation.providerReference;

      // a receipt the schema refuses: a typed error naming the field, and nothing written
      const before = await ledger.get({ tenant, id });
      const refused = await ledger.admin
        .resolve({ tenant, id, outcome: "succeeded", reason: "seen", actor: "ops", receipt: { id: 42 } })
        .catch((e: unknown) => e);
      expect(refused).toBeInstanceOf(InvalidValueError);
      expect((refused as InvalidValueError).path).toMatch(/^receipt/);
      const wrongShape = await ledger.admin
        .resolve({ tenant, id, outcome: "succeeded", reason: "seen", actor: "ops", receipt: { id: "ch_1" } })
        .catch((e: unknown) => e);
      expect(wrongShape).toBeInstanceOf(InvalidValueError);
      expect((wrongShape as InvalidValueError).path).toBe("receipt.id");
      expect(await ledger.get({ tenant, id })).toEqual(before);
      expect(before.operation.status).toBe("needs_review");

      const op = await ledger.admin.resolve({
        tenant,
        id,
        outcome: "succeeded",
        reason: "found it",
        actor: "ops:alice",
        evidence: "console",
        receipt: { id: "SM77", extra: "dropped by the schema" },
      });
      const resolution = {
        outcome: "succeeded",
        actor: "ops:alice",
        reason: "found it",
        evidence: "console",
        at: op.completedAt,
      };
      expect(op).toMatchObject({
        status: "succeeded",
        providerReference: reference,
        result: { id: "SM77" },
        resolution,
      });
      const again = await ledger.run(sms, { tenant, key: ["s1"], args: { to: "x" } });
      expect(again).toEqual({
        status: "succeeded",
        receipt: { id: "SM77" },
        replayed: true,
        operationId: id,
        attempt: op.attempt,
        resolution,
      });
      expect(again.status === "succeeded" && again.receipt!.id).toBe("SM77");
      expect(sent).toHaveLength(1);
    });

    it("refuses a receipt when no receipt schema is registered for the action, and writes nothing", async () => {
      const tenant = uniqueTenant();
      const sent: string[] = [];
      for (const ledger of [await db.open(), await db.open({ actions: [lostSms(sent)] })]) {
        // unregistered, then registered without a receipt schema: nothing can check the receipt
        const { operationId: id } = await ledger.run(lostSms(sent, SmsReceipt), {
          tenant,
          key: ["n", sent.length],
          args: { to: "x" },
        });
        const before = await ledger.get({ tenant, id });
        const err = await ledger.admin
          .resolve({ tenant, id, outcome: "succeeded", reason: "seen", actor: "ops", receipt: { id: "SM1" } })
          .catch((e: unknown) => e);
        expect(err).toBeInstanceOf(InvalidValueError);
        expect((err as InvalidValueError).path).toBe("receipt");
        expect(await ledger.get({ tenant, id })).toEqual(before);
        expect(before.operation.status).toBe("needs_review");
      }
    });

    it("refuses to resolve what is not in review, or without a reason", async () => {
      const ledger = await db.open();
      const tenant = uniqueTenant();
      const out = await ledger.run(new TestProvider().action("mail", {}), { tenant, key: ["ok"], args: { to: "x" } });
      await expect(
        ledger.admin.resolve({ tenant, id: out.operationId, outcome: "failed", reason: "no", actor: "ops" }),
      ).rejects.toBeInstanceOf(InvalidTransitionError);
      const { id } = await parked(ledger, tenant, "r2");
      await expect(
        ledger.admin.resolve({ tenant, id, outcome: "failed", reason: " ", actor: "ops" }),
      ).rejects.toBeInstanceOf(InvalidValueError);
      expect((await ledger.get({ tenant, id })).operation.status).toBe("needs_review");
    });

    it("a decision taken on an older view of the operation (seen) is refused, even where its new status allows it", async () => {
      const ledger = await db.open();
      const t = uniqueTenant();
      const { id } = await parked(ledger, t, "seen");
      const shown = (await ledger.get({ tenant: t, id })).operation;
      // Someone else decides first: failed, from which a retry would be allowed.
      await ledger.admin.resolve({ tenant: t, id, outcome: "failed", reason: "checked: not sent", actor: "carol" });
      const stale = ledger.admin.retry({
        tenant: t,
        id,
        reason: "not sent",
        actor: "dave",
        seen: shown,
      });
      await expect(stale).rejects.toThrow(InvalidTransitionError);
      await expect(stale).rejects.toThrow(/changed since it was shown/);
      expect((await ledger.get({ tenant: t, id })).operation).toMatchObject({
        status: "failed",
        resolution: { actor: "carol" },
      });
      // The view as it is now decides.
      const current = (await ledger.get({ tenant: t, id })).operation;
      await ledger.admin.retry({ tenant: t, id, reason: "not sent", actor: "dave", seen: current });
      expect((await ledger.get({ tenant: t, id })).operation.status).toBe("pending");
    });

    it("tells a stale view (CHANGED_SINCE_SEEN, with the version seen and the one now) from a move the status does not allow (INVALID_TRANSITION)", async () => {
      const ledger = await db.open();
      const t = uniqueTenant();
      const { id } = await parked(ledger, t, "stale-or-not");
      const shown = (await ledger.get({ tenant: t, id })).operation;
      const seen = { status: shown.status, attempt: shown.attempt, checks: shown.checks, updatedAt: shown.updatedAt };
      await ledger.admin.resolve({ tenant: t, id, outcome: "succeeded", reason: "found it", actor: "carol", seen });
      const done = (await ledger.get({ tenant: t, id })).operation;
      const now = {
        status: "succeeded" as const,
        attempt: done.attempt,
        checks: done.checks,
        updatedAt: done.updatedAt,
      };
      // On the view before carol's verdict: reading it again is the way on (it may still need a person).
      for (const decide of [
        () => ledger.admin.retry({ tenant: t, id, reason: "not sent", actor: "dave", seen }),
        () => ledger.admin.resolve({ tenant: t, id, outcome: "failed", reason: "not sent", actor: "dave", seen }),
      ])
        await expect(decide()).rejects.toMatchObject({
          name: "ChangedSinceSeenError",
          code: "CHANGED_SINCE_SEEN",
          operationId: id,
          seen,
          now,
          shown: true,
          message: expect.stringMatching(/changed since it was shown .*it is now succeeded .*read it again/),
        });
      // On the view as it is now: succeeded allows neither, and reading it again will not change that.
      const refused = await ledger.admin
        .retry({ tenant: t, id, reason: "not sent", actor: "dave", seen: now })
        .catch((e: unknown) => e);
      expect(refused).toBeInstanceOf(InvalidTransitionError);
      expect(refused).toMatchObject({ code: "INVALID_TRANSITION", from: "succeeded", to: "pending" });
      expect(refused).not.toHaveProperty("now");
    });

    it("two people deciding on the same view at once: one decides, the other is refused as a stale view, whichever way it lost", async () => {
      const ledger = await db.open();
      const t = uniqueTenant();
      for (let i = 0; i < 4; i++) {
        const { id } = await parked(ledger, t, `race-${i}`);
        const shown = (await ledger.get({ tenant: t, id })).operation;
        const seen = { status: shown.status, attempt: shown.attempt, checks: shown.checks, updatedAt: shown.updatedAt };
        const ref = { tenant: t, id, seen };
        const [a, b] = await Promise.allSettled([
          ledger.admin.resolve({ ...ref, outcome: "succeeded", reason: "found it", actor: "carol" }),
          ledger.admin.retry({ ...ref, reason: "not sent", actor: "dave" }),
        ]);
        const lost = [a, b].filter((r) => r.status === "rejected");
        expect(lost).toHaveLength(1);
        const after = (await ledger.get({ tenant: t, id })).operation;
        expect((lost[0] as PromiseRejectedResult).reason).toMatchObject({
          code: "CHANGED_SINCE_SEEN",
          operationId: id,
          seen,
          now: { status: after.status, attempt: after.attempt, checks: after.checks, updatedAt: after.updatedAt },
        });
      }
    });

    it("counts what came in per time bucket and status, for one tenant, several, or all", async () => {
      const ledger = await db.open();
      const [a, b] = [uniqueTenant(), uniqueTenant()];
      await parked(ledger, a, "x");
      const ok = new TestProvider().action("mail", {});
      for (const k of ["1", "2"]) await ledger.run(ok, { tenant: b, key: [k], args: { to: "y" } });
      const sum = (rows: { status: string; count: number }[], status: string) =>
        rows.filter((r) => r.status === status).reduce((n, r) => n + r.count, 0);
      const both = await ledger.admin.activity({ tenant: [a, b] });
      expect([sum(both, "needs_review"), sum(both, "succeeded")]).toEqual([1, 2]);
      expect(sum(await ledger.admin.activity({ tenant: b }), "needs_review")).toBe(0);
      expect(sum(await ledger.admin.activity(), "succeeded")).toBeGreaterThanOrEqual(2);
      for (const r of both) expect(r.at % 3_600_000).toBe(0);
      expect(await ledger.admin.activity({ tenant: [] })).toEqual([]);
    });

    for (const verdict of ["failed", "succeeded"] as const) {
      it(`a receipt that arrives after a person resolved the operation as ${verdict} without one is kept: it proves the effect`, async () => {
        const p = new TestProvider();
        let release!: () => void;
        p.gate = new Promise<void>((r) => (release = r));
        const action = p.action("sms", {}); // nothing can check it: an expired lease goes to a person
        const tenant = uniqueTenant();
        const worker = await db.open();
        const later = await db.open({ clock: () => Date.now() + 3_600_000, actions: [action] });
        const first = worker.run(action, { tenant, key: ["late"], args: { to: "x" } });
        await p.called(1);
        const [row] = await later.admin.list({ tenant });
        expect(await later.daemon.settle({ tenant, id: row!.id, actor: "daemon" })).toMatchObject({
          state: "needs_review",
        });
        await later.admin.resolve({
          tenant,
          id: row!.id,
          outcome: verdict,
          reason: "checked: nothing there yet",
          actor: "ann",
        });
        release(); // the first attempt's answer arrives, late
        expect(await first).toMatchObject({ status: "succeeded", receipt: { id: "obj_1" }, replayed: false });
        const { operation, events } = await later.get({ tenant, id: row!.id });
        expect(operation).toMatchObject({ status: "succeeded", result: { id: "obj_1" }, error: null });
        expect(operation.resolution === null).toBe(verdict === "failed"); // a contradicted verdict is gone; the history keeps it
        // A person who said "failed" may have acted on it (told the customer, done the work by
        // hand): they hear it was contradicted. A "succeeded" the receipt agrees with is not alerted.
        const alerted = (await later.daemon.alertsDue({ limit: 1_000 })).filter((a) => a.id === row!.id);
        expect({ alerted: alerted.length, overruled: isVerdictOverruled(operation.reason ?? "") }).toEqual(
          verdict === "failed" ? { alerted: 1, overruled: true } : { alerted: 0, overruled: false },
        );
        expect(events.map((e) => e.reason).join(" | ")).toMatch(
          /resolved by a person: checked: nothing there yet.*fenced: attempt 1/,
        );
        // Every later caller replays the receipt: a retry would have done it twice.
        expect(await later.run(action, { tenant, key: ["late"], args: { to: "x" } })).toMatchObject({
          receipt: { id: "obj_1" },
          replayed: true,
        });
        expect(p.effects).toHaveLength(1);
      });
    }

    it("a retry of a settled operation reopens it: no completion time, not due for pruning", async () => {
      const ledger = await db.open({ retentionMs: 0 });
      const t = uniqueTenant();
      const { id } = await parked(ledger, t, "reopen");
      const failed = await ledger.admin.resolve({ tenant: t, id, outcome: "failed", reason: "not sent", actor: "ann" });
      expect(failed.completedAt).not.toBeNull();
      expect(failed.expiresAt).not.toBeNull();
      const back = await ledger.admin.retry({ tenant: t, id, reason: "the cause is fixed", actor: "ann" });
      expect(back).toMatchObject({ status: "pending", completedAt: null, expiresAt: null, resolution: null });
      expect(await ledger.admin.prune({ tenant: t })).toBe(0);
    });

    it("retry sends a reviewed operation back to pending; the next call runs it with the same key", async () => {
      const ledger = await db.open();
      const tenant = uniqueTenant();
      const { id, provider } = await parked(ledger, tenant, "r3");
      provider.effects.length = 0; // the person checked: the provider has nothing
      await ledger.admin.retry({ tenant, id, reason: "not in the SMS console", actor: "ops:bob" });
      const out = await ledger.run(provider.action("sms", {}), { tenant, key: ["r3"], args: { to: "x" } });
      expect(out).toMatchObject({ status: "succeeded", operationId: id });
      expect(provider.effects).toHaveLength(1);
    });

    it("a retry keeps the person's evidence in its audit event, bounded as a verdict's; one without keeps the event as it was", async () => {
      const ledger = await db.open();
      const tenant = uniqueTenant();
      const { id } = await parked(ledger, tenant, "r-evidence");
      const evidence = `SMS log searched for +15550100, 09:00-10:00: nothing ${"·".repeat(900)}`;
      // Over a verdict's 1,000 characters, or with a NUL: refused, nothing written.
      const before = await ledger.get({ tenant, id });
      for (const bad of ["x".repeat(1_001), "found\u0000nothing"]) {
        const refused = await ledger.admin
          .retry({ tenant, id, reason: "not in the SMS console", actor: "ops:bob", evidence: bad })
          .catch((e: unknown) => e);
        expect(refused).toBeInstanceOf(InvalidValueError);
        expect((refused as InvalidValueError).message).toMatch(/^evidence: /);
      }
      expect(await ledger.get({ tenant, id })).toEqual(before);

      const back = await ledger.admin.retry({
        tenant,
        id,
        reason: "not in the SMS console",
        actor: "ops:bob",
        evidence,
        seen: before.operation,
      });
      expect(back).toMatchObject({ status: "pending", resolution: null });
      const { events } = await ledger.get({ tenant, id });
      // Whole and apart from the reason, which stays the person's own.
      expect(events.at(-1)).toMatchObject({
        from: "needs_review",
        to: "pending",
        actor: "ops:bob",
        reason: "retry asked: not in the SMS console",
        evidence,
      });
      // The events before it carry none.
      expect(events.slice(0, -1).every((e) => !("evidence" in e))).toBe(true);

      // Without evidence, the event is as before: no field at all.
      const other = await parked(ledger, tenant, "r-no-evidence");
      await ledger.admin.retry({ tenant, id: other.id, reason: "not in the SMS console", actor: "ops:bob" });
      const last = (await ledger.get({ tenant, id: other.id })).events.at(-1)!;
      expect(last).toMatchObject({ to: "pending", reason: "retry asked: not in the SMS console" });
      expect("evidence" in last).toBe(false);
    });

    it("a ledger before migration 0010 refuses a retry's evidence (its trigger writes the event), deciding nothing", async () => {
      const url = await freshDatabase(dialect);
      const bare = await openLedger(url, { migrate: false });
      try {
        await new Migrator({
          db: databaseOf(bare),
          migrationTableName: "idem_migration",
          migrationLockTableName: "idem_migration_lock",
          provider: migrationProvider(dialect),
        }).migrateTo("0009-first-execution");
        const ledger = await openLedger(url, { migrate: false });
        try {
          const tenant = uniqueTenant();
          const { id } = await parked(ledger, tenant, "old");
          const refused = await ledger.admin
            .retry({ tenant, id, reason: "not sent", actor: "ops", evidence: "SMS log" })
            .catch((e: unknown) => e);
          expect(refused).toBeInstanceOf(InvalidValueError);
          expect((refused as InvalidValueError).message).toMatch(/run idem migrate/);
          expect((await ledger.get({ tenant, id })).operation.status).toBe("needs_review");
          // Without evidence, this one is refused too: it may have committed, so its retry is looked
          // up first, and the ledger records that only from 0012 on.
          await expect(ledger.admin.retry({ tenant, id, reason: "not sent", actor: "ops" })).rejects.toMatchObject({
            // Before: an InvalidTransitionError, as if its status did not take a retry.
            name: "LedgerConfigError",
            code: "LEDGER_CONFIG",
            message: expect.stringMatching(/looked up first.*run idem migrate/),
          });
          expect((await ledger.get({ tenant, id })).operation.status).toBe("needs_review");
          // A failed operation's retry (the provider refused it: nothing to look for) is decided as ever.
          const p = new TestProvider();
          p.faults.push({ when: "before", cls: { kind: "permanent", reason: "400 invalid number" } });
          const refusedOp = await ledger.run(p.action("sms", {}), { tenant, key: ["refused"], args: { to: "x" } });
          expect(refusedOp.status).toBe("failed");
          expect(
            await ledger.admin.retry({ tenant, id: refusedOp.operationId, reason: "number fixed", actor: "ops" }),
          ).toMatchObject({ status: "pending" });
          // Once migrated (by this process here), decided as ever, the look recorded.
          await ledger.admin.migrate();
          expect(await ledger.admin.retry({ tenant, id, reason: "not sent", actor: "ops" })).toMatchObject({
            status: "pending",
          });
        } finally {
          await ledger.close();
        }
      } finally {
        await bare.close();
      }
    });

    it("lists by status, action and age, newest first", async () => {
      const ledger = await db.open();
      const tenant = uniqueTenant();
      const p = new TestProvider();
      await ledger.run(p.action("mail", {}), { tenant, key: ["l1"], args: { to: "x" } });
      await ledger.run(p.action("charge", {}), { tenant, key: ["l2"], args: { to: "x" } });
      await parked(ledger, tenant, "l3");
      expect((await ledger.admin.list({ tenant })).map((o) => o.action)).toEqual(["sms", "charge", "mail"]);
      expect((await ledger.admin.list({ tenant, status: "succeeded" })).map((o) => o.action)).toEqual([
        "charge",
        "mail",
      ]);
      expect(await ledger.admin.list({ tenant, status: ["needs_review"], action: "sms" })).toHaveLength(1);
      expect(await ledger.admin.list({ tenant, olderThanMs: 3_600_000 })).toEqual([]);
      expect(await ledger.admin.list({ tenant, limit: 1 })).toHaveLength(1);
    });

    it("lists the operations of several tenants, or of every tenant, newest first and a page at a time", async () => {
      const ledger = await db.open();
      const [a, b, c] = [uniqueTenant(), uniqueTenant(), uniqueTenant()];
      const p = new TestProvider();
      const made: Record<string, string[]> = { [a]: [], [b]: [], [c]: [] };
      for (const [tenant, n] of [
        [a, 2],
        [b, 2],
        [c, 1],
      ] as const) {
        for (let i = 0; i < n; i++)
          made[tenant]!.push(
            (await ledger.run(p.action("mail", {}), { tenant, key: [`m${i}`], args: { to: "x" } })).operationId,
          );
      }
      const newestFirst = (ids: string[]) => [...ids].sort().reverse(); // ids are time-ordered
      const ids = (ops: { id: string }[]) => ops.map((o) => o.id);

      const ofAB = await ledger.admin.list({ tenant: [a, b] });
      expect(ids(ofAB)).toEqual(newestFirst([...made[a]!, ...made[b]!]));
      expect(new Set(ofAB.map((o) => o.tenant))).toEqual(new Set([a, b]));
      const firstPage = await ledger.admin.list({ tenant: [a, b], limit: 3 });
      const nextPage = await ledger.admin.list({ tenant: [a, b], limit: 3, before: firstPage.at(-1)!.id });
      expect(ids([...firstPage, ...nextPage])).toEqual(ids(ofAB));
      expect(nextPage).toHaveLength(1);
      expect(await ledger.admin.list({ tenant: [] })).toEqual([]);

      // every tenant: ours among the earlier tests' rows, in id order, the same read a page at a time
      const all = await ledger.admin.list({ allTenants: true, limit: 1_000 });
      const ours = new Set([...made[a]!, ...made[b]!, ...made[c]!]);
      expect(ids(all.filter((o) => ours.has(o.id)))).toEqual(newestFirst([...ours]));
      expect(ids(all)).toEqual(newestFirst(ids(all)));
      expect(all.length).toBeGreaterThan(ours.size);
      const paged: string[] = [];
      for (
        let page = await ledger.admin.list({ allTenants: true, limit: 2 });
        page.length > 0;
        page = await ledger.admin.list({ allTenants: true, limit: 2, before: page.at(-1)!.id })
      ) {
        expect(page.length).toBeLessThanOrEqual(2);
        paged.push(...ids(page));
      }
      expect(paged).toEqual(ids(all));
    });

    it("prunes only completed operations past retention, with their events", async () => {
      const ledger = await db.open({ retentionMs: 0 });
      const tenant = uniqueTenant();
      await ledger.run(new TestProvider().action("mail", {}), { tenant, key: ["p1"], args: { to: "x" } });
      const { id } = await parked(ledger, tenant, "p2");
      expect(await ledger.admin.prune({ tenant })).toBe(1);
      expect(await countRows(ledger, dialect, tenant)).toEqual({
        ops: 1,
        events: (await ledger.get({ tenant, id })).events.length,
      });
      const keep = await db.open(); // default retention: 30 days
      await keep.run(new TestProvider().action("mail", {}), { tenant, key: ["p3"], args: { to: "x" } });
      expect(await keep.admin.prune({ tenant })).toBe(0);
    });

    it("admin.now reads the database's clock, the one rows are written on", async () => {
      const ledger = await db.open();
      const tenant = uniqueTenant();
      const before = await ledger.admin.now();
      const out = await ledger.run(new TestProvider().action("mail", {}), { tenant, key: ["now"], args: { to: "x" } });
      const after = await ledger.admin.now();
      const { createdAt } = (await ledger.get({ tenant, id: out.operationId })).operation;
      expect(Number.isInteger(before)).toBe(true);
      expect(before).toBeLessThanOrEqual(createdAt);
      expect(createdAt).toBeLessThanOrEqual(after);
      // The database and this host share a clock here: within a minute of each other.
      expect(Math.abs(after - Date.now())).toBeLessThan(60_000);
    });

    it("does not prune a completed operation whose alert is still due: a person hears of it first", async () => {
      // Before: a failure alerted (a revoked key) or a success with two effects, past its
      // retention while the daemon or its alert sink was down, was deleted with its alert unsent.
      const ledger = await db.open({ retentionMs: 0 });
      const tenant = uniqueTenant();
      const p = new TestProvider();
      p.faults.push({ when: "before", cls: { kind: "permanent", reason: "401 invalid token", alert: true } });
      const out = await ledger.run(p.action("mail", {}), { tenant, key: ["alerted"], args: { to: "x" } });
      expect(out).toMatchObject({ status: "failed", error: { alert: true } });
      const [due] = (await ledger.daemon.alertsDue({ limit: 100 })).filter((a) => a.id === out.operationId);
      expect(due).toBeDefined();
      expect(await ledger.admin.prune({ tenant })).toBe(0);
      expect((await ledger.get({ tenant, id: out.operationId })).operation.status).toBe("failed");
      // Delivered and acknowledged: pruned as any other.
      await ledger.daemon.ackAlert(due!);
      expect(await ledger.admin.prune({ tenant })).toBe(1);
    });

    it("keeps an operation for the retention of the ledger that claimed it, whoever completes it", async () => {
      // The application keeps its operations; the daemon and a person (idem resolve) open the
      // ledger with another retention. Their completion must not make the key prunable, or a
      // redelivered job runs again once it is pruned.
      const p = new TestProvider();
      const mail = p.action("mail", { lookup: true });
      const app = await db.open({ retentionMs: null, actions: [mail] });
      const operators = await db.open({ retentionMs: 0, actions: [mail] });
      const tenant = uniqueTenant();
      p.lookupAnswer = "inconclusive";
      p.faults.push({ when: "after", cls: { kind: "ambiguous", reason: "timeout" } });
      const unknown = await app.run(mail, { tenant, key: ["kept1"], args: { to: "x" } });
      expect(unknown).toMatchObject({ state: "unknown" });
      p.lookupAnswer = "real";
      expect(await operators.daemon.settle({ tenant, id: unknown.operationId })).toMatchObject({ status: "succeeded" });
      const { id } = await parked(app, tenant, "kept2");
      await operators.admin.resolve({ tenant, id, outcome: "failed", reason: "never sent", actor: "ann" });
      for (const op of [unknown.operationId, id])
        expect((await operators.get({ tenant, id: op })).operation).toMatchObject({ expiresAt: null });
      expect(await operators.admin.prune({ tenant })).toBe(0);
      expect(await app.run(mail, { tenant, key: ["kept1"], args: { to: "x" } })).toMatchObject({ replayed: true });
      expect(p.effects).toHaveLength(1);

      // And the converse: an operation claimed to be pruned is, whoever completes it.
      const short = await db.open({ retentionMs: 0, actions: [mail] });
      const forever = await db.open({ retentionMs: null, actions: [mail] });
      const { id: brief } = await parked(short, tenant, "brief");
      await forever.admin.resolve({ tenant, id: brief, outcome: "failed", reason: "never sent", actor: "ann" });
      expect((await forever.get({ tenant, id: brief })).operation.expiresAt).not.toBeNull();
      expect(await forever.admin.prune({ tenant })).toBe(1);

      // A row claimed before migration 0007 recorded none: the completer's retention applies.
      const { id: old } = await parked(app, tenant, "old");
      await sql`update idem_operations set retention_ms = null where id = ${old}`.execute(databaseOf(app));
      await operators.admin.resolve({ tenant, id: old, outcome: "failed", reason: "never sent", actor: "ann" });
      expect(await operators.admin.prune({ tenant })).toBe(1);
      await expect(app.get({ tenant, id: old })).rejects.toBeInstanceOf(OperationNotFoundError);
    });

    // Postgres only (not defined on SQLite, where a statement runs alone on the file and no row
    // changes under it).
    if (dialect === "postgres")
      it("prune leaves a row an operator sent back to pending while the prune waited for its lock", async () => {
        const ledger = await db.open({ retentionMs: 0 });
        const tenant = uniqueTenant();
        const p = new TestProvider();
        p.faults.push({ when: "before", cls: { kind: "permanent", reason: "declined" } });
        const out = await ledger.run(p.action("charge", {}), { tenant, key: ["k"], args: { to: "x" } });
        expect(out.status).toBe("failed");
        const { default: pg } = await import("pg");
        const other = new pg.Client({ connectionString: db.url() });
        await other.connect();
        try {
          // What admin.retry writes (failed to pending), uncommitted while the prune starts.
          await other.query("begin");
          await other.query(
            "update idem_operations set status = 'pending', maybe_committed = 0, expires_at = null, completed_at = null where tenant_id = $1 and id = $2",
            [tenant, out.operationId],
          );
          const pruning = ledger.admin.prune({ tenant });
          const deadline = Date.now() + 30_000;
          for (;;) {
            const { rows } = await other.query<{ n: number }>(
              "select count(*)::int as n from pg_locks where not granted",
            );
            if (rows[0]!.n > 0) break; // the prune's DELETE waits for the row
            if (Date.now() > deadline) throw new Error("the prune never waited for the row's lock");
            await new Promise((r) => setTimeout(r, 20));
          }
          await other.query("commit");
          expect(await pruning).toBe(0);
        } finally {
          await other.end();
        }
        expect((await ledger.get({ tenant, id: out.operationId })).operation.status).toBe("pending");
      });

    it("refuses an action type the tenant may not run, before anything is written", async () => {
      const tenant = uniqueTenant();
      const ledger = await db.open({ allowedActions: { [tenant]: ["mail"], "*": [] } });
      const p = new TestProvider();
      await expect(
        ledger.run(p.action("charge", {}), { tenant, key: ["g"], args: { to: "x" } }),
      ).rejects.toBeInstanceOf(GuardrailError);
      await expect(
        ledger.run(p.action("mail", {}), { tenant: uniqueTenant(), key: ["g"], args: { to: "x" } }),
      ).rejects.toBeInstanceOf(GuardrailError);
      expect(await ledger.run(p.action("mail", {}), { tenant, key: ["g"], args: { to: "x" } })).toMatchObject({
        status: "succeeded",
      });
      expect(p.calls).toBe(1);
      expect(await countRows(ledger, dialect, tenant)).toEqual({ ops: 1, events: 2 });
    });

    it("refuses non-JSON args before writing anything", async () => {
      const ledger = await db.open();
      const tenant = uniqueTenant();
      const send = new TestProvider().action("mail", {});
      const cyclic: Record<string, unknown> = { to: "x" };
      cyclic.self = cyclic;
      await expect(ledger.run(send, { tenant, key: ["b1"], args: { to: "x", n: 10n } as never })).rejects.toThrow(
        /args\.n: BigInt/,
      );
      await expect(ledger.run(send, { tenant, key: ["b2"], args: cyclic as never })).rejects.toBeInstanceOf(
        InvalidValueError,
      );
      await expect(ledger.run(send, { tenant, key: [new Date()], args: { to: "x" } })).rejects.toBeInstanceOf(
        InvalidValueError,
      );
      expect(await countRows(ledger, dialect, tenant)).toEqual({ ops: 0, events: 0 });
    });

    it("refuses args over the configured size before writing anything", async () => {
      const ledger = await db.open({ maxArgsBytes: 1_000 });
      const tenant = uniqueTenant();
      const err = await ledger
        .run(new TestProvider().action("mail", {}), { tenant, key: ["big"], args: { to: "x".repeat(2_000) } })
        .catch((e: unknown) => e);
      expect(err).toBeInstanceOf(PayloadTooLargeError);
      expect(err).toMatchObject({ what: "args", limit: 1_000 });
      expect(await countRows(ledger, dialect, tenant)).toEqual({ ops: 0, events: 0 });
    });

    it("parks an effect whose receipt is over the size for review, and says so", async () => {
      const ledger = await db.open({ maxResultBytes: 100 });
      const tenant = uniqueTenant();
      const { defineAction } = await import("@idem/core");
      let effects = 0;
      const bloated = defineAction({
        type: "bloated",
        capabilities: {},
        execute: async () => {
          effects++;
          return { blob: "y".repeat(500) };
        },
      });
      const err = await ledger.run(bloated, { tenant, key: ["r"], args: {} }).catch((e: unknown) => e);
      expect(err).toBeInstanceOf(PayloadTooLargeError);
      // What a caller (a model) reads says the effect happened, not only that a value was too big.
      expect((err as Error).message).toMatch(
        /^result is \d+ bytes, over the limit of 100 \(operation op_\w+\): the effect happened; its receipt cannot be kept \(maxResultBytes\)/,
      );
      const [op] = await ledger.admin.list({ tenant });
      expect(op).toMatchObject({ status: "needs_review", result: null, error: { kind: "invalid_result" } });
      // never run again in silence
      const again = await ledger.run(bloated, { tenant, key: ["r"], args: {} });
      expect(again).toMatchObject({ status: "pending_verification", state: "needs_review" });
      expect(effects).toBe(1);
    });

    it("settling a stored operation of an unregistered action type is a typed error; the row is untouched", async () => {
      const ledger = await db.open({ actions: [] });
      const tenant = uniqueTenant();
      const { id } = await parked(ledger, tenant, "u1");
      const before = await ledger.get({ tenant, id });
      const err = await ledger.daemon.settle({ tenant, id }).catch((e: unknown) => e);
      expect(err).toBeInstanceOf(UnknownActionError);
      expect(err).toMatchObject({ action: "sms", operationId: id });
      expect(await ledger.get({ tenant, id })).toEqual(before);
    });

    it("an unknown outcome of an unregistered action type past the daemon's limits goes to a person, alerted; before them, untouched", async () => {
      // helper-72's review: settle threw before its escalation, so such a row stayed unknown for
      // ever, its checks 0, no alert, out of the console's queue, an agent told "pending".
      let now = Date.now();
      const app = await db.open({ budget: { attempts: 1 } });
      const tenant = uniqueTenant();
      const p = new TestProvider();
      p.faults.push({ when: "after", cls: { kind: "ambiguous", reason: "timeout" } });
      const out = await app.run(p.action("crm.note", { lookup: true }), { tenant, key: ["n"], args: { to: "x" } });
      expect(out).toMatchObject({ state: "unknown" });
      const daemon = await db.open({ actions: [], clock: () => now });
      const escalate = { maxChecks: 5, maxAgeMs: HOUR };
      const early = await daemon.daemon.settle({ tenant, id: out.operationId, escalate }).catch((e: unknown) => e);
      expect(early).toBeInstanceOf(UnknownActionError);
      expect((await daemon.get({ tenant, id: out.operationId })).operation.status).toBe("unknown");
      now += 2 * HOUR;
      const late = await daemon.daemon.settle({ tenant, id: out.operationId, actor: "daemon", escalate });
      expect(late).toMatchObject({
        status: "pending_verification",
        state: "needs_review",
        reason: expect.stringMatching(/^still unknown after .*no action of type crm\.note/),
      });
      expect(late.status === "pending_verification" && isEscalation(late.reason)).toBe(true);
      expect((await daemon.daemon.alertsDue({ limit: 100 })).map((a) => a.id)).toContain(out.operationId);
      expect(p.effects).toHaveLength(1);
    });

    it("a pending operation of an unregistered action type past the daemon's limits goes to a person, alerted; before them, untouched", async () => {
      // helper-76's review: only unknown outcomes were escalated, so a pending one threw at every
      // claim for ever, no alert, while its agent was told the daemon or a later call would retry.
      let now = Date.now();
      const app = await db.open({ budget: { attempts: 1 } });
      const tenant = uniqueTenant();
      const p = new TestProvider();
      p.faults.push({ when: "before", cls: { kind: "transient", reason: "503 before execution" } });
      const out = await app.run(p.action("crm.task", {}), { tenant, key: ["t"], args: { to: "x" } });
      expect(out).toMatchObject({ state: "pending" });
      const daemon = await db.open({ actions: [], clock: () => now });
      const escalate = { maxChecks: 5, maxAgeMs: HOUR };
      const early = await daemon.daemon.settle({ tenant, id: out.operationId, escalate }).catch((e: unknown) => e);
      expect(early).toBeInstanceOf(UnknownActionError);
      expect((await daemon.get({ tenant, id: out.operationId })).operation.status).toBe("pending");
      now += 2 * HOUR;
      const late = await daemon.daemon.settle({ tenant, id: out.operationId, actor: "daemon", escalate });
      expect(late).toMatchObject({
        status: "pending_verification",
        state: "needs_review",
        reason: expect.stringMatching(
          /^still not done after 2 h since its last attempt \(1 try the provider refused for now\), and no action of type crm\.task is registered to run it/,
        ),
      });
      // An escalation as any other: `idem_escalations_total` counts it (apps/idem escalations.test).
      expect(late.status === "pending_verification" && isEscalation(late.reason)).toBe(true);
      expect((await daemon.daemon.alertsDue({ limit: 100 })).map((a) => a.id)).toContain(out.operationId);
      expect(p.effects).toHaveLength(0);
    });

    it("a pending operation of an unregistered action type whose args are not stored is left to its caller past the limits, as decide() leaves it", async () => {
      // helper-136: the daemon with the action answers "a caller with the args must run it again"
      // and parks nothing; without the action it sent the row to a person, so the caller's own
      // later call (the only one that can run it) found it waiting for a person.
      let now = Date.now();
      const app = await db.open({ budget: { attempts: 1 } });
      const tenant = uniqueTenant();
      const p = new TestProvider();
      p.faults.push({ when: "before", cls: { kind: "transient", reason: "503 before execution" } });
      const action = p.action("crm.private", {});
      const out = await app.run(action, { tenant, key: ["t"], args: { to: "x" }, storeArgs: false });
      expect(out).toMatchObject({ state: "pending" });
      const daemon = await db.open({ actions: [], clock: () => now });
      now += 2 * HOUR;
      const late = await daemon.daemon
        .settle({ tenant, id: out.operationId, actor: "daemon", escalate: { maxChecks: 5, maxAgeMs: HOUR } })
        .catch((e: unknown) => e);
      expect(late).toBeInstanceOf(UnknownActionError);
      expect((await daemon.get({ tenant, id: out.operationId })).operation.status).toBe("pending");
      // Its caller, with the args, runs it.
      const again = await app.run(action, { tenant, key: ["t"], args: { to: "x" }, storeArgs: false });
      expect(again).toMatchObject({ status: "succeeded" });
      expect(p.effects).toHaveLength(1);
    });

    it("the daemon never claims a pending operation whose args are not stored: only its caller can run it", async () => {
      // helper-142: such a row was claimed every claimMs, for ever, to answer "a caller with the
      // args must run it again" (a daemon lacking the action counted an error each time).
      let now = Date.now();
      const app = await db.open({ budget: { attempts: 1 } });
      const tenant = uniqueTenant();
      const p = new TestProvider();
      const action = p.action("crm.unstored", {});
      const pending = async (key: string, storeArgs: boolean) => {
        p.faults.push({ when: "before", cls: { kind: "transient", reason: "503 before execution" } });
        const out = await app.run(action, { tenant, key: [key], args: { to: key }, storeArgs });
        expect(out).toMatchObject({ state: "pending" });
        return out.operationId;
      };
      const unstored = await pending("unstored", false);
      const stored = await pending("stored", true);
      const daemon = await db.open({ actions: [action], clock: () => now });
      const ours = async () =>
        (await daemon.daemon.claimDue({ limit: 1_000, claimMs: 60_000 }))
          .filter((c) => c.tenant === tenant)
          .map((c) => c.id);
      for (let round = 0; round < 3; round++) {
        now += 2 * HOUR; // every claim long expired
        expect(await ours()).toEqual(round === 0 ? [stored] : []);
        if (round === 0) await daemon.daemon.settle({ tenant, id: stored, actor: "daemon" });
      }
      expect((await daemon.get({ tenant, id: stored })).operation.status).toBe("succeeded");
      expect((await daemon.get({ tenant, id: unstored })).operation.status).toBe("pending");
      // Its caller, with the args, runs it.
      expect(
        await app.run(action, { tenant, key: ["unstored"], args: { to: "unstored" }, storeArgs: false }),
      ).toMatchObject({
        status: "succeeded",
      });
      expect(p.effects).toHaveLength(2);
    });

    it("an old operation's first unknown outcome is looked up before a person is asked: the escalation's age counts from its last execution", async () => {
      // The review of 66d1b33: the age counted from the operation's creation, so an operation known
      // not done for a day, then run (its answer lost), went to a person on the daemon's first look,
      // "still unknown after 0 inconclusive checks", without one lookup.
      let now = Date.now();
      const p = new TestProvider();
      const action = p.action("mail.age", { lookup: true });
      const ledger = await db.open({ clock: () => now, actions: [action], budget: { attempts: 1 } });
      const tenant = uniqueTenant();
      p.faults.push({ when: "before", cls: { kind: "transient", reason: "503 before execution" } });
      expect(await ledger.run(action, { tenant, key: ["k"], args: { to: "x" } })).toMatchObject({ state: "pending" });
      now += 25 * HOUR; // nobody ran it again for a day
      p.faults.push({ when: "after", cls: { kind: "ambiguous", reason: "timeout" } }); // it commits, the answer is lost
      const out = await ledger.run(action, { tenant, key: ["k"], args: { to: "x" } });
      expect(out).toMatchObject({ state: "unknown" });
      // The daemon's first look, with the command's default limits (20 checks, 24 h).
      const escalate = { maxChecks: 20, maxAgeMs: 24 * HOUR };
      const settled = await ledger.daemon.settle({ tenant, id: out.operationId, actor: "daemon", escalate });
      expect(settled).toMatchObject({ status: "succeeded", receipt: { id: "obj_1" } });
      expect(p.effects).toHaveLength(1);
    });

    it("claimDue claims at most the batch and hides claimed rows from another daemon", async () => {
      // A database of its own: claimDue works across tenants, so other tests' due rows would take the batch.
      const url = await freshDatabase(dialect);
      const tenant = uniqueTenant();
      const agent = await openTestLedger(url, { budget: { attempts: 1, baseDelayMs: 20 } });
      const p = new TestProvider();
      p.lookupAnswer = "inconclusive";
      for (let i = 0; i < 6; i++) {
        p.faults.push({ when: "after", cls: { kind: "ambiguous", reason: "timeout" } });
        await agent.run(p.action("mail", { lookup: true }), { tenant, key: [`c${i}`], args: { to: "x" } });
      }
      // Two daemons whose database clock reads an hour later: every check is due.
      const later = () => openTestLedger(url, { clock: () => Date.now() + 3_600_000 });
      const [a, b] = [await later(), await later()];
      const mine = await a.daemon.claimDue({ limit: 2, claimMs: 60_000 });
      const theirs = await b.daemon.claimDue({ limit: 2, claimMs: 60_000 });
      await Promise.all([agent.close(), a.close(), b.close()]);
      expect(mine).toHaveLength(2);
      expect(theirs).toHaveLength(2);
      expect(new Set([...mine, ...theirs].map((r) => r.id)).size).toBe(4);
    });

    it("counts a lookup's settle window from the last execution, not from the last inconclusive check", async () => {
      const seen: number[] = [];
      const mail = windowAction("mail.window", seen);
      const ledger = await db.open({ actions: [mail], budget: { attempts: 1 } });
      const tenant = uniqueTenant();
      const out = await ledger.run(mail, { tenant, key: ["w"], args: {} });
      // the run itself stopped at unknown (its budget is one execution); each settle checks once
      for (let i = 0; i < 3; i++) {
        await new Promise((r) => setTimeout(r, 30));
        await ledger.daemon.settle({ tenant, id: out.operationId });
      }
      expect(seen).toHaveLength(3);
      expect(new Set(seen).size).toBe(1);
    });

    it("keeps a dead worker's lease end as the settle window's start through later checks (it may have sent until then)", async () => {
      const seen: number[] = [];
      const mail = windowAction("mail.dead-window", seen);
      const ledger = await db.open({ actions: [mail], budget: { attempts: 1 } });
      const tenant = uniqueTenant();
      const out = await ledger.run(mail, { tenant, key: ["d"], args: {} });
      seen.length = 0;
      // As a worker leaves it that began sending 100 s ago, kept its lease by heartbeats for 70 s
      // while the send hung, and died: running, its lease ended 30 s ago.
      const began = Date.now() - 100_000;
      const leaseEnd = began + 70_000;
      await databaseOf(ledger)
        .updateTable("idem_operations")
        .set({ status: "running", lease_expires_at: leaseEnd, last_execution_at: began, created_at: began })
        .where("tenant_id", "=", tenant)
        .where("id", "=", out.operationId)
        .execute();
      for (let i = 0; i < 3; i++) await ledger.daemon.settle({ tenant, id: out.operationId });
      // Each check counts from the lease's end, not only the first: the second counted from when
      // the send began, 70 s earlier, so an absence it could not yet prove looked proven.
      expect(seen).toEqual([leaseEnd, leaseEnd, leaseEnd]);
    });

    it("a replay whose providerReference throws, after an attempt that may have sent: a person decides, once", async () => {
      const { defineAction } = await import("@idem/core");
      let sends = 0;
      const charge = defineAction({
        type: "charge.no-ref",
        capabilities: { dedupe: { retentionMs: 24 * 3_600_000 } },
        providerReference: () => {
          throw new TypeError("reference unavailable");
        },
        execute: async () => {
          sends += 1;
          return { ok: true };
        },
      });
      const ledger = await db.open({ actions: [charge] });
      const tenant = uniqueTenant();
      const first = await ledger.run(charge, { tenant, key: ["no-ref"], args: {} });
      expect(first).toMatchObject({ status: "failed" });
      // As a dead worker of an older version leaves it: sent without a reference, outcome unknown.
      await databaseOf(ledger)
        .updateTable("idem_operations")
        .set({ status: "unknown", maybe_committed: 1, completed_at: null, expires_at: null, error_json: null })
        .where("tenant_id", "=", tenant)
        .where("id", "=", first.operationId)
        .execute();
      const settled = await ledger.daemon.settle({ tenant, id: first.operationId });
      expect(settled).toMatchObject({ status: "pending_verification", state: "needs_review" });
      expect(sends).toBe(0);
    });

    it("settles a stored unknown operation with its stored args (the daemon's path)", async () => {
      const p = new TestProvider();
      const mail = p.action("mail", { lookup: true });
      const ledger = await db.open({ actions: [mail] });
      const tenant = uniqueTenant();
      p.lookupAnswer = "inconclusive";
      p.faults.push({ when: "after", cls: { kind: "ambiguous", reason: "timeout" } });
      const out = await ledger.run(mail, { tenant, key: ["s1"], args: { to: "x" } });
      expect(out).toMatchObject({ state: "unknown" });
      p.lookupAnswer = "real"; // the index caught up
      const settled = await ledger.daemon.settle({ tenant, id: out.operationId, actor: "daemon" });
      expect(settled).toMatchObject({ status: "succeeded", receipt: { id: "obj_1" } });
      expect(p.effects).toHaveLength(1);
    });
  });

  describe(`opening a ${dialect} ledger`, () => {
    const db = ledgers(dialect);
    it("carries a 0001 ledger into 0002: rows unchanged, audit events in their order", async () => {
      const url = await freshDatabase(dialect);
      const bare = await openLedger(url, { migrate: false });
      // The ledger as 0001 left it, written by 0001's own SQL and triggers.
      await new Migrator({
        db: databaseOf(bare),
        migrationTableName: "idem_migration",
        migrationLockTableName: "idem_migration_lock",
        provider: {
          getMigrations: async () => ({
            "0001-init": {
              up: async (k) => {
                for (const q of m0001[dialect]) await sql.raw(q).execute(k);
              },
            },
          }),
        },
      }).migrateToLatest();
      const insert = `INSERT INTO idem_operations (id, tenant_id, key, key_label, action, args_hash, args_json, status, attempt, lease_owner, lease_expires_at, actor, reason, checks, created_at, updated_at, last_execution_at)
        VALUES ('op_old1', 'acme', 'k1', '["a"]', 'mail', 'h1', '{"to":"x"}', 'running', 1, 'w', 100, 'agent', 'claimed', 0, 10, 10, 10)`;
      await sql.raw(insert).execute(databaseOf(bare));
      await sql
        .raw(`UPDATE idem_operations SET status = 'unknown', reason = 'timeout', updated_at = 20 WHERE id = 'op_old1'`)
        .execute(databaseOf(bare));
      await sql
        .raw(
          `INSERT INTO idem_events (operation_id, tenant_id, from_status, to_status, attempt, actor, reason, at) VALUES ('op_old1', 'acme', 'unknown', 'unknown', 1, 'w2', 'fenced: a note', 25)`,
        )
        .execute(databaseOf(bare));
      await sql
        .raw(
          `UPDATE idem_operations SET status = 'succeeded', result_json = '{"id":"m1"}', reason = 'reconciled', updated_at = 30, completed_at = 30 WHERE id = 'op_old1'`,
        )
        .execute(databaseOf(bare));
      expect(await bare.admin.migrate()).toEqual([
        "0002-lean-rows",
        "0003-sticky-maybe-committed",
        "0004-resolutions",
        "0005-claim-writes-its-event",
        "0006-operator-indexes",
        "0007-retention-per-operation",
        "0008-daemon-heartbeats",
        "0009-first-execution",
        "0010-transitions-write-their-event",
        "0011-due-rows-have-args",
        "0012-look-first-after-retry",
        "0013-rerun-attempt",
      ]);
      const { operation, events } = await bare.get({ tenant: "acme", id: "op_old1" });
      expect(operation).toMatchObject({
        id: "op_old1",
        key: "k1",
        keyLabel: '["a"]',
        status: "succeeded",
        result: { id: "m1" },
        argsHash: "h1",
        createdAt: 10,
        completedAt: 30,
      });
      expect(events.map((e) => [e.id, e.from, e.to, e.reason, e.at])).toEqual([
        [1, null, "running", "claimed", 10],
        [2, "running", "unknown", "timeout", 20],
        [3, "unknown", "unknown", "fenced: a note", 25],
        [4, "unknown", "succeeded", "reconciled", 30],
      ]);
      await expect(bare.get({ tenant: "other", id: "op_old1" })).rejects.toBeInstanceOf(OperationNotFoundError);
      // and the new triggers keep appending
      const resolved = await bare.run(new TestProvider().action("mail", {}), {
        tenant: "acme",
        key: ["fresh"],
        args: { to: "x" },
      });
      expect((await bare.get({ tenant: "acme", id: resolved.operationId })).events.map((e) => e.to)).toEqual([
        "running",
        "succeeded",
      ]);
      await bare.close();
    });

    it("carries a 0003 ledger into 0004: a person's old verdict leaves the receipt for the resolution", async () => {
      const url = await freshDatabase(dialect);
      const bare = await openLedger(url, { migrate: false });
      // The ledger as 0003 left it, with rows as resolve and the runner wrote them then.
      await new Migrator({
        db: databaseOf(bare),
        migrationTableName: "idem_migration",
        migrationLockTableName: "idem_migration_lock",
        provider: migrationProvider(dialect),
      }).migrateTo("0003-sticky-maybe-committed");
      expect(await bare.admin.pendingMigrations()).toEqual([
        "0004-resolutions",
        "0005-claim-writes-its-event",
        "0006-operator-indexes",
        "0007-retention-per-operation",
        "0008-daemon-heartbeats",
        "0009-first-execution",
        "0010-transitions-write-their-event",
        "0011-due-rows-have-args",
        "0012-look-first-after-retry",
        "0013-rerun-attempt",
      ]);
      const columns =
        "id, tenant_id, key, action, status, attempt, provider_reference, result_json, error_json, actor, reason, created_at, updated_at, completed_at";
      await sql
        .raw(`INSERT INTO idem_operations (${columns}) VALUES
        ('op_res1', 'acme', 'k1', 'charge', 'succeeded', 1, 'ch_1', '{"reference":"ch_1","resolvedBy":"ann"}', NULL, 'ann', 'resolved by a person: checked', 10, 40, 40),
        ('op_res2', 'acme', 'k2', 'charge', 'failed', 1, NULL, NULL, '{"kind":"permanent","reason":"resolved by a person: never sent"}', 'bob', 'resolved by a person: never sent', 10, 50, 50),
        ('op_run1', 'acme', 'k3', 'charge', 'succeeded', 1, 'ch_3', '{"id":"ch_3"}', NULL, 'agent', 'reconciled', 10, 60, 60),
        ('op_res3', 'acme', 'k4', 'charge', 'succeeded', 1, NULL, '{"reference":"r","resolvedBy":"ann","total":5}', NULL, 'ann', 'resolved by a person: gave the receipt', 10, 70, 70),
        ('op_res4', 'acme', 'k5', 'charge', 'succeeded', 1, NULL, '["a","b"]', NULL, 'ann', 'resolved by a person: gave a list', 10, 80, 80)`)
        .execute(databaseOf(bare));
      await bare.close();

      const ledger = await openLedger(url); // migrates on open
      expect(await ledger.admin.pendingMigrations()).toEqual([]);
      const { operation } = await ledger.get({ tenant: "acme", id: "op_res1" });
      expect(operation).toMatchObject({
        status: "succeeded",
        providerReference: "ch_1",
        result: null,
        completedAt: 40,
      });
      expect(operation.resolution).toEqual({
        outcome: "succeeded",
        actor: "ann",
        reason: "checked",
        evidence: "ch_1",
        at: operation.completedAt,
      });
      expect(await ledger.status({ tenant: "acme", id: "op_res1" })).toEqual({
        status: "succeeded",
        receipt: null,
        replayed: true,
        operationId: "op_res1",
        attempt: 1,
        resolution: operation.resolution,
      });
      const failed = (await ledger.get({ tenant: "acme", id: "op_res2" })).operation;
      expect(failed).toMatchObject({
        status: "failed",
        error: { kind: "permanent" },
        resolution: { outcome: "failed", actor: "bob", reason: "never sent", evidence: null, at: 50 },
      });
      // receipts a person gave that only look like the old verdict, or are not objects, are kept as they are
      expect((await ledger.get({ tenant: "acme", id: "op_res3" })).operation).toMatchObject({
        result: { reference: "r", resolvedBy: "ann", total: 5 },
        resolution: { outcome: "succeeded", actor: "ann", reason: "gave the receipt", evidence: null },
      });
      expect((await ledger.get({ tenant: "acme", id: "op_res4" })).operation).toMatchObject({
        result: ["a", "b"],
        resolution: { outcome: "succeeded", reason: "gave a list" },
      });
      // a row no person decided keeps its receipt and has no resolution
      expect((await ledger.get({ tenant: "acme", id: "op_run1" })).operation).toMatchObject({
        result: { id: "ch_3" },
        resolution: null,
      });
      await ledger.close();
    });

    it("runs the same through kysely's own driver (a Dialect given) and, on Postgres, without prepared statements", async () => {
      const url = await freshDatabase(dialect);
      const opened: Ledger[] = [];
      if (dialect === "sqlite") {
        const { default: Database } = await import("better-sqlite3");
        opened.push(await openLedger(new SqliteDialect({ database: new Database(url.slice("sqlite:".length)) })));
      } else {
        const { default: pg } = await import("pg");
        opened.push(await openLedger(new PostgresDialect({ pool: new pg.Pool({ connectionString: url, max: 2 }) })));
        opened.push(await openLedger(url, { preparedStatements: false, poolSize: 2 }));
      }
      try {
        for (const [n, ledger] of opened.entries()) {
          const tenant = uniqueTenant();
          const p = new TestProvider();
          const first = await ledger.run(p.action("mail", {}), { tenant, key: ["d", n], args: { to: "x" } });
          const again = await ledger.run(p.action("mail", {}), { tenant, key: ["d", n], args: { to: "x" } });
          expect(first).toMatchObject({ status: "succeeded", replayed: false });
          expect(again).toMatchObject({ status: "succeeded", replayed: true, operationId: first.operationId });
          expect(p.calls).toBe(1);
          await expect(
            ledger.run(p.action("mail", {}), { tenant, key: ["d", n], args: { to: "y" } }),
          ).rejects.toBeInstanceOf(ArgsMismatchError);
          const { operation, events } = await ledger.get({ tenant, id: first.operationId });
          expect(events.map((e) => e.to)).toEqual(["running", "succeeded"]);
          expect(operation.completedAt).toBeGreaterThanOrEqual(operation.createdAt);
        }
      } finally {
        for (const l of opened) await l.close();
      }
    });

    it("migrates once; reopening is a no-op; migrate: false leaves it to migrate()", async () => {
      const fresh = dialect === "sqlite" ? `sqlite:${(await import("@idem/testkit")).tempDir()}/m.db` : db.url();
      const bare = await openLedger(fresh, { migrate: false });
      if (dialect === "sqlite") {
        await expect(bare.admin.list({ tenant: "t" })).rejects.toThrow(/no such table/);
        expect(await bare.admin.migrate()).toEqual([
          "0001-init",
          "0002-lean-rows",
          "0003-sticky-maybe-committed",
          "0004-resolutions",
          "0005-claim-writes-its-event",
          "0006-operator-indexes",
          "0007-retention-per-operation",
          "0008-daemon-heartbeats",
          "0009-first-execution",
          "0010-transitions-write-their-event",
          "0011-due-rows-have-args",
          "0012-look-first-after-retry",
          "0013-rerun-attempt",
        ]);
      } else {
        await bare.admin.migrate();
      }
      expect(await bare.admin.migrate()).toEqual([]);
      await bare.close();
      const again = await openLedger(fresh);
      expect(await again.admin.list({ tenant: "t" })).toEqual([]);
      await again.close();
      await expect(again.admin.list({ tenant: "t" })).rejects.toBeInstanceOf(LedgerConfigError);
    });
  });
}

describe("bad ledger URLs", () => {
  it.each([
    ["mysql://x", /unsupported ledger URL/],
    ["sqlite:", /needs a path/],
    ["sqlite:/nonexistent-dir/x/idem.db", /cannot open SQLite ledger/],
    ["postgres://nobody:secret@127.0.0.1:1/db", /cannot connect to Postgres ledger postgres:\/\/nobody:\*\*\*@/],
  ])("%s is a LedgerConfigError", async (url, message) => {
    const err = await openLedger(url).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(LedgerConfigError);
    expect((err as Error).message).toMatch(message);
    expect((err as Error).message).not.toContain("secret");
  });
});
