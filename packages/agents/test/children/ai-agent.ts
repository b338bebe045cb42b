/**
 * An agent process: the AI SDK's generateText with a mock model that calls the guarded charge
 * tool once for INVOICE, then prints `outcome <json>` of what the model read.
 * Env: LEDGER_URL, STRIPE_PORT, STRIPE_KEY, TENANT, INVOICE, LEASE_MS.
 */
import { generateText, stepCountIs } from "ai";
import { MockLanguageModelV3 } from "ai/test";
import { openLedger } from "@idem/core";
import { stripeActions, stripeTools } from "@idem/stripe";
import { aiTool } from "@idem/agents/ai";

const env = process.env;
const ledger = await openLedger(env.LEDGER_URL!, { migrate: false, poolSize: 2, leaseMs: Number(env.LEASE_MS) });
const stripe = stripeActions({
  apiKey: env.STRIPE_KEY!,
  host: "127.0.0.1",
  port: Number(env.STRIPE_PORT),
  protocol: "http",
  timeoutMs: 60_000,
});
// A re-run waits for a dead attempt's lease to end, then takes the work over with the same key.
const charge = aiTool(ledger, stripeTools(stripe).charge, { tenant: env.TENANT!, waitMs: 60_000 });
const usage = {
  inputTokens: { total: 1, noCache: 1, cacheRead: 0, cacheWrite: 0 },
  outputTokens: { total: 1, text: 1, reasoning: 0 },
};
let step = 0;
const model = new MockLanguageModelV3({
  doGenerate: async () =>
    step++ === 0
      ? {
          content: [
            {
              type: "tool-call",
              toolCallId: `call_${process.pid}`,
              toolName: "charge",
              input: JSON.stringify({ invoiceId: env.INVOICE, amount: 1200, currency: "eur" }),
            },
          ],
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
const result = await generateText({ model, tools: { charge }, stopWhen: stepCountIs(3), prompt: "charge the invoice" });
console.log(`outcome ${JSON.stringify(result.steps[0]!.toolResults[0]!.output)}`);
await ledger.close();
