/**
 * A person's retry of an operation whose last execution may have committed (`admin.retry` of an
 * `unknown` row, or of a `needs_review` one that may have): they looked at the provider and found
 * nothing, but the earlier request can land late (mail queued at the server, its copy in Sent only
 * after the lookup's settle window; a search index that lags). The next run looks the effect up
 * first, as it would for an unknown outcome, with the settle window counted from the earlier
 * execution: found settles it (alerted, nothing runs twice), inconclusive leaves it pending for a
 * later look, and only absence proven, or a lookup that can never prove it (the person's word is
 * the proof then), runs it. A retry of a `failed` operation (the provider refused: no effect)
 * runs at once, unless the provider refused what it had taken whole (`mayHaveTaken`: a mail
 * server's 554 after the body, which some queue all the same): that one looks first too. Each
 * test failed first: two effects at the provider.
 */
import { describe, expect, it, vi } from "vitest";
import { Migrator, sql } from "kysely";
import { defineAction, isFoundOnRetry, openLedger, type Ledger } from "@idem/core";
import { databaseOf } from "@idem/core/testing";
import { DIALECTS, freshDatabase } from "@idem/testkit";
import { migrationProvider } from "../src/migrations/index.js";
import { ProviderError } from "./support/provider.js";
import { ledgers, uniqueTenant } from "./support/ledgers.js";

/** How long after a send its copy may still be missing from the provider's records (a settle window). */
const SETTLE_MS = 60_000;

/**
 * A mail server with a settle window: a message it accepted is queued, and lands (is sent, its copy
 * filed where the lookup reads) when the test says so. `execute` checks the copies before sending
 * (email's pre-send check), as the email adapter does. The first send's answer is lost (a timeout
 * after the server accepted it). `lookup: "settling"` answers inconclusive inside the settle window
 * (counted from `op.lastAttemptAt` on the database clock) and absent after it; `"never"`: the
 * copies are the client's own (APPEND), so no lookup can prove absence.
 */
function mailServer(lookup: "settling" | "never", loseFirst = true) {
  const landed: { key: string; id: string }[] = [];
  const queued: { key: string; id: string }[] = [];
  let sends = 0;
  let lookups = 0;
  const action = defineAction<{ to: string }, { id: string }>({
    type: `mail.${lookup}`,
    capabilities: { lookup: true },
    execute: async (_args, op) => {
      const copy = landed.find((m) => m.key === op.key);
      if (copy) return copy; // the pre-send check found an earlier send's copy
      sends += 1;
      const message = { key: op.key, id: `msg_${sends}` };
      if (sends === 1 && loseFirst) {
        queued.push(message); // accepted, not delivered yet; its answer is lost
        throw new ProviderError({ kind: "ambiguous", reason: "timeout after DATA" });
      }
      landed.push(message);
      return message;
    },
    classify: (e) => (e instanceof ProviderError ? e.cls : { kind: "ambiguous", reason: String(e) }),
    reconcile: async (_args, op) => {
      lookups += 1;
      const copy = landed.find((m) => m.key === op.key);
      if (copy) return { found: true as const, receipt: copy };
      if (lookup === "never")
        return { found: false as const, proof: "never" as const, reason: "copies are appended by the client" };
      if (op.now - op.lastAttemptAt < SETTLE_MS)
        return {
          found: false as const,
          proof: "inconclusive" as const,
          reason: "inside the settle window",
          retryAfterMs: SETTLE_MS - (op.now - op.lastAttemptAt),
        };
      return { found: false as const, proof: "absent" as const, reason: "no copy past the settle window" };
    },
  });
  return {
    action,
    /** Messages delivered: the effects counted at the provider. */
    landed,
    /** The queued message reaches its recipient (and Sent). */
    land: () => landed.push(...queued.splice(0)),
    sends: () => sends,
    lookups: () => lookups,
  };
}

for (const dialect of DIALECTS) {
  describe(`a person's retry of an outcome that may have committed, ${dialect}`, () => {
    const db = ledgers(dialect);

    async function unknownOutcome(server: ReturnType<typeof mailServer>, storeArgs = true) {
      let now = Date.now();
      const ledger: Ledger = await db.open({
        clock: () => now,
        actions: [server.action],
        budget: { attempts: 1 },
      });
      const tenant = uniqueTenant();
      const first = await ledger.run(server.action, { tenant, key: ["invoice", "1"], args: { to: "x" }, storeArgs });
      expect(first).toMatchObject({ status: "pending_verification", state: "unknown" });
      const id = first.operationId;
      return {
        ledger,
        tenant,
        id,
        advance: (ms: number) => (now += ms),
        /**
         * Moves the clock on by `ms`, and on to the operation's next look if that is due later. A
         * look inside the settle window schedules the next one at the window's end plus up to a
         * second of jitter (policy.ts `afterProvider`); the window counts from the last execution's
         * end, which the ledger records a millisecond after its claim on this frozen clock. So after
         * a look 1 s past that execution, the next is due up to 1 ms after `SETTLE_MS` more: a
         * caller there was told "next look in 1 ms" (when random() ≥ 0.9995). No later than that
         * second of jitter: a look scheduled any later still fails the test, as it did before.
         */
        advanceToLook: async (ms: number) => {
          const { nextCheckAt } = (await ledger.get({ tenant, id })).operation;
          expect(nextCheckAt).not.toBeNull();
          expect(nextCheckAt! - (now + ms)).toBeLessThanOrEqual(1_000);
          now = Math.max(now + ms, nextCheckAt!);
        },
      };
    }

    const alerted = async (ledger: Ledger, tenant: string, id: string) =>
      Number(
        (
          await sql<{
            alert_pending: number;
          }>`SELECT alert_pending FROM idem_operations WHERE tenant_id = ${tenant} AND id = ${id}`.execute(
            databaseOf(ledger),
          )
        ).rows[0]?.alert_pending,
      );

    // The lookup after the person's retry is slow: its lease runs out, another daemon takes the row
    // over and looks too, then the slow one finds the earlier message. Its write of the receipt
    // matched no row, so it is recorded through the fence (fence.ts).
    for (const later of ["inconclusive", "absent"] as const)
      it(`found while another look took the row over (${later}): recorded through the fence, said as the retry not run only if nothing ran it`, async () => {
        let now = Date.now();
        let lookups = 0;
        let open: () => void = () => {};
        const gate = new Promise<void>((r) => (open = r));
        const action = defineAction<{ to: string }, { id: string }>({
          type: "mail.slow-lookup",
          capabilities: { lookup: true },
          execute: async () => {
            throw new ProviderError({ kind: "ambiguous", reason: "timeout after DATA" });
          },
          classify: (e) => (e instanceof ProviderError ? e.cls : { kind: "ambiguous", reason: String(e) }),
          reconcile: async () => {
            lookups += 1;
            if (lookups > 1) return { found: false as const, proof: later, reason: `the search answered ${later}` };
            await gate;
            return { found: true as const, receipt: { id: "msg_1" } };
          },
        });
        const ledger = await db.open({ clock: () => now, leaseMs: 30_000, actions: [action], budget: { attempts: 1 } });
        const tenant = uniqueTenant();
        const first = await ledger.run(action, { tenant, key: ["invoice", "1"], args: { to: "x" } });
        expect(first).toMatchObject({ state: "unknown" });
        const id = first.operationId;
        now += 1_000;
        await ledger.admin.retry({ tenant, id, actor: "alice", reason: "nothing in Sent" });
        const slow = ledger.daemon.settle({ tenant, id, actor: "daemon-a" }).catch((e: unknown) => e);
        await vi.waitFor(() => expect(lookups).toBe(1));
        now += 31_000; // the slow lookup's lease ran out (by the ledger's clock) while it looked
        // Absence proven: attempt 3 ran it again (its answer lost too), so the retry did run.
        expect(await ledger.daemon.settle({ tenant, id, actor: "daemon-b" })).toMatchObject({
          state: later === "absent" ? "unknown" : "pending",
        });
        open();
        expect(await slow).toMatchObject({ status: "succeeded", receipt: { id: "msg_1" } });
        const { operation, events } = await ledger.get({ tenant, id });
        const story = events.map((e) => `${e.from}>${e.to}@${e.attempt} ${e.reason}`).join(" | ");
        expect(operation.status, story).toBe("succeeded");
        expect(events.filter((e) => e.to === "succeeded")).toHaveLength(1);
        if (later === "absent") {
          expect(isFoundOnRetry(operation.reason ?? ""), story).toBe(false);
          return;
        }
        // Before: recorded as "attempt 2's receipt proves the effect happened", not alerted at all.
        expect(await alerted(ledger, tenant, id), story).toBe(1);
        expect(isFoundOnRetry(operation.reason ?? ""), story).toBe(true);
        expect(operation.reason, story).toMatch(/found by attempt 2's lookup.*attempt 3 took the operation over/);
      });

    // The earlier attempt's request is still out when a person retries (its lease ran out, a look
    // proved nothing): then it lands, and its own receipt settles the row through the fence before
    // the retry ran. As when the retry's lookup finds it, the person hears that their retry did not
    // run (the row's check_refused alert, if due, is about a look no longer needed).
    for (const looked of ["refused", "not yet"] as const)
      it(`the earlier attempt's late receipt settles the retry before it ran (its look ${looked}): said as the retry not run`, async () => {
        let now = Date.now();
        let sent: () => void = () => {};
        const out = new Promise<void>((r) => (sent = r));
        let land: () => void = () => {};
        const gate = new Promise<void>((r) => (land = r));
        let sends = 0;
        const action = defineAction<{ to: string }, { id: string }>({
          type: "mail.late-receipt",
          capabilities: { lookup: true },
          execute: async () => {
            sends += 1;
            sent();
            await gate; // attempt 1's request, out until it lands
            return { id: "msg_1" };
          },
          classify: (e) => (e instanceof ProviderError ? e.cls : { kind: "ambiguous", reason: String(e) }),
          // The lookup's credential was revoked: every look is refused, the outcome stays unknown.
          reconcile: async () => {
            throw new ProviderError({ kind: "permanent", reason: "the API key was revoked", alert: true });
          },
        });
        const ledger = await db.open({ clock: () => now, leaseMs: 30_000, actions: [action], budget: { attempts: 1 } });
        const tenant = uniqueTenant();
        const first = ledger.run(action, { tenant, key: ["invoice", "1"], args: { to: "x" } });
        await out;
        now += 31_000; // attempt 1's lease ran out (by the ledger's clock); its request is still out
        const [row] = await ledger.admin.list({ tenant });
        const id = row!.id;
        expect(await ledger.daemon.settle({ tenant, id, actor: "daemon" })).toMatchObject({ state: "unknown" });
        now += 1_000;
        await ledger.admin.retry({ tenant, id, actor: "alice", reason: "nothing at the provider" });
        if (looked === "refused") {
          expect(await ledger.daemon.settle({ tenant, id, actor: "daemon" })).toMatchObject({ state: "pending" });
          expect((await ledger.get({ tenant, id })).operation).toMatchObject({ lookFirst: true });
          expect(await alerted(ledger, tenant, id)).toBe(1); // the look refused: check_refused due
        }
        land(); // attempt 1's request lands; its receipt arrives
        expect(await first).toMatchObject({ status: "succeeded", receipt: { id: "msg_1" } });
        const { operation, events } = await ledger.get({ tenant, id });
        const story = events.map((e) => `${e.from}>${e.to}@${e.attempt} ${e.reason}`).join(" | ");
        expect(operation.status, story).toBe("succeeded");
        // Before: "attempt 1's receipt proves the effect happened", the alert cleared (or never
        // raised): nothing told the person their retry did not run.
        expect(await alerted(ledger, tenant, id), story).toBe(1);
        expect(isFoundOnRetry(operation.reason ?? ""), story).toBe(true);
        expect(operation.reason, story).toMatch(/attempt 1's receipt proves the effect happened/);
        expect(sends).toBe(1);
        // Replayed to the next caller: one effect, nothing run again.
        expect(await ledger.run(action, { tenant, key: ["invoice", "1"], args: { to: "x" } })).toMatchObject({
          status: "succeeded",
          receipt: { id: "msg_1" },
          replayed: true,
        });
        expect(sends).toBe(1);
      });

    it("a caller after the retry looks first: inside the settle window it waits, and the late message is found, not sent again", async () => {
      const server = mailServer("settling");
      const { ledger, tenant, id, advance, advanceToLook } = await unknownOutcome(server);
      advance(1_000);
      // The person looks at the provider: nothing there yet (the message is still queued).
      expect(server.landed).toHaveLength(0);
      const back = await ledger.admin.retry({ tenant, id, actor: "alice", reason: "nothing in Sent" });
      expect(back.status).toBe("pending");
      const again = await ledger.run(server.action, { tenant, key: ["invoice", "1"], args: { to: "x" } });
      expect(server.sends(), JSON.stringify(again)).toBe(1); // before: the caller sent a second message at once
      expect(again).toMatchObject({ status: "pending_verification", state: "pending" });
      expect((again as { reason: string }).reason).toMatch(/looked up first.*settle window/);
      server.land();
      await advanceToLook(SETTLE_MS);
      const settled = await ledger.run(server.action, { tenant, key: ["invoice", "1"], args: { to: "x" } });
      expect(settled).toMatchObject({ status: "succeeded", receipt: { id: "msg_1" } });
      expect(server.landed).toHaveLength(1);
      expect(server.sends()).toBe(1);
      const { operation, events } = await ledger.get({ tenant, id });
      expect(operation.reason).toMatch(/person's retry/);
      expect(await alerted(ledger, tenant, id)).toBe(1); // the person hears their retry found the effect
      expect(events.map((e) => e.to)).toEqual([
        "running",
        "unknown",
        "pending",
        "running",
        "pending",
        "running",
        "succeeded",
      ]);
    });

    it("the daemon's settlement after the retry (idem retry --now) looks first too, and is due again after the window", async () => {
      const server = mailServer("settling");
      const { ledger, tenant, id, advance } = await unknownOutcome(server);
      // Escalated to a person first: a needs_review row that may have committed.
      expect(
        await ledger.daemon.settle({ tenant, id, actor: "daemon", escalate: { maxChecks: 0, maxAgeMs: 1 } }),
      ).toMatchObject({ state: "needs_review" });
      advance(1_000);
      await ledger.admin.retry({ tenant, id, actor: "alice", reason: "nothing in Sent" });
      const out = await ledger.daemon.settle({ tenant, id, actor: "daemon" });
      expect(server.sends(), JSON.stringify(out)).toBe(1);
      expect(out).toMatchObject({ status: "pending_verification", state: "pending" });
      const { operation } = await ledger.get({ tenant, id });
      expect(operation.nextCheckAt! - operation.updatedAt).toBeGreaterThanOrEqual(SETTLE_MS - 1_000);
      server.land();
      advance(SETTLE_MS);
      expect(await ledger.daemon.settle({ tenant, id, actor: "daemon" })).toMatchObject({
        status: "succeeded",
        receipt: { id: "msg_1" },
      });
      expect(server.landed).toHaveLength(1);
    });

    it("looks that prove nothing past the daemon's limit go to a person, who may retry again: still looked up first", async () => {
      const server = mailServer("settling");
      const { ledger, tenant, id, advance } = await unknownOutcome(server);
      await ledger.admin.retry({ tenant, id, actor: "alice", reason: "nothing in Sent" });
      const escalate = { maxChecks: 1, maxAgeMs: 3_600_000 };
      expect(await ledger.daemon.settle({ tenant, id, actor: "daemon", escalate })).toMatchObject({ state: "pending" });
      expect(await ledger.daemon.settle({ tenant, id, actor: "daemon", escalate })).toMatchObject({
        state: "needs_review",
        reason: expect.stringMatching(/since a person's retry/),
      });
      expect(await alerted(ledger, tenant, id)).toBe(1);
      await ledger.admin.retry({ tenant, id, actor: "bob", reason: "still nothing in Sent" });
      const out = await ledger.run(server.action, { tenant, key: ["invoice", "1"], args: { to: "x" } });
      expect(server.sends(), JSON.stringify(out)).toBe(1); // before: sent at once, the person's review having lost "may have committed"
      expect(out).toMatchObject({ state: "pending" });
      server.land();
      advance(SETTLE_MS);
      expect(await ledger.daemon.settle({ tenant, id, actor: "daemon" })).toMatchObject({ status: "succeeded" });
      expect(server.landed).toHaveLength(1);
    });

    it("past the settle window with no copy, absence is proven and it runs; a lookup that can never prove absence takes the person's word", async () => {
      for (const lookup of ["settling", "never"] as const) {
        const server = mailServer(lookup);
        const { ledger, tenant, id, advance } = await unknownOutcome(server);
        advance(SETTLE_MS + 1_000); // the first message was lost for good: it never lands
        await ledger.admin.retry({ tenant, id, actor: "alice", reason: "nothing in Sent" });
        const out = await ledger.run(server.action, { tenant, key: ["invoice", "1"], args: { to: "x" } });
        expect(out, lookup).toMatchObject({ status: "succeeded", receipt: { id: "msg_2" } });
        expect(server.lookups(), lookup).toBe(1);
        expect(server.landed).toHaveLength(1);
      }
    });

    it("the mark is shown: the retry's answer, get, lists and status say the next run looks first, until a look answers", async () => {
      const server = mailServer("settling");
      const { ledger, tenant, id, advance, advanceToLook } = await unknownOutcome(server);
      expect((await ledger.get({ tenant, id })).operation.lookFirst).toBe(false); // unknown: not a person's retry
      advance(1_000);
      const back = await ledger.admin.retry({ tenant, id, actor: "alice", reason: "nothing in Sent" });
      // Before: a reopened row read as plain pending work, known not done, until its first look.
      expect(back).toMatchObject({ status: "pending", lookFirst: true });
      expect((await ledger.get({ tenant, id })).operation.lookFirst).toBe(true);
      expect(await ledger.admin.list({ tenant, status: "pending" })).toEqual([
        expect.objectContaining({ id, lookFirst: true }),
      ]);
      const { lists } = await ledger.admin.readAtOnce({ lists: [{ tenant, status: ["pending", "unknown"] }] });
      expect(lists[0]).toEqual([expect.objectContaining({ id, lookFirst: true })]);
      const told = await ledger.status({ tenant, id });
      expect(told).toMatchObject({ status: "pending_verification", state: "pending" });
      expect((told as { reason: string }).reason).toMatch(/may have committed: its effect is looked up first/);
      expect((told as { reason: string }).reason).not.toMatch(/known not done/);
      // A look that proves nothing keeps the mark; the one that finds the effect settles it.
      await ledger.run(server.action, { tenant, key: ["invoice", "1"], args: { to: "x" } });
      expect((await ledger.get({ tenant, id })).operation).toMatchObject({ status: "pending", lookFirst: true });
      server.land();
      await advanceToLook(SETTLE_MS);
      await ledger.run(server.action, { tenant, key: ["invoice", "1"], args: { to: "x" } });
      expect((await ledger.get({ tenant, id })).operation).toMatchObject({ status: "succeeded", lookFirst: false });
      expect(server.sends()).toBe(1);
    });

    it("args not stored: the daemon cannot look, so a caller's look that proves nothing goes to a person, not left pending for nobody", async () => {
      const server = mailServer("settling");
      const { ledger, tenant, id, advance } = await unknownOutcome(server, false);
      advance(1_000);
      const back = await ledger.admin.retry({ tenant, id, actor: "alice", reason: "nothing in Sent" });
      expect(back).toMatchObject({ status: "pending", lookFirst: true });
      // Only a call with the args can look (the lookup reads them): said so, and nothing claimed.
      const told = (await ledger.status({ tenant, id })) as { reason: string };
      expect(told.reason).toMatch(/args are not stored/);
      expect(await ledger.daemon.claimDue({ limit: 10, claimMs: 1_000 })).toEqual([]);
      const again = await ledger.run(server.action, {
        tenant,
        key: ["invoice", "1"],
        args: { to: "x" },
        storeArgs: false,
      });
      expect(server.sends()).toBe(1);
      expect(server.lookups()).toBe(1);
      // Before: pending, "looked at again later", due for a daemon that never claims it (0011).
      expect(again, JSON.stringify(again)).toMatchObject({
        status: "pending_verification",
        state: "needs_review",
        reason: expect.stringMatching(/args are not stored/),
      });
      expect(await alerted(ledger, tenant, id)).toBe(1);
      // The person may retry again: still looked up first, and found once it landed.
      server.land();
      advance(SETTLE_MS);
      await ledger.admin.retry({ tenant, id, actor: "alice", reason: "a caller will bring the args" });
      expect(
        await ledger.run(server.action, { tenant, key: ["invoice", "1"], args: { to: "x" }, storeArgs: false }),
      ).toMatchObject({ status: "succeeded", receipt: { id: "msg_1" } });
      expect(server.landed).toHaveLength(1);
      expect(server.sends()).toBe(1);
    });

    it("on a ledger before migration 0012 (opened without migrating) every operation reads lookFirst false", async () => {
      const url = await freshDatabase(dialect);
      const bare = await openLedger(url, { migrate: false });
      try {
        await new Migrator({
          db: databaseOf(bare),
          migrationTableName: "idem_migration",
          migrationLockTableName: "idem_migration_lock",
          provider: migrationProvider(dialect),
        }).migrateTo("0011-due-rows-have-args");
        const server = mailServer("settling");
        const ledger = await openLedger(url, { migrate: false, actions: [server.action], budget: { attempts: 1 } });
        try {
          const tenant = uniqueTenant();
          const out = await ledger.run(server.action, { tenant, key: ["old"], args: { to: "x" } });
          expect(out).toMatchObject({ state: "unknown" });
          const id = out.operationId;
          expect((await ledger.get({ tenant, id })).operation.lookFirst).toBe(false);
          expect((await ledger.admin.list({ tenant }))[0]).toMatchObject({ id, lookFirst: false });
          const { lists } = await ledger.admin.readAtOnce({ lists: [{ tenant, status: "unknown" }] });
          expect(lists[0]).toEqual([expect.objectContaining({ id, lookFirst: false })]);
          expect(await ledger.status({ tenant, id })).toMatchObject({ state: "unknown" });
        } finally {
          await ledger.close();
        }
      } finally {
        await bare.close();
      }
    });

    it("a retry of an operation refused after the provider had it whole (mayHaveTaken: a 554 after the body) looks first, and finds the late effect", async () => {
      const server = mailServer("settling");
      let now = Date.now();
      const ledger = await db.open({ clock: () => now, actions: [server.action], budget: { attempts: 1 } });
      const tenant = uniqueTenant();
      // The server queues the message, answers 554, and delivers it all the same, later.
      const refusing = defineAction<{ to: string }, { id: string }>({
        type: server.action.type,
        capabilities: { lookup: true },
        execute: async (args, op) => {
          await server.action.execute(args, op).catch(() => {}); // queued, its answer the 554 below
          throw new ProviderError({ kind: "permanent", reason: "554 refused after the body", mayHaveTaken: true });
        },
        classify: (e) => (e instanceof ProviderError ? e.cls : { kind: "ambiguous", reason: String(e) }),
        reconcile: server.action.reconcile!,
      });
      const first = await ledger.run(refusing, { tenant, key: ["k"], args: { to: "x" } });
      expect(first).toMatchObject({ status: "failed" });
      now += 1_000;
      await ledger.admin.retry({ tenant, id: first.operationId, actor: "alice", reason: "filter fixed" });
      const out = await ledger.run(server.action, { tenant, key: ["k"], args: { to: "x" } });
      // Before: run at once, a second message (sends 2, succeeded).
      expect({ sends: server.sends(), out }).toMatchObject({
        sends: 1,
        out: { status: "pending_verification", state: "pending" },
      });
      expect(first).toMatchObject({ error: { mayHaveTaken: true } });
      server.land();
      now += SETTLE_MS; // its copy is found
      expect(await ledger.daemon.settle({ tenant, id: first.operationId, actor: "daemon" })).toMatchObject({
        status: "succeeded",
      });
      expect(server.sends()).toBe(1);
    });

    it("a retry of a failed operation (no effect) runs at once, without a look", async () => {
      const server = mailServer("settling", false);
      let now = Date.now();
      const ledger = await db.open({ clock: () => now, actions: [server.action], budget: { attempts: 1 } });
      const tenant = uniqueTenant();
      const refusing = defineAction<{ to: string }, { id: string }>({
        type: server.action.type,
        capabilities: { lookup: true },
        execute: async () => {
          throw new ProviderError({ kind: "permanent", reason: "550 mailbox unavailable" });
        },
        classify: (e) => (e instanceof ProviderError ? e.cls : { kind: "ambiguous", reason: String(e) }),
        reconcile: server.action.reconcile!,
      });
      const first = await ledger.run(refusing, { tenant, key: ["k"], args: { to: "x" } });
      expect(first.status).toBe("failed");
      now += 1_000;
      await ledger.admin.retry({ tenant, id: first.operationId, actor: "alice", reason: "mailbox fixed" });
      const out = await ledger.run(server.action, { tenant, key: ["k"], args: { to: "x" } });
      expect(out).toMatchObject({ status: "succeeded", receipt: { id: "msg_1" } });
      expect(server.lookups()).toBe(0);
    });
  });
}
