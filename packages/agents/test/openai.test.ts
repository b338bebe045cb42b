/**
 * The OpenAI Agents SDK's own runner, with a scripted model in place of OpenAI's, calls a guarded
 * charge tool as models do: once, again, with another amount, twice in one turn. Counted at the
 * Stripe sandbox: one PaymentIntent per invoice; the model reads done / already done / refused.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import {
  Agent,
  Usage,
  run,
  setTracingDisabled,
  type Model,
  type ModelRequest,
  type ModelResponse,
} from "@openai/agents";
import { openLedger, type LedgerOptions } from "@idem/core";
import { StripeSandbox } from "@idem/sandbox";
import { stripeActions, stripeTools } from "@idem/stripe";
import { DIALECTS, ledgersFor } from "@idem/testkit";
import { openaiStatusTool, openaiTool } from "@idem/agents/openai";
import { CALLS, expectAppliedOnce, transformingTools } from "./transforming-tools.js";

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

      const outputs = result.newItems
        .filter((i) => i.type === "tool_call_output_item")
        .map((i) => {
          const out = (i as unknown as { output: unknown }).output;
          return (typeof out === "string" ? JSON.parse(out) : out) as { status: string; message: string };
        });
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
      const outputs = result.newItems
        .filter((i) => i.type === "tool_call_output_item")
        .map((i) => {
          const out = (i as unknown as { output: unknown }).output;
          return (typeof out === "string" ? JSON.parse(out) : out) as { status: string; message: string };
        });
      expect(outputs.map((o) => o.status)).toEqual(["done", "done", "done", "done", "refused"]);
      expect(outputs[4]!.message).toMatch(/^Refused: invalid input: amount/);
    });
  });
}
