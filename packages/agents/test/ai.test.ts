/**
 * The Vercel AI SDK's own `generateText`, driven by its mock language model, calls a guarded
 * charge tool the way models do: once (Stripe answers too late, so the first attempt times out
 * after the charge committed), again with the same input, again with another amount, and twice
 * in parallel in one step. Counted at the target: one PaymentIntent per invoice. The model reads
 * done / already done / refused, never an exception.
 */
import { once } from "node:events";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { generateText, stepCountIs } from "ai";
import { MockLanguageModelV3 } from "ai/test";
import { z } from "zod";
import { defineAction, openLedger, type LedgerOptions } from "@idem/core";
import { StripeSandbox } from "@idem/sandbox";
import { stripeActions, stripeTools } from "@idem/stripe";
import { DIALECTS, ledgersFor } from "@idem/testkit";
import { aiStatusTool, aiTool } from "@idem/agents/ai";
import { defineTool, type Outcome } from "@idem/agents";
import { otherSchemaTools } from "./transforming-tools.js";

let sandbox: StripeSandbox;
let server: { port: number; apiKey: string };
beforeAll(async () => {
  sandbox = new StripeSandbox();
  server = await sandbox.start();
});
afterAll(() => sandbox.close());

type Call = { toolName: string; input: unknown };
/** A model that makes these tool calls, one step per entry (several calls in one step run in parallel), then stops. */
function scriptedModel(steps: Call[][]) {
  let step = 0;
  const usage = {
    inputTokens: { total: 1, noCache: 1, cacheRead: 0, cacheWrite: 0 },
    outputTokens: { total: 1, text: 1, reasoning: 0 },
  };
  return new MockLanguageModelV3({
    doGenerate: async () => {
      const calls = steps[step++];
      if (!calls)
        return {
          content: [{ type: "text", text: "finished" }],
          finishReason: { unified: "stop", raw: "stop" },
          usage,
          warnings: [],
        };
      return {
        content: calls.map((c, i) => ({
          type: "tool-call" as const,
          toolCallId: `call_${step}_${i}_${Math.random().toString(36).slice(2)}`,
          toolName: c.toolName,
          input: JSON.stringify(c.input),
        })),
        finishReason: { unified: "tool-calls", raw: "tool_calls" },
        usage,
        warnings: [],
      };
    },
  });
}

for (const dialect of DIALECTS) {
  describe(`AI SDK tools on ${dialect}`, () => {
    const db = ledgersFor(dialect, openLedger, { defaults: { poolSize: 4 } as LedgerOptions });

    it("a model that retries a charge: one PaymentIntent per invoice, and it reads done, already done, refused", async () => {
      const ledger = await db.open();
      const stripe = stripeActions({
        apiKey: server.apiKey,
        host: "127.0.0.1",
        port: server.port,
        protocol: "http",
        timeoutMs: 1_000,
      });
      const tenantId = `acme-${dialect}-${Math.random().toString(36).slice(2, 7)}`;
      const charge = aiTool(ledger, stripeTools(stripe).charge, {
        tenant: (c) => (c.context as { tenantId: string }).tenantId,
      });
      const before = sandbox.count("payment_intents");
      // Stripe commits the first charge but answers after the client gave up: an unknown outcome,
      // settled by replaying the same key, inside the same tool call.
      sandbox.faults.add({ kind: "delay_after_commit", match: { path: "/v1/payment_intents" }, delayMs: 3_000 });

      const inv1 = { invoiceId: `inv-1-${tenantId}`, amount: 500, currency: "eur" };
      const inv2 = { invoiceId: `inv-2-${tenantId}`, amount: 900, currency: "eur" };
      const result = await generateText({
        model: scriptedModel([
          [{ toolName: "charge", input: inv1 }],
          [{ toolName: "charge", input: inv1 }], // the model "tries again"
          [{ toolName: "charge", input: { ...inv1, amount: 700 } }], // and then with another amount
          [
            { toolName: "charge", input: inv2 },
            { toolName: "charge", input: inv2 },
          ], // two calls in one step
        ]),
        tools: {
          charge,
          operation_status: aiStatusTool(ledger, { tenant: (c) => (c.context as { tenantId: string }).tenantId }),
        },
        experimental_context: { tenantId },
        stopWhen: stepCountIs(10),
        prompt: "charge the invoices",
      });

      const read = result.steps.map((s) => s.toolResults.map((r) => (r.output as Outcome).status));
      expect(read.slice(0, 3)).toEqual([["done"], ["already_done"], ["refused"]]);
      expect(read[3]!.sort()).toEqual(["already_done", "done"]);
      const refused = result.steps[2]!.toolResults[0]!.output as Outcome;
      expect(refused.message).toMatch(
        /^Refused: this work \(charge inv-1-\S+\) was already done with different arguments \(operation op_\w+\)/,
      );
      const done = result.steps[0]!.toolResults[0]!.output as {
        operationId: string;
        result: { id: string; status: string };
      };
      // The summary, not Stripe's request ids; no payment method given: not charged, and it says so.
      expect(done.result).toEqual({
        id: expect.stringMatching(/^pi_/),
        status: "requires_payment_method",
        note: expect.stringMatching(/^not charged: the payment waits for the customer to pay it/),
      });
      expect(JSON.stringify(result.steps.map((s) => s.toolResults))).not.toMatch(/req_|[0-9a-f]{64}/);
      expect(result.steps.flatMap((s) => s.content).filter((p) => p.type === "tool-error")).toEqual([]);

      // The first charge's answer came too late: it was replayed with the same key, not sent anew.
      const { events } = await ledger.get({ tenant: tenantId, id: done.operationId });
      expect(events.map((e) => e.to)).toEqual(["running", "unknown", "running", "succeeded"]);
      expect(sandbox.count("payment_intents") - before).toBe(2);
      const pis = sandbox.objects.all("payment_intents").slice(-2);
      expect(pis.map((p) => (p.metadata as Record<string, string>).invoice_id).sort()).toEqual(
        [inv1.invoiceId, inv2.invoiceId].sort(),
      );
    });

    it("charge_invoice charges only with a payment method: without one, the model reads a payment waiting for the customer", async () => {
      const ledger = await db.open();
      const stripe = stripeActions({ apiKey: server.apiKey, host: "127.0.0.1", port: server.port, protocol: "http" });
      const tenant = `t-pay-${dialect}-${Math.random().toString(36).slice(2, 7)}`;
      const charge = aiTool(ledger, stripeTools(stripe).charge, { tenant });
      const [pis, charges] = [sandbox.count("payment_intents"), sandbox.count("charges")];
      const result = await generateText({
        model: scriptedModel([
          [
            {
              toolName: "charge",
              input: { invoiceId: `inv-pm-${tenant}`, amount: 500, currency: "eur", paymentMethod: "pm_card_visa" },
            },
          ],
          [{ toolName: "charge", input: { invoiceId: `inv-later-${tenant}`, amount: 500, currency: "eur" } }],
          [
            {
              toolName: "charge",
              input: {
                invoiceId: `inv-declined-${tenant}`,
                amount: 500,
                currency: "eur",
                paymentMethod: "pm_card_chargeDeclined",
              },
            },
          ],
        ]),
        tools: { charge },
        stopWhen: stepCountIs(10),
        prompt: "charge the invoices",
      });
      const read = result.steps.slice(0, 3).map((s) => s.toolResults[0]!.output as Outcome & { result?: unknown });
      expect(read.map((o) => o.status)).toEqual(["done", "done", "failed"]);
      expect(read[0]).toMatchObject({ result: { status: "succeeded" } });
      expect(read[1]).toMatchObject({ result: { status: "requires_payment_method" } });
      expect(read[2]!.message).toMatch(/card_declined/);
      expect(sandbox.count("payment_intents") - pis).toBe(3);
      expect(sandbox.count("charges") - charges).toBe(1); // only the one with a payment method that works
    });

    it("the status tool tells a model what became of an operation; an unknown id is refused, not thrown", async () => {
      const ledger = await db.open();
      const stripe = stripeActions({ apiKey: server.apiKey, host: "127.0.0.1", port: server.port, protocol: "http" });
      const tenantId = `acme-s-${dialect}-${Math.random().toString(36).slice(2, 7)}`;
      const tenant = () => tenantId;
      const charge = aiTool(ledger, stripeTools(stripe).charge, { tenant });
      const first = await generateText({
        model: scriptedModel([
          [{ toolName: "charge", input: { invoiceId: `inv-s-${tenantId}`, amount: 100, currency: "usd" } }],
        ]),
        tools: { charge },
        prompt: "charge",
      });
      const { operationId } = first.steps[0]!.toolResults[0]!.output as { operationId: string };
      const checked = await generateText({
        model: scriptedModel([
          [
            { toolName: "operation_status", input: { operationId } },
            { toolName: "operation_status", input: { operationId: "op_nope" } },
          ],
        ]),
        tools: { operation_status: aiStatusTool(ledger, { tenant }) },
        prompt: "check",
      });
      const [known, unknown] = checked.steps[0]!.toolResults.map((r) => r.output as Outcome);
      expect(known).toMatchObject({ status: "done", operationId });
      expect(unknown).toMatchObject({ status: "refused" });
      expect(unknown!.message).toMatch(/No operation "op_nope"/);
    });

    it("the status tool answers input it cannot read with a refusal that checked nothing, not the SDK's validation error", async () => {
      // Before: the SDK checked the status tool's input against its zod schema, and the model read
      // a tool-error part with zod's issues in it, nothing saying the operation was not checked.
      const ledger = await db.open();
      const stripe = stripeActions({ apiKey: server.apiKey, host: "127.0.0.1", port: server.port, protocol: "http" });
      const tenant = `t-sbad-${dialect}-${Math.random().toString(36).slice(2, 7)}`;
      const tools = {
        charge: aiTool(ledger, stripeTools(stripe).charge, { tenant }),
        operation_status: aiStatusTool(ledger, { tenant }),
      };
      const first = await generateText({
        model: scriptedModel([
          [{ toolName: "charge", input: { invoiceId: `inv-${tenant}`, amount: 100, currency: "eur" } }],
        ]),
        tools,
        prompt: "charge",
      });
      const { operationId } = first.steps[0]!.toolResults[0]!.output as { operationId: string };
      const model = scriptedModel([
        [
          { toolName: "operation_status", input: { operationId: 42 } },
          { toolName: "operation_status", input: { waitMs: 1_000 } },
          { toolName: "operation_status", input: { operationId, waitMs: "soon" } },
          { toolName: "operation_status", input: { operationId, waitMs: 120_000 } }, // more than the most: the most
        ],
      ]);
      const { steps } = await generateText({ model, tools, prompt: "check" });
      const parts = steps[0]!.content.filter((p) => p.type === "tool-error" || p.type === "tool-result");
      expect(
        parts.map((p) => p.type),
        JSON.stringify(parts),
      ).toEqual(["tool-result", "tool-result", "tool-result", "tool-result"]);
      const read = steps[0]!.toolResults.map((r) => r.output as Outcome);
      expect(read.map((o) => o.status)).toEqual(["refused", "refused", "refused", "done"]);
      expect(read[0]!.message).toMatch(/^Refused: invalid input: operationId: .+ Nothing was checked/);
      expect(read[1]!.message).toMatch(/^Refused: invalid input: operationId: /);
      expect(read[2]!.message).toMatch(/^Refused: invalid input: waitMs: .+ Nothing was checked/);
      expect(read[3]).toMatchObject({ operationId });
      // The model is still asked for the tool's input as before.
      const asked = (model.doGenerateCalls[0]!.tools as { name: string; inputSchema: unknown }[]).find(
        (t) => t.name === "operation_status",
      );
      expect(asked!.inputSchema).toMatchObject({
        type: "object",
        // The id's form, shown to the model (before: any string, refused when called).
        properties: {
          operationId: { type: "string", pattern: "^op_[0-9a-z]{1,64}$" },
          waitMs: { type: "integer", minimum: 0, maximum: 50_000 },
        },
        required: ["operationId"],
      });
    });

    it("the status tool reads a settled operation as the tool that made it: a charge waiting for the customer, not a bare 'Done'", async () => {
      // Before: the status tool summarized no receipt, so a payment still waiting for the
      // customer (requires_payment_method) read "Done", as if the invoice had been charged.
      const stripe = stripeActions({
        apiKey: server.apiKey,
        host: "127.0.0.1",
        port: server.port,
        protocol: "http",
        timeoutMs: 300,
      });
      const def = stripeTools(stripe).charge;
      const ledger = await db.open({ budget: { attempts: 1 }, actions: [def.action] } as LedgerOptions);
      const tenant = `t-st-${dialect}-${Math.random().toString(36).slice(2, 7)}`;
      const tools = {
        charge: aiTool(ledger, def, { tenant }),
        operation_status: aiStatusTool(ledger, { tenant, tools: [def] }),
      };
      sandbox.faults.add({ kind: "delay_after_commit", match: { path: "/v1/payment_intents" }, delayMs: 1_000 });
      const late = once(sandbox.events, "late");
      const first = await generateText({
        model: scriptedModel([
          [{ toolName: "charge", input: { invoiceId: `inv-st-${tenant}`, amount: 500, currency: "eur" } }],
        ]),
        tools,
        prompt: "charge",
      });
      const pending = first.steps[0]!.toolResults[0]!.output as Outcome;
      expect(pending).toMatchObject({ status: "pending_verification" });
      const operationId = (pending as { operationId: string }).operationId;
      await late; // the intent's late answer has come and gone
      // The daemon settles it: it replays the same key, and Stripe answers with the saved intent.
      expect(await ledger.daemon.settle({ tenant, id: operationId })).toMatchObject({
        status: "succeeded",
        receipt: { status: "requires_payment_method" },
      });
      const checked = await generateText({
        model: scriptedModel([[{ toolName: "operation_status", input: { operationId } }]]),
        tools,
        prompt: "check",
      });
      const read = checked.steps[0]!.toolResults[0]!.output as Outcome & { result?: unknown };
      expect(read, JSON.stringify(read)).toMatchObject({
        status: "done",
        operationId,
        result: { id: expect.stringMatching(/^pi_/), status: "requires_payment_method" },
      });
    });

    it("input the schema refuses reads as guard's refusal, a value, not the SDK's validation error: nothing is charged", async () => {
      // Before: the SDK checked the input against the zod schema before the tool ran, and the
      // model read a tool-error part with zod's issues in it.
      const ledger = await db.open();
      const stripe = stripeActions({ apiKey: server.apiKey, host: "127.0.0.1", port: server.port, protocol: "http" });
      const tenant = `t-inv-${dialect}-${Math.random().toString(36).slice(2, 7)}`;
      const before = sandbox.count("payment_intents");
      const model = scriptedModel([
        [{ toolName: "charge", input: { invoiceId: "invoice of May", amount: 12.5, currency: "euro" } }],
      ]);
      const { steps } = await generateText({
        model,
        tools: { charge: aiTool(ledger, stripeTools(stripe).charge, { tenant }) },
        prompt: "charge",
        stopWhen: stepCountIs(3),
      });
      const parts = steps[0]!.content.filter((p) => p.type === "tool-error" || p.type === "tool-result");
      expect(
        parts.map((p) => p.type),
        JSON.stringify(parts),
      ).toEqual(["tool-result"]);
      const read = steps[0]!.toolResults[0]!.output as Outcome;
      expect(read.status).toBe("refused");
      expect(read.message).toMatch(/^Refused: invalid input: invoiceId: must be the invoice's id, without spaces/);
      expect(sandbox.count("payment_intents")).toBe(before);
      expect(await ledger.admin.list({ tenant })).toEqual([]); // refused before the ledger had it
      // The model is still asked for the schema's input, as the SDK describes it.
      const [asked] = model.doGenerateCalls[0]!.tools as unknown as { inputSchema: Record<string, unknown> }[];
      expect(asked!.inputSchema).toMatchObject({
        type: "object",
        properties: { invoiceId: { type: "string", pattern: "^\\S+$" }, amount: { type: "integer" } },
        required: ["invoiceId", "amount", "currency"],
        additionalProperties: false,
      });
    });

    it("a schema that transforms the model's input is applied once: the effect gets what the model meant", async () => {
      // Before: the SDK parsed the input, then the guard (a tool's schema) or the ledger (an
      // action's) parsed that output again: 12.50 euros went out as 125,000 cents, and a schema
      // that changes a type refused every valid call.
      const ledger = await db.open();
      const charged: unknown[] = [];
      const charge = defineAction<{ cents: number; invoice: string }, { ok: true }>({
        type: "test.charge",
        capabilities: {},
        execute: async (a) => {
          charged.push(a);
          return { ok: true };
        },
      });
      const byTool = defineTool({
        name: "charge",
        description: "Charge an invoice in euros.",
        action: charge,
        input: z.object({ invoice: z.string(), euros: z.number().transform((e) => Math.round(e * 100)) }),
        args: (i: { invoice: string; euros: number }) => ({ cents: i.euros, invoice: i.invoice }),
        key: (i: { invoice: string }) => ["charge", i.invoice],
      });
      const dated = defineAction<{ at: string }, { ok: true }, { at: string }>({
        type: "test.remind",
        capabilities: {},
        // An action's own schema, transforming: a day becomes a timestamp (a string again, as args are JSON).
        input: z.object({ at: z.string().transform((d) => `${d}T09:00:00Z`) }),
        execute: async (a) => {
          charged.push(a);
          return { ok: true };
        },
      });
      const tenant = `t-${dialect}-${Math.random().toString(36).slice(2, 7)}`;
      const tools = {
        charge: aiTool(ledger, byTool, { tenant }),
        remind: aiTool(ledger, dated, { tenant, key: (i) => ["remind", i.at] }),
      };
      const { steps } = await generateText({
        model: scriptedModel([
          [
            { toolName: "charge", input: { invoice: "inv-t", euros: 12.5 } },
            { toolName: "remind", input: { at: "2026-12-24" } },
          ],
        ]),
        prompt: "charge and remind",
        tools,
        stopWhen: stepCountIs(3),
      });
      expect(steps[0]!.toolResults.map((r) => (r.output as Outcome).status)).toEqual(["done", "done"]);
      expect(charged).toHaveLength(2); // the two calls ran in parallel: in either order
      expect(charged).toEqual(
        expect.arrayContaining([{ cents: 1250, invoice: "inv-t" }, { at: "2026-12-24T09:00:00Z" }]),
      );
    });

    it("a zod 3 schema, or another library's, is applied once by guard: refused input reads as guard's refusal, nothing done", async () => {
      const ledger = await db.open();
      const tenant = `t-z3-${dialect}-${Math.random().toString(36).slice(2, 7)}`;
      const { executed, zod3, standard, undescribed } = otherSchemaTools();
      const model = scriptedModel([
        [
          { toolName: "pay_z3", input: { invoice: "inv of May", euros: "12.50" } },
          { toolName: "pay_std", input: { invoice: "inv of June", euros: "12.50" } },
          { toolName: "pay_z3", input: { invoice: `inv-3-${tenant}`, euros: "12.50" } },
          { toolName: "pay_std", input: { invoice: `inv-s-${tenant}`, euros: "12.50" } },
        ],
      ]);
      const { steps } = await generateText({
        model,
        tools: { pay_z3: aiTool(ledger, zod3, { tenant }), pay_std: aiTool(ledger, standard, { tenant }) },
        prompt: "pay",
        stopWhen: stepCountIs(3),
      });
      const parts = steps[0]!.content.filter((p) => p.type === "tool-error" || p.type === "tool-result");
      const read = parts.map((p) => (p.type === "tool-result" ? (p.output as Outcome) : undefined));
      expect(
        read.map((o) => o?.status),
        JSON.stringify(parts),
      ).toEqual(["refused", "refused", "done", "done"]);
      expect(read[0]!.message).toMatch(/^Refused: invalid input: invoice: must be an invoice id/);
      expect(read[1]!.message).toMatch(/^Refused: invalid input: invoice: must be an invoice id/);
      expect(executed).toHaveLength(2); // the calls ran in any order
      expect(executed).toEqual(
        expect.arrayContaining([
          { invoice: `inv-3-${tenant}`, cents: 1250 },
          { invoice: `inv-s-${tenant}`, cents: 1250 },
        ]),
      );
      // The model is asked for each schema's input.
      for (const asked of model.doGenerateCalls[0]!.tools as unknown as { inputSchema: unknown }[])
        expect(asked.inputSchema).toMatchObject({
          type: "object",
          properties: { invoice: { type: "string", pattern: "^\\S+$" }, euros: { type: "string" } },
          required: ["invoice", "euros"],
        });
      // A schema that cannot be listed: refused when the tool is made, not when a run starts.
      expect(() => aiTool(ledger, undescribed, { tenant })).toThrow(/pay_bare: .*JSON Schema/);
    });
  });
}
