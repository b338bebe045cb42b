/**
 * A guarded Stripe charge as an OpenAI Agents SDK function tool, run by the SDK's own runner. A
 * scripted model (no network, no API key) charges an invoice, calls the same tool again with the
 * same input, then with another amount. The Stripe sandbox counts the PaymentIntents: one.
 *
 *   node --conditions=idem-source --import tsx agents/openai-agents.ts   (from examples/)
 */
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Agent, Usage, run, setTracingDisabled, type Model, type ModelResponse } from "@openai/agents";
import { openLedger } from "@idem/core";
import { StripeSandbox } from "@idem/sandbox";
import { stripeActions, stripeTools } from "@idem/stripe";
import type { Outcome, ToolCall } from "@idem/agents";
import { openaiStatusTool, openaiTool } from "@idem/agents/openai";

setTracingDisabled(true); // the SDK would otherwise export traces to OpenAI: nothing leaves the machine

const dir = mkdtempSync(join(tmpdir(), "idem-openai-agents-"));
const sandbox = new StripeSandbox();
const server = await sandbox.start();
const ledger = await openLedger(`sqlite:${dir}/idem.db`);
const stripe = stripeActions({ apiKey: server.apiKey, host: "127.0.0.1", port: server.port, protocol: "http" });

// ---- the guarded tool: this is all an application writes ----
// The tenant comes from run()'s context (never sent to the model); the key is the ready
// definition's, ["charge", invoiceId], never the SDK's callId, which changes on each retry.
type Ctx = { tenantId: string };
const tenant = (call: ToolCall<Ctx>) => call.context.tenantId;
const tools = [
  openaiTool(ledger, stripeTools(stripe).charge, { tenant }), // named charge_invoice
  openaiStatusTool(ledger, { tenant }), // operation_status, for an answer "pending verification"
];

// ---- a scripted model: one function call per turn, then a final message ----
// Strict mode asks a model for every field, so the optional customer comes as null.
const invoice = { invoiceId: "inv-2001", amount: 4200, currency: "eur", customer: null };
const script = [invoice, invoice, { ...invoice, amount: 5000 }];
let turn = 0;
const model: Model = {
  async getResponse(): Promise<ModelResponse> {
    const input = script[turn++];
    const usage = new Usage({ requests: 1, inputTokens: 1, outputTokens: 1, totalTokens: 2 });
    if (!input)
      return {
        usage,
        output: [
          {
            type: "message",
            role: "assistant",
            status: "completed",
            content: [{ type: "output_text", text: "All done." }],
          },
        ],
      };
    return {
      usage,
      output: [
        {
          type: "function_call",
          callId: `call_${turn}_${Date.now()}`,
          name: "charge_invoice",
          arguments: JSON.stringify(input),
          status: "completed",
        },
      ],
    };
  },
  getStreamedResponse() {
    throw new Error("this example does not stream");
  },
};

let ok = false;
try {
  const agent = new Agent<Ctx>({ name: "billing", instructions: "Charge the invoices you are given.", model, tools });
  const result = await run(agent, "Charge invoice inv-2001.", { context: { tenantId: "acme" }, maxTurns: 10 });
  const read = result.newItems.flatMap((item) => {
    if (item.type !== "tool_call_output_item") return [];
    const output = item.output; // the Outcome, as the tool returned it (the SDK sends it as JSON)
    return [(typeof output === "string" ? JSON.parse(output) : output) as Outcome];
  });
  for (const [i, outcome] of read.entries())
    console.log(`  charge ${JSON.stringify(script[i])}\n    the model read: ${outcome.message}`);
  const payments = sandbox.count("payment_intents");
  console.log(`  PaymentIntents at Stripe: ${payments}`);
  ok = payments === 1 && read.map((o) => o.status).join() === "done,already_done,refused";
} finally {
  await ledger.close();
  await sandbox.close();
  rmSync(dir, { recursive: true, force: true });
}
if (!ok) {
  console.error("openai-agents: expected one PaymentIntent, and done, already done, refused");
  process.exit(1);
}
