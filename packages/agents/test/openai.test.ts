/**
 * The OpenAI Agents SDK's own runner, with a scripted model in place of OpenAI's, calls a guarded
 * charge tool as models do: once, again, with another amount, twice in one turn. Counted at the
 * Stripe sandbox: one PaymentIntent per invoice; the model reads done / already done / refused.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import {
  Agent,
  RunContext,
  Usage,
  run,
  setTracingDisabled,
  tool,
  type Model,
  type ModelRequest,
  type ModelResponse,
} from "@openai/agents";
import { z } from "zod";
import { defineAction, openLedger, type LedgerOptions } from "@idem/core";
import { StripeSandbox } from "@idem/sandbox";
import { stripeActions, stripeTools } from "@idem/stripe";
import { DIALECTS, ledgersFor } from "@idem/testkit";
import { openaiStatusTool, openaiTool } from "@idem/agents/openai";
import { defineTool } from "@idem/agents";
import { CALLS, expectAppliedOnce, otherSchemaTools, transformingTools } from "./transforming-tools.js";

setTracingDisabled(true); // no exporter: nothing leaves the machine

let sandbox: StripeSandbox;
let server: { port: number; apiKey: string };
beforeAll(async () => {
  sandbox = new StripeSandbox();
  server = await sandbox.start();
});
afterAll(() => sandbox.close());

type Call = { name: string; input: unknown };
/** A model that makes these function calls, one turn per entry, then answers with text. */
function scriptedModel(turns: Call[][]): Model {
  let turn = 0;
  return {
    async getResponse(_request: ModelRequest): Promise<ModelResponse> {
      const calls = turns[turn++];
      const output = calls
        ? calls.map((c, i) => ({
            type: "function_call" as const,
            callId: `call_${turn}_${i}_${Math.random().toString(36).slice(2)}`,
            name: c.name,
            arguments: JSON.stringify(c.input),
            status: "completed" as const,
          }))
        : [
            {
              type: "message" as const,
              role: "assistant" as const,
              status: "completed" as const,
              content: [{ type: "output_text" as const, text: "finished" }],
            },
          ];
      return { usage: new Usage({ requests: 1, inputTokens: 1, outputTokens: 1, totalTokens: 2 }), output };
    },
    getStreamedResponse(): AsyncIterable<never> {
      throw new Error("not streamed in these tests");
    },
  };
}

/** What the model read of each tool call, in order. */
function outputsOf(result: { newItems: { type: string }[] }) {
  return result.newItems
    .filter((i) => i.type === "tool_call_output_item")
    .map((i) => {
      const out = (i as unknown as { output: unknown }).output;
      return (typeof out === "string" ? JSON.parse(out) : out) as { status: string; message: string };
    });
}

for (const dialect of DIALECTS) {
  describe(`OpenAI Agents tools on ${dialect}`, () => {
    const db = ledgersFor(dialect, openLedger, { defaults: { poolSize: 4 } as LedgerOptions });

    it("a model that retries a charge: one PaymentIntent per invoice, and it reads done, already done, refused", async () => {
      const ledger = await db.open();
      const stripe = stripeActions({ apiKey: server.apiKey, host: "127.0.0.1", port: server.port, protocol: "http" });
      const tenantId = `acme-oa-${dialect}-${Math.random().toString(36).slice(2, 7)}`;
      const tenant = (c: { context: unknown }) => (c.context as { tenantId: string }).tenantId;
      const before = sandbox.count("payment_intents");
      const inv1 = { invoiceId: `inv-1-${tenantId}`, amount: 500, currency: "eur", customer: null };
      const inv2 = { invoiceId: `inv-2-${tenantId}`, amount: 900, currency: "eur", customer: null };
      const agent = new Agent({
        name: "billing",
        instructions: "Charge the invoices you are given.",
        model: scriptedModel([
          [{ name: "charge_invoice", input: inv1 }],
          [{ name: "charge_invoice", input: inv1 }],
          [{ name: "charge_invoice", input: { ...inv1, amount: 700 } }],
          [
            { name: "charge_invoice", input: inv2 },
            { name: "charge_invoice", input: inv2 },
          ],
        ]),
        tools: [openaiTool(ledger, stripeTools(stripe).charge, { tenant }), openaiStatusTool(ledger, { tenant })],
      });
      const result = await run(agent, "charge them", { context: { tenantId }, maxTurns: 10 });

      const outputs = outputsOf(result);
      expect(outputs.map((o) => o.status).slice(0, 3)).toEqual(["done", "already_done", "refused"]);
      expect(
        outputs
          .map((o) => o.status)
          .slice(3)
          .sort(),
      ).toEqual(["already_done", "done"]);
      expect(outputs[2]!.message).toMatch(/already done with different arguments/);
      expect(result.finalOutput).toBe("finished");
      expect(sandbox.count("payment_intents") - before).toBe(2);
    });

    it("input the schema refuses reads as guard's refusal, as in the AI SDK and MCP adapters, not 'Not performed': nothing is charged", async () => {
      // Before: the SDK checked the input against the zod schema itself, and the model read
      // idemErrorFunction's "Not performed: Invalid JSON input for tool", unlike the other adapters.
      const ledger = await db.open();
      const stripe = stripeActions({ apiKey: server.apiKey, host: "127.0.0.1", port: server.port, protocol: "http" });
      const tenant = `t-oa-inv-${dialect}-${Math.random().toString(36).slice(2, 7)}`;
      const def = stripeTools(stripe).charge;
      const charge = openaiTool(ledger, def, { tenant });
      const before = sandbox.count("payment_intents");
      const agent = new Agent({
        name: "billing",
        instructions: "Charge the invoices you are given.",
        model: scriptedModel([
          [
            {
              name: "charge_invoice",
              input: {
                invoiceId: "invoice of May",
                amount: 12.5,
                currency: "euro",
                customer: null,
                paymentMethod: null,
              },
            },
          ],
        ]),
        tools: [charge],
      });
      const result = await run(agent, "charge", { maxTurns: 3 });
      const [read] = outputsOf(result);
      expect(read, JSON.stringify(read)).toMatchObject({ status: "refused" });
      expect(read!.message).toMatch(/^Refused: invalid input: invoiceId: must be the invoice's id, without spaces/);
      expect(read!.message).toMatch(/\. Nothing was done; fix the input before calling again\.$/);
      // Arguments that are not JSON, invoked directly (a run answers them itself, before the tool):
      // refused as guard refuses input, nothing done. Before: `not_performed`, another status for
      // the same situation.
      const unparsed = JSON.parse(String(await charge.invoke(new RunContext({}), "{not json")));
      expect(unparsed).toMatchObject({
        status: "refused",
        message: expect.stringMatching(
          /^Refused: invalid input: the arguments could not be read \(.+\)\. Nothing was done; fix the input/,
        ),
      });
      expect(sandbox.count("payment_intents")).toBe(before);
      expect(await ledger.admin.list({ tenant })).toEqual([]); // refused before the ledger had it
      // The model is still asked for what the SDK itself makes of the schema, in strict mode.
      const described = tool({
        name: def.name,
        description: def.description,
        parameters: def.input,
        execute: () => "",
      });
      expect(charge.parameters).toEqual(described.parameters);
      expect(charge.strict).toBe(true);
    });

    it("strict mode's null for an optional field is still no value, and a valid call is done once", async () => {
      // In strict mode every field is required and an optional one is nullable: the model sends
      // null for "none". The SDK read such a null as absent before checking; guard must see the same.
      const ledger = await db.open();
      const noted: unknown[] = [];
      const note = defineTool({
        name: "note",
        description: "Note something about an invoice.",
        action: defineAction<{ invoice: string; text: string; tag?: string }, { ok: true }>({
          type: "test.note",
          capabilities: {},
          execute: async (a) => {
            noted.push(a);
            return { ok: true };
          },
        }),
        input: z.object({ invoice: z.string(), text: z.string(), tag: z.string().optional() }),
        key: (i: { invoice: string }) => ["note", i.invoice],
      });
      const tenant = `t-oa-null-${dialect}-${Math.random().toString(36).slice(2, 7)}`;
      const agent = new Agent({
        name: "notes",
        instructions: "Note it.",
        model: scriptedModel([[{ name: "note", input: { invoice: "inv-n", text: "paid late", tag: null } }]]),
        tools: [openaiTool(ledger, note, { tenant })],
      });
      const result = await run(agent, "note", { maxTurns: 3 });
      expect(outputsOf(result).map((o) => o.status)).toEqual(["done"]);
      expect(noted).toEqual([{ invoice: "inv-n", text: "paid late" }]);
    });

    it("the status tool answers input it cannot read with a refusal that checked nothing, not 'Not performed'", async () => {
      // Before: the SDK checked the status tool's input itself, and the model read idemErrorFunction's
      // "Not performed: … Nothing was done", which a model may take for the operation's answer.
      const ledger = await db.open();
      const stripe = stripeActions({ apiKey: server.apiKey, host: "127.0.0.1", port: server.port, protocol: "http" });
      const tenant = `t-oa-sbad-${dialect}-${Math.random().toString(36).slice(2, 7)}`;
      const charge = stripeTools(stripe).charge;
      const status = openaiStatusTool(ledger, { tenant, tools: [charge] });
      const first = await run(
        new Agent({
          name: "billing",
          instructions: "Charge.",
          model: scriptedModel([
            [
              {
                name: "charge_invoice",
                input: {
                  invoiceId: `inv-${tenant}`,
                  amount: 100,
                  currency: "eur",
                  customer: null,
                  paymentMethod: null,
                },
              },
            ],
          ]),
          tools: [openaiTool(ledger, charge, { tenant })],
        }),
        "charge",
        { maxTurns: 3 },
      );
      const { operationId } = outputsOf(first)[0] as unknown as { operationId: string };
      const agent = new Agent({
        name: "checker",
        instructions: "Check.",
        model: scriptedModel([
          [
            { name: "operation_status", input: { operationId: 42, waitMs: null } },
            { name: "operation_status", input: { waitMs: 1_000 } },
            { name: "operation_status", input: { operationId, waitMs: "soon" } },
            { name: "operation_status", input: { operationId, waitMs: 120_000 } }, // more than the most: the most
            { name: "operation_status", input: { operationId, waitMs: null } },
          ],
        ]),
        tools: [status],
      });
      const read = outputsOf(await run(agent, "check", { maxTurns: 3 }));
      expect(
        read.map((o) => o.status),
        JSON.stringify(read),
      ).toEqual(["refused", "refused", "refused", "done", "done"]);
      expect(read[0]!.message).toMatch(/^Refused: invalid input: operationId: .+ Nothing was checked/);
      expect(read[2]!.message).toMatch(/^Refused: invalid input: waitMs: .+ Nothing was checked/);
      // Arguments that are not JSON, invoked directly (a run answers them itself, before the tool).
      const unparsed = JSON.parse(String(await status.invoke(new RunContext({}), `{"operationId": "${operationId}"`)));
      expect(unparsed).toMatchObject({ status: "refused", message: expect.stringMatching(/Nothing was checked/) });
      // The model is still shown what the SDK makes of the tool's input, in strict mode.
      expect(status.strict).toBe(true);
      expect(status.parameters).toMatchObject({
        properties: {
          // The id's form, shown to the model (before: any string, refused when called).
          operationId: { type: "string", pattern: "^op_[0-9a-z]{1,64}$" },
          waitMs: { anyOf: [{ type: "integer", minimum: 0, maximum: 50_000 }, { type: "null" }] },
        },
        required: ["operationId", "waitMs"],
      });
    });

    it("a schema that transforms the model's input is applied once: 12.50 euros are 1250 cents, a day one timestamp", async () => {
      // The SDK cannot describe a zod schema that transforms: before, openaiTool threw ("Transforms
      // cannot be represented in JSON Schema"). The model is now asked for the schema's input, and
      // the schema is applied once: applied twice, 12.50 euros would be 125,000 cents and a
      // string-to-number schema would refuse every valid call.
      const ledger = await db.open();
      const { tools: definitions, executed } = transformingTools();
      const tenant = `t-oa-${dialect}-${Math.random().toString(36).slice(2, 7)}`;
      const tools = definitions.map((t) => openaiTool(ledger, t, { tenant }));
      const asked = Object.fromEntries(tools.map((t) => [t.name, t.parameters.properties]));
      expect(asked).toMatchObject({
        charge: { euros: { type: "number" } },
        bill: { euros: { type: "number" } },
        remind: { at: { type: "string" } },
        pay: { amount: { type: "string" } },
      });
      const agent = new Agent({
        name: "billing",
        instructions: "Charge, remind and pay.",
        model: scriptedModel([
          [
            { name: "charge", input: CALLS.charge },
            { name: "bill", input: CALLS.bill },
            { name: "remind", input: CALLS.remind },
            { name: "pay", input: CALLS.pay },
            { name: "pay", input: { invoice: "inv-x", amount: "12,50" } }, // not euros as the schema reads them
          ],
        ]),
        tools,
      });
      const result = await run(agent, "go", { maxTurns: 3 });

      await expectAppliedOnce(ledger, tenant, executed);
      const outputs = outputsOf(result);
      expect(outputs.map((o) => o.status)).toEqual(["done", "done", "done", "done", "refused"]);
      expect(outputs[4]!.message).toMatch(/^Refused: invalid input: amount/);
    });

    it("a zod 3 schema, or another library's, is listed and applied once by guard: refused input reads as guard's refusal", async () => {
      // Before: the SDK checked a zod 3 schema itself (the model read "the arguments could not be
      // read (Invalid JSON input for tool)", not what was wrong) and failed to copy another
      // library's ("DataCloneError") when the tool was made.
      const ledger = await db.open();
      const tenant = `t-oa-z3-${dialect}-${Math.random().toString(36).slice(2, 7)}`;
      const { executed, zod3, standard, undescribed } = otherSchemaTools();
      const tools = [openaiTool(ledger, zod3, { tenant }), openaiTool(ledger, standard, { tenant })];
      const agent = new Agent({
        name: "billing",
        instructions: "Pay the invoices.",
        model: scriptedModel([
          [
            { name: "pay_z3", input: { invoice: "inv of May", euros: "12.50" } },
            { name: "pay_std", input: { invoice: "inv of June", euros: "12.50" } },
            { name: "pay_z3", input: { invoice: `inv-3-${tenant}`, euros: "12.50" } },
            { name: "pay_std", input: { invoice: `inv-s-${tenant}`, euros: "12.50" } },
          ],
        ]),
        tools,
      });
      const outputs = outputsOf(await run(agent, "pay", { maxTurns: 3 }));
      expect(
        outputs.map((o) => o.status),
        JSON.stringify(outputs),
      ).toEqual(["refused", "refused", "done", "done"]);
      expect(outputs[0]!.message).toMatch(/^Refused: invalid input: invoice: must be an invoice id/);
      expect(outputs[1]!.message).toMatch(/^Refused: invalid input: invoice: must be an invoice id/);
      expect(executed).toHaveLength(2); // the calls ran in any order
      expect(executed).toEqual(
        expect.arrayContaining([
          { invoice: `inv-3-${tenant}`, cents: 1250 },
          { invoice: `inv-s-${tenant}`, cents: 1250 },
        ]),
      );
      // The model is asked for each schema's input.
      for (const t of tools)
        expect(t.parameters, t.name).toMatchObject({
          type: "object",
          properties: { invoice: { type: "string", pattern: "^\\S+$" }, euros: { type: "string" } },
          required: ["invoice", "euros"],
        });
      // A schema that cannot be listed would show the model no fields: refused when the tool is made.
      expect(() => openaiTool(ledger, undescribed, { tenant })).toThrow(/pay_bare: .*JSON Schema/);
    });
  });
}
