/**
 * Guarded tools on an `McpServer`, called by the MCP SDK's own client over its in-memory
 * transport: the server checks the arguments against each tool's schema and hands the handler
 * the schema's output, so a schema that transforms is applied once.
 */
import { afterEach, describe, expect, it } from "vitest";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { InMemoryTransport } from "@modelcontextprotocol/sdk/inMemory.js";
import { McpServer } from "@modelcontextprotocol/sdk/server/mcp.js";
import { openLedger, type LedgerOptions } from "@idem/core";
import { DIALECTS, ledgersFor } from "@idem/testkit";
import { registerGuardedTool } from "@idem/agents/mcp";
import { CALLS, expectAppliedOnce, transformingTools } from "./transforming-tools.js";

const connected: { client: Client; server: McpServer }[] = [];
afterEach(async () => {
  for (const { client, server } of connected.splice(0)) {
    await client.close();
    await server.close();
  }
});

/** A client linked in memory to `server`, closed (with the server) after the test. */
async function connect(server: McpServer): Promise<Client> {
  const [clientSide, serverSide] = InMemoryTransport.createLinkedPair();
  const client = new Client({ name: "idem-test", version: "1.0.0" });
  connected.push({ client, server });
  await server.connect(serverSide);
  await client.connect(clientSide);
  return client;
}

for (const dialect of DIALECTS) {
  describe(`MCP tools on ${dialect}`, () => {
    const db = ledgersFor(dialect, openLedger, { defaults: { poolSize: 4 } as LedgerOptions });

    it("a schema that transforms the model's input is applied once: 12.50 euros are 1250 cents, a day one timestamp", async () => {
      // The server parses the arguments with the tool's inputSchema and hands the handler the
      // output; applied again, the euros would be 125,000 cents and a string-to-number schema
      // would refuse the call.
      const ledger = await db.open();
      const { tools, executed } = transformingTools();
      const tenant = `t-mcp-${dialect}-${Math.random().toString(36).slice(2, 7)}`;
      const server = new McpServer({ name: "billing", version: "1.0.0" });
      for (const t of tools) registerGuardedTool(server, ledger, t, { tenant });
      const client = await connect(server);
      // What the model is asked for: each schema's input.
      const asked = Object.fromEntries((await client.listTools()).tools.map((t) => [t.name, t.inputSchema.properties]));
      expect(asked).toEqual({
        charge: { invoice: { type: "string" }, euros: { type: "number" } },
        bill: { invoice: { type: "string" }, euros: { type: "number" } },
        remind: { at: { type: "string" } },
        pay: { invoice: { type: "string" }, amount: expect.objectContaining({ type: "string" }) },
      });

      const results = await Promise.all(
        Object.entries(CALLS).map(([name, args]) => client.callTool({ name, arguments: { ...args } })),
      );
      await expectAppliedOnce(ledger, tenant, executed);
      expect(results.map((r) => [r.isError, (r.structuredContent as { status: string }).status])).toEqual([
        [false, "done"],
        [false, "done"],
        [false, "done"],
        [false, "done"],
      ]);
    });
  });
}
