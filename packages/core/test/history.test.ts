/**
 * The audit history: one event per change of status or attempt, whoever writes it. Since
 * migration 0010 the ledger's own moves append their event in the statement that moves the row,
 * and the trigger writes it for any other statement (a takeover, a writer by hand); these tests
 * hold the two to the same event, and to one each.
 */
import { describe, expect, it } from "vitest";
import { Migrator, sql } from "kysely";
import { defineAction, openLedger, type Ledger } from "@idem/core";
import { databaseOf } from "@idem/core/testing";
import { DIALECTS, freshDatabase } from "@idem/testkit";
import { migrationProvider } from "../src/migrations/index.js";
import { contextOf } from "../src/ledger.js";
import { ledgers, uniqueTenant } from "./support/ledgers.js";
import { TestProvider } from "./support/provider.js";

/** The row's history as stored (its JSON text parsed, keys in their stored order), with the columns an event repeats. */
async function stored(ledger: Ledger, tenant: string, id: string) {
  const { rows } = await sql<{ history: unknown; updated_at: number | string; provider_reference: string | null }>`
    select history, updated_at, provider_reference from idem_operations where tenant_id = ${tenant} and id = ${id}`.execute(
    databaseOf(ledger),
  );
  const row = rows[0]!;
  const history = (typeof row.history === "string" ? JSON.parse(row.history) : row.history) as Record<
    string,
    unknown
  >[];
  return { history, updatedAt: Number(row.updated_at), ref: row.provider_reference };
}

/** An event of attempt 1, its fields in the order the trigger writes them. */
function firstAttempt(from: string, to: string, actor: string, reason: string, ref: string, at: number) {
  return { from, to, attempt: 1, actor, reason, ref, at };
}

for (const dialect of DIALECTS) {
  describe(`audit history on ${dialect}`, () => {
    const db = ledgers(dialect);
    // A reference written before the request is sent, after the claim: the completion's event
    // must name it, though the runner completes from the row as it was claimed.
    const referenced = defineAction({
      type: "history.referenced",
      capabilities: {},
      providerReference: (args: { n: number }) => `ref-${args.n}`,
      execute: async () => ({ ok: true }),
    });

    it("a guarded call's completion writes its event once, with the reference and time the row holds", async () => {
      const ledger = await db.open();
      const tenant = uniqueTenant();
      try {
        const out = await ledger.run(referenced, { tenant, key: ["a"], args: { n: 7 }, actor: "agent-1" });
        expect(out).toMatchObject({ status: "succeeded" });
        const { history, updatedAt, ref } = await stored(ledger, tenant, out.operationId);
        expect(ref).toBe("ref-7");
        expect(history).toHaveLength(2);
        expect(history[1]).toEqual(
          firstAttempt("running", "succeeded", "agent-1", "the effect happened", "ref-7", updatedAt),
        );
        const { events } = await ledger.get({ tenant, id: out.operationId });
        expect(events.map((e) => [e.from, e.to])).toEqual([
          [null, "running"],
          ["running", "succeeded"],
        ]);
      } finally {
        await ledger.close();
      }
    });

    it("the event's time is the row's new updated_at, also under a test clock that moves at every read", async () => {
      let t = 2_000_000_000_000;
      const ledger = await db.open({ clock: () => t++ });
      const tenant = uniqueTenant();
      try {
        const out = await ledger.run(referenced, { tenant, key: ["clock"], args: { n: 9 } });
        const { history, updatedAt } = await stored(ledger, tenant, out.operationId);
        expect(history.at(-1)!.at).toBe(updatedAt);
      } finally {
        await ledger.close();
      }
    });

    it("a statement that moves the row and leaves its history gets the same event from the trigger", async () => {
      const ledger = await db.open();
      const tenant = uniqueTenant();
      try {
        const out = await ledger.run(referenced, { tenant, key: ["b"], args: { n: 8 }, actor: "agent-1" });
        const before = await stored(ledger, tenant, out.operationId);
        // A writer by hand (an operator's SQL, a release before 0010): status moved, history untouched.
        await sql`update idem_operations set status = 'failed', actor = 'ops', reason = 'by hand', updated_at = updated_at + 5
          where tenant_id = ${tenant} and id = ${out.operationId}`.execute(databaseOf(ledger));
        const { history, updatedAt } = await stored(ledger, tenant, out.operationId);
        expect(history).toHaveLength(3);
        expect(history[2]).toEqual(firstAttempt("succeeded", "failed", "ops", "by hand", "ref-8", updatedAt));
        // Field for field as the ledger's own statement writes it: the same keys, in the same order.
        expect(Object.keys(history[2]!)).toEqual(Object.keys(before.history[1]!));
        // A statement that changes neither status nor attempt records nothing.
        await sql`update idem_operations set reason = 'a note' where tenant_id = ${tenant} and id = ${out.operationId}`.execute(
          databaseOf(ledger),
        );
        expect((await stored(ledger, tenant, out.operationId)).history).toHaveLength(3);
      } finally {
        await ledger.close();
      }
    });

    it("each move of an unknown outcome to a person's verdict is one event: the runner's and the person's", async () => {
      const ledger = await db.open();
      const tenant = uniqueTenant();
      try {
        const p = new TestProvider();
        p.faults.push({ when: "after", cls: { kind: "ambiguous", reason: "timeout" } });
        const out = await ledger.run(p.action("sms", {}), { tenant, key: ["c"], args: { to: "x" } });
        expect(out).toMatchObject({ state: "needs_review" });
        await ledger.admin.resolve({
          tenant,
          id: out.operationId,
          outcome: "succeeded",
          reason: "seen",
          actor: "ops:ann",
        });
        const { history, updatedAt } = await stored(ledger, tenant, out.operationId);
        const { events } = await ledger.get({ tenant, id: out.operationId });
        // Every event moves the row on from where the one before left it: none missing, none twice.
        for (let i = 1; i < events.length; i++) expect(events[i]!.from).toBe(events[i - 1]!.to);
        expect(events.map((e) => e.to)).toEqual(history.map((e) => e.to));
        expect(history.at(-1)).toMatchObject({ to: "succeeded", actor: "ops:ann", at: updatedAt });
        expect(history.map((e) => Object.keys(e))).toEqual(history.map(() => Object.keys(history[0]!)));
      } finally {
        await ledger.close();
      }
    });

    it("a ledger opened with migrate: false before 0010 leaves the events to the trigger until admin.migrate()", async () => {
      const url = await freshDatabase(dialect);
      const bare = await openLedger(url, { migrate: false });
      try {
        await new Migrator({
          db: databaseOf(bare),
          migrationTableName: "idem_migration",
          migrationLockTableName: "idem_migration_lock",
          provider: migrationProvider(dialect),
        }).migrateTo("0009-first-execution");
        // A guarded call on `ledger`, and the moves its history holds.
        const moves = async (ledger: Ledger, key: string) => {
          const out = await ledger.run(referenced, { tenant: "acme", key: [key], args: { n: 1 } });
          return (await stored(ledger, "acme", out.operationId)).history.map((e) => `${e.from}>${e.to}`);
        };
        // This process still sends the statements of before 0010: its moves left to the 0003 trigger, once each.
        const ledger = await openLedger(url, { migrate: false });
        try {
          expect(await ledger.admin.pendingMigrations()).toEqual([
            "0010-transitions-write-their-event",
            "0011-due-rows-have-args",
            "0012-look-first-after-retry",
            "0013-rerun-attempt",
          ]);
          expect(await moves(ledger, "before")).toEqual(["null>running", "running>succeeded"]);
          expect(contextOf(ledger).store.movesWriteEvents).toBe(false);
          expect(await ledger.admin.migrate()).toEqual([
            "0010-transitions-write-their-event",
            "0011-due-rows-have-args",
            "0012-look-first-after-retry",
            "0013-rerun-attempt",
          ]);
          expect(contextOf(ledger).store.movesWriteEvents).toBe(true); // its own statements write them now
          expect(await moves(ledger, "after")).toEqual(["null>running", "running>succeeded"]);
        } finally {
          await ledger.close();
        }
        // Migrated by another process meanwhile: still once each (the 0010 trigger writes what this one leaves).
        expect(await moves(bare, "other")).toEqual(["null>running", "running>succeeded"]);
      } finally {
        await bare.close();
      }
    });
  });
}
