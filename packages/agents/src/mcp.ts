/**
 * MCP (`@modelcontextprotocol/sdk` 1.x): guarded actions as tools of an `McpServer`. The input
 * schema must be a zod schema (what the SDK validates with). The run context comes from the
 * request (`context(extra)`: its authInfo, a header), never from the model's arguments; MCP's
 * request id is per connection and never part of a key.
 *
 * Every outcome is a result, not a protocol error: `content` says it in words, `structuredContent`
 * is the `Outcome`; `isError` is set when nothing was done (failed, refused, not performed), not
 * for a pending verification, which a client must not retry, nor for an unconfirmed one.
 */
import type { McpServer } from "@modelcontextprotocol/sdk/server/mcp.js";
import type { CallToolResult } from "@modelcontextprotocol/sdk/types.js";
import { z } from "zod";
import type { Action, Ledger } from "@idem/core";
import { guard, type GuardOptions, type ToolCall } from "./guard.js";
import type { Outcome } from "./outcome.js";
import { MAX_WAIT_MS, STATUS_TOOL, statusTool } from "./status.js";
import { definitionOf, inputSchemaOf, type ToolDefinition } from "./tool.js";

/** What the SDK hands a tool handler besides its arguments (the part we read). */
export interface McpExtra {
  readonly signal: AbortSignal;
  readonly requestId: string | number;
  readonly authInfo?: unknown;
  readonly sessionId?: string;
}

export interface McpToolOptions<I, R, C> extends GuardOptions<I, R, C> {
  /** The run context of a request (for `tenant`, `actor`, `key`). Default: none. */
  readonly context?: (extra: McpExtra) => C;
  /** The tool's name (default: the definition's). */
  readonly name?: string;
  /** What the model reads about the tool (default: the definition's). */
  readonly description?: string;
}

export function toCallToolResult(outcome: Outcome): CallToolResult {
  const nothingDone = outcome.status === "failed" || outcome.status === "refused" || outcome.status === "not_performed";
  return {
    content: [{ type: "text", text: outcome.message }],
    structuredContent: { ...outcome },
    isError: nothingDone,
  };
}

const callOf = <C>(extra: McpExtra, context?: (extra: McpExtra) => C): ToolCall<C> => ({
  context: context?.(extra) as C,
  callId: String(extra.requestId),
  signal: extra.signal,
  inputParsed: true, // by the tool's inputSchema
});

/** Registers `target` on `server` as a guarded tool. */
export function registerGuardedTool<A, R, I, C = unknown>(
  server: McpServer,
  ledger: Ledger,
  target: Action<A, R, I> | ToolDefinition<I, A, R>,
  options: McpToolOptions<I, R, C>,
): void {
  const def = definitionOf(target);
  // MCP's request id counts per connection: no actor at all says more in an audit trail.
  const run = guard(ledger, target, { actor: "mcp", ...options });
  server.registerTool(
    options.name ?? def.name,
    {
      description: options.description ?? def.description,
      inputSchema: inputSchemaOf(def) as unknown as z.ZodObject,
      // Hints only (clients must not trust them): it acts on the world, and a repeat with the same input adds nothing.
      annotations: { readOnlyHint: false, destructiveHint: false, idempotentHint: true, openWorldHint: true },
    },
    async (args: unknown, extra: McpExtra) => toCallToolResult(await run(args as I, callOf(extra, options.context))),
  );
}

/** Registers the status tool (`operation_status`). */
export function registerStatusTool<C = unknown>(
  server: McpServer,
  ledger: Ledger,
  options: Parameters<typeof statusTool<C>>[1] & { context?: (extra: McpExtra) => C },
): void {
  const check = statusTool<C>(ledger, options);
  server.registerTool(
    STATUS_TOOL.name,
    {
      description: STATUS_TOOL.description,
      inputSchema: z.object({ operationId: z.string(), waitMs: z.number().int().min(0).max(MAX_WAIT_MS).optional() }),
      annotations: { readOnlyHint: true, openWorldHint: false },
    },
    async (args, extra) => toCallToolResult(await check(args, callOf(extra as McpExtra, options.context))),
  );
}
