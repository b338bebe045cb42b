/**
 * `guard` without a framework: what the model reads in the cases the framework tests do not
 * reach: a summary that fails after the effect, a key that cannot be made, input its schema
 * refuses, a ledger that is gone. Effects are counted in the action.
 */
import { describe, expect, it } from "vitest";
import { z } from "zod";
import { defineAction, openLedger, type LedgerOptions } from "@idem/core";
import { DIALECTS, ledgersFor } from "@idem/testkit";
import { guard } from "@idem/agents";

const sent: string[] = [];
const note = {
  name: "send_note",
  description: "Send a note, once per note id.",
  action: defineAction<{ text: string }, { id: string }>({
    type: "test.note",
    capabilities: {},
    async execute(args) {
      sent.push(args.text);
      return { id: `n${sent.length}` };
    },
  }),
  input: z.object({ noteId: z.string().min(1), text: z.string() }),
  args: (i: { text: string }) => ({ text: i.text }),
  key: (i: { noteId: string }) => ["note", i.noteId],
};
const call = { context: { tenantId: "acme" }, callId: "call_1" };

for (const dialect of DIALECTS) {
  describe(`guard on ${dialect}`, () => {
    const db = ledgersFor(dialect, openLedger, { defaults: { poolSize: 2 } as LedgerOptions });

    it("a summary that throws after the effect: the model still reads done, without the summary", async () => {
      const ledger = await db.open();
      const tool = guard(ledger, note, {
        tenant: (c) => (c.context as { tenantId: string }).tenantId,
        summarize: () => {
          throw new Error("bad summary");
        },
      });
      const before = sent.length;
      const out = await tool({ noteId: `s-${dialect}`, text: "hi" }, call);
      expect(out).toMatchObject({ status: "done" });
      expect(out).not.toHaveProperty("result");
      expect(sent.length - before).toBe(1);
    });

    it("input the schema refuses, a key that cannot be made, a closed ledger: refused or not performed, nothing sent", async () => {
      const ledger = await db.open();
      const before = sent.length;
      const tool = guard(ledger, note, { tenant: "acme" });
      expect(await tool({ noteId: "", text: "x" }, call)).toMatchObject({
        status: "refused",
        message: expect.stringMatching(/^Refused: invalid input: noteId/),
      });
      const badKey = guard(ledger, note, { tenant: "acme", key: () => [new Date()] });
      expect(await badKey({ noteId: "d", text: "x" }, call)).toMatchObject({ status: "refused" });
      await ledger.close();
      const closed = await tool({ noteId: "c", text: "x" }, call);
      expect(closed.status).toBe("not_performed");
      expect(closed.message).not.toMatch(/closed/); // the developer's error message stays out of the model's words
      expect(sent.length).toBe(before);
    });

    it("refuses to build a tool without a business identity", async () => {
      const ledger = await db.open();
      expect(() => guard(ledger, note.action, { tenant: "acme" })).toThrow(/give a key/);
    });
  });
}
