/**
 * A guarded call still in flight when the ledger's close stopped waiting for it
 * (`LedgerUnavailableError`, `closed`, with its operation): its process shut down while the
 * action's request was out. The database did not become unavailable, so the model reads that the
 * tool was shut down during the call, and that the work may or may not have happened. Effects are
 * counted at the target, as the action sends them.
 */
import { describe, expect, it } from "vitest";
import { z } from "zod";
import { defineAction, type Ledger } from "@idem/core";
import { openTestLedger, type TestLedgerOptions } from "@idem/core/testing";
import { DIALECTS, ledgersFor, scaled, within } from "@idem/testkit";
import { guard } from "@idem/agents";

/** The target: what reached it, and a request of it still out until the close aborts it. */
const sent: string[] = [];
let requestOut: () => void = () => {};
const note = defineAction<{ noteId: string; text: string }, { id: string }, { noteId: string; text: string }>({
  type: "test.note-in-flight",
  capabilities: {},
  input: z.object({ noteId: z.string().min(1), text: z.string() }),
  execute: async (a, op) => {
    sent.push(a.text); // the target has it; its answer never comes back
    requestOut();
    await new Promise((r) => op.signal.addEventListener("abort", r, { once: true }));
    throw new Error("This operation was aborted");
  },
  classify: () => ({ kind: "ambiguous", reason: "aborted with its request out" }),
});

for (const dialect of DIALECTS) {
  describe(`a guarded call the close stopped waiting for, on ${dialect}`, () => {
    const db = ledgersFor<Ledger, TestLedgerOptions>(dialect, openTestLedger, { defaults: {} });

    it("its request out: unconfirmed with its operation, 'the tool was shut down', the row left running and named in flight", async () => {
      sent.length = 0;
      const requested = new Promise<void>((r) => (requestOut = r));
      const ledger = await db.open({ leaseMs: 60_000 });
      const tenant = `t-${dialect}`;
      const send = guard(ledger, note, { tenant, key: (i) => ["note", i.noteId] });
      const out = send({ noteId: "n-1", text: "hello" }, { context: {}, callId: "c-1" });
      await requested;
      const closed = await within(scaled(10_000), "the close", ledger.close({ waitMs: scaled(300) }));
      const answer = await within(scaled(10_000), "the guarded call", out);
      const [op] = await (await db.open()).admin.list({ tenant });
      // Before: "the ledger became unavailable during the call": it did not, its process shut it down.
      expect(answer).toEqual({
        status: "unconfirmed",
        operationId: op!.id,
        message: `Not confirmed (operation ${op!.id}): the tool was shut down during the call, so it may or may not have happened. Do not tell the user either way; check later with the status tool and this operation id, or call this tool again later with the same input (it is never done twice).`,
      });
      expect(sent).toEqual(["hello"]);
      // As the close left it: running under the lease its request went out on, named in flight.
      expect({ status: op!.status, attempt: op!.attempt }).toEqual({ status: "running", attempt: 1 });
      expect(closed.inFlight).toEqual([{ tenant, id: op!.id }]);
    });
  });
}
