/**
 * `idem mcp`: the config's tools as an MCP server over stdio, each guarded (once per business
 * identity, a truthful outcome for the model), plus the status tool. stdout is the protocol
 * channel: nothing else may be written there.
 */
import { hostname } from "node:os";
import type { ToolDefinition } from "@idem/agents";
import type { Ledger } from "@idem/core";
import { ConfigError, importOptional, toolsOf, type IdemConfig } from "./config.js";

/** Serves until the client goes away or `stop` aborts (the command's stop signals, stop-signals.ts). */
export async function serveMcp(ledger: Ledger, config: IdemConfig, tenant: string, stop: AbortSignal): Promise<void> {
  const sdk = "@modelcontextprotocol/sdk";
  const { McpServer } = await importOptional(sdk, "idem mcp", () => import("@modelcontextprotocol/sdk/server/mcp.js"));
  const { StdioServerTransport } = await importOptional(
    sdk,
    "idem mcp",
    () => import("@modelcontextprotocol/sdk/server/stdio.js"),
  );
  const { registerGuardedTool, registerStatusTool } = await importOptional(
    "@idem/agents",
    "idem mcp",
    () => import("@idem/agents/mcp"),
  );
  const tools = await toolsOf(config);
  if (tools.length === 0)
    throw new ConfigError(
      `config ${config.source} has no tools to serve (tools: [...], or a provider with ready tools)`,
    );
  const server = new McpServer({ name: "idem", version: "0.1.0" });
  const actor = `idem-mcp@${hostname()}`;
  // The config checked each tool's shape (ConfigTool); they are @idem/agents definitions.
  const definitions = tools as ToolDefinition<any, any, any>[];
  for (const tool of definitions)
    registerGuardedTool(server, ledger, tool, {
      tenant,
      actor,
      ...(config.mcp.waitMs !== undefined && { waitMs: config.mcp.waitMs }),
      ...(config.mcp.deadlineMs !== undefined && { deadlineMs: config.mcp.deadlineMs }),
    });
  // A settled operation reads as its tool would have said it (a payment waiting for the customer).
  registerStatusTool(server, ledger, { tenant, tools: definitions });
  const closed = new Promise<void>((resolve) => (server.server.onclose = resolve));
  await server.connect(new StdioServerTransport());
  const end = () => void server.close();
  process.stdin.once("end", end); // the client went away
  // Or stopped reading (its end of our output closed): a write meets EPIPE. Without a listener that
  // is an unhandled 'error' that ends the process mid-call; it is a client gone, as above.
  process.stdout.on("error", end);
  // Stopped by its supervisor: no new call; the caller (idem's withLedger) then closes the
  // ledger, which lets the calls in flight record their effects (Node's default ends mid-call),
  // within mcp.stopTimeoutMs of the stop, naming those it could not wait out (cli.ts).
  if (stop.aborted) end();
  stop.addEventListener("abort", end, { once: true });
  try {
    await closed;
  } finally {
    stop.removeEventListener("abort", end);
  }
}
