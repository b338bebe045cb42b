/**
 * A model calling a guarded tool for work whose operation already exists: in flight (parallel
 * tool calls of one step), settled, or its ledger unreachable. Each call reads what is true of
 * the work, and none makes a second effect. Effects are counted in the action.
 */
import { describe, expect, it } from "vitest";
import { z } from "zod";
import { defineAction, openLedger, type LedgerOptions } from "@idem/core";
import { DIALECTS, ledgersFor, pgProxy } from "@idem/testkit";
import { databaseOf, openTestLedger } from "@idem/core/testing";
import { guard, statusTool } from "@idem/agents";
// The core's test dialect with hooks around each statement (to act right after a read).
import { dialectFor, hooked } from "../../core/test/support/dialects.js";

/** A note whose send waits for `release()`: the first call's request is out, its answer not come. */
function slowNote(type: string) {
  const sent: string[] = [];
  let release!: () => void;
  const released = new Promise<void>((r) => (release = r));
  let started!: () => void;
  const executing = new Promise<void>((r) => (started = r));
  const tool = {
    name: "send_note",
    description: "Send a note, once per note id.",
    action: defineAction<{ text: string }, { id: string }>({
      type,
      capabilities: {},
      async execute(args) {
        sent.push(args.text);
        started();
        await released;
        return { id: `n${sent.length}` };
      },
    }),
    input: z.object({ noteId: z.string().min(1), text: z.string() }),
    args: (i: { text: string }) => ({ text: i.text }),
    key: (i: { noteId: string }) => ["note", i.noteId],
  };
  return { tool, sent, release, executing };
}

/** The tenant's newest operation (the one a call in flight made). */
async function lastOperation(ledger: Awaited<ReturnType<typeof openLedger>>) {
  const [op] = await ledger.admin.list({ tenant: "acme", limit: 1 });
  if (!op) throw new Error("no operation");
  return op;
}

for (const dialect of DIALECTS) {
  describe(`a guarded tool called again for work under way or done, on ${dialect}`, () => {
    const db = ledgersFor(dialect, openLedger, { defaults: { poolSize: 4 } as LedgerOptions });

    it("parallel calls of one step while the first is out: pending, refused for other args, nothing sent twice", async () => {
      const ledger = await db.open();
      const { tool, sent, release, executing } = slowNote("test.parallel");
      const run = guard(ledger, tool, { tenant: "acme", waitMs: 100 });
      const first = run({ noteId: "p1", text: "hello" }, { context: {}, callId: "call_a" });
      await executing;
      const same = await run({ noteId: "p1", text: "hello" }, { context: {}, callId: "call_b" });
      const other = await run({ noteId: "p1", text: "goodbye" }, { context: {}, callId: "call_c" });
      expect(same).toMatchObject({ status: "pending_verification", state: "running" });
      expect(same.message).toMatch(/Do not retry it/);
      const id = (same as { operationId: string }).operationId;
      expect(other).toMatchObject({ status: "refused", operationId: id });
      expect(other.message).toMatch(/is already under way with different arguments/);
      // The status tool, asked while it is out, says so.
      const checked = await statusTool(ledger, { tenant: "acme" })({ operationId: id }, { context: {} });
      expect(checked).toMatchObject({ status: "pending_verification", state: "running" });
      release();
      expect(await first).toMatchObject({ status: "done", operationId: id });
      expect(await run({ noteId: "p1", text: "hello" }, { context: {}, callId: "call_d" })).toMatchObject({
        status: "already_done",
        operationId: id,
      });
      expect(sent).toEqual(["hello"]);
      // The other arguments were written nowhere: the stored args are the first call's, and the
      // refused call (call_c) is in no audit event.
      const { operation, args, events } = await ledger.get({ tenant: "acme", id });
      expect(operation.status).toBe("succeeded");
      expect(args).toEqual({ text: "hello" });
      expect(events.map((e) => e.actor)).not.toContain("call_c");
    });

    it("a duplicate waiting on the first whose framework stops it: pending with the operation, the first's lease kept", async () => {
      const ledger = await db.open();
      const tenant = "acme-stop";
      const { tool, sent, release, executing } = slowNote("test.parallel-stop");
      const options = { tenant, waitMs: 60_000 };
      const first = guard(ledger, tool, options)({ noteId: "s1", text: "hello" }, { context: {}, callId: "call_a" });
      await executing;
      // The duplicate (another worker) reads the row, under the first's lease, then waits on it.
      let read!: () => void;
      const hasRead = new Promise<void>((r) => (read = r));
      const duplicate = await openTestLedger(
        hooked(await dialectFor(dialect, db.url()), {
          async query(q, run) {
            const out = await run();
            if (q.parameters.includes(tenant)) read();
            return out;
          },
        }),
      );
      try {
        const stop = new AbortController();
        const second = guard(
          duplicate,
          tool,
          options,
        )({ noteId: "s1", text: "hello" }, { context: {}, callId: "call_b", stop: stop.signal });
        await hasRead;
        stop.abort(new DOMException("This operation was aborted", "AbortError")); // the run aborted
        const out = await second;
        const [op] = await ledger.admin.list({ tenant });
        expect(out).toMatchObject({ status: "pending_verification", state: "running", operationId: op!.id });
        expect(out.message).toMatch(/it is being performed/);
        expect(op).toMatchObject({ status: "running", attempt: 1 }); // the first's attempt, untouched
        release();
        expect(await first).toMatchObject({ status: "done", operationId: op!.id });
        expect(sent).toEqual(["hello"]);
      } finally {
        release();
        await duplicate.close();
      }
    });

    it("stopped while its lost answer waits to be replayed: unknown, to the call, the status tool and the same input again, one request", async () => {
      const ledger = await db.open({ budget: { attempts: 3, baseDelayMs: 60_000 } });
      const tenant = "acme-unknown";
      const stop = new AbortController();
      // A provider that dedupes on our key (as Stripe does): a replay returns the first result.
      const made = new Map<string, string>();
      let requests = 0;
      const charge = {
        name: "charge",
        description: "Charge, once per invoice.",
        action: defineAction<{ amount: number }, { id: string }>({
          type: "test.dedupe-lost",
          capabilities: { dedupe: { retentionMs: 24 * 3_600_000 } }, // Stripe's 24 h
          async execute(_args, op) {
            requests += 1;
            if (!made.has(op.key)) made.set(op.key, `ch_${made.size + 1}`);
            if (requests === 1) {
              // Committed, its answer lost; the framework stops the run while the replay waits.
              queueMicrotask(() => stop.abort(new DOMException("This operation was aborted", "AbortError")));
              throw Object.assign(new Error("socket hang up"), { code: "ECONNRESET" });
            }
            return { id: made.get(op.key)! };
          },
        }),
        input: z.object({ invoice: z.string(), amount: z.number() }),
        args: (i: { amount: number }) => ({ amount: i.amount }),
        key: (i: { invoice: string }) => ["invoice", i.invoice],
      };
      const run = guard(ledger, charge, { tenant });
      const input = { invoice: "inv-1", amount: 100 };
      const first = await run(input, { context: {}, callId: "a", stop: stop.signal });
      // Not "not performed" nor "failed": it may have happened, and no one may charge it by hand.
      expect(first).toMatchObject({ status: "pending_verification", state: "unknown" });
      expect(first.message).toMatch(/its outcome is being checked with the provider\. Do not retry it/);
      const id = (first as { operationId: string }).operationId;
      const checked = await statusTool(ledger, { tenant })({ operationId: id }, { context: {} });
      expect(checked).toMatchObject({ status: "pending_verification", state: "unknown", operationId: id });
      // The model asks again before the replay is due: told the same, nothing sent meanwhile.
      const again = await run(input, { context: {}, callId: "b" });
      expect(again).toMatchObject({ status: "pending_verification", state: "unknown", operationId: id });
      expect(requests).toBe(1);
      expect([...made.values()]).toEqual(["ch_1"]);
    });

    it("work found under an ambiguous outcome: the second call reads pending, never a second send", async () => {
      const ledger = await db.open();
      let sends = 0;
      const lost = {
        name: "send_note",
        description: "Send a note.",
        action: defineAction<{ text: string }, { id: string }>({
          type: "test.lost-again",
          capabilities: {},
          async execute() {
            sends += 1;
            throw Object.assign(new Error("socket hang up"), { code: "ECONNRESET" });
          },
        }),
        input: z.object({ noteId: z.string(), text: z.string() }),
        args: (i: { text: string }) => ({ text: i.text }),
        key: (i: { noteId: string }) => ["note", i.noteId],
      };
      const run = guard(ledger, lost, { tenant: "acme" });
      const first = await run({ noteId: "u1", text: "x" }, { context: {}, callId: "a" });
      const again = await run({ noteId: "u1", text: "x" }, { context: {}, callId: "b" });
      const other = await run({ noteId: "u1", text: "y" }, { context: {}, callId: "c" });
      expect(first).toMatchObject({ status: "pending_verification", state: "needs_review" });
      expect(again).toMatchObject({ status: "pending_verification", state: "needs_review" });
      expect(other).toMatchObject({ status: "refused" });
      expect(other.message).toMatch(/a person will decide whether it happened/);
      expect(sends).toBe(1);
    });

    it("work already done, the ledger closed (the agent shutting down): the model is not told it was not done", async () => {
      const ledger = await db.open();
      const { tool, sent, release } = slowNote("test.done-then-closed");
      release();
      const run = guard(ledger, tool, { tenant: "acme" });
      expect(await run({ noteId: "c1", text: "hello" }, { context: {}, callId: "a" })).toMatchObject({
        status: "done",
      });
      await ledger.close();
      const again = await run({ noteId: "c1", text: "hello" }, { context: {}, callId: "b" });
      // Before: not_performed, "Not performed: the tool is not available right now … do not assume
      // it happened" (over MCP, isError: nothing was done), of a note sent. The ledger was not read.
      expect(again).toMatchObject({ status: "unconfirmed" });
      expect(again.message).toMatch(
        /^Not confirmed: the tool is not available right now, so whether this work was already done \(by an earlier call\) could not be read; this call sent nothing\./,
      );
      expect(again.message).not.toMatch(/was not done|not performed|closed/i);
      // New work reads the same: this call sent nothing, and whether an earlier one did is not known.
      const fresh = await run({ noteId: "c2", text: "other" }, { context: {}, callId: "c" });
      expect(fresh).toMatchObject({ status: "unconfirmed", message: again.message });
      expect(sent).toEqual(["hello"]);
    });

    it("work already done, called again and stopped before the ledger had the call: the model is not told it was not done", async () => {
      const ledger = await db.open();
      const { tool, sent, release } = slowNote("test.done-then-stopped");
      release();
      const run = guard(ledger, tool, { tenant: "acme-stopped" });
      expect(await run({ noteId: "a1", text: "hello" }, { context: {}, callId: "a" })).toMatchObject({
        status: "done",
      });
      // The framework gave up first (the run aborted, a sibling tool failing): by its cut (`signal`) or its stop.
      for (const given of ["signal", "stop"] as const) {
        const gaveUp = new AbortController();
        gaveUp.abort(new DOMException("This operation was aborted", "AbortError"));
        const again = await run({ noteId: "a1", text: "hello" }, { context: {}, callId: "b", [given]: gaveUp.signal });
        // Before: not_performed, "Not performed: the tool failed before doing anything (AbortError).
        // Tell the user; do not assume it happened" (over MCP, isError: nothing was done), of a
        // note sent. This call did not read the ledger.
        expect(again, given).toMatchObject({ status: "unconfirmed" });
        expect(again.message).toMatch(
          /^Not confirmed: the call was stopped before whether this work was already done \(by an earlier call\) could be read; this call sent nothing\./,
        );
        expect(again.message).not.toMatch(/was not done|not performed|failed/i);
        // New work reads the same: this call sent nothing, and whether an earlier one did is not known.
        const fresh = await run({ noteId: "a2", text: "other" }, { context: {}, callId: "c", [given]: gaveUp.signal });
        expect(fresh).toMatchObject({ status: "unconfirmed", message: again.message });
      }
      expect(sent).toEqual(["hello"]);
      // The work is where the first call left it: done, read as such once nothing stops the call.
      expect(await run({ noteId: "a1", text: "hello" }, { context: {}, callId: "d" })).toMatchObject({
        status: "already_done",
      });
      expect(await ledger.admin.list({ tenant: "acme-stopped" })).toHaveLength(1);
    });

    it("work whose worker stopped (its lease ended): the status tool does not say it is being performed", async () => {
      const ledger = await db.open();
      const { tool, release, executing } = slowNote("test.stalled");
      const first = guard(ledger, tool, { tenant: "acme" })({ noteId: "s1", text: "hi" }, { context: {} });
      await executing;
      try {
        const operation = await lastOperation(ledger);
        // As a worker that died leaves it: running, its lease ended (its creation time, on the
        // database's clock: so ended by that clock, whatever this process's says).
        await databaseOf(ledger)
          .updateTable("idem_operations")
          .set((eb) => ({ lease_expires_at: eb.ref("created_at") }))
          .where("id", "=", operation.id)
          .execute();
        const checked = await statusTool(ledger, { tenant: "acme" })({ operationId: operation.id }, { context: {} });
        // Before: "it is being performed, or its outcome is being recorded", of a worker that is gone.
        expect(checked).toMatchObject({ status: "pending_verification", state: "running" });
        expect(checked.message).toMatch(/the worker that ran it stopped before recording its outcome/);
        expect(checked.message).toMatch(/Do not retry it/);
        expect(await ledger.status({ tenant: "acme", id: operation.id })).toMatchObject({ stalled: true });
      } finally {
        release();
      }
      await first;
    });

    it("work done whose operation was pruned after its retention: the status tool does not say the id was wrong", async () => {
      const ledger = await db.open({ retentionMs: 0 } as LedgerOptions);
      const { tool, release } = slowNote("test.pruned");
      release();
      const done = await guard(ledger, tool, { tenant: "acme" })({ noteId: "r1", text: "hi" }, { context: {} });
      expect(done).toMatchObject({ status: "done" });
      const id = (done as { operationId: string }).operationId;
      expect(await ledger.admin.prune({ tenant: "acme" })).toBe(1);
      const checked = await statusTool(ledger, { tenant: "acme" })({ operationId: id }, { context: {} });
      // Before: "No operation … here: check the id", of an id the ledger itself had given.
      expect(checked).toMatchObject({ status: "refused" });
      expect(checked.message).toMatch(/removed once its retention ended/);
    });
  });
}

describe("a guarded tool called again for work done, its ledger unreachable (postgres behind a proxy)", () => {
  const db = ledgersFor("postgres", openLedger, { defaults: { poolSize: 2 } as LedgerOptions });

  it("work already done, the ledger down: the model is not told it was not done", async () => {
    const proxy = await pgProxy(new URL(db.url()));
    const options = { connectTimeoutMs: 1_000, statementTimeoutMs: 1_000, poolSize: 2 } as LedgerOptions;
    const ledger = await openLedger(proxy.url, options);
    try {
      const { tool, sent, release } = slowNote("test.done-then-down");
      release();
      const run = guard(ledger, tool, { tenant: "acme" });
      const done = await run({ noteId: "d1", text: "hello" }, { context: {}, callId: "a" });
      expect(done).toMatchObject({ status: "done" });
      proxy.down();
      const again = await run({ noteId: "d1", text: "hello" }, { context: {}, callId: "b" });
      expect(sent).toEqual(["hello"]);
      // Before: not_performed, "the ledger is unavailable right now, so this was not done … Do not
      // tell the user it happened": the model told the user the note was not sent (and over MCP,
      // isError: nothing was done), when it had been. The ledger was not read: it is not known.
      expect(again).toMatchObject({ status: "unconfirmed" });
      expect(again.message).toMatch(
        /^Not confirmed: the ledger is unavailable right now, so whether this work was already done/,
      );
      expect(again.message).toMatch(/this call sent nothing/);
      expect(again.message).not.toMatch(/was not done|not performed/i);
      // New work reads the same: this call sent nothing, and whether an earlier one did is not known.
      const fresh = await run({ noteId: "d2", text: "other" }, { context: {}, callId: "c" });
      expect(fresh).toMatchObject({ status: "unconfirmed", message: again.message });
      expect(sent).toEqual(["hello"]);
      const checked = await statusTool(ledger, { tenant: "acme" })(
        { operationId: (done as { operationId: string }).operationId },
        { context: {} },
      );
      expect(checked.status).toBe("unconfirmed");
    } finally {
      await ledger.close();
      await proxy.close();
    }
  });
});
