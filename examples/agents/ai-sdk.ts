/**
 * A guarded Stripe charge as a Vercel AI SDK tool. A scripted model (no network, no API key)
 * charges an invoice, calls the same tool again with the same input (as models do when they are
 * unsure), then with another amount. The Stripe sandbox counts the PaymentIntents: one.
 *
 *   pnpm example:agents   (every framework), or from examples/:
 *   node --conditions=idem-source --import tsx agents/ai-sdk.ts
 */
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { generateText, stepCountIs } from "ai";
import { MockLanguageModelV3 } from "ai/test";
import { openLedger } from "@idem/core";
import { StripeSandbox } from "@idem/sandbox";
import { stripeActions, stripeTools } from "@idem/stripe";
import type { Outcome, ToolCall } from "@idem/agents";
import { aiStatusTool, aiTool } from "@idem/agents/ai";

const dir = mkdtempSync(join(tmpdir(), "idem-ai-sdk-"));
const sandbox = new StripeSandbox();
const server = await sandbox.start();
const ledger = await openLedger(`sqlite:${dir}/idem.db`);
const stripe = stripeActions({ apiKey: server.apiKey, host: "127.0.0.1", port: server.port, protocol: "http" });

// ---- the guarded tool: this is all an application writes ----
// The run context is the application's, set per run; the tenant is read from it, never from
// what the model writes. The key is the ready definition's: ["charge", invoiceId].
type Ctx = { tenantId: string };
const tenant = (call: ToolCall<Ctx>) => call.context.tenantId;
const tools = {
  charge_invoice: aiTool(ledger, stripeTools(stripe).charge, { tenant }),
  operation_status: aiStatusTool(ledger, { tenant }), // for an answer "pending verification"
};

// ---- a scripted model: one tool call per step, then a final text ----
const invoice = { invoiceId: "inv-1001", amount: 4200, currency: "eur" };
const script = [invoice, invoice, { ...invoice, amount: 5000 }];
const usage = {
  inputTokens: { total: 1, noCache: 1, cacheRead: 0, cacheWrite: 0 },
  outputTokens: { total: 1, text: 1, reasoning: 0 },
};
let step = 0;
const model = new MockLanguageModelV3({
  doGenerate: async () => {
    const input = script[step++];
    if (!input)
      return {
        content: [{ type: "text", text: "All done." }],
        finishReason: { unified: "stop", raw: "stop" },
        usage,
        warnings: [],
      };
    // A fresh tool-call id each time, as a real model's retry has: it is not the work's identity.
    const call = {
      type: "tool-call" as const,
      toolCallId: `call_${step}_${Date.now()}`,
      toolName: "charge_invoice",
      input: JSON.stringify(input),
    };
    return { content: [call], finishReason: { unified: "tool-calls", raw: "tool_calls" }, usage, warnings: [] };
  },
});

let ok = false;
try {
  const result = await generateText({
    model,
    tools,
    experimental_context: { tenantId: "acme" } satisfies Ctx,
    stopWhen: stepCountIs(10),
    prompt: "Charge invoice inv-1001.",
  });
  const read = result.steps.flatMap((s) =>
    s.toolResults.map((r) => ({ input: r.input, outcome: r.output as Outcome })),
  );
  for (const { input, outcome } of read)
    console.log(`  charge ${JSON.stringify(input)}\n    the model read: ${outcome.message}`);
  const payments = sandbox.count("payment_intents");
  console.log(`  PaymentIntents at Stripe: ${payments}`);
  ok = payments === 1 && read.map((r) => r.outcome.status).join() === "done,already_done,refused";
} finally {
  await ledger.close();
  await sandbox.close();
  rmSync(dir, { recursive: true, force: true });
}
if (!ok) {
  console.error("ai-sdk: expected one PaymentIntent, and done, already done, refused");
  process.exit(1);
}
