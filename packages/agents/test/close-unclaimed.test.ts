/**
 * A guarded call whose claim the ledger's close refused unwritten (`LedgerUnavailableError`,
 * `unclaimed`): its process shut down while the claim still waited, on SQLite for another
 * process's write lock, on Postgres for the pool's only connection or on the server for a lock
 * (the close cancels it there). The model reads what a call
 * the closed ledger refused up front reads: the tool is not available, this call sent nothing.
 * Effects are counted in the action.
 */
import { describe, expect, it, vi } from "vitest";
import { z } from "zod";
import { defineAction, type Ledger } from "@idem/core";
import { openTestLedger, type TestLedgerOptions } from "@idem/core/testing";
import { DIALECTS, ledgersFor, scaled, untilLockWaits, within } from "@idem/testkit";
import { guard, type Outcome } from "@idem/agents";
// Another process holding the ledger's writes, and a call that keeps the close from being quiet.
import { heldUntilClose, holdWriteLock } from "../../core/test/support/closing.js";

/**
 * Resolves once `n` calls are in `ledger.run`, past its check that the ledger is open: the close
 * that follows meets their claims, not calls made after it began (refused up front, which the
 * model read as "not available" before too).
 */
function callsEntered(ledger: Ledger, n: number): Promise<void> {
  const run = ledger.run.bind(ledger) as (...args: unknown[]) => unknown;
  let count = 0;
  return new Promise((resolve) => {
    vi.spyOn(ledger, "run").mockImplementation(((...args: unknown[]) => {
      const out = run(...args);
      if (++count === n) resolve();
      return out;
    }) as Ledger["run"]);
  });
}

/** What a call the closed ledger refused reads, whether made after the close began or its claim waited then. */
const NOT_AVAILABLE =
  "Not confirmed: the tool is not available right now, so whether this work was already done (by an earlier call) could not be read; this call sent nothing. Do not tell the user either way; calling this tool again later with the same input is safe (it is never done twice) and says what happened.";

const sent: string[] = [];
const note = defineAction<{ noteId: string; text: string }, { id: string }, { noteId: string; text: string }>({
  type: "test.note-at-close",
  capabilities: {},
  input: z.object({ noteId: z.string().min(1), text: z.string() }),
  execute: async (a) => {
    sent.push(a.text);
    return { id: a.noteId };
  },
});

for (const dialect of DIALECTS) {
  describe(`a guarded call whose claim the close refused unwritten, on ${dialect}`, () => {
    const db = ledgersFor<Ledger, TestLedgerOptions>(dialect, openTestLedger, { defaults: {} });
    const pg = dialect === "postgres";

    it(`its claim waiting ${pg ? "for the pool's only connection as the pool ends" : "for another process's write lock as the close stops waiting"}: 'not available', nothing sent, no row`, async () => {
      // Postgres: one connection, and a connect timeout far past the test's bound: only the close answers.
      const ledger = await db.open(
        pg ? { leaseMs: 60_000, poolSize: 1, connectTimeoutMs: 600_000 } : { leaseMs: 60_000, busyTimeoutMs: 60_000 },
      );
      const tenant = `t-${dialect}`;
      const send = guard(ledger, note, { tenant, key: (i) => ["note", i.noteId] });
      const { held, started, closeStoppedWaiting } = heldUntilClose();
      const holding = ledger.run(held, { tenant, key: ["held"], args: { to: "x" } }).catch((e: unknown) => e);
      await started;
      // Another process's lock. SQLite: the claim waits for it, past the close's waitMs. Postgres:
      // the first claim holds the pool's only connection, waiting on the server for it; the second
      // waits for that connection.
      const lock = await holdWriteLock(dialect, db.url());
      const notes = pg ? ["first", "second"] : ["only"];
      const entered = callsEntered(ledger, notes.length);
      const outs = notes.map((n) => send({ noteId: n, text: n }, { context: {}, callId: n }));
      await entered;
      if (pg) await untilLockWaits(db.url(), 1);
      const closing = ledger.close({ waitMs: scaled(300) });
      await closeStoppedWaiting;
      // Postgres: answered while the lock is still held, the claim on the server cancelled by the close.
      if (pg) await within(scaled(10_000), "the guarded calls", Promise.all(outs));
      await lock.release();
      await closing;
      await holding;
      const answers = (await Promise.all(outs)) as Extract<Outcome, { status: "unconfirmed" }>[];
      // Before: "Not confirmed: the ledger is unavailable right now, … this call sent nothing (at
      // most it recorded the work, which may then be done once later)": it recorded nothing, and
      // the ledger was not unavailable, its process was shutting down.
      // Postgres: the one waiting for the connection, and the one whose claim was cancelled.
      for (const answer of answers) expect(answer).toEqual({ status: "unconfirmed", message: NOT_AVAILABLE });
      expect(sent).toEqual([]);
      expect(await (await db.open()).admin.list({ tenant, action: note.type })).toEqual([]);
    });
  });
}
