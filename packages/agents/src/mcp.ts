/**
 * MCP (`@modelcontextprotocol/sdk` 1.x): guarded actions as tools of an `McpServer`. The SDK lists
 * the JSON Schema of the input the model fills in (zod 4's, zod 3's, or a Standard JSON Schema
 * library's: valibot, arktype), but checks nothing: guard applies the schema, once, so input it
 * refuses reads as guard's "Refused: invalid input: …" outcome, not the SDK's protocol error (the
 * status tool reads its own input in the same way). A schema that cannot be listed as JSON Schema
 * is refused when the tool is registered. The run context comes from the request
 * (`context(extra)`: its authInfo, a header), never from the model's arguments; MCP's request id
 * is per connection and never part of a key.
 *
 * Every outcome is a result, not a protocol error: `structuredContent` is the `Outcome`, and
 * `content` says it in words, then holds the same `Outcome` as JSON text (as the MCP spec asks of
 * a tool with structured content): a host hands its model the `content`, and the tool's summary
 * of the receipt (a payment's status, an id for later) is part of what the model must read.
 * `isError` is set when nothing was done (failed, refused), not for a pending verification, which
 * a client must not retry, nor for an unconfirmed one (whether the work was done is not known: a
 * call stopped, or one refused before the ledger was read, the tool not set up right).
 *
 * A zod 3 schema is listed by the SDK's own converter, which the SDK does not export by a
 * documented path (only through its catch-all `./*`): it is loaded when the first zod 3 schema is
 * registered, never at import, so a later SDK that moves it breaks that registration with an
 * `McpSdkVersionError` (use zod 4, or a supported SDK), not the import of this module.
 */
import { readFileSync } from "node:fs";
import { createRequire } from "node:module";
import { join } from "node:path";
import type { McpServer } from "@modelcontextprotocol/sdk/server/mcp.js";
import type { CallToolResult } from "@modelcontextprotocol/sdk/types.js";
import type { z } from "zod";
import type { Action, Ledger } from "@idem/core";
import { guard, type GuardOptions, type ToolCall } from "./guard.js";
import { nothingDone, type Outcome } from "./outcome.js";
import { STATUS_TOOL, listedStatusInput, statusTool, type StatusInput, type StatusToolOptions } from "./status.js";
import { definitionOf, inputJsonSchema, inputSchemaOf, isZod, listedOnly, type ToolDefinition } from "./tool.js";

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

/** An outcome as an MCP tool result: its message, then the whole outcome (as JSON text and as `structuredContent`). */
export function toCallToolResult(outcome: Outcome): CallToolResult {
  return {
    content: [
      { type: "text", text: outcome.message },
      { type: "text", text: JSON.stringify(outcome) },
    ],
    structuredContent: { ...outcome },
    isError: nothingDone(outcome),
  };
}

/**
 * The SDK aborts `extra.signal` when the client cancels the request and when the connection
 * closes (`idem mcp` stopping): the call's `stop`, not its `signal`. The request under way ends
 * and is recorded (aborted, its outcome would be unknown, and without a lookup a person's to
 * decide), and nothing more is sent; the client reads no answer either way.
 */
const callOf = <C>(extra: McpExtra, context?: (extra: McpExtra) => C): ToolCall<C> => {
  let read: { value: C } | undefined;
  return {
    // Read when guard or the status tool first needs it, inside their own error handling: the
    // application's `context` throwing (a request without its authInfo) reads as an outcome, not
    // as the SDK's error result, which shows the model the exception's message.
    get context() {
      read ??= { value: context?.(extra) as C };
      return read.value;
    },
    callId: String(extra.requestId),
    stop: extra.signal,
  };
};

/** The SDK's converter of zod 3 schemas: internal to the SDK, reached through its catch-all export. */
const ZOD3_CONVERTER = "@modelcontextprotocol/sdk/server/zod-json-schema-compat.js";

/**
 * The installed SDK lacks what this adapter uses of it (a module it has moved or removed):
 * `sdkVersion` is the version installed (undefined when it cannot be read), `module` what was
 * looked for, `cause` why it could not be loaded. Thrown when the tool is registered.
 */
export class McpSdkVersionError extends Error {
  constructor(
    readonly tool: string,
    readonly module: string,
    readonly sdkVersion: string | undefined,
    options: { cause: unknown },
  ) {
    super(
      `tool ${tool}: listing a zod 3 schema uses ${module}, which @modelcontextprotocol/sdk ` +
        `${sdkVersion ?? "(version unknown)"} does not provide: give the tool a zod 4 schema (\`import { z } from "zod"\`, ` +
        `zod 4), or install the @modelcontextprotocol/sdk version @idem/agents declares as its peer`,
      options,
    );
    this.name = "McpSdkVersionError";
  }
}

// Resolved from this module, as its static imports are: the SDK instance the application shares
// with @idem/agents (a peer). Synchronous, so that registering a tool stays synchronous.
const requireHere = createRequire(import.meta.url);
let zod3Converter: ((schema: never) => unknown) | undefined;

/** The SDK's zod 3 converter, loaded on first use; `McpSdkVersionError` when the SDK has none there. */
function zod3ConverterFor(tool: string): (schema: never) => unknown {
  if (zod3Converter) return zod3Converter;
  try {
    const loaded = requireHere(ZOD3_CONVERTER) as { toJsonSchemaCompat?: unknown };
    if (typeof loaded.toJsonSchemaCompat !== "function") throw new TypeError("it exports no toJsonSchemaCompat");
    zod3Converter = loaded.toJsonSchemaCompat as (schema: never) => unknown;
    return zod3Converter;
  } catch (cause) {
    throw new McpSdkVersionError(tool, ZOD3_CONVERTER, installedSdkVersion(), { cause });
  }
}

/**
 * The installed SDK's version: from the package.json that resolution reads the SDK's exports from
 * (the first node_modules on the lookup path that holds it). The SDK does not export it.
 */
function installedSdkVersion(): string | undefined {
  for (const dir of requireHere.resolve.paths("@modelcontextprotocol/sdk") ?? []) {
    try {
      const pkg = JSON.parse(readFileSync(join(dir, "@modelcontextprotocol", "sdk", "package.json"), "utf8"));
      return typeof pkg.version === "string" ? pkg.version : undefined;
    } catch {
      // not in this node_modules: look further up, as resolution does
    }
  }
  return undefined;
}

/**
 * What the SDK is given as a tool's input schema: `listedOnly`, as the JSON Schema of the input.
 * Given a zod 3 schema, the SDK checked it itself and answered "MCP error -32602: Input
 * validation error …", no outcome; given another library's, it refused it.
 */
function listedFor(name: string, schema: unknown): z.ZodObject {
  let json = inputJsonSchema(schema);
  if (!json && isZod(schema) && !("_zod" in (schema as object))) {
    // The SDK's own converter lists a zod 3 schema (zod-to-json-schema); zod 4's has `_zod`.
    const convert = zod3ConverterFor(name);
    try {
      json = convert(schema as never) as Record<string, unknown>;
    } catch {
      json = undefined;
    }
  }
  if (!json)
    throw new TypeError(
      `tool ${name}: MCP lists a tool's input to the model as JSON Schema, and this schema cannot be given as one: use zod, or a schema library with Standard JSON Schema`,
    );
  const { $schema: _dialect, ...shape } = json; // the SDK writes its own
  return listedOnly(shape);
}

/** Registers `target` on `server` as a guarded tool. */
export function registerGuardedTool<A, R, I, C = unknown>(
  server: McpServer,
  ledger: Ledger,
  target: Action<A, R, I> | ToolDefinition<I, A, R>,
  options: McpToolOptions<I, R, C>,
): void {
  const def = definitionOf(target);
  // MCP's request id counts per connection: it says nothing in an audit trail. "mcp" unless an
  // actor is given (an `actor: undefined` passed on from the application's settings is none).
  const run = guard(ledger, target, { ...options, actor: options.actor ?? "mcp" });
  const inputSchema = listedFor(options.name ?? def.name, inputSchemaOf(def));
  server.registerTool(
    options.name ?? def.name,
    {
      description: options.description ?? def.description,
      inputSchema,
      // Hints only (clients must not trust them): it acts on the world, and a repeat with the same input adds nothing.
      annotations: { readOnlyHint: false, destructiveHint: false, idempotentHint: true, openWorldHint: true },
    },
    async (args: unknown, extra: McpExtra) => toCallToolResult(await run(args as I, callOf(extra, options.context))),
  );
}

/** Registers the status tool (`operation_status`); give it the tools registered, to summarize what they did. */
export function registerStatusTool<C = unknown>(
  server: McpServer,
  ledger: Ledger,
  options: StatusToolOptions<C> & { context?: (extra: McpExtra) => C },
): void {
  const check = statusTool<C>(ledger, options);
  server.registerTool(
    STATUS_TOOL.name,
    {
      description: STATUS_TOOL.description,
      // Listed, not checked: the status tool reads its input itself and refuses what it cannot read.
      inputSchema: listedFor(STATUS_TOOL.name, listedStatusInput("optional")),
      annotations: { readOnlyHint: true, openWorldHint: false },
    },
    async (args: unknown, extra: McpExtra) =>
      toCallToolResult(await check(args as StatusInput, callOf(extra, options.context))),
  );
}
