import { describe, expect, it } from "vitest";
import { Migrator, PostgresDialect, SqliteDialect, sql } from "kysely";
import {
  ArgsMismatchError, GuardrailError, InvalidTransitionError, InvalidValueError, LedgerConfigError, OperationNotFoundError, PayloadTooLargeError,
  UnknownActionError, openLedger, type Ledger,
} from "@idem/core";
import { DIALECTS, freshDatabase } from "@idem/testkit";
import * as m0001 from "../src/migrations/0001-init.js";
import { ledgers, uniqueTenant } from "./support/ledgers.js";
import { TestProvider } from "./support/provider.js";

/** Rows and audit events (kept in each row's history) stored for the tenant, counted in SQL. */
async function countRows(ledger: { db: any; dialect: string }, tenant: string): Promise<{ ops: number; events: number }> {
  const length = ledger.dialect === "postgres" ? sql`jsonb_array_length(history)` : sql`json_array_length(history)`;
  const { rows } = await sql<{ ops: number; events: number | null }>`select count(*) as ops, sum(${length}) as events from idem_operations where tenant_id = ${tenant}`.execute(ledger.db);
  return { ops: Number(rows[0]!.ops), events: Number(rows[0]!.events ?? 0) };
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
      const done = await ledger.run(new TestProvider().action("mail", {}), { tenant: a, key: ["done"], args: { to: "x" } });
      await expect(ledger.get(b, id)).rejects.toBeInstanceOf(OperationNotFoundError);
      expect(await ledger.list({ tenant: b })).toEqual([]);
      await expect(ledger.resolve(b, id, { outcome: "succeeded", reason: "seen in provider", actor: "ops-b" })).rejects.toBeInstanceOf(OperationNotFoundError);
      await expect(ledger.retry(b, id, { reason: "x", actor: "ops-b" })).rejects.toBeInstanceOf(OperationNotFoundError);
      expect(await ledger.prune(b)).toBe(0);
      expect((await ledger.get(a, id)).operation.status).toBe("needs_review");
      expect((await ledger.get(a, done.operationId)).operation.status).toBe("succeeded");
      // the same key under another tenant is another operation
      const p = new TestProvider();
      await ledger.run(p.action("sms", {}), { tenant: b, key: ["k"], args: { to: "x" } });
      expect(p.effects).toHaveLength(1);
    });

    it("resolves needs_review with the person's verdict and records the actor", async () => {
      const ledger = await db.open();
      const tenant = uniqueTenant();
      const { id, provider } = await parked(ledger, tenant, "r1");
      const op = await ledger.resolve(tenant, id, { outcome: "succeeded", reason: "found in the SMS console", actor: "ops:alice", reference: "SM123" });
      expect(op).toMatchObject({ status: "succeeded", providerReference: "SM123" });
      const { events } = await ledger.get(tenant, id);
      expect(events.at(-1)).toMatchObject({ from: "needs_review", to: "succeeded", actor: "ops:alice" });
      expect(events.at(-1)!.reason).toMatch(/found in the SMS console/);
      // a later call gets the resolution, and nothing is sent again
      const again = await ledger.run(provider.action("sms", {}), { tenant, key: ["r1"], args: { to: "x" } });
      expect(again).toMatchObject({ status: "succeeded", replayed: true, receipt: { reference: "SM123", resolvedBy: "ops:alice" } });
      expect(provider.effects).toHaveLength(1);
    });

    it("refuses to resolve what is not in review, or without a reason", async () => {
      const ledger = await db.open();
      const tenant = uniqueTenant();
      const out = await ledger.run(new TestProvider().action("mail", {}), { tenant, key: ["ok"], args: { to: "x" } });
      await expect(ledger.resolve(tenant, out.operationId, { outcome: "failed", reason: "no", actor: "ops" })).rejects.toBeInstanceOf(InvalidTransitionError);
      const { id } = await parked(ledger, tenant, "r2");
      await expect(ledger.resolve(tenant, id, { outcome: "failed", reason: " ", actor: "ops" })).rejects.toBeInstanceOf(InvalidValueError);
      expect((await ledger.get(tenant, id)).operation.status).toBe("needs_review");
    });

    it("retry sends a reviewed operation back to pending; the next call runs it with the same key", async () => {
      const ledger = await db.open();
      const tenant = uniqueTenant();
      const { id, provider } = await parked(ledger, tenant, "r3");
      provider.effects.length = 0; // the person checked: the provider has nothing
      await ledger.retry(tenant, id, { reason: "not in the SMS console", actor: "ops:bob" });
      const out = await ledger.run(provider.action("sms", {}), { tenant, key: ["r3"], args: { to: "x" } });
      expect(out).toMatchObject({ status: "succeeded", operationId: id });
      expect(provider.effects).toHaveLength(1);
    });

    it("lists by status, action and age, newest first", async () => {
      const ledger = await db.open();
      const tenant = uniqueTenant();
      const p = new TestProvider();
      await ledger.run(p.action("mail", {}), { tenant, key: ["l1"], args: { to: "x" } });
      await ledger.run(p.action("charge", {}), { tenant, key: ["l2"], args: { to: "x" } });
      await parked(ledger, tenant, "l3");
      expect((await ledger.list({ tenant })).map((o) => o.action)).toEqual(["sms", "charge", "mail"]);
      expect((await ledger.list({ tenant, status: "succeeded" })).map((o) => o.action)).toEqual(["charge", "mail"]);
      expect((await ledger.list({ tenant, status: ["needs_review"], action: "sms" }))).toHaveLength(1);
      expect(await ledger.list({ tenant, olderThanMs: 3_600_000 })).toEqual([]);
      expect(await ledger.list({ tenant, limit: 1 })).toHaveLength(1);
    });

    it("prunes only completed operations past retention, with their events", async () => {
      const ledger = await db.open({ retentionMs: 0 });
      const tenant = uniqueTenant();
      await ledger.run(new TestProvider().action("mail", {}), { tenant, key: ["p1"], args: { to: "x" } });
      const { id } = await parked(ledger, tenant, "p2");
      expect(await ledger.prune(tenant)).toBe(1);
      expect(await countRows(ledger, tenant)).toEqual({ ops: 1, events: (await ledger.get(tenant, id)).events.length });
      const keep = await db.open(); // default retention: 30 days
      await keep.run(new TestProvider().action("mail", {}), { tenant, key: ["p3"], args: { to: "x" } });
      expect(await keep.prune(tenant)).toBe(0);
    });

    it("refuses an action type the tenant may not run, before anything is written", async () => {
      const tenant = uniqueTenant();
      const ledger = await db.open({ allowedActions: { [tenant]: ["mail"], "*": [] } });
      const p = new TestProvider();
      await expect(ledger.run(p.action("charge", {}), { tenant, key: ["g"], args: { to: "x" } })).rejects.toBeInstanceOf(GuardrailError);
      await expect(ledger.run(p.action("mail", {}), { tenant: uniqueTenant(), key: ["g"], args: { to: "x" } })).rejects.toBeInstanceOf(GuardrailError);
      expect(await ledger.run(p.action("mail", {}), { tenant, key: ["g"], args: { to: "x" } })).toMatchObject({ status: "succeeded" });
      expect(p.calls).toBe(1);
      expect(await countRows(ledger, tenant)).toEqual({ ops: 1, events: 2 });
    });

    it("refuses non-JSON args before writing anything", async () => {
      const ledger = await db.open();
      const tenant = uniqueTenant();
      const send = new TestProvider().action("mail", {});
      const cyclic: Record<string, unknown> = { to: "x" };
      cyclic.self = cyclic;
      await expect(ledger.run(send, { tenant, key: ["b1"], args: { to: "x", n: 10n } as never })).rejects.toThrow(/args\.n: BigInt/);
      await expect(ledger.run(send, { tenant, key: ["b2"], args: cyclic as never })).rejects.toBeInstanceOf(InvalidValueError);
      await expect(ledger.run(send, { tenant, key: [new Date()], args: { to: "x" } })).rejects.toBeInstanceOf(InvalidValueError);
      expect(await countRows(ledger, tenant)).toEqual({ ops: 0, events: 0 });
    });

    it("refuses args over the configured size before writing anything", async () => {
      const ledger = await db.open({ maxArgsBytes: 1_000 });
      const tenant = uniqueTenant();
      const err = await ledger.run(new TestProvider().action("mail", {}), { tenant, key: ["big"], args: { to: "x".repeat(2_000) } }).catch((e: unknown) => e);
      expect(err).toBeInstanceOf(PayloadTooLargeError);
      expect(err).toMatchObject({ what: "args", limit: 1_000 });
      expect(await countRows(ledger, tenant)).toEqual({ ops: 0, events: 0 });
    });

    it("parks an effect whose receipt is over the size for review, and says so", async () => {
      const ledger = await db.open({ maxResultBytes: 100 });
      const tenant = uniqueTenant();
      const { defineAction } = await import("@idem/core");
      let effects = 0;
      const bloated = defineAction({ type: "bloated", capabilities: {}, execute: async () => { effects++; return { blob: "y".repeat(500) }; } });
      const err = await ledger.run(bloated, { tenant, key: ["r"], args: {} }).catch((e: unknown) => e);
      expect(err).toBeInstanceOf(PayloadTooLargeError);
      const [op] = await ledger.list({ tenant });
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
      const before = await ledger.get(tenant, id);
      const err = await ledger.settle(tenant, id).catch((e: unknown) => e);
      expect(err).toBeInstanceOf(UnknownActionError);
      expect(err).toMatchObject({ action: "sms", operationId: id });
      expect(await ledger.get(tenant, id)).toEqual(before);
    });

    it("claimDue claims at most the batch and hides claimed rows from another daemon", async () => {
      const tenant = uniqueTenant();
      const a = await db.open({ budget: { attempts: 1, baseDelayMs: 20 } });
      const b = await db.open();
      const p = new TestProvider();
      p.lookupAnswer = "inconclusive";
      for (let i = 0; i < 6; i++) {
        p.faults.push({ when: "after", cls: { kind: "ambiguous", reason: "timeout" } });
        await a.run(p.action("mail", { lookup: true }), { tenant, key: [`c${i}`], args: { to: "x" } });
      }
      await new Promise((r) => setTimeout(r, 60)); // the lookups asked to be retried after 50 ms
      const mine = (await a.claimDue(2, 60_000)).filter((r) => r.tenant === tenant);
      const theirs = (await b.claimDue(2, 60_000)).filter((r) => r.tenant === tenant);
      expect(mine).toHaveLength(2);
      expect(theirs).toHaveLength(2);
      expect(new Set([...mine, ...theirs].map((r) => r.id)).size).toBe(4);
    });

    it("counts a lookup's settle window from the last execution, not from the last inconclusive check", async () => {
      const seen: number[] = [];
      const { defineAction } = await import("@idem/core");
      const mail = defineAction({
        type: "mail.window", capabilities: { lookup: true },
        execute: async () => { throw new Error("timeout after DATA"); },
        reconcile: async (_a: unknown, op) => { seen.push(op.lastAttemptAt); return { found: false, proof: "inconclusive", reason: "not yet", retryAfterMs: 0 } as const; },
      });
      const ledger = await db.open({ actions: [mail], budget: { attempts: 1 } });
      const tenant = uniqueTenant();
      const out = await ledger.run(mail, { tenant, key: ["w"], args: {} });
      // the run itself stopped at unknown (its budget is one execution); each settle checks once
      for (let i = 0; i < 3; i++) {
        await new Promise((r) => setTimeout(r, 30));
        await ledger.settle(tenant, out.operationId);
      }
      expect(seen).toHaveLength(3);
      expect(new Set(seen).size).toBe(1);
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
      const settled = await ledger.settle(tenant, out.operationId, "daemon");
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
        db: bare.db, migrationTableName: "idem_migration", migrationLockTableName: "idem_migration_lock",
        provider: { getMigrations: async () => ({ "0001-init": { up: async (k) => { for (const q of m0001[dialect]) await sql.raw(q).execute(k); } } }) },
      }).migrateToLatest();
      const insert = `INSERT INTO idem_operations (id, tenant_id, key, key_label, action, args_hash, args_json, status, attempt, lease_owner, lease_expires_at, actor, reason, checks, created_at, updated_at, last_execution_at)
        VALUES ('op_old1', 'acme', 'k1', '["a"]', 'mail', 'h1', '{"to":"x"}', 'running', 1, 'w', 100, 'agent', 'claimed', 0, 10, 10, 10)`;
      await sql.raw(insert).execute(bare.db);
      await sql.raw(`UPDATE idem_operations SET status = 'unknown', reason = 'timeout', updated_at = 20 WHERE id = 'op_old1'`).execute(bare.db);
      await sql.raw(`INSERT INTO idem_events (operation_id, tenant_id, from_status, to_status, attempt, actor, reason, at) VALUES ('op_old1', 'acme', 'unknown', 'unknown', 1, 'w2', 'fenced: a note', 25)`).execute(bare.db);
      await sql.raw(`UPDATE idem_operations SET status = 'succeeded', result_json = '{"id":"m1"}', reason = 'reconciled', updated_at = 30, completed_at = 30 WHERE id = 'op_old1'`).execute(bare.db);
      expect(await bare.migrate()).toEqual(["0002-lean-rows", "0003-sticky-maybe-committed"]);
      const { operation, events } = await bare.get("acme", "op_old1");
      expect(operation).toMatchObject({ id: "op_old1", key: "k1", keyLabel: '["a"]', status: "succeeded", result: { id: "m1" }, argsHash: "h1", createdAt: 10, completedAt: 30 });
      expect(events.map((e) => [e.id, e.from, e.to, e.reason, e.at])).toEqual([
        [1, null, "running", "claimed", 10], [2, "running", "unknown", "timeout", 20], [3, "unknown", "unknown", "fenced: a note", 25], [4, "unknown", "succeeded", "reconciled", 30],
      ]);
      await expect(bare.get("other", "op_old1")).rejects.toBeInstanceOf(OperationNotFoundError);
      // and the new triggers keep appending
      const resolved = await bare.run(new TestProvider().action("mail", {}), { tenant: "acme", key: ["fresh"], args: { to: "x" } });
      expect((await bare.get("acme", resolved.operationId)).events.map((e) => e.to)).toEqual(["running", "succeeded"]);
      await bare.close();
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
          await expect(ledger.run(p.action("mail", {}), { tenant, key: ["d", n], args: { to: "y" } })).rejects.toBeInstanceOf(ArgsMismatchError);
          const { operation, events } = await ledger.get(tenant, first.operationId);
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
        await expect(bare.list({ tenant: "t" })).rejects.toThrow(/no such table/);
        expect(await bare.migrate()).toEqual(["0001-init", "0002-lean-rows", "0003-sticky-maybe-committed"]);
      } else {
        await bare.migrate();
      }
      expect(await bare.migrate()).toEqual([]);
      await bare.close();
      const again = await openLedger(fresh);
      expect(await again.list({ tenant: "t" })).toEqual([]);
      await again.close();
      await expect(again.list({ tenant: "t" })).rejects.toBeInstanceOf(LedgerConfigError);
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
