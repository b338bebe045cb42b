/**
 * A guarded Stripe charge as a tool of an MCP server, called by the MCP SDK's own client (in
 * memory here; `idem mcp` serves the same over stdio). The client plays a model's host: it
 * charges an invoice, calls the same tool again with the same arguments, then with another
 * amount. The Stripe sandbox counts the PaymentIntents: one.
 *
 *   node --conditions=idem-source --import tsx agents/mcp.ts   (from examples/)
 */
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { McpServer } from "@modelcontextprotocol/sdk/server/mcp.js";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { InMemoryTransport } from "@modelcontextprotocol/sdk/inMemory.js";
import { openLedger } from "@idem/core";
import { StripeSandbox } from "@idem/sandbox";
import { stripeActions, stripeTools } from "@idem/stripe";
import type { Outcome } from "@idem/agents";
import { registerGuardedTool, registerStatusTool } from "@idem/agents/mcp";

const dir = mkdtempSync(join(tmpdir(), "idem-mcp-"));
const sandbox = new StripeSandbox();
const server = await sandbox.start();
const ledger = await openLedger(`sqlite:${dir}/idem.db`);
const stripe = stripeActions({ apiKey: server.apiKey, host: "127.0.0.1", port: server.port, protocol: "http" });

// ---- the guarded tool: this is all an application writes ----
// One tenant per server here, as `idem mcp` does. A multi-tenant server reads it from the
// request instead (`context: (extra) => …` from extra.authInfo), never from the arguments.
// The key is the ready definition's, ["charge", invoiceId]; MCP's request id is a per-connection
// counter, so it is neither the key nor a useful actor for the audit trail: name the server.
const mcp = new McpServer({ name: "billing", version: "1.0.0" });
registerGuardedTool(mcp, ledger, stripeTools(stripe).charge, { tenant: "acme", actor: "billing-mcp" }); // charge_invoice
registerStatusTool(mcp, ledger, { tenant: "acme" }); // operation_status, for "pending verification"

// ---- the host: the SDK's client, linked to the server in memory ----
const [clientSide, serverSide] = InMemoryTransport.createLinkedPair();
await mcp.connect(serverSide);
const client = new Client({ name: "example-host", version: "1.0.0" });
await client.connect(clientSide);

const invoice = { invoiceId: "inv-3001", amount: 4200, currency: "eur" };
let ok = false;
try {
  const statuses: string[] = [];
  for (const args of [invoice, invoice, { ...invoice, amount: 5000 }]) {
    const result = await client.callTool({ name: "charge_invoice", arguments: args });
    // The model reads the text: the message, then the Outcome as JSON (also in structuredContent); isError: nothing was done.
    const outcome = result.structuredContent as Outcome;
    const text = (result.content as { type: string; text: string }[])[0]!.text;
    console.log(`  charge ${JSON.stringify(args)}\n    the model read: ${text}${result.isError ? " (isError)" : ""}`);
    statuses.push(outcome.status);
  }
  const payments = sandbox.count("payment_intents");
  console.log(`  PaymentIntents at Stripe: ${payments}`);
  ok = payments === 1 && statuses.join() === "done,already_done,refused";
} finally {
  await client.close(); // closes the linked server side too
  await ledger.close();
  await sandbox.close();
  rmSync(dir, { recursive: true, force: true });
}
if (!ok) {
  console.error("mcp: expected one PaymentIntent, and done, already done, refused");
  process.exit(1);
}
