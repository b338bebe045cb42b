/**
 * A guarded Stripe charge as a LangChain tool, run by a LangGraph agent graph (agent ⇄ the
 * prebuilt ToolNode). A scripted agent node (no network, no API key) charges an invoice, calls the
 * same tool again with the same input, then with another amount. The Stripe sandbox counts the
 * PaymentIntents: one.
 *
 *   pnpm example:agents   (every framework), or from examples/:
 *   node --conditions=idem-source --import tsx agents/langgraph.ts
 */
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { AIMessage, HumanMessage, ToolMessage } from "@langchain/core/messages";
import { END, MessagesAnnotation, START, StateGraph } from "@langchain/langgraph";
import { ToolNode, toolsCondition } from "@langchain/langgraph/prebuilt";
import { openLedger } from "@idem/core";
import { StripeSandbox } from "@idem/sandbox";
import { stripeActions, stripeTools } from "@idem/stripe";
import type { Outcome, ToolCall } from "@idem/agents";
import { langchainStatusTool, langchainTool } from "@idem/agents/langchain";

const dir = mkdtempSync(join(tmpdir(), "idem-langgraph-"));
const sandbox = new StripeSandbox();
const server = await sandbox.start();
const ledger = await openLedger(`sqlite:${dir}/idem.db`);
const stripe = stripeActions({ apiKey: server.apiKey, host: "127.0.0.1", port: server.port, protocol: "http" });

// ---- the guarded tool: this is all an application writes ----
// The tenant comes from LangGraph's run context (invoke's `context`, never sent to the model); the
// key is the ready definition's, ["charge", invoiceId], never the tool-call id, new on each retry.
type Ctx = { tenantId: string };
const tenant = (call: ToolCall<Ctx>) => call.context.tenantId;
const tools = [
  langchainTool(ledger, stripeTools(stripe).charge, { tenant }), // named charge_invoice
  langchainStatusTool(ledger, { tenant }), // operation_status, for an answer "pending verification"
];

// ---- a scripted agent node: one tool call per turn, then a final message ----
const invoice = { invoiceId: "inv-3001", amount: 4200, currency: "eur" };
const script = [invoice, invoice, { ...invoice, amount: 5000 }];
let turn = 0;
const agent = () => {
  const args = script[turn++];
  if (!args) return { messages: [new AIMessage("All done.")] };
  const call = { name: "charge_invoice", args, id: `call_${turn}_${Date.now()}`, type: "tool_call" as const };
  return { messages: [new AIMessage({ content: "", tool_calls: [call] })] };
};
const graph = new StateGraph(MessagesAnnotation)
  .addNode("agent", agent)
  .addNode("tools", new ToolNode(tools))
  .addEdge(START, "agent")
  .addConditionalEdges("agent", toolsCondition, ["tools", END])
  .addEdge("tools", "agent")
  .compile();

let ok = false;
try {
  const input = { messages: [new HumanMessage("Charge invoice inv-3001.")] };
  const { messages } = await graph.invoke(input, { context: { tenantId: "acme" } });
  // What the model read: each ToolMessage's content, the Outcome as JSON.
  const read = messages.filter((m) => m instanceof ToolMessage).map((m) => JSON.parse(String(m.content)) as Outcome);
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
  console.error("langgraph: expected one PaymentIntent, and done, already done, refused");
  process.exit(1);
}
