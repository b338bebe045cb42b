/**
 * The tool-call id is not the model's input, nor a business identity: guard makes it the audit
 * actor by default, and the ledger refuses an actor that is empty or longer than 200 characters.
 * Some providers send `id: ""` for tool calls (Gemini's OpenAI-compatible endpoint, LM Studio:
 * vercel/ai#7834). Every call was then refused as "invalid input: actor ... fix the input":
 * nothing done, and the model told to fix what it did not write (helper-117). Such an id is no
 * actor now (a long one is cut), and an application's bad tenant or actor reads as the tool's
 * setup, not the model's input.
 */
import { describe, expect, it } from "vitest";
import { generateText, stepCountIs } from "ai";
import { MockLanguageModelV3 } from "ai/test";
import { z } from "zod";
import { defineAction, openLedger, type LedgerOptions } from "@idem/core";
import { DIALECTS, ledgersFor } from "@idem/testkit";
import { aiTool } from "@idem/agents/ai";
import { guard, type Outcome } from "@idem/agents";

let sent = 0;
const note = {
  name: "send_note",
  description: "Send a note, once per note id.",
  action: defineAction<{ text: string }, { id: string }>({
    type: "test.note-callid",
    capabilities: {},
    async execute() {
      sent += 1;
      return { id: `n${sent}` };
    },
  }),
  input: z.object({ noteId: z.string().min(1), text: z.string() }),
  args: (i: { text: string }) => ({ text: i.text }),
  key: (i: { noteId: string }) => ["note", i.noteId],
};

const usage = {
  inputTokens: { total: 1, noCache: 1, cacheRead: 0, cacheWrite: 0 },
  outputTokens: { total: 1, text: 1, reasoning: 0 },
};
/** A model (provider) that sends its tool call with an empty id, once, then stops. */
function modelWithCallId(toolCallId: string, input: unknown) {
  let step = 0;
  return new MockLanguageModelV3({
    doGenerate: async () =>
      step++ === 0
        ? {
            content: [{ type: "tool-call" as const, toolCallId, toolName: "send_note", input: JSON.stringify(input) }],
            finishReason: { unified: "tool-calls", raw: "tool_calls" },
            usage,
            warnings: [],
          }
        : {
            content: [{ type: "text", text: "ok" }],
            finishReason: { unified: "stop", raw: "stop" },
            usage,
            warnings: [],
          },
  });
}

for (const dialect of DIALECTS) {
  describe(`the framework's tool-call id on ${dialect}`, () => {
    const db = ledgersFor(dialect, openLedger, { defaults: { poolSize: 2 } as LedgerOptions });

    it("an empty tool-call id from the provider: the note is sent, not refused as the model's invalid input", async () => {
      const ledger = await db.open();
      const tenantId = `cid-${dialect}-${Math.random().toString(36).slice(2, 7)}`;
      const before = sent;
      const result = await generateText({
        model: modelWithCallId("", { noteId: "n-1", text: "hi" }),
        tools: { send_note: aiTool(ledger, note, { tenant: (c) => (c.context as { tenantId: string }).tenantId }) },
        experimental_context: { tenantId },
        stopWhen: stepCountIs(3),
        prompt: "send the note",
      });
      const out = result.steps[0]!.toolResults[0]!.output as Outcome;
      expect(out.message).not.toMatch(/invalid input: actor/);
      expect(out).toMatchObject({ status: "done" });
      expect(sent - before).toBe(1);
    });

    it("a tool-call id over 200 characters: done, not 'Refused: invalid input: actor'", async () => {
      const ledger = await db.open();
      const out = await guard(ledger, note, { tenant: `cid-long-${dialect}` })(
        { noteId: "n-2", text: "hi" },
        { context: undefined, callId: `call_${"x".repeat(200)}` },
      );
      expect(out.message).not.toMatch(/invalid input: actor/);
      expect(out).toMatchObject({ status: "done" });
      const [op] = await ledger.admin.list({ tenant: `cid-long-${dialect}` });
      const { events } = await ledger.get({ tenant: `cid-long-${dialect}`, id: op!.id });
      expect(events[0]?.actor).toBe(`call_${"x".repeat(195)}`);
    });

    it("a long tool-call id with an emoji across its 200th character: cut before it, not inside it", async () => {
      const ledger = await db.open();
      const tenant = `cid-emoji-${dialect}`;
      const out = await guard(ledger, note, { tenant })(
        { noteId: "n-4", text: "hi" },
        { context: undefined, callId: `${"x".repeat(199)}\u{1F600}tail` },
      );
      expect(out).toMatchObject({ status: "done" });
      const [op] = await ledger.admin.list({ tenant });
      const { events } = await ledger.get({ tenant, id: op!.id });
      expect(events[0]?.actor).toBe("x".repeat(199));
    });

    for (const bad of [
      { name: "a tenant read from the context that is empty", options: { tenant: () => "" } },
      { name: "an actor the application set that is too long", options: { tenant: "t", actor: "a".repeat(201) } },
      { name: "a waitMs the application set that no timer takes", options: { tenant: "t", waitMs: 2 ** 31 } },
    ])
      it(`${bad.name}: not set up right, the tool's setup, not the model's input to fix`, async () => {
        const ledger = await db.open();
        const before = sent;
        const out = await guard(ledger, note, bad.options)({ noteId: "n-3", text: "hi" }, { context: undefined });
        // Not "not performed": an earlier call may have done this work (before-ledger.test.ts).
        expect(out).toMatchObject({ status: "unconfirmed" });
        expect(out.message).toMatch(/^Not confirmed: the tool is not set up right \((tenant|actor|waitMs): /);
        expect(out.message).not.toMatch(/fix the input/);
        expect(sent - before).toBe(0);
      });
  });
}
