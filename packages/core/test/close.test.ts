/**
 * `ledger.close()` with calls in flight, the usual end of a process (SIGTERM): no request goes
 * out once it began, and what was under way is recorded before the connection closes. Before,
 * the claims waiting for their commit were committed at close, their effects were sent after
 * close returned, and none could be recorded: each call waited out its lease and left its row
 * running (a person's review, for an effect done exactly once).
 */
import { describe, expect, it, vi } from "vitest";
import { z } from "zod";
import {
  CompletionNotRecordedError,
  defineAction,
  LeaseDeadlineError,
  LedgerConfigError,
  LedgerUnavailableError,
} from "@idem/core";
import { openTestLedger } from "@idem/core/testing";
import { DIALECTS, scaled, untilLockWaits, within } from "@idem/testkit";
import { heldUntilClose, holdWriteLock } from "./support/closing.js";
import { ledgers, uniqueTenant } from "./support/ledgers.js";
import { TestProvider } from "./support/provider.js";

for (const dialect of DIALECTS) {
  describe(`closing a ledger with calls in flight on ${dialect}`, () => {
    const db = ledgers(dialect);

    it("sends nothing once close began, records the effect under way, and leaves no row running", async () => {
      const ledger = await openTestLedger(db.url(), { leaseMs: 5_000 });
      const p = new TestProvider();
      const mail = p.action("mail", {});
      const tenant = uniqueTenant();
      let release!: () => void;
      p.gate = new Promise((r) => (release = r));
      const underWay = ledger.run(mail, { tenant, key: ["under-way"], args: { to: "x" } });
      await p.called(1); // its request is out, its answer held
      // Five calls that have not reached their provider yet, and the close, in one turn.
      const waiting = [1, 2, 3, 4, 5].map((i) => ledger.run(mail, { tenant, key: ["waiting", i], args: { to: "x" } }));
      const closed = ledger.close();
      await expect(ledger.run(mail, { tenant, key: ["after"], args: { to: "x" } })).rejects.toThrow(LedgerConfigError);
      release();
      await closed;
      expect(await underWay).toMatchObject({ status: "succeeded" });
      for (const out of await Promise.all(waiting))
        expect(out).toMatchObject({
          status: "pending_verification",
          state: "pending",
          reason: expect.stringMatching(/the ledger was closing before attempt 1's request was sent/),
        });
      expect(p.effects).toHaveLength(1); // the one under way, and nothing after close
      const after = await db.open();
      const rows = await after.admin.list({ tenant });
      expect(rows.map((r) => r.status).sort()).toEqual([
        "pending",
        "pending",
        "pending",
        "pending",
        "pending",
        "succeeded",
      ]);
      // A pending one is run by the next caller (or the daemon), once.
      expect(await after.run(mail, { tenant, key: ["waiting", 1], args: { to: "x" } })).toMatchObject({
        status: "succeeded",
      });
      expect(p.effects).toHaveLength(2);
    });

    it("a call waiting out a Retry-After, or still checking its input, when close begins: answered pending at once, nothing sent", async () => {
      const ledger = await openTestLedger(db.url(), { leaseMs: 20_000 });
      const p = new TestProvider();
      const mail = p.action("mail", {});
      const tenant = uniqueTenant();
      p.faults.push({ when: "before", cls: { kind: "rate_limited", reason: "slow down", retryAfterMs: 10_000 } });
      const waiting = ledger.run(mail, { tenant, key: ["rate-limited"], args: { to: "x" } });
      await p.called(1); // refused before anything was done; now in its 10 s pause
      // Its input schema is checked before the call reaches the runner: it counts from its first line.
      const sent: unknown[] = [];
      const checked = defineAction({
        type: "checked",
        capabilities: {},
        input: z.object({ to: z.string().refine(async () => true) }),
        execute: async (a) => {
          sent.push(a);
          return { ok: true };
        },
      });
      const parsing = ledger.run(checked, { tenant, key: ["parsing"], args: { to: "y" } });
      const t0 = performance.now();
      await ledger.close();
      expect(performance.now() - t0).toBeLessThan(5_000); // not the pause, nor a lease
      expect(await waiting).toMatchObject({ status: "pending_verification", state: "pending" });
      expect(await parsing).toMatchObject({
        status: "pending_verification",
        state: "pending",
        reason: expect.stringMatching(/the ledger was closing/),
      });
      expect(p.calls).toBe(1);
      expect(sent).toHaveLength(0);
    });

    /** A pending operation the daemon settles: its request refused (10 s Retry-After), then held at `gate`. */
    async function settling(leaseMs: number) {
      const p = new TestProvider();
      const mail = p.action("mail", {});
      const app = await openTestLedger(db.url(), { budget: { attempts: 1 } });
      const tenant = uniqueTenant();
      p.faults.push({ when: "before", cls: { kind: "transient", reason: "503 before execution" } });
      const parked = await app.run(mail, { tenant, key: ["due"], args: { to: "x" } });
      expect(parked).toMatchObject({ state: "pending" });
      await app.close();
      const daemon = await openTestLedger(db.url(), { leaseMs, actions: [mail] });
      return { p, tenant, id: parked.operationId, daemon };
    }

    it("close() while the daemon settles: a settlement waiting out a Retry-After ends at once, one with its request out is recorded", async () => {
      const { p, tenant, id, daemon } = await settling(20_000);
      p.faults.push({ when: "before", cls: { kind: "rate_limited", reason: "slow down", retryAfterMs: 10_000 } });
      const pausing = daemon.daemon.settle({ tenant, id });
      await p.called(2); // the daemon's try was refused: in its 10 s pause
      const t0 = performance.now();
      await daemon.close();
      expect(performance.now() - t0).toBeLessThan(5_000); // not the pause
      expect(await pausing).toMatchObject({ status: "pending_verification", state: "pending" });
      expect(p.calls).toBe(2);
      expect(p.effects).toHaveLength(0);

      // The same with its request out when close begins: the effect is recorded before close returns.
      const again = await openTestLedger(db.url(), { leaseMs: 20_000, actions: [p.action("mail", {})] });
      let release!: () => void;
      p.gate = new Promise((r) => (release = r));
      const underWay = again.daemon.settle({ tenant, id });
      await p.called(3);
      const closed = again.close();
      release();
      await closed;
      expect(await underWay).toMatchObject({ status: "succeeded" });
      expect(p.effects).toHaveLength(1);
      const after = await db.open();
      expect((await after.get({ tenant, id })).operation.status).toBe("succeeded");
    });

    it("close() while an abandoned execute's answer is still out: close waits for it (up to a lease), and its receipt is recorded", async () => {
      const ledger = await openTestLedger(db.url(), { leaseMs: 20_000 });
      const p = new TestProvider();
      const mail = p.action("mail", { lookup: true });
      const tenant = uniqueTenant();
      let release!: () => void;
      p.gate = new Promise((r) => (release = r)); // its request is taken, its answer held; its signal ignored
      const gaveUp = new AbortController();
      const call = ledger.run(mail, { tenant, key: ["late"], args: { to: "x" }, signal: gaveUp.signal });
      await p.called(1);
      gaveUp.abort(new Error("the agent's turn ended"));
      // The caller is answered a second later; the request is abandoned, not ended.
      await expect(call).rejects.toThrow("the agent's turn ended");
      const [op] = await ledger.admin.list({ tenant });
      expect(op).toMatchObject({ status: "unknown" });
      const closed = ledger.close();
      release();
      await closed;
      // Recorded before the connection closed: not left for a lookup.
      const after = await db.open();
      expect(await after.status({ tenant, id: op!.id })).toMatchObject({ status: "succeeded" });
      expect(p.effects).toHaveLength(1);
    });

    /** A call given up by its caller while its request's answer is held: abandoned, unknown, its late answer awaited by close. */
    async function abandoned(ledger: Awaited<ReturnType<typeof openTestLedger>>) {
      const p = new TestProvider();
      const mail = p.action("mail", { lookup: true });
      const tenant = uniqueTenant();
      let release!: () => void;
      p.gate = new Promise((r) => (release = r)); // its request is taken, its answer held; its signal ignored
      const gaveUp = new AbortController();
      const call = ledger.run(mail, { tenant, key: ["late"], args: { to: "x" }, signal: gaveUp.signal });
      await p.called(1);
      gaveUp.abort(new Error("the agent's turn ended"));
      await expect(call).rejects.toThrow("the agent's turn ended");
      const [op] = await ledger.admin.list({ tenant });
      expect(op).toMatchObject({ status: "unknown" });
      return { p, tenant, id: op!.id, release };
    }

    it("close({ waitMs }): stops waiting for a late answer after waitMs, closes the connection and names the operation it did not await", async () => {
      const ledger = await openTestLedger(db.url(), { leaseMs: 20_000 });
      const { p, tenant, id, release } = await abandoned(ledger);
      const t0 = performance.now();
      // Before: no bound but the lease (20 s here), and nothing said which answer was left.
      const closed = await ledger.close({ waitMs: 300 });
      const took = performance.now() - t0;
      expect({ closed, cutShort: took < 10_000 }).toEqual({
        closed: { lateAnswers: [{ tenant, id }], inFlight: [] },
        cutShort: true,
      });
      await expect(ledger.run(p.action("mail", {}), { tenant, key: ["after"], args: { to: "x" } })).rejects.toThrow(
        LedgerConfigError,
      );
      release(); // the answer comes after the close: nowhere to record it, and no error escapes
      await vi.waitFor(() => expect(p.effects).toHaveLength(1));
      const after = await db.open();
      // As the cut-off left it: unknown, for its lookup (the effect happened: the lookup finds it).
      expect((await after.get({ tenant, id })).operation.status).toBe("unknown");
      expect(p.effects).toHaveLength(1);
    });

    it("close({ waitMs }): an operation with two late answers out (an abandoned execute's, a given-up lookup's) is named once", async () => {
      // A short lease: the abandoned request's operation is due for its lookup soon after.
      const ledger = await openTestLedger(db.url(), { leaseMs: 1_500 });
      const { p, tenant, id, release } = await abandoned(ledger);
      p.lookupAnswer = "hang"; // its lookup never answers, and ignores its signal
      const gaveUp = new AbortController();
      const mail = p.action("mail", { lookup: true });
      let looking: Promise<unknown> | undefined;
      // Called again until a call looks it up (the ones before answer "next check in …" at once).
      await vi.waitFor(
        async () => {
          if (p.lookups === 0) {
            looking = ledger.run(mail, { tenant, key: ["late"], args: { to: "x" }, signal: gaveUp.signal });
            await Promise.race([looking, new Promise((r) => setTimeout(r, 100))]);
          }
          expect(p.lookups).toBeGreaterThan(0);
        },
        { timeout: 30_000, interval: 50 },
      );
      gaveUp.abort(new Error("the agent's turn ended"));
      await expect(looking).rejects.toThrow("the agent's turn ended");
      expect(await ledger.close({ waitMs: 300 })).toEqual({ lateAnswers: [{ tenant, id }], inFlight: [] });
      release();
    });

    it("close({ waitMs }): a late answer that comes within waitMs is recorded, and none is named", async () => {
      const ledger = await openTestLedger(db.url(), { leaseMs: 20_000 });
      const { p, tenant, id, release } = await abandoned(ledger);
      const closed = ledger.close({ waitMs: 15_000 });
      release();
      expect(await closed).toEqual({ lateAnswers: [], inFlight: [] });
      const after = await db.open();
      expect(await after.status({ tenant, id })).toMatchObject({ status: "succeeded" });
      expect(p.effects).toHaveLength(1);
    });

    it("close({ waitMs }): a call whose request is still out when it stops waiting is named (inFlight), and its caller hears the ledger closed", async () => {
      const ledger = await openTestLedger(db.url(), { leaseMs: 20_000 });
      const p = new TestProvider();
      const mail = p.action("mail", { lookup: true });
      const tenant = uniqueTenant();
      let release!: () => void;
      p.gate = new Promise((r) => (release = r)); // its request is taken, its answer held past waitMs
      const call = ledger.run(mail, { tenant, key: ["held"], args: { to: "x" } });
      const heard = call.then(
        (out) => ({ out }),
        (error: unknown) => ({ error }),
      );
      await p.called(1);
      const [op] = await ledger.admin.list({ tenant });
      // Before: { lateAnswers: [] }, the call not named, though its outcome could no longer be recorded.
      expect(await ledger.close({ waitMs: 300 })).toEqual({ lateAnswers: [], inFlight: [{ tenant, id: op!.id }] });
      release(); // the effect happens after the close: its receipt reaches the caller, not the ledger
      const t0 = performance.now();
      const { error } = (await heard) as { error: CompletionNotRecordedError };
      // Before: the closed connection was retried as an outage (about 8 s), then said "the ledger database failed".
      expect(performance.now() - t0).toBeLessThan(5_000);
      expect(error).toBeInstanceOf(CompletionNotRecordedError);
      expect(error).toMatchObject({ operationId: op!.id, receipt: { id: "obj_1" } });
      expect(error.cause).toBeInstanceOf(LedgerUnavailableError);
      expect(error.cause).toMatchObject({
        closed: true,
        message: expect.stringMatching(/^the ledger was closed while/),
      });
      // Read through a fresh ledger: running under the attempt's lease, settled by the replay policy once it ends.
      const after = await db.open();
      const { operation } = await after.get({ tenant, id: op!.id });
      expect(operation).toMatchObject({ status: "running", attempt: 1, result: null });
      expect(operation.leaseExpiresAt).toBeGreaterThan(await after.admin.now());
      expect(await after.status({ tenant, id: op!.id })).toMatchObject({
        status: "pending_verification",
        state: "running",
      });
      expect(p.effects).toHaveLength(1);
    });

    it("close({ waitMs }): a call whose request never answers is named, and its caller hears the ledger closed a second after the close, not a lease later", async () => {
      // A long lease: its deadline is not what ends the call.
      const ledger = await openTestLedger(db.url(), { leaseMs: 60_000 });
      const p = new TestProvider();
      const mail = p.action("mail", { lookup: true });
      const tenant = uniqueTenant();
      p.gate = new Promise(() => {}); // never answers, and ignores its signal
      const call = ledger.run(mail, { tenant, key: ["never"], args: { to: "x" } });
      const heard = call.then(
        (out) => ({ out }),
        (error: unknown) => ({ error }),
      );
      await p.called(1);
      const [op] = await ledger.admin.list({ tenant });
      expect(await ledger.close({ waitMs: 300 })).toEqual({ lateAnswers: [], inFlight: [{ tenant, id: op!.id }] });
      const t0 = performance.now();
      // Its lease is not renewed through a closed ledger: the attempt is abandoned (its signal
      // aborted at the close, a second's grace), its outcome not recorded.
      const { error } = (await heard) as { error: LedgerUnavailableError };
      // Before: at the lease's deadline (58 s here).
      expect(performance.now() - t0).toBeLessThan(20_000);
      expect(error).toBeInstanceOf(LedgerUnavailableError);
      expect(error).toMatchObject({
        closed: true,
        reopen: false,
        operationId: op!.id,
        message: expect.stringMatching(/^the ledger was closed while/),
      });
      const after = await db.open();
      expect((await after.get({ tenant, id: op!.id })).operation).toMatchObject({ status: "running", attempt: 1 });
    });

    it("close({ waitMs }): an action still running when it stops waiting sees its signal aborted for the close as the close ends, not at its lease's deadline, and sends nothing after", async () => {
      // A long lease: a deadline a minute away cannot be what aborts the signal.
      const ledger = await openTestLedger(db.url(), { leaseMs: 60_000 });
      const tenant = uniqueTenant();
      let running!: () => void;
      const started = new Promise<void>((r) => (running = r));
      // The action's next request waits for this (a step after a first one, a page of a batch):
      // released after the close, it is sent only if its signal has not aborted.
      let proceed!: () => void;
      const next = new Promise<void>((r) => (proceed = r));
      const reasons: unknown[] = [];
      const sent: string[] = [];
      const waits = defineAction({
        type: "waits",
        capabilities: {},
        execute: async (_a: { to: string }, op) => {
          op.signal.addEventListener("abort", () => reasons.push(op.signal.reason), { once: true });
          running();
          await Promise.race([next, new Promise((r) => op.signal.addEventListener("abort", r, { once: true }))]);
          if (op.signal.aborted) throw op.signal.reason;
          sent.push("the next request"); // as fetch(url, { signal }) would send it
          return { ok: true };
        },
        classify: (error) => ({ kind: "ambiguous", reason: String(error) }),
      });
      const call = ledger.run(waits, { tenant, key: ["waits"], args: { to: "x" } });
      const heard = call.then(
        (out) => ({ out }),
        (error: unknown) => ({ error }),
      );
      await started;
      const [op] = await ledger.admin.list({ tenant });
      expect(await ledger.close({ waitMs: 300 })).toEqual({ lateAnswers: [], inFlight: [{ tenant, id: op!.id }] });
      // Aborted by the time close answered. Before: only at the lease's deadline (58 s here), and
      // the request released meanwhile went out after the ledger said it closed.
      expect(reasons).toHaveLength(1);
      proceed();
      const { error } = (await heard) as { error: unknown };
      expect(error).toMatchObject({ closed: true });
      expect(sent).toEqual([]);
      expect(reasons[0]).toBeInstanceOf(LedgerUnavailableError);
      expect(reasons[0]).not.toBeInstanceOf(LeaseDeadlineError);
      expect(reasons[0]).toMatchObject({
        closed: true,
        reopen: false,
        operationId: op!.id,
        message: expect.stringMatching(
          /^the ledger was closed while this call was in flight \(its close stopped waiting for it\): its outcome is not recorded and its lease is no longer renewed; .*settled by the replay policy/,
        ),
      });
      // Left running under the attempt's lease (not given back: its request may have been out), for the replay policy.
      const after = await db.open();
      const { operation } = await after.get({ tenant, id: op!.id });
      expect(operation).toMatchObject({ status: "running", attempt: 1 });
      expect(operation.leaseExpiresAt).toBeGreaterThan(await after.admin.now());
    });

    it("close({ waitMs }): an outcome a call writes after the close stopped waiting is refused, not committed while the close drains a write that waits for a lock", async () => {
      const ledger = await openTestLedger(db.url(), { leaseMs: 60_000, busyTimeoutMs: 60_000 });
      const tenant = uniqueTenant();
      // Answers its abort at once with its own error, as fetch does (an AbortError): ambiguous.
      const { held: waits, started } = heldUntilClose();
      const plain = defineAction({ type: "plain", capabilities: {}, execute: async () => ({ ok: true }) });
      const heard = ledger.run(waits, { tenant, key: ["waits"], args: { to: "x" } }).then(
        (out) => ({ out }),
        (error: unknown) => ({ error }),
      );
      await started;
      const [op] = await ledger.admin.list({ tenant });
      // Another process holds the write lock: a claim made now waits for it, and so does the end
      // of the close, which lets the statements already waiting have their answer.
      const lock = await holdWriteLock(dialect, db.url());
      const waiting = ledger.run(plain, { tenant, key: ["waiting"], args: {} }).catch((e: unknown) => e);
      const closing = ledger.close({ waitMs: 300 });
      // Before (SQLite): the outcome, written once the action heard the close, waited in that
      // drain with the claim, and was committed once the lock was let go.
      const early = await Promise.race([
        heard,
        new Promise((r) => setTimeout(() => r("still waiting for the lock"), scaled(5_000))),
      ]);
      await lock.release();
      const closed = await closing;
      await waiting;
      expect(closed.inFlight).toContainEqual({ tenant, id: op!.id });
      expect(early).not.toBe("still waiting for the lock");
      const { error } = (await heard) as { error: unknown };
      expect(error).toBeInstanceOf(LedgerUnavailableError);
      expect(error).toMatchObject({
        closed: true,
        operationId: op!.id,
        message: expect.stringMatching(/^the ledger was closed while this call was in flight/),
      });
      // As the close said: not recorded, running under the attempt's lease, for the replay policy.
      const after = await db.open();
      expect((await after.get({ tenant, id: op!.id })).operation).toMatchObject({ status: "running", attempt: 1 });
    });

    // SQLite: claims waiting in the group commit's queue (the second one inserted before it reads,
    // store.ts `claim`), and claims waiting alone (sqlite-busy.ts).
    for (const groupCommit of dialect === "sqlite" ? [true, false] : [true])
      it(`close({ waitMs }): claims still waiting for a lock when the close stops waiting are refused (nothing written, their callers told so and that calling again is safe): at their next try on SQLite, cancelled on the server on Postgres${groupCommit ? "" : " (no group commit)"}`, async () => {
        const ledger = await openTestLedger(db.url(), {
          leaseMs: 60_000,
          busyTimeoutMs: 60_000,
          lockTimeoutMs: 60_000,
          groupCommit,
        });
        const tenant = uniqueTenant();
        const p = new TestProvider();
        const { held, started, closeStoppedWaiting } = heldUntilClose();
        const holding = ledger.run(held, { tenant, key: ["held"], args: { to: "x" } }).catch((e: unknown) => e);
        await started;
        // Another process holds the write lock: these claims wait for it, past the close's waitMs.
        const lock = await holdWriteLock(dialect, db.url());
        const keys = [
          ["waiting", 1],
          ["waiting", 2],
        ];
        const heard = keys.map((key) =>
          ledger.run(p.action("plain", {}), { tenant, key, args: { to: "x" } }).then(
            (out) => ({ out }),
            (error: unknown) => ({ error }),
          ),
        );
        const closing = ledger.close({ waitMs: 300 });
        // Let go once the close stopped waiting: before (SQLite), the close let the claims wait out
        // the lock and committed them, rows running under a lease nobody renews, of calls the
        // close did not name (their claims had no answer yet).
        await closeStoppedWaiting;
        // Postgres: answered while the lock is still held, their statements cancelled. Before, they
        // waited on the server (and the close's end with them) and committed once it was let go.
        if (dialect === "postgres") await within(scaled(10_000), "the claims cancelled", Promise.all(heard));
        await lock.release();
        const closed = await closing;
        await holding;
        const errors = (await Promise.all(heard)).map((h) => (h as { error: unknown }).error);
        for (const error of errors) {
          expect(error).toBeInstanceOf(LedgerUnavailableError);
          expect(error).toMatchObject({ closed: true });
        }
        expect(p.calls).toBe(0);
        const after = await db.open();
        const [first] = await after.admin.list({ tenant, action: "held" });
        const waiting = await after.admin.list({ tenant, action: "plain" });
        // Refused, none of them run, and their callers read that, not a lease and a row that do
        // not exist (before: the close's message for a call in flight, of "the operation" as its
        // last write left it, running under that lease).
        expect(waiting).toEqual([]);
        expect(closed.inFlight).toEqual([{ tenant, id: first!.id }]);
        for (const error of errors)
          expect(error).toMatchObject({
            unclaimed: true,
            operationId: undefined,
            message:
              "the ledger was closed before this call's claim was written: no operation was recorded for this call and nothing was sent; calling again with the same key on an open ledger is safe",
          });
        // As they were told: called again, each key is claimed and done, once.
        for (const key of keys)
          expect(await after.run(p.action("plain", {}), { tenant, key, args: { to: "x" } })).toMatchObject({
            status: "succeeded",
          });
        expect(p.calls).toBe(2);
      });

    if (dialect === "postgres")
      it("close({ waitMs }) on Postgres: a call waiting for one of the pool's connections as the pool ends is answered then, not at its connect timeout, nothing sent or written", async () => {
        // One connection, and a connect timeout far past the test's bound: only the close can answer.
        const ledger = await openTestLedger(db.url(), { leaseMs: 60_000, poolSize: 1, connectTimeoutMs: 600_000 });
        const tenant = uniqueTenant();
        const p = new TestProvider();
        const plain = p.action("plain", {});
        const { held, started, closeStoppedWaiting } = heldUntilClose();
        const holding = ledger.run(held, { tenant, key: ["held"], args: { to: "x" } }).catch((e: unknown) => e);
        await started;
        // Another process's lock: the first claim holds the pool's only connection, waiting on the
        // server for it; the second waits for that connection.
        const lock = await holdWriteLock(dialect, db.url());
        const answered: string[] = [];
        const call = (key: string) =>
          ledger
            .run(plain, { tenant, key: [key], args: { to: "x" } })
            .catch((e: unknown) => e)
            .finally(() => answered.push(key));
        const calls = [call("a"), call("b")];
        await untilLockWaits(db.url(), 1);
        const closing = ledger.close({ waitMs: scaled(300) });
        await closeStoppedWaiting;
        // Before: the waiting call heard nothing until its connect timeout (10 s by default; here
        // 600 s), and pg-pool's timer does not hold the process: one that ended first never heard.
        // And the claim holding the connection waited on the server until the lock was let go.
        const bound = new Promise((r) => setTimeout(() => r("still waiting"), scaled(10_000)));
        expect(await Promise.race([Promise.all(calls), bound])).not.toBe("still waiting");
        await lock.release();
        const closed = await closing;
        await holding;
        const errors = (await Promise.all(calls)) as LedgerUnavailableError[];
        for (const error of errors) {
          expect(error).toBeInstanceOf(LedgerUnavailableError);
          expect(error).toMatchObject({ closed: true });
        }
        // Both are told their claims were not written, and no operation: the one that waited for
        // the connection, never sent, and the one whose claim the end cancelled on the server.
        for (const error of errors)
          expect(error).toMatchObject({
            unclaimed: true,
            operationId: undefined,
            message: expect.stringMatching(/^the ledger was closed before this call's claim was written/),
          });
        expect(p.calls).toBe(0);
        const after = await db.open();
        expect(await after.admin.list({ tenant, action: "plain" })).toEqual([]);
        const [first] = await after.admin.list({ tenant, action: "held" });
        expect(closed.inFlight).toEqual([{ tenant, id: first!.id }]);
        expect(answered).toHaveLength(2);
      });

    it("close({ waitMs }): the writes already waiting for a lock as the close stops waiting still end: an effect's receipt and a request not sent are recorded", async () => {
      const ledger = await openTestLedger(db.url(), { leaseMs: 60_000, busyTimeoutMs: 60_000 });
      const tenant = uniqueTenant();
      const { held, started, closeStoppedWaiting } = heldUntilClose();
      const p = new TestProvider();
      let go!: () => void;
      p.gate = new Promise<void>((r) => (go = r));
      // A 503 before the provider did anything: the call writes `pending` (known not done).
      let refuse!: () => void;
      const refused = new Promise<void>((r) => (refuse = r));
      let entered!: () => void;
      const inside = new Promise<void>((r) => (entered = r));
      const unavailable = defineAction({
        type: "unavailable",
        capabilities: {},
        execute: async () => {
          entered();
          await refused;
          throw new Error("503 Service Unavailable");
        },
        classify: () => ({ kind: "transient", reason: "503, nothing done" }),
      });
      const holding = ledger.run(held, { tenant, key: ["held"], args: { to: "x" } }).catch((e: unknown) => e);
      const done = ledger.run(p.action("mail", {}), { tenant, key: ["done"], args: { to: "x" } });
      const notSent = ledger.run(unavailable, { tenant, key: ["not-sent"], args: {}, budget: { attempts: 1 } });
      await Promise.all([started, p.called(1), inside]);
      const lock = await holdWriteLock(dialect, db.url());
      // Both writes now wait for the lock, well before the close stops waiting.
      go();
      refuse();
      const closing = ledger.close({ waitMs: scaled(1_000) });
      await closeStoppedWaiting;
      await lock.release();
      const closed = await closing;
      await holding;
      // Before (SQLite, at 9812ccd): both were refused with the close, the rows left running,
      // the request not sent taken later for one that may have been (a person's review).
      const told = await done;
      expect(told).toMatchObject({ status: "succeeded", receipt: { id: "obj_1" } });
      await notSent;
      const after = await db.open();
      const rows = new Map((await after.admin.list({ tenant })).map((o) => [o.action, o]));
      expect(rows.get("mail")).toMatchObject({ status: "succeeded" });
      expect(rows.get("unavailable")).toMatchObject({ status: "pending" });
      expect(p.effects).toHaveLength(1);
      // Named as in flight when the close stopped waiting; their rows are the truth.
      expect(closed.inFlight).toContainEqual({ tenant, id: rows.get("held")!.id });
    });

    it("close({ waitMs }) while the daemon settles: a settlement whose request is still out is named (inFlight)", async () => {
      const { p, tenant, id, daemon } = await settling(20_000);
      let release!: () => void;
      p.gate = new Promise((r) => (release = r));
      const underWay = daemon.daemon.settle({ tenant, id });
      const heard = underWay.then(
        (out) => ({ out }),
        (error: unknown) => ({ error }),
      );
      await p.called(2);
      expect(await daemon.close({ waitMs: 300 })).toEqual({ lateAnswers: [], inFlight: [{ tenant, id }] });
      release();
      expect(await heard).toMatchObject({ error: expect.any(CompletionNotRecordedError) });
      const after = await db.open();
      expect((await after.get({ tenant, id })).operation).toMatchObject({ status: "running", attempt: 2 });
    });

    it("close({ waitMs }) with a waitMs that is no duration is refused, the ledger left open", async () => {
      const ledger = await openTestLedger(db.url());
      for (const waitMs of [-1, Number.NaN, 2 ** 31]) await expect(ledger.close({ waitMs })).rejects.toThrow(/waitMs/);
      expect(await ledger.admin.list({ tenant: uniqueTenant() })).toEqual([]);
      expect(await ledger.close({ waitMs: 0 })).toEqual({ lateAnswers: [], inFlight: [] });
    });

    it("a call whose stop signal aborts while it waits out a Retry-After: answered pending at once, nothing more sent, no rejection", async () => {
      const ledger = await openTestLedger(db.url(), { leaseMs: 20_000 });
      const p = new TestProvider();
      const mail = p.action("mail", {});
      const tenant = uniqueTenant();
      p.faults.push({ when: "before", cls: { kind: "rate_limited", reason: "slow down", retryAfterMs: 10_000 } });
      const stop = new AbortController();
      const waiting = ledger.run(mail, { tenant, key: ["stopped"], args: { to: "x" }, stop: stop.signal });
      await p.called(1);
      const t0 = performance.now();
      stop.abort();
      expect(await waiting).toMatchObject({ status: "pending_verification", state: "pending" });
      expect(performance.now() - t0).toBeLessThan(5_000);
      expect(p.calls).toBe(1);
      // The ledger itself stays open: the row is pending, held by the provider's Retry-After for every caller.
      expect(await ledger.run(mail, { tenant, key: ["stopped"], args: { to: "x" } })).toMatchObject({
        state: "pending",
        reason: expect.stringMatching(/^known not done; retried in \d+ ms$/),
      });
      expect(p.effects).toHaveLength(0);
      await ledger.close();
    });

    it("a settlement whose stop signal aborts ends as at close: no request after it, the pause ended, the ledger still open", async () => {
      const { p, tenant, id, daemon } = await settling(20_000);
      p.faults.push({ when: "before", cls: { kind: "transient", reason: "503 before execution" } });
      const stop = new AbortController();
      // A backoff of seconds between tries, as the daemon's budget allows.
      const pausing = daemon.daemon.settle({ tenant, id, stop: stop.signal });
      await p.called(2);
      const t0 = performance.now();
      stop.abort(new Error("the daemon is stopping"));
      const out = await pausing;
      expect(performance.now() - t0).toBeLessThan(5_000);
      expect(out).toMatchObject({ status: "pending_verification", state: "pending" });
      expect(p.calls).toBe(2); // before: it waited out its backoff and sent again
      // Stopped before it sent: nothing is sent, the row stays pending for the next settlement.
      const stopped = await daemon.daemon.settle({ tenant, id, stop: stop.signal });
      expect(stopped).toMatchObject({
        state: "pending",
        reason: "known not done; the settlement was stopped, the daemon or a later call retries",
      });
      expect(p.calls).toBe(2);
      expect(await daemon.daemon.settle({ tenant, id })).toMatchObject({ status: "succeeded" });
      expect(p.effects).toHaveLength(1);
      await daemon.close();
    });
  });
}
