/**
 * LangGraph's own graph and prebuilt `ToolNode`, with a scripted agent node in place of a chat
 * model, call a guarded charge tool as models do: once, again with a new tool-call id, with another
 * amount, twice in one turn. Counted at the Stripe sandbox: one PaymentIntent per invoice. The
 * model reads the `Outcome` as the ToolMessage's content, never the ToolNode's "Error: …
 * Please fix your mistakes.", which asks it to call again.
 */
import { once } from "node:events";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { AIMessage, HumanMessage, type BaseMessage, type ToolMessage } from "@langchain/core/messages";
import { tool, type StructuredToolInterface } from "@langchain/core/tools";
import { convertToOpenAITool } from "@langchain/core/utils/function_calling";
import { Command, END, interrupt, MemorySaver, MessagesAnnotation, START, StateGraph } from "@langchain/langgraph";
import { ToolNode, toolsCondition } from "@langchain/langgraph/prebuilt";
import { z } from "zod";
import { defineAction, openLedger, type LedgerOptions } from "@idem/core";
import { StripeSandbox } from "@idem/sandbox";
import { stripeActions, stripeTools } from "@idem/stripe";
import { DIALECTS, ledgersFor } from "@idem/testkit";
import { langchainStatusTool, langchainTool } from "@idem/agents/langchain";
import type { Outcome } from "@idem/agents";
import { CALLS, expectAppliedOnce, otherSchemaTools, transformingTools } from "./transforming-tools.js";

let sandbox: StripeSandbox;
let server: { port: number; apiKey: string };
beforeAll(async () => {
  sandbox = new StripeSandbox();
  server = await sandbox.start();
});
afterAll(() => sandbox.close());

const rnd = () => Math.random().toString(36).slice(2, 7);
type Call = { name: string; args: Record<string, unknown> };
/** A model's turn: these tool calls, each with a new id, as a model that calls again makes them. */
const turn = (calls: Call[]) =>
  new AIMessage({
    content: "",
    tool_calls: calls.map((c, i) => ({ ...c, id: `call_${i}_${rnd()}`, type: "tool_call" as const })),
  });

/** What the model read of a tool call: the ToolMessage's status, its content as sent, and that content parsed. */
function readOf(m: BaseMessage) {
  const message = m as ToolMessage;
  const text = String(message.content);
  let outcome: Outcome | undefined;
  try {
    outcome = JSON.parse(text) as Outcome;
  } catch {
    outcome = undefined; // not an Outcome: the ToolNode's own error text
  }
  return { status: message.status, text, outcome, artifact: message.artifact as unknown };
}

/** An agent graph (agent ⇄ ToolNode) whose agent makes these turns, then answers "finished". */
function scriptedAgent(turns: Call[][], tools: StructuredToolInterface[]) {
  let step = 0;
  return new StateGraph(MessagesAnnotation)
    .addNode("agent", () => {
      const calls = turns[step++];
      return { messages: [calls ? turn(calls) : new AIMessage("finished")] };
    })
    .addNode("tools", new ToolNode(tools))
    .addEdge(START, "agent")
    .addConditionalEdges("agent", toolsCondition, ["tools", END])
    .addEdge("tools", "agent")
    .compile();
}

/** Each turn's tool calls as the model read them. */
function turnsRead(messages: BaseMessage[]) {
  const turns: ReturnType<typeof readOf>[][] = [];
  for (const m of messages) {
    if (m.getType() === "ai" && (m as AIMessage).tool_calls?.length) turns.push([]);
    else if (m.getType() === "tool") turns.at(-1)!.push(readOf(m));
  }
  return turns;
}

/** One LangGraph ToolNode turn, outside a graph: what the model read of each call. */
async function toolNodeTurn(tools: StructuredToolInterface[], calls: Call[], config: Record<string, unknown> = {}) {
  const { messages } = (await new ToolNode(tools).invoke({ messages: [turn(calls)] }, config)) as {
    messages: BaseMessage[];
  };
  return messages.map(readOf);
}

for (const dialect of DIALECTS) {
  describe(`LangChain tools on ${dialect}`, () => {
    const db = ledgersFor(dialect, openLedger, { defaults: { poolSize: 4 } as LedgerOptions });

    it("a model that retries a charge: one PaymentIntent per invoice, and it reads done, already done, refused", async () => {
      const ledger = await db.open();
      const stripe = stripeActions({ apiKey: server.apiKey, host: "127.0.0.1", port: server.port, protocol: "http" });
      const tenantId = `acme-lc-${dialect}-${rnd()}`;
      const tenant = (c: { context: unknown }) => (c.context as { tenantId: string }).tenantId;
      const before = sandbox.count("payment_intents");
      const inv1 = { invoiceId: `inv-1-${tenantId}`, amount: 500, currency: "eur" };
      const inv2 = { invoiceId: `inv-2-${tenantId}`, amount: 900, currency: "eur" };
      const charge = langchainTool(ledger, stripeTools(stripe).charge, { tenant });
      const agent = scriptedAgent(
        [
          [{ name: "charge_invoice", args: inv1 }],
          [{ name: "charge_invoice", args: inv1 }], // the model "tries again", with a new tool-call id
          [{ name: "charge_invoice", args: { ...inv1, amount: 700 } }],
          [
            { name: "charge_invoice", args: inv2 },
            { name: "charge_invoice", args: inv2 },
          ],
        ],
        [charge, langchainStatusTool(ledger, { tenant })],
      );
      // The tenant is LangGraph's run context, never sent to the model.
      const { messages } = await agent.invoke(
        { messages: [new HumanMessage("charge them")] },
        { context: { tenantId } },
      );

      const read = turnsRead(messages);
      expect(read.map((t) => t.map((r) => r.outcome?.status).sort())).toEqual([
        ["done"],
        ["already_done"],
        ["refused"],
        ["already_done", "done"],
      ]);
      // Nothing done is the ToolMessage's "error" status (as MCP's isError); done or already done, "success".
      expect(read.map((t) => t.map((r) => r.status))).toEqual([
        ["success"],
        ["success"],
        ["error"],
        ["success", "success"],
      ]);
      expect(read[2]![0]!.outcome!.message).toMatch(/already done with different arguments/);
      expect(read[0]![0]!.outcome).toMatchObject({ result: { id: expect.stringMatching(/^pi_/) } });
      expect(read[0]![0]!.artifact).toEqual(read[0]![0]!.outcome); // the Outcome itself, for the application
      expect(messages.at(-1)!.content).toBe("finished");
      expect(sandbox.count("payment_intents") - before).toBe(2);
      // The tool-call id is the audit trail's actor, never the key: one operation per invoice.
      const operations = await ledger.admin.list({ tenant: tenantId });
      expect(operations).toHaveLength(2);
      const first = (read[0]![0]!.outcome as { operationId: string }).operationId;
      const { events } = await ledger.get({ tenant: tenantId, id: first });
      expect(events[0]!.actor).toMatch(/^call_0_/);
    });

    it("a failed charge reads as the Outcome with status 'error', not the ToolNode's 'Please fix your mistakes'", async () => {
      // A tool that throws for "failed" (to get LangChain's error status) has the ToolNode answer
      // "Error: … Please fix your mistakes.": a model told to fix its call calls it again.
      const ledger = await db.open();
      const stripe = stripeActions({ apiKey: server.apiKey, host: "127.0.0.1", port: server.port, protocol: "http" });
      const tenant = `t-lc-fail-${dialect}-${rnd()}`;
      const charge = langchainTool(ledger, stripeTools(stripe).charge, { tenant });
      const declined = {
        invoiceId: `inv-d-${tenant}`,
        amount: 500,
        currency: "eur",
        paymentMethod: "pm_card_chargeDeclined",
      };
      const [first] = await toolNodeTurn([charge], [{ name: "charge_invoice", args: declined }]);
      const [again] = await toolNodeTurn([charge], [{ name: "charge_invoice", args: declined }]);
      expect(first!.text).not.toMatch(/Please fix your mistakes|^Error/);
      expect(first).toMatchObject({
        status: "error",
        outcome: { status: "failed", message: expect.stringMatching(/^Failed because .*card_declined/) },
      });
      expect(again!.outcome!.message).toMatch(/It failed earlier and was not tried again/);
      const operations = await ledger.admin.list({ tenant });
      expect(operations.map((o) => o.status)).toEqual(["failed"]);
    });

    it("input the schema refuses reads as guard's refusal, not LangChain's schema error: nothing is charged", async () => {
      // Given the schema itself, LangChain checks the input before the tool runs and the ToolNode
      // answers "Error: Received tool input did not match expected schema … Please fix your mistakes."
      const ledger = await db.open();
      const stripe = stripeActions({ apiKey: server.apiKey, host: "127.0.0.1", port: server.port, protocol: "http" });
      const tenant = `t-lc-inv-${dialect}-${rnd()}`;
      const def = stripeTools(stripe).charge;
      const charge = langchainTool(ledger, def, { tenant });
      const before = sandbox.count("payment_intents");
      const [read] = await toolNodeTurn(
        [charge],
        [{ name: "charge_invoice", args: { invoiceId: "invoice of May", amount: 12.5, currency: "euro" } }],
      );
      expect(read!.status).toBe("error");
      expect(read!.outcome, read!.text).toMatchObject({ status: "refused" });
      expect(read!.outcome!.message).toMatch(
        /^Refused: invalid input: invoiceId: must be the invoice's id, without spaces/,
      );
      expect(read!.outcome!.message).toMatch(/\. Nothing was done; fix the input before calling again\.$/);
      expect(sandbox.count("payment_intents")).toBe(before);
      expect(await ledger.admin.list({ tenant })).toEqual([]); // refused before the ledger had it
      // The model is still shown the schema's input, as LangChain lists a tool to a chat model.
      expect(convertToOpenAITool(charge).function.parameters).toMatchObject({
        type: "object",
        properties: { invoiceId: { type: "string", pattern: "^\\S+$" }, amount: { type: "integer" } },
        required: ["invoiceId", "amount", "currency"],
      });
    });

    it("a charge whose answer is late reads pending verification (not an error); the status tool then reads it done", async () => {
      const stripe = stripeActions({
        apiKey: server.apiKey,
        host: "127.0.0.1",
        port: server.port,
        protocol: "http",
        timeoutMs: 300,
      });
      const def = stripeTools(stripe).charge;
      const ledger = await db.open({ budget: { attempts: 1 }, actions: [def.action] } as LedgerOptions);
      const tenantId = `t-lc-st-${dialect}-${rnd()}`;
      // The tenant read from LangGraph's `configurable`, as an application that keeps it there does.
      const options = {
        tenant: (c: { context: { tenantId: string } }) => c.context.tenantId,
        context: (config: { configurable?: Record<string, unknown> }) => ({
          tenantId: config.configurable?.tenantId as string,
        }),
      };
      const tools = [langchainTool(ledger, def, options), langchainStatusTool(ledger, { ...options, tools: [def] })];
      const config = { configurable: { tenantId } };
      sandbox.faults.add({ kind: "delay_after_commit", match: { path: "/v1/payment_intents" }, delayMs: 1_000 });
      const late = once(sandbox.events, "late");
      const [pending] = await toolNodeTurn(
        tools,
        [{ name: "charge_invoice", args: { invoiceId: `inv-st-${tenantId}`, amount: 500, currency: "eur" } }],
        config,
      );
      // Not an error: a model (or a client) must not retry it.
      expect(pending).toMatchObject({ status: "success", outcome: { status: "pending_verification" } });
      const operationId = (pending!.outcome as { operationId: string }).operationId;
      await late;
      expect(await ledger.daemon.settle({ tenant: tenantId, id: operationId })).toMatchObject({
        status: "succeeded",
      });
      const checked = await toolNodeTurn(
        tools,
        [
          { name: "operation_status", args: { operationId } },
          { name: "operation_status", args: { operationId: 42 } },
          { name: "operation_status", args: { operationId: "op_nope" } },
        ],
        config,
      );
      expect(checked[0]).toMatchObject({
        status: "success",
        outcome: { status: "done", operationId, result: { status: "requires_payment_method" } },
      });
      expect(checked[1]).toMatchObject({ status: "error", outcome: { status: "refused" } });
      expect(checked[1]!.outcome!.message).toMatch(/^Refused: invalid input: operationId: .+ Nothing was checked/);
      expect(checked[2]!.outcome!.message).toMatch(/No operation "op_nope"/);
      expect(checked.map((c) => c.text).join()).not.toMatch(/Please fix your mistakes/);
    });

    it("a schema that transforms the model's input is applied once: 12.50 euros are 1250 cents, a day one timestamp", async () => {
      const ledger = await db.open();
      const { tools: definitions, executed } = transformingTools();
      const tenant = `t-lc-tr-${dialect}-${rnd()}`;
      const tools = definitions.map((t) => langchainTool(ledger, t, { tenant }));
      const read = await toolNodeTurn(tools, [
        { name: "charge", args: CALLS.charge },
        { name: "bill", args: CALLS.bill },
        { name: "remind", args: CALLS.remind },
        { name: "pay", args: CALLS.pay },
        { name: "pay", args: { invoice: "inv-x", amount: "12,50" } }, // not euros as the schema reads them
      ]);
      await expectAppliedOnce(ledger, tenant, executed);
      expect(read.map((r) => r.outcome?.status)).toEqual(["done", "done", "done", "done", "refused"]);
      expect(read[4]!.outcome!.message).toMatch(/^Refused: invalid input: amount/);
    });

    it("a zod 3 schema, or another library's, is listed to the model and applied once by guard: refused input reads as guard's refusal", async () => {
      // Given a schema zod 4 cannot describe, LangChain checked a zod 3 one itself (the ToolNode
      // answered "Error: Received tool input did not match expected schema … Please fix your
      // mistakes.") and checked another library's not at all: input it refuses was performed.
      const ledger = await db.open();
      const tenant = `t-lc-z3-${dialect}-${rnd()}`;
      const { executed, zod3, standard, undescribed } = otherSchemaTools();
      const tools = [langchainTool(ledger, zod3, { tenant }), langchainTool(ledger, standard, { tenant })];
      const read = await toolNodeTurn(tools, [
        { name: "pay_z3", args: { invoice: "inv of May", euros: "12.50" } },
        { name: "pay_std", args: { invoice: "inv of June", euros: "12.50" } },
        { name: "pay_z3", args: { invoice: `inv-3-${tenant}`, euros: "12.50" } },
        { name: "pay_std", args: { invoice: `inv-s-${tenant}`, euros: "12.50" } },
      ]);
      expect(read.map((r) => r.text).join()).not.toMatch(/Please fix your mistakes/);
      expect(read.map((r) => [r.status, r.outcome?.status])).toEqual([
        ["error", "refused"],
        ["error", "refused"],
        ["success", "done"],
        ["success", "done"],
      ]);
      expect(read[0]!.outcome!.message).toMatch(/^Refused: invalid input: invoice: must be an invoice id/);
      expect(read[1]!.outcome!.message).toMatch(/^Refused: invalid input: invoice: must be an invoice id/);
      expect(executed).toHaveLength(2); // the calls ran in any order
      expect(executed).toEqual(
        expect.arrayContaining([
          { invoice: `inv-3-${tenant}`, cents: 1250 },
          { invoice: `inv-s-${tenant}`, cents: 1250 },
        ]),
      ); // The model is shown each schema's input, as LangChain lists a tool to a chat model.
      for (const tool of tools)
        expect(convertToOpenAITool(tool).function.parameters).toMatchObject({
          type: "object",
          properties: { invoice: { type: "string", pattern: "^\\S+$" }, euros: { type: "string" } },
          required: ["invoice", "euros"],
        });
      // A schema that cannot be listed would show the model no fields: refused when the tool is made.
      expect(() => langchainTool(ledger, undescribed, { tenant })).toThrow(/pay_bare: .*JSON Schema/);
    });

    it("an input of one of several shapes (a card or an IBAN) is listed as the model fills it in, and either is done", async () => {
      // Listed as LangChain's own object schema with the input's JSON Schema over it, the shapes
      // were given under an object that allows no field at all ("properties": {},
      // "additionalProperties": false): no call could match it.
      const ledger = await db.open();
      const tenant = `t-lc-union-${dialect}-${rnd()}`;
      const paid: unknown[] = [];
      const input = z.discriminatedUnion("by", [
        z.object({ by: z.literal("card"), invoice: z.string(), last4: z.string().length(4) }),
        z.object({ by: z.literal("iban"), invoice: z.string(), iban: z.string() }),
      ]);
      const pay = langchainTool(
        ledger,
        {
          name: "pay",
          description: "Pay an invoice by card or by IBAN.",
          action: defineAction<z.output<typeof input>, { ok: true }>({
            type: "test.lc-pay-union",
            capabilities: {},
            async execute(args) {
              paid.push(args);
              return { ok: true };
            },
          }),
          input,
          key: (i: { invoice: string }) => ["pay", i.invoice],
        },
        { tenant },
      );
      const { $schema: _dialect, ...listed } = convertToOpenAITool(pay).function.parameters as Record<string, unknown>;
      const { $schema: _draft, ...shapes } = z.toJSONSchema(input, { io: "input", target: "draft-7" });
      expect(listed).toEqual(shapes); // its shapes, nothing more
      const read = await toolNodeTurn(
        [pay],
        [
          { name: "pay", args: { by: "card", invoice: `inv-c-${tenant}`, last4: "4242" } },
          { name: "pay", args: { by: "iban", invoice: `inv-i-${tenant}`, iban: "DE89370400440532013000" } },
        ],
      );
      expect(read.map((r) => r.outcome?.status)).toEqual(["done", "done"]);
      expect(paid).toHaveLength(2);
    });

    it("a graph resumed after an interrupt runs its ToolNode again: the charge is made once, its tool call the actor", async () => {
      // LangGraph re-runs a whole node on resume: the guarded call made before a sibling tool's
      // interrupt is called again, with the same tool-call id, and the ledger answers it.
      const ledger = await db.open();
      const tenant = `t-lc-resume-${dialect}-${rnd()}`;
      const executed: unknown[] = [];
      const pay = langchainTool(
        ledger,
        {
          name: "pay",
          description: "Pay an invoice.",
          action: defineAction<{ invoice: string }, { ok: true }>({
            type: "test.lc-pay-resume",
            capabilities: {},
            async execute(args) {
              executed.push(args);
              return { ok: true };
            },
          }),
          input: z.object({ invoice: z.string() }),
          key: (i: { invoice: string }) => ["pay", i.invoice],
        },
        { tenant },
      );
      const approve = tool(async () => `approved: ${String(interrupt("approve the receipt?"))}`, {
        name: "approve",
        description: "Ask a person.",
        schema: z.object({}),
      });
      let step = 0;
      const calls = [
        { name: "pay", args: { invoice: `inv-r-${tenant}` }, id: `call_pay_${rnd()}`, type: "tool_call" as const },
        { name: "approve", args: {}, id: `call_ask_${rnd()}`, type: "tool_call" as const },
      ];
      const graph = new StateGraph(MessagesAnnotation)
        .addNode("agent", () => ({
          messages: [step++ === 0 ? new AIMessage({ content: "", tool_calls: calls }) : new AIMessage("finished")],
        }))
        .addNode("tools", new ToolNode([pay, approve]))
        .addEdge(START, "agent")
        .addConditionalEdges("agent", toolsCondition, ["tools", END])
        .addEdge("tools", "agent")
        .compile({ checkpointer: new MemorySaver() });
      const thread = { configurable: { thread_id: `th-${tenant}` } };
      await graph.invoke({ messages: [new HumanMessage("pay it")] }, thread);
      // The interrupt ends the run at once, the charge perhaps still under way: the resumed call waits for it.
      expect((await graph.getState(thread)).next).toEqual(["tools"]);
      const { messages } = await graph.invoke(new Command({ resume: "yes" }), thread);

      const [paid] = turnsRead(messages)[0]!;
      const [operation] = await ledger.admin.list({ tenant });
      expect(paid).toMatchObject({ status: "success", outcome: { operationId: operation!.id } });
      expect(executed).toHaveLength(1);
      const { events } = await ledger.get({ tenant, id: operation!.id });
      expect(events.map((e) => e.actor)).toContain(calls[0]!.id);
      // The model reads that this very tool call did it before the resume, not someone else.
      // Before: "Already done earlier; not repeated", which reads as another's work.
      expect(paid!.outcome).toMatchObject({
        status: "already_done",
        message: `Already done earlier by this same tool call (${calls[0]!.id}), before it was run again; not repeated (operation ${operation!.id}).`,
      });
    });

    it("called outside a ToolNode (tool.invoke with a ToolCall, or with bare input) it answers the same content", async () => {
      const ledger = await db.open();
      const stripe = stripeActions({ apiKey: server.apiKey, host: "127.0.0.1", port: server.port, protocol: "http" });
      const tenant = `t-lc-inv2-${dialect}-${rnd()}`;
      const charge = langchainTool(ledger, stripeTools(stripe).charge, { tenant });
      const args = { invoiceId: `inv-i-${tenant}`, amount: 300, currency: "eur" };
      const message = (await charge.invoke({
        name: "charge_invoice",
        args,
        id: "call_a",
        type: "tool_call",
      })) as ToolMessage;
      expect(message.tool_call_id).toBe("call_a");
      expect(JSON.parse(String(message.content))).toMatchObject({ status: "done" });
      const bare = await charge.invoke(args);
      expect(JSON.parse(String(bare))).toMatchObject({ status: "already_done" });
    });
  });
}
