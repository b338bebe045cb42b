/**
 * A process that imports the MCP adapter from the path given (argv[2]: a copy of its sources
 * beside an SDK that no longer exports what the adapter used to import), prints `imported`, then
 * registers a zod 4 tool and a zod 3 tool on a real `McpServer` with a real SQLite ledger, lists
 * the tools with the SDK's client, and prints `listed <names>` and `zod3 <json of the error>`.
 */
import { pathToFileURL } from "node:url";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { InMemoryTransport } from "@modelcontextprotocol/sdk/inMemory.js";
import { McpServer } from "@modelcontextprotocol/sdk/server/mcp.js";
import { z } from "zod";
import { z as z3 } from "zod/v3";
import { defineAction, openLedger } from "@idem/core";
import type * as Adapter from "../../src/mcp.js";

const mcp = (await import(pathToFileURL(process.argv[2]!).href)) as typeof Adapter;
console.log("imported");

const ledger = await openLedger("sqlite::memory:");
const action = defineAction<{ invoice: string }, { ok: true }>({
  type: "test.pay",
  capabilities: {},
  execute: async () => ({ ok: true }),
});
const common = { description: "Pay an invoice.", action, key: (i: { invoice: string }) => ["pay", i.invoice] };
const server = new McpServer({ name: "billing", version: "1.0.0" });
mcp.registerGuardedTool(
  server,
  ledger,
  { ...common, name: "pay_z4", input: z.object({ invoice: z.string() }) },
  {
    tenant: "t",
  },
);
try {
  const input = z3.object({ invoice: z3.string() }) as never; // a Standard Schema too (zod 3.25 and later)
  mcp.registerGuardedTool(server, ledger, { ...common, name: "pay_z3", input }, { tenant: "t" });
  console.log("zod3 registered");
} catch (e) {
  const err = e as Error & { sdkVersion?: string; module?: string; tool?: string; cause?: { code?: string } };
  console.log(
    `zod3 ${JSON.stringify({ name: err.name, tool: err.tool, module: err.module, sdkVersion: err.sdkVersion, message: err.message, cause: err.cause?.code })}`,
  );
}
const [clientSide, serverSide] = InMemoryTransport.createLinkedPair();
const client = new Client({ name: "idem-test", version: "1.0.0" });
await server.connect(serverSide);
await client.connect(clientSide);
const { tools } = await client.listTools();
console.log(`listed ${JSON.stringify(tools.map((t) => [t.name, t.inputSchema.properties]))}`);
await client.close();
await server.close();
await ledger.close();
