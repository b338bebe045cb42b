/**
 * A framework that gives up on a guarded tool while its provider request is out: the AI SDK's run
 * aborted (its `abortSignal`, or its timeout), the OpenAI Agents SDK cancelling a tool because a
 * sibling tool of the same turn failed (or the run's `signal`), LangGraph's run aborted (the
 * `signal` its ToolNode hands a tool). Handed to the ledger as the
 * caller's `signal`, the abort cut the request under way: an email the SMTP server had accepted
 * was left unknown (the model read "Not confirmed", a lookup or a person to settle it). It is the
 * call's `stop` now, as in MCP (mcp-stop.test.ts): the request in flight ends and is recorded,
 * nothing more is sent. Against the mail sandbox (SMTP, and Dovecot for the journal), whose
 * client cancels on `op.signal`, as the ledger asks of a provider's client.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { generateText } from "ai";
import { MockLanguageModelV3 } from "ai/test";
import { Agent, Usage, run, setTracingDisabled, tool, type Model, type ModelResponse } from "@openai/agents";
import { AIMessage, type ToolMessage } from "@langchain/core/messages";
import { ToolNode } from "@langchain/langgraph/prebuilt";
import { z } from "zod";
import { openLedger, type LedgerOptions } from "@idem/core";
import { emailActions, emailTools } from "@idem/email";
import { JOURNAL, MailSandbox, SENDER } from "@idem/sandbox";
import { DIALECTS, ledgersFor } from "@idem/testkit";
import { aiTool } from "@idem/agents/ai";
import { openaiTool } from "@idem/agents/openai";
import { langchainTool } from "@idem/agents/langchain";
import type { Outcome } from "@idem/agents";

setTracingDisabled(true);

let mail: MailSandbox;
let ports: { smtp: number; imap: number };
beforeAll(async () => {
  mail = new MailSandbox({ mode: "journal" });
  const s = await mail.start();
  ports = { smtp: s.smtp.port, imap: s.imap.port };
}, 60_000);
afterAll(() => mail?.close());

const send = () =>
  emailTools(
    emailActions({
      smtp: { host: "127.0.0.1", port: ports.smtp, auth: SENDER, timeoutMs: 10_000, requireTLS: false },
      imap: { host: "127.0.0.1", port: ports.imap, auth: SENDER, requireTLS: false },
      from: SENDER.user,
      copy: {
        mode: "journal",
        address: JOURNAL.user,
        imap: { host: "127.0.0.1", port: ports.imap, auth: JOURNAL, requireTLS: false },
      },
    }),
  ).send;

/** Resolves once the SMTP server has taken the next message, before its 250 goes out. */
const accepted = () => new Promise<void>((resolve) => mail.events.once("accepted", () => resolve()));

const usage = {
  inputTokens: { total: 1, noCache: 1, cacheRead: 0, cacheWrite: 0 },
  outputTokens: { total: 1, text: 1, reasoning: 0 },
};
const rnd = () => Math.random().toString(36).slice(2, 7);

for (const dialect of DIALECTS) {
  describe(`a framework giving up on a tool call in flight, on ${dialect}`, () => {
    const db = ledgersFor(dialect, openLedger, { defaults: { poolSize: 4 } as LedgerOptions });

    it("AI SDK, the run aborted: the email the server was taking is recorded sent, not left unknown", async () => {
      const ledger = await db.open();
      const tenant = `abort-ai-${dialect}-${rnd()}`;
      const before = mail.count();
      const giveUp = new AbortController();
      // The user stops the run once the server has the message, before its 250 reaches the client.
      mail.events.once("accepted", () => giveUp.abort(new DOMException("The user stopped the run.", "AbortError")));
      let step = 0;
      const read: unknown[] = [];
      const input = { to: "client@example.test", reference: `ord-${tenant}`, subject: "Your order", text: "Shipped." };
      await generateText({
        model: new MockLanguageModelV3({
          doGenerate: async () =>
            step++ === 0
              ? {
                  content: [
                    {
                      type: "tool-call" as const,
                      toolCallId: "call_1",
                      toolName: "send",
                      input: JSON.stringify(input),
                    },
                  ],
                  finishReason: { unified: "tool-calls", raw: "tool_calls" },
                  usage,
                  warnings: [],
                }
              : { content: [], finishReason: { unified: "stop", raw: "stop" }, usage, warnings: [] },
        }),
        tools: { send: aiTool(ledger, send(), { tenant }) },
        abortSignal: giveUp.signal,
        experimental_onToolCallFinish: (e) => {
          read.push(e.success ? e.output : e.error);
        },
        prompt: "email the client",
      }).catch(() => undefined); // aborted: the SDK may reject; the tool's own answer is in `read`

      expect(giveUp.signal.aborted).toBe(true);
      const [op] = await ledger.admin.list({ tenant });
      // Before: "unconfirmed", and the operation unknown (pending_verification) though the server had the email.
      expect({
        read: (read[0] as Outcome).status,
        ledger: (await ledger.status({ tenant, id: op!.id })).status,
      }).toEqual({ read: "done", ledger: "succeeded" });
      expect(mail.count() - before).toBe(1);
    });

    it("OpenAI Agents, a sibling tool of the same turn fails: the email the server was taking is recorded sent, not left unknown", async () => {
      const ledger = await db.open();
      const tenant = `abort-oa-${dialect}-${rnd()}`;
      const before = mail.count();
      const taken = accepted();
      // A tool of the application's own that fails for good (no errorFunction) once the server has
      // the message: the SDK then cancels the other tools of the turn (their `signal`).
      let cancelled = false;
      const lookup = tool({
        name: "lookup_customer",
        description: "Look the customer up.",
        parameters: z.object({ reference: z.string() }),
        errorFunction: null,
        async execute(_input, _context, details) {
          await taken;
          details?.signal?.addEventListener("abort", () => (cancelled = true), { once: true });
          throw new Error("the CRM is down");
        },
      });
      const input = { to: "client@example.test", reference: `ord-${tenant}`, subject: "Your order", text: "Shipped." };
      let turn = 0;
      const model: Model = {
        async getResponse(): Promise<ModelResponse> {
          const output =
            turn++ === 0
              ? [
                  {
                    type: "function_call" as const,
                    callId: "call_send",
                    name: "send_email",
                    arguments: JSON.stringify(input),
                    status: "completed" as const,
                  },
                  {
                    type: "function_call" as const,
                    callId: "call_lookup",
                    name: "lookup_customer",
                    arguments: JSON.stringify({ reference: input.reference }),
                    status: "completed" as const,
                  },
                ]
              : [];
          return { usage: new Usage({ requests: 1, inputTokens: 1, outputTokens: 1, totalTokens: 2 }), output };
        },
        getStreamedResponse(): AsyncIterable<never> {
          throw new Error("not streamed in these tests");
        },
      };
      const agent = new Agent({
        name: "support",
        instructions: "Email the clients you are given.",
        model,
        tools: [openaiTool(ledger, send(), { tenant }), lookup],
      });
      // The run fails with the sibling's error once every tool of the turn has ended.
      await expect(run(agent, "email the client", { maxTurns: 3 })).rejects.toThrow(/the CRM is down/);

      expect(cancelled).toBe(true);
      const [op] = await ledger.admin.list({ tenant });
      // Before: pending_verification (unknown), though the server had the email.
      expect((await ledger.status({ tenant, id: op!.id })).status).toBe("succeeded");
      expect(mail.count() - before).toBe(1);
    });

    it("LangGraph, the run aborted: the email the server was taking is recorded sent, and the tool answers it, not 'Please fix your mistakes'", async () => {
      // A tool that gives up when LangChain's signal aborts (its `tool()` wrapper rejects at once)
      // has the ToolNode answer "Error: This operation was aborted\n Please fix your mistakes.".
      const ledger = await db.open();
      const tenant = `abort-lc-${dialect}-${rnd()}`;
      const before = mail.count();
      const giveUp = new AbortController();
      mail.events.once("accepted", () => giveUp.abort(new DOMException("The user stopped the run.", "AbortError")));
      const input = { to: "client@example.test", reference: `ord-${tenant}`, subject: "Your order", text: "Shipped." };
      const call = { name: "send_email", args: input, id: "call_1", type: "tool_call" as const };
      const { messages } = (await new ToolNode([langchainTool(ledger, send(), { tenant })]).invoke(
        { messages: [new AIMessage({ content: "", tool_calls: [call] })] },
        { signal: giveUp.signal },
      )) as { messages: ToolMessage[] };

      expect(giveUp.signal.aborted).toBe(true);
      const [op] = await ledger.admin.list({ tenant });
      expect({
        read: String(messages[0]!.content),
        ledger: (await ledger.status({ tenant, id: op!.id })).status,
      }).toEqual({ read: expect.stringContaining('"status":"done"'), ledger: "succeeded" });
      expect(mail.count() - before).toBe(1);
    });
  });
}
