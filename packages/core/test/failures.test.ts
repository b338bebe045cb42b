/**
 * One test per unsafe window of issue 11, on both databases: a ledger that cannot record a
 * completion or a heartbeat (real failing writes, raised by the database), a full SQLite file,
 * lazy args slower than the lease, Retry-After past the budget, `retry` after checks, the
 * history's cost, and the database time handed to actions.
 */
import { describe, expect, it } from "vitest";
import { setTimeout as sleep } from "node:timers/promises";
import { sql } from "kysely";
import {
  ArgsMismatchError,
  CompletionNotRecordedError,
  LeaseDeadlineError,
  LedgerUnavailableError,
  defineAction,
  type Ledger,
} from "@idem/core";
import { DIALECTS, type TestDialect } from "@idem/testkit";
import { databaseOf, openTestLedger } from "@idem/core/testing";
import { dialectFor, hooked, isClaim } from "./support/dialects.js";
import { ledgers, uniqueTenant } from "./support/ledgers.js";
import { TestProvider } from "./support/provider.js";

/** Makes the database refuse some writes, as a failing disk or connection would. */
async function refuse(
  ledger: Ledger,
  dialect: TestDialect,
  name: string,
  when: { sqlite: string; postgres: string },
  of: string,
): Promise<() => Promise<void>> {
  if (dialect === "sqlite") {
    await sql
      .raw(
        `CREATE TRIGGER ${name} BEFORE UPDATE OF ${of} ON idem_operations WHEN ${when.sqlite} BEGIN SELECT RAISE(ABORT, 'disk I/O error (test)'); END`,
      )
      .execute(databaseOf(ledger));
    return async () => void (await sql.raw(`DROP TRIGGER ${name}`).execute(databaseOf(ledger)));
  }
  await sql
    .raw(
      `CREATE FUNCTION ${name}() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION 'disk I/O error (test)'; END $$`,
    )
    .execute(databaseOf(ledger));
  await sql
    .raw(
      `CREATE TRIGGER ${name} BEFORE UPDATE OF ${of} ON idem_operations FOR EACH ROW WHEN (${when.postgres}) EXECUTE FUNCTION ${name}()`,
    )
    .execute(databaseOf(ledger));
  return async () => {
    await sql.raw(`DROP TRIGGER ${name} ON idem_operations`).execute(databaseOf(ledger));
    await sql.raw(`DROP FUNCTION ${name}()`).execute(databaseOf(ledger));
  };
}

for (const dialect of DIALECTS) {
  describe(`unsafe windows on ${dialect}`, () => {
    const db = ledgers(dialect);

    /** An operation left unknown (a timeout) whose lookups stay inconclusive. */
    async function unknownOutcome() {
      const p = new TestProvider();
      p.lookupAnswer = "inconclusive";
      const mail = p.action("mail", { lookup: true });
      const ledger = await db.open({ actions: [mail], budget: { attempts: 1 } });
      const tenant = uniqueTenant();
      p.faults.push({ when: "before", cls: { kind: "ambiguous", reason: "timeout" } });
      return { ledger, tenant, out: await ledger.run(mail, { tenant, key: ["u"], args: { to: "x" } }) };
    }

    it("a completion the ledger cannot record: retried, then a typed error carrying the receipt; the row is settled later, never re-sent", async () => {
      const p = new TestProvider();
      const mail = p.action("mail", { lookup: true });
      let now = Date.now();
      const ledger = await db.open({ leaseMs: 300, actions: [mail], clock: () => now });
      const tenant = uniqueTenant();
      const undo = await refuse(
        ledger,
        dialect,
        "refuse_success",
        { sqlite: "NEW.status = 'succeeded'", postgres: "NEW.status = 'succeeded'" },
        "status",
      );
      const err = await ledger.run(mail, { tenant, key: ["c1"], args: { to: "x" } }).catch((e: unknown) => e);
      await undo();
      expect(err).toBeInstanceOf(CompletionNotRecordedError);
      expect(err).toMatchObject({ receipt: { id: "obj_1" }, attempt: 1 });
      const [op] = await ledger.admin.list({ tenant });
      expect(op).toMatchObject({ status: "running", id: (err as CompletionNotRecordedError).operationId });
      now += 350; // its lease runs out, by the database clock
      const later = await ledger.run(mail, { tenant, key: ["c1"], args: { to: "x" } });
      expect(later).toMatchObject({ status: "succeeded", receipt: { id: "obj_1" } }); // found by the lookup
      expect(p.effects).toHaveLength(1);
    });

    it("a completion the database keeps refusing is retried with waits for at most a lease; an error of ours is not retried", async () => {
      const p = new TestProvider();
      const mail = p.action("mail", {});
      const tenant = uniqueTenant();
      let attempts = 0;
      let refusal: () => Error = () => new Error("connection reset (test)");
      const refusing = hooked(await dialectFor(dialect, db.url()), {
        async query(q, run) {
          const completion = q.sql.startsWith('update "idem_operations"') && q.parameters.includes("succeeded");
          if (completion && q.parameters.includes(tenant)) {
            attempts += 1;
            throw refusal();
          }
          return run();
        },
      });
      const leaseMs = 1_000;
      const ledger = await openTestLedger(refusing, { leaseMs });
      try {
        const started = performance.now();
        const err = await ledger.run(mail, { tenant, key: ["r1"], args: { to: "x" } }).catch((e: unknown) => e);
        const took = performance.now() - started;
        expect(err).toBeInstanceOf(CompletionNotRecordedError);
        // Waits of 50 ms and more, doubling: a few attempts fit in the lease, never the nine allowed.
        expect(attempts).toBeGreaterThanOrEqual(3);
        expect(attempts).toBeLessThan(9);
        expect(took).toBeGreaterThanOrEqual(50 + 100);
        expect(took).toBeLessThan(leaseMs + 2_000 + 2_000); // the last wait may start just inside the lease

        // Not the database failing but the ledger refusing (an IdemError): answered at once.
        attempts = 0;
        refusal = () => new LeaseDeadlineError("op_x", 1);
        const refused = await ledger.run(mail, { tenant, key: ["r2"], args: { to: "x" } }).catch((e: unknown) => e);
        expect(refused).toBeInstanceOf(CompletionNotRecordedError);
        expect(attempts).toBe(1);
      } finally {
        await ledger.close();
      }
    });

    it("a completion that committed but whose answer was lost is the caller's own: not a replay, no fenced event", async () => {
      const p = new TestProvider();
      const mail = p.action("mail", {});
      const tenant = uniqueTenant();
      let lost = 0;
      const lossy = hooked(await dialectFor(dialect, db.url()), {
        async query(q, run) {
          const out = await run();
          const completion = q.sql.startsWith('update "idem_operations"') && q.parameters.includes("succeeded");
          if (completion && q.parameters.includes(tenant) && lost++ === 0) throw new Error("connection reset (test)");
          return out;
        },
      });
      const ledger = await openTestLedger(lossy, {});
      try {
        const out = await ledger.run(mail, { tenant, key: ["k"], args: { to: "x" } });
        // Before: replayed true ("already done earlier") and a "fenced" event in the history.
        expect(out).toMatchObject({ status: "succeeded", receipt: { id: "obj_1" }, replayed: false });
        const { events } = await ledger.get({ tenant, id: out.operationId });
        expect(events.map((e) => e.to)).toEqual(["running", "succeeded"]);
        expect(p.effects).toHaveLength(1);
      } finally {
        await ledger.close();
      }
    });

    it("heartbeats that fail: the action's signal aborts before the lease can pass to another worker", async () => {
      // 2 s: the abort comes 1.6 s after the claim (the lease less its margin), which leaves a
      // loaded machine's late timer 400 ms before the lease could pass.
      const leaseMs = 2_000;
      const ledger = await db.open({ leaseMs });
      const tenant = uniqueTenant();
      const undo = await refuse(
        ledger,
        dialect,
        "refuse_beat",
        {
          sqlite: "NEW.status = 'running' AND OLD.status = 'running' AND NEW.attempt = OLD.attempt",
          postgres: "NEW.status = 'running' AND OLD.status = 'running' AND NEW.attempt = OLD.attempt",
        },
        "lease_expires_at",
      );
      const started = performance.now();
      let reason: unknown;
      let abortedAt = Number.POSITIVE_INFINITY;
      const slow = defineAction({
        type: "slow",
        capabilities: {},
        execute: async (_a: { n: number }, op) => {
          await new Promise((resolve) => op.signal.addEventListener("abort", resolve, { once: true }));
          abortedAt = performance.now();
          reason = op.signal.reason;
          throw reason;
        },
        classify: () => ({ kind: "transient", reason: "stopped before sending" }),
      });
      const out = await ledger.run(slow, { tenant, key: ["h"], args: { n: 1 }, budget: { attempts: 1 } });
      await undo();
      expect(reason).toBeInstanceOf(LeaseDeadlineError);
      // Aborted before the lease (2 s from the claim, which came after `started`) could be taken over.
      expect(abortedAt - started).toBeLessThan(leaseMs);
      expect(out).toMatchObject({ status: "pending_verification", state: "pending" });
    });

    it("lazy args slower than the lease: the lease is kept while they are generated; never sent to review", async () => {
      const p = new TestProvider();
      const mail = p.action("mail", {});
      // Long enough that a loaded machine's late heartbeats do not lose it (150 ms did, and 600 ms,
      // once each in CI: a heartbeat is a durable commit, slow when fsyncs queue).
      const leaseMs = 2_000;
      const ledger = await db.open({ leaseMs, actions: [mail] });
      const { daemon } = await db.open({ leaseMs, actions: [mail] });
      const tenant = uniqueTenant();
      let release!: () => void;
      const slowModel = new Promise<void>((r) => (release = r));
      const run = ledger.run(mail, {
        tenant,
        key: ["lazy"],
        args: async () => {
          await slowModel;
          return { to: "x" };
        },
      });
      await new Promise((r) => setTimeout(r, 3 * leaseMs)); // three leases long
      const [op] = await ledger.admin.list({ tenant });
      const meanwhile = await daemon.settle({ tenant, id: op!.id, actor: "daemon" });
      expect(meanwhile).toMatchObject({ status: "pending_verification", state: "running" }); // its lease is live
      release();
      expect(await run).toMatchObject({ status: "succeeded", replayed: false });
      const { events } = await ledger.get({ tenant, id: op!.id });
      expect(events.map((e) => e.to)).toEqual(["running", "succeeded"]);
      expect(p.effects).toHaveLength(1);
    });

    it("a dead worker that never stored its lazy args is known not done: pending, not needs_review", async () => {
      const p = new TestProvider();
      const mail = p.action("mail", {});
      const dying = await db.open({ leaseMs: 100 });
      const ledger = await db.open({ leaseMs: 100, actions: [mail] });
      const tenant = uniqueTenant();
      void dying
        .run(mail, { tenant, key: ["gone"], args: () => new Promise<{ to: string }>(() => {}) })
        .catch(() => {});
      // Its claim is committed (polled: a loaded machine may take longer than any fixed wait)...
      const deadline = Date.now() + 20_000;
      while ((await ledger.admin.list({ tenant })).length === 0 && Date.now() < deadline) await sleep(5);
      await dying.close(); // ...then the worker is gone: no more heartbeats
      const [op] = await ledger.admin.list({ tenant });
      expect(op).toBeDefined();
      // Settled once its last lease (100 ms, by the database clock) has run out: polled, as a loaded
      // machine may take longer than any fixed wait (a settlement under a live lease leaves it running).
      const settle = () => ledger.daemon.settle({ tenant, id: op!.id, actor: "daemon" });
      let settled = await settle();
      while (settled.status === "pending_verification" && settled.state === "running" && Date.now() < deadline)
        settled = await sleep(20).then(settle);
      expect(settled).toMatchObject({ status: "pending_verification", state: "pending" });
      const out = await ledger.run(mail, { tenant, key: ["gone"], args: () => ({ to: "y" }) });
      expect(out).toMatchObject({ status: "succeeded" });
      expect(p.effects).toHaveLength(1);
      expect((await ledger.get({ tenant, id: op!.id })).events.some((e) => e.to === "needs_review")).toBe(false);
    });

    it("a caller with args that takes over a row whose lazy args were never stored records them before sending: its crash leaves an unknown outcome, not known not done", async () => {
      // A provider without our key (no dedupe), looked up by it: what it received is counted here.
      const sent: { to: string }[] = [];
      let hang = true;
      const mail = defineAction<{ to: string }, { id: string }>({
        type: "mail",
        capabilities: { lookup: true },
        execute: async (args) => {
          sent.push(args);
          if (hang) await new Promise(() => {}); // the worker dies before the answer
          return { id: `m${sent.length}` };
        },
        reconcile: async () =>
          sent.length > 0 ? { found: true, receipt: { id: "m1" } } : { found: false, proof: "absent", reason: "none" },
      });
      let at = 1_900_000_000_000;
      const clock = () => at;
      const tenant = uniqueTenant();
      const polled = async (ok: () => boolean | Promise<boolean>) => {
        const deadline = Date.now() + 20_000;
        while (!(await ok()) && Date.now() < deadline) await sleep(5);
      };
      // A claims with a generator and dies before it answers: nothing stored, nothing sent.
      const a = await db.open({ clock, leaseMs: 1_000 });
      const ledger = await db.open({ clock, leaseMs: 1_000, actions: [mail] });
      void a.run(mail, { tenant, key: ["k"], args: () => new Promise<{ to: string }>(() => {}) }).catch(() => {});
      await polled(async () => (await ledger.admin.list({ tenant })).length === 1);
      await a.close();
      at += 2_000;
      // B gives the args, takes the row over, sends, and dies before the answer.
      const b = await db.open({ clock, leaseMs: 1_000, actions: [mail] });
      void b.run(mail, { tenant, key: ["k"], args: { to: "x" } }).catch(() => {});
      await polled(() => sent.length === 1);
      await b.close();
      at += 2_000;
      hang = false;
      const [op] = await ledger.admin.list({ tenant });
      const settled = await ledger.daemon.settle({ tenant, id: op!.id, actor: "daemon" });
      // Before: "known not done" (pending), and the next caller sent a second email.
      expect(settled).toMatchObject({ status: "succeeded", receipt: { id: "m1" } });
      expect(await ledger.run(mail, { tenant, key: ["k"], args: { to: "x" } })).toMatchObject({ status: "succeeded" });
      expect(sent).toHaveLength(1);
    });

    it("a caller whose snapshot missed args an expired holder stored late sends nothing under their key: ArgsMismatchError, the row unknown", async () => {
      const sent: { to: string }[] = [];
      const mail = defineAction<{ to: string }, { id: string }>({
        type: "mail",
        capabilities: { lookup: true },
        execute: async (args) => {
          sent.push(args);
          return { id: `m${sent.length}` };
        },
        reconcile: async () => ({ found: false, proof: "inconclusive", reason: "not yet" }),
      });
      let at = 1_900_000_000_000;
      const clock = () => at;
      const tenant = uniqueTenant();
      const deadline = Date.now() + 20_000;
      // A claims with a generator and dies: nothing stored, nothing sent.
      const a = await db.open({ clock, leaseMs: 1_000 });
      void a.run(mail, { tenant, key: ["k"], args: () => new Promise<{ to: string }>(() => {}) }).catch(() => {});
      const watcher = await db.open({ clock });
      while ((await watcher.admin.list({ tenant })).length === 0 && Date.now() < deadline) await sleep(5);
      await a.close();
      at += 2_000;
      // B takes the row over with args it does not store; its write of their hash is slow.
      let release!: () => void;
      const released = new Promise<void>((r) => (release = r));
      let writing!: () => void;
      const isWriting = new Promise<void>((r) => (writing = r));
      let wrote!: () => void;
      const written = new Promise<void>((r) => (wrote = r));
      let cDone!: () => void;
      const cDecided = new Promise<void>((r) => (cDone = r));
      const slowB = hooked(await dialectFor(dialect, db.url()), {
        async query(q, run) {
          if (
            q.sql.startsWith('update "idem_operations"') &&
            q.sql.includes('"args_hash" =') &&
            q.parameters.includes(tenant)
          ) {
            writing();
            await released;
            const out = await run();
            wrote();
            await cDecided; // B hears back only once C is done: C's takeover comes first
            return out;
          }
          return run();
        },
      });
      const b = await openTestLedger(slowB, { clock, leaseMs: 1_000, actions: [mail] });
      const bOut = b.run(mail, { tenant, key: ["k"], args: { to: "x" }, storeArgs: false }).catch((e: unknown) => e);
      await isWriting;
      at += 2_000; // B's lease runs out while its write is on its way
      // C reads the row (B's attempt, no args, lease run out); B's write lands before C takes over.
      let peeked = false;
      const c = await openTestLedger(
        hooked(await dialectFor(dialect, db.url()), {
          async query(q, run) {
            // Its peek (the read a decision is made on: a settled row's outcome is read first, alone).
            if (peeked || !q.parameters.includes(tenant) || !q.sql.includes('"maybe_committed"')) return run();
            peeked = true;
            const out = await run();
            release();
            await written;
            return out;
          },
        }),
        { clock, leaseMs: 1_000, actions: [mail] },
      );
      try {
        const err = await c.run(mail, { tenant, key: ["k"], args: { to: "y" } }).catch((e: unknown) => e);
        cDone();
        // Before: y was sent under the key whose args hash is x's.
        expect(err).toBeInstanceOf(ArgsMismatchError);
        expect(sent).toEqual([]);
        const [op] = await c.admin.list({ tenant });
        expect(op).toMatchObject({ status: "unknown" });
        await bOut;
        expect(sent).toEqual([]); // B, its lease gone, did not send either
      } finally {
        cDone();
        await Promise.all([b.close(), c.close()]);
      }
    });

    it("a generator does not replace args an earlier caller sent without storing them: one request under the key", async () => {
      const received: { to: string }[] = [];
      const mail = defineAction<{ to: string }, { id: string }>({
        type: "mail",
        capabilities: { dedupe: { retentionMs: 86_400_000 } },
        execute: async (args) => {
          received.push(args);
          if (received.length === 1) throw new Error("socket hang up"); // sent, answer lost
          return { id: "m1" };
        },
        classify: () => ({ kind: "ambiguous", reason: "no answer" }),
      });
      let at = 1_900_000_000_000;
      const ledger = await db.open({ clock: () => at, budget: { attempts: 1 } });
      const tenant = uniqueTenant();
      const first = await ledger.run(mail, { tenant, key: ["k"], args: { to: "v1" }, storeArgs: false });
      expect(first).toMatchObject({ status: "pending_verification", state: "unknown" });
      const hash = (await ledger.get({ tenant, id: first.operationId })).operation.argsHash;
      at += 3_600_000; // its check is due: a replay of the same request would be safe
      const out = await ledger.run(mail, { tenant, key: ["k"], args: () => ({ to: "v2 (generated again)" }) });
      // Before: v2 was sent under v1's key and its hash replaced v1's. A generator cannot give
      // the args that were sent: as for the daemon, which has none either, a person decides.
      expect(received).toEqual([{ to: "v1" }]);
      expect(out).toMatchObject({ status: "pending_verification", state: "needs_review" });
      expect((await ledger.get({ tenant, id: first.operationId })).operation.argsHash).toBe(hash);
    });

    it("a lookup that answers no verdict (a JavaScript reconcile resolving to undefined) is inconclusive, not a TypeError", async () => {
      const looked = defineAction<{ to: string }, { id: string }>({
        type: "mail",
        capabilities: { lookup: true },
        execute: async () => {
          throw new Error("socket hang up");
        },
        classify: () => ({ kind: "ambiguous", reason: "no answer" }),
        reconcile: (async () => undefined) as never,
      });
      const ledger = await db.open({ actions: [looked], budget: { attempts: 1 } });
      const tenant = uniqueTenant();
      const out = await ledger.run(looked, { tenant, key: ["v"], args: { to: "x" } });
      expect(out).toMatchObject({ status: "pending_verification", state: "unknown" });
      // Before: a raw TypeError ("Cannot read properties of undefined") out of settle, the row left running.
      const settled = await ledger.daemon.settle({ tenant, id: out.operationId, actor: "daemon" });
      expect(settled).toMatchObject({
        status: "pending_verification",
        state: "unknown",
        reason: expect.stringMatching(/answered no verdict \(undefined\)/),
      });
    });

    it("a Retry-After longer than the budget is kept on the row, not shortened to maxDelayMs", async () => {
      const p = new TestProvider();
      const ledger = await db.open({ budget: { maxDelayMs: 1_000, elapsedMs: 2_000 } });
      const tenant = uniqueTenant();
      p.faults.push({ when: "before", cls: { kind: "rate_limited", reason: "429", retryAfterMs: 60_000 } });
      const out = await ledger.run(p.action("mail", {}), { tenant, key: ["r"], args: { to: "x" } });
      expect(out).toMatchObject({ status: "pending_verification", state: "pending" });
      const [op] = await ledger.admin.list({ tenant });
      // Never shorter than asked; spread by at most a second so the callers held back together do not return together.
      const wait = op!.nextCheckAt! - op!.updatedAt;
      expect(wait >= 60_000 && wait <= 61_000, String(wait)).toBe(true);
      // and another caller is held to it too: the provider asked everyone to wait
      expect(await ledger.run(p.action("mail", {}), { tenant, key: ["r"], args: { to: "x" } })).toMatchObject({
        state: "pending",
      });
      expect(p.effects).toHaveLength(0);
    });

    it("a lookup that never answers and ignores op.signal is given up after budget.elapsedMs: still unknown, one check more", async () => {
      const p = new TestProvider();
      const mail = p.action("mail", { lookup: true });
      const ledger = await db.open({ actions: [mail], budget: { attempts: 1, elapsedMs: 400 } });
      const tenant = uniqueTenant();
      p.faults.push({ when: "before", cls: { kind: "ambiguous", reason: "timeout" } });
      const out = await ledger.run(mail, { tenant, key: ["h"], args: { to: "x" } });
      expect(out).toMatchObject({ status: "pending_verification", state: "unknown" });
      p.lookupAnswer = "hang";
      const started = performance.now();
      const settled = await Promise.race([
        ledger.daemon.settle({ tenant, id: out.operationId, actor: "daemon" }),
        sleep(10_000).then(() => "no answer in 10 s"),
      ]);
      expect(settled).toMatchObject({
        status: "pending_verification",
        state: "unknown",
        reason: expect.stringMatching(/no answer within 400 ms/),
      });
      expect(performance.now() - started).toBeLessThan(5_000);
      expect((await ledger.get({ tenant, id: out.operationId })).operation.checks).toBe(1);
      expect(p.effects).toHaveLength(0);
      // The lookup is still out: closed without waiting a lease (30 s) for an answer that never comes.
      const closed = await ledger.close({ waitMs: 0 });
      expect(closed.lateAnswers).toEqual([{ tenant, id: out.operationId }]);
    });

    it("retry after needs_review starts the checks over", async () => {
      const { ledger, tenant, out } = await unknownOutcome();
      for (let i = 0; i < 3; i++) await ledger.daemon.settle({ tenant, id: out.operationId, actor: "daemon" });
      expect((await ledger.get({ tenant, id: out.operationId })).operation.checks).toBe(3);
      const escalated = await ledger.daemon.settle({
        tenant,
        id: out.operationId,
        actor: "daemon",
        escalate: { maxChecks: 3, maxAgeMs: 3_600_000 },
      });
      expect(escalated).toMatchObject({
        state: "needs_review",
        reason: expect.stringMatching(/still unknown after 3/),
      });
      const back = await ledger.admin.retry({ tenant, id: out.operationId, actor: "ops", reason: "not sent" });
      expect(back).toMatchObject({ status: "pending", checks: 0 });
    });

    it("a full SQLite file / a refused claim: a typed error and no effect, never a loop", async () => {
      const p = new TestProvider();
      const ledger = await db.open();
      const tenant = uniqueTenant();
      const undo =
        dialect === "sqlite"
          ? await (async () => {
              // The file may not grow by a page more: the next claim's commit fails with SQLITE_FULL.
              const { rows } = await sql<{ page_count: number }>`PRAGMA page_count`.execute(databaseOf(ledger));
              await sql.raw(`PRAGMA max_page_count = ${rows[0]!.page_count}`).execute(databaseOf(ledger));
              return async () => void (await sql.raw(`PRAGMA max_page_count = 1073741823`).execute(databaseOf(ledger)));
            })()
          : await (async () => {
              await sql
                .raw(
                  `CREATE FUNCTION refuse_claim() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION 'could not extend file: No space left on device (test)'; END $$`,
                )
                .execute(databaseOf(ledger));
              await sql
                .raw(
                  `CREATE TRIGGER refuse_claim BEFORE INSERT ON idem_operations FOR EACH ROW EXECUTE FUNCTION refuse_claim()`,
                )
                .execute(databaseOf(ledger));
              return async () => {
                await sql.raw(`DROP TRIGGER refuse_claim ON idem_operations`).execute(databaseOf(ledger));
                await sql.raw(`DROP FUNCTION refuse_claim()`).execute(databaseOf(ledger));
              };
            })();
      const big = "x".repeat(200_000); // more than the free pages left
      const errors: unknown[] = [];
      for (let i = 0; i < 5; i++)
        errors.push(
          await ledger
            .run(p.action("mail", {}), { tenant, key: [`full-${i}`], args: { to: big } })
            .catch((e: unknown) => e),
        );
      await undo();
      for (const e of errors) expect(e).toBeInstanceOf(LedgerUnavailableError);
      expect(p.calls).toBe(0);
      expect(await ledger.admin.list({ tenant })).toEqual([]);
    });

    it("the history keeps its first and last events: a transition's cost does not grow with the checks", async () => {
      const { ledger, tenant, out } = await unknownOutcome();
      for (let i = 0; i < 150; i++) await ledger.daemon.settle({ tenant, id: out.operationId, actor: "daemon" });
      const { operation, events } = await ledger.get({ tenant, id: out.operationId });
      expect(operation.checks).toBe(150);
      const total = 2 + 150 * 2; // claim, unknown, then running + unknown per check
      expect(events).toHaveLength(100);
      expect(events.slice(0, 3).map((e) => [e.id, e.from, e.to])).toEqual([
        [1, null, "running"],
        [2, "running", "unknown"],
        [3, "unknown", "running"],
      ]);
      expect(events.at(-1)!.id).toBe(total);
      expect(events.slice(10).map((e) => e.id)).toEqual(Array.from({ length: 90 }, (_, i) => total - 89 + i));
    });

    it("actions read the database's time (op.now), not the process clock", async () => {
      let seen: { now: number; createdAt: number } | undefined;
      const at = 1_900_000_000_000;
      const ledger = await db.open({ clock: () => at });
      const probe = defineAction({
        type: "probe",
        capabilities: {},
        execute: async (_a: { n: number }, op) => (seen = { now: op.now, createdAt: op.createdAt }),
      });
      await ledger.run(probe, { tenant: uniqueTenant(), key: ["t"], args: { n: 1 } });
      expect(seen).toEqual({ now: at, createdAt: at });
    });

    it("a claim answered after its lease ran out is not sent: the worker that took over did it, once", async () => {
      const p = new TestProvider();
      const mail = p.action("mail", { lookup: true });
      const other = await db.open({ leaseMs: 200, waitMs: 10_000, actions: [mail] });
      const tenant = uniqueTenant();
      // The claim commits, then its answer is held (a slow network) until another worker has
      // waited the lease out, looked the effect up (absent: nothing was sent) and done it.
      let claimed!: () => void;
      const committed = new Promise<void>((r) => (claimed = r));
      let answer!: () => void;
      const held = new Promise<void>((r) => (answer = r));
      const slow = hooked(await dialectFor(dialect, db.url()), {
        async query(q, run) {
          const out = await run();
          if (isClaim(q) && q.parameters.includes(tenant)) {
            claimed();
            await held;
          }
          return out;
        },
      });
      const late = await openTestLedger(slow, { leaseMs: 200, actions: [mail] });
      const first = late.run(mail, { tenant, key: ["z"], args: { to: "x" } });
      try {
        await committed;
        const meanwhile = await other.run(mail, { tenant, key: ["z"], args: { to: "x" } });
        expect(meanwhile).toMatchObject({ status: "succeeded", replayed: false }); // looked up (absent), then sent
        answer();
        // The late worker's lease is gone: it must not send, and gets the outcome of the other.
        expect(await first).toMatchObject({ status: "succeeded", receipt: { id: "obj_1" }, replayed: true });
        expect(p.effects).toHaveLength(1);
      } finally {
        answer();
        await first.catch(() => {});
        await late.close();
      }
    });

    it("a replay whose takeover answered after its lease sends nothing: the unknown row keeps its checks", async () => {
      const p = new TestProvider();
      const pay = p.action("pay", { dedupe: { retentionMs: 3_600_000, marginMs: 60_000 } });
      const tenant = uniqueTenant();
      // (Its lease is long: only the later caller's must run out, and this run must send in time.)
      const first = await db.open({ leaseMs: 30_000, actions: [pay], budget: { attempts: 1, baseDelayMs: 1 } });
      p.faults.push({ when: "after", cls: { kind: "ambiguous", reason: "timeout" } });
      expect(await first.run(pay, { tenant, key: ["u"], args: { to: "x" } })).toMatchObject({ state: "unknown" });
      // A later caller replays it with the same key; the statement taking the row over answers late
      // (a slow network): the lease it granted has run out on the way back.
      let late = true;
      const slow = hooked(await dialectFor(dialect, db.url()), {
        async query(q, run) {
          const out = await run();
          if (late && q.sql.startsWith('update "idem_operations"') && q.parameters.includes(tenant)) {
            late = false;
            await sleep(300); // the injected fault: an answer 300 ms late, past the 200 ms lease
          }
          return out;
        },
      });
      const caller = await openTestLedger(slow, {
        leaseMs: 200,
        waitMs: 5_000,
        actions: [pay],
        budget: { attempts: 1 },
      });
      try {
        const out = await caller.run(pay, { tenant, key: ["u"], args: { to: "x" } });
        expect(out).toMatchObject({ status: "pending_verification", state: "unknown" });
        expect(p.calls).toBe(1); // nothing was sent by the late attempt
        const { operation, events } = await caller.get({ tenant, id: out.operationId });
        // Not an execution that ended unanswered: no check counted, nothing for the replay window.
        expect(operation).toMatchObject({ status: "unknown", attempt: 2, checks: 0 });
        expect(events.at(-1)!.reason).toMatch(/ran out before its request was sent/);
      } finally {
        await caller.close();
      }
    });

    /** A provider refused the connection (nothing sent) the first time, then takes the mail. */
    function refusedOnce(type: string, onRefusal: () => void) {
      const sent = { n: 0, refused: 0 };
      const action = defineAction({
        type,
        capabilities: {}, // a plain mailer: no dedupe, no lookup
        async execute() {
          if (sent.refused === 0) {
            sent.refused += 1;
            onRefusal(); // the network goes: the ledger's database too, for a moment
            throw Object.assign(new Error("connect ECONNREFUSED 10.0.0.5:587"), { code: "ECONNREFUSED" });
          }
          sent.n += 1;
          return { messageId: "m-1" };
        },
        classify: (e) =>
          (e as { code?: string }).code === "ECONNREFUSED"
            ? { kind: "transient", reason: "connection refused: not sent" }
            : { kind: "ambiguous", reason: String(e) },
      });
      return { action, sent };
    }

    /** The ledger's database refusing the next `n` writes matching `which` (a disk full for a moment). */
    async function briefOutage(tenant: string, which: (sql: string, parameters: readonly unknown[]) => boolean) {
      const outage = { left: 0, refused: 0 };
      const dialectOut = hooked(await dialectFor(dialect, db.url()), {
        async query(q, run) {
          if (outage.left > 0 && q.parameters.includes(tenant) && which(q.sql, q.parameters)) {
            outage.left -= 1;
            outage.refused += 1;
            throw new Error("database or disk is full (test)");
          }
          return run();
        },
      });
      return { outage, dialect: dialectOut };
    }

    it("a 'not sent' end that meets a brief outage of the ledger is written once it is back: known not done, never a person's review", async () => {
      // The review's scratch (a tmpfs full for 300 ms inside a 1.5 s lease): the move to pending was
      // written once; the row stayed running, "may have committed", the caller read
      // LedgerUnavailableError, and after the lease the daemon sent it to a person.
      const tenant = uniqueTenant();
      const { outage, dialect: flaky } = await briefOutage(
        tenant,
        (text, parameters) => text.startsWith('update "idem_operations"') && parameters.includes("pending"),
      );
      const mail = refusedOnce("mail.refused", () => (outage.left = 2));
      const ledger = await openTestLedger(flaky, { actions: [mail.action], budget: { attempts: 1 } });
      try {
        const out = await ledger.run(mail.action, { tenant, key: ["k"], args: { to: "a" } });
        expect(outage.refused).toBe(2);
        expect(out).toMatchObject({ status: "pending_verification", state: "pending" });
        expect((await ledger.get({ tenant, id: out.operationId })).operation.status).toBe("pending");
        // Known not done: the daemon sends it, once.
        const settled = await ledger.daemon.settle({ tenant, id: out.operationId, actor: "daemon" });
        expect(settled).toMatchObject({ status: "succeeded", receipt: { messageId: "m-1" } });
        expect(mail.sent.n).toBe(1);
      } finally {
        await ledger.close();
      }
    });

    it("a write before the send (the provider reference) that meets a brief outage is retried: sent once, the caller reads the effect", async () => {
      const tenant = uniqueTenant();
      const { outage, dialect: flaky } = await briefOutage(
        tenant,
        (text) => text.startsWith('update "idem_operations"') && text.includes('"provider_reference" ='),
      );
      let sends = 0;
      const mail = defineAction({
        type: "mail.ref",
        capabilities: {},
        providerReference(_args: { to: string }, op) {
          outage.left = 2;
          return `<${op.key}@example.com>`;
        },
        async execute() {
          sends += 1;
          return { messageId: "m-1" };
        },
      });
      const ledger = await openTestLedger(flaky, { actions: [mail] });
      try {
        const out = await ledger.run(mail, { tenant, key: ["k"], args: { to: "a" } });
        expect(outage.refused).toBe(2);
        // Before: LedgerUnavailableError naming the operation ("may or may not have happened"), nothing sent.
        expect(out).toMatchObject({ status: "succeeded", receipt: { messageId: "m-1" }, replayed: false });
        const { operation, events } = await ledger.get({ tenant, id: out.operationId });
        expect(operation.providerReference).toMatch(/@example\.com>$/);
        expect(events.map((e) => e.to)).toEqual(["running", "succeeded"]);
        expect(sends).toBe(1);
      } finally {
        await ledger.close();
      }
    });

    it("a write before the send that fails for a whole lease gives the row back: known not done, nothing sent, the caller told so", async () => {
      const tenant = uniqueTenant();
      const { outage, dialect: flaky } = await briefOutage(
        tenant,
        (text) => text.startsWith('update "idem_operations"') && text.includes('"provider_reference" ='),
      );
      outage.left = Number.POSITIVE_INFINITY;
      let sends = 0;
      const mail = defineAction({
        type: "mail.ref.down",
        capabilities: {},
        providerReference: (_args: { to: string }, op) => `<${op.key}@example.com>`,
        async execute() {
          sends += 1;
          return { messageId: "m-1" };
        },
      });
      const ledger = await openTestLedger(flaky, { leaseMs: 600, actions: [mail], budget: { attempts: 1 } });
      try {
        const out = await ledger.run(mail, { tenant, key: ["k"], args: { to: "a" } });
        expect(outage.refused).toBeGreaterThan(2); // retried, with waits, for about a lease
        expect(out).toMatchObject({
          status: "pending_verification",
          state: "pending",
          reason: expect.stringMatching(/could not record its reference before sending .*nothing was sent/),
        });
        expect((await ledger.get({ tenant, id: out.operationId })).operation).toMatchObject({
          status: "pending",
          leaseOwner: null,
        });
        expect(sends).toBe(0);
      } finally {
        await ledger.close();
      }
    });

    it("a receipt whose recording meets a row that keeps changing is never answered as pending: the caller keeps the effect", async () => {
      // The review of 66d1b33: after five looks at a row other attempts kept taking over, fenced()
      // answered "pending verification" to the caller holding the receipt.
      const p = new TestProvider();
      const mail = p.action("mail", { lookup: true });
      const tenant = uniqueTenant();
      const side = databaseOf(await db.open());
      let bumps = 0;
      // Before each write of succeeded, another worker takes the row over (its attempt moves on).
      const contended = hooked(await dialectFor(dialect, db.url(), { groupCommit: false }), {
        async query(q, run) {
          if (
            q.sql.startsWith('update "idem_operations"') &&
            q.parameters.includes("succeeded") &&
            q.parameters.includes(tenant)
          ) {
            bumps += 1;
            await sql`update idem_operations set attempt = attempt + 1 where tenant_id = ${tenant}`.execute(side);
          }
          return run();
        },
      });
      const ledger = await openTestLedger(contended, { actions: [mail] });
      try {
        const err = await ledger.run(mail, { tenant, key: ["k"], args: { to: "x" } }).catch((e: unknown) => e);
        expect(bumps).toBeGreaterThanOrEqual(5);
        // Before: { status: "pending_verification", state: "running", reason: "lease lost to attempt 7; ..." }.
        expect(err).toBeInstanceOf(CompletionNotRecordedError);
        expect(err).toMatchObject({ receipt: { id: "obj_1" }, attempt: 1 });
        expect(p.effects).toHaveLength(1);
      } finally {
        await ledger.close();
      }
    });
  });
}
