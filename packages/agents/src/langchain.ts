/**
 * LangChain.js / LangGraph.js (`@langchain/core` 1.x): guarded structured tools, for LangGraph's
 * `ToolNode` (and the agents built on it) and a chat model's `bindTools`. The run context is
 * LangGraph's (`graph.invoke(input, { context })`), or what `context(config)` reads of the call's
 * config (its `configurable`); the tool-call id is kept for the audit trail only.
 *
 * The ToolNode answers a tool that throws with "Error: … Please fix your mistakes.", which invites a
 * model to repeat an effect: a guarded tool never throws. Given the tool's schema, LangChain checks
 * the input first and throws (a zod one), or checks it not at all (another library's: valibot,
 * arktype). It is given a schema that accepts any arguments, listed as the JSON Schema of the input
 * the model fills in; guard applies the tool's schema, once, so input it refuses reads as guard's
 * "Refused: invalid input: …", as in the other adapters (the status tool reads its own input in the
 * same way). A schema that cannot be listed as JSON Schema is refused when the tool is made.
 *
 * Called with a tool call (as the ToolNode calls it), a tool answers a ToolMessage whose content is
 * the `Outcome` as JSON (its `artifact` the `Outcome` itself, for the application, never sent to a
 * model), with the status "error" when nothing was done (failed, refused: MCP's `isError`), not
 * for a pending verification, which must not be retried, nor for an unconfirmed one. Called with
 * bare input, it answers the same JSON text.
 *
 *   const charge = langchainTool(ledger, stripeTools(stripe).charge, { tenant: (c) => c.context.tenantId });
 *   new ToolNode([charge, langchainStatusTool(ledger, { tenant, tools: [stripeTools(stripe).charge] })]);
 */
import { ToolMessage } from "@langchain/core/messages";
import { DynamicStructuredTool, type ToolRunnableConfig } from "@langchain/core/tools";
import { toJsonSchema } from "@langchain/core/utils/json_schema";
import { z } from "zod";
import type { Action, Ledger } from "@idem/core";
import { guard, type GuardOptions, type ToolCall } from "./guard.js";
import { nothingDone, type Outcome } from "./outcome.js";
import { STATUS_TOOL, listedStatusInput, statusTool, type StatusInput, type StatusToolOptions } from "./status.js";
import { definitionOf, inputJsonSchema, inputSchemaOf, type ToolDefinition } from "./tool.js";

/** How a tool reads the application's run context from the call's config (default: LangGraph's `context`). */
export type LangChainContext<C> = (config: ToolRunnableConfig) => C;

export interface LangChainToolOptions<I, R, C> extends GuardOptions<I, R, C> {
  /** The run context of a call (for `tenant`, `actor`, `key`). Default: the config's `context`, LangGraph's run context. */
  readonly context?: LangChainContext<C>;
  /** The tool's name (default: the definition's). */
  readonly name?: string;
  /** What the model reads about the tool (default: the definition's). */
  readonly description?: string;
}

/**
 * LangChain aborts the config's `signal` when the run is aborted or times out: the call's `stop`,
 * not its `signal`. An abort cannot take back a request the provider already has; cutting it only
 * leaves its outcome unknown. So the request under way ends and is recorded, nothing more is sent,
 * and the tool answers once it has ended (the tool is built without LangChain's `tool()`, which
 * rejects at the abort: the ToolNode then answered "Error: … Please fix your mistakes.").
 */
const callOf = <C>(config: ToolRunnableConfig | undefined, context?: LangChainContext<C>) => {
  let read: { value: C } | undefined;
  const call: ToolCall<C> = {
    // Read when guard or the status tool first needs it, inside their own error handling: the
    // application's `context` throwing reads as an outcome, not as the ToolNode's error text.
    get context() {
      read ??= { value: (context ? context(config ?? {}) : config?.context) as C };
      return read.value;
    },
    callId: config?.toolCall?.id,
    stop: config?.signal,
  };
  return call;
};

/** The outcome as LangChain hands it on: a ToolMessage for a tool call, else its JSON text. */
function answer(outcome: Outcome, name: string, config: ToolRunnableConfig | undefined): ToolMessage | string {
  const content = JSON.stringify(outcome);
  const id = config?.toolCall?.id;
  if (id === undefined) return content;
  return new ToolMessage({
    content,
    artifact: outcome,
    tool_call_id: id,
    name,
    status: nothingDone(outcome) ? "error" : "success",
  });
}

/**
 * What LangChain is given as a tool's input schema (see the top): a schema that accepts anything,
 * whose JSON Schema is the input's and nothing more (an object schema's would wrap an input of one
 * of several shapes in an object that allows no field). The input's JSON Schema is zod 4's
 * (`inputJsonSchema`), else LangChain's own (a zod 3 schema, a Standard Schema that describes
 * itself as JSON Schema: valibot, arktype).
 */
function listedFor(name: string, schema: unknown): z.ZodType {
  let json: unknown = inputJsonSchema(schema);
  try {
    json ??= toJsonSchema(schema as Parameters<typeof toJsonSchema>[0]);
  } catch {
    json = undefined;
  }
  // LangChain hands back what it cannot convert as it is: a schema, not its JSON Schema.
  if (typeof json !== "object" || json === null || json === schema || "~standard" in json)
    throw new TypeError(
      `tool ${name}: LangChain lists a tool's input to the model as JSON Schema, and this schema cannot be given as one: use zod, or a schema library with Standard JSON Schema`,
    );
  const { $schema: _dialect, ...shape } = json as Record<string, unknown>; // LangChain writes its own
  return z.any().meta(shape);
}

/** A structured tool that lists `schema` to the model and hands `run` whatever arguments came, to check them itself. */
function uncheckedTool<C>(
  schema: unknown,
  about: { name: string; description: string },
  context: LangChainContext<C> | undefined,
  run: (input: unknown, call: ToolCall<C>) => Promise<Outcome>,
) {
  return new DynamicStructuredTool({
    ...about,
    schema: listedFor(about.name, schema),
    func: async (input: unknown, _runManager: unknown, config?: ToolRunnableConfig) =>
      answer(await run(input, callOf(config, context)), about.name, config),
  });
}

/** A LangChain tool that performs `target` once per business identity and answers with an `Outcome`. */
export function langchainTool<A, R, I, C = unknown>(
  ledger: Ledger,
  target: Action<A, R, I> | ToolDefinition<I, A, R>,
  options: LangChainToolOptions<I, R, C>,
) {
  const def = definitionOf(target);
  const run = guard(ledger, target, options);
  return uncheckedTool(
    inputSchemaOf(def),
    { name: options.name ?? def.name, description: options.description ?? def.description },
    options.context,
    (input, call) => run(input as I, call),
  );
}

/** The status tool (`operation_status`) for LangChain; give it the tools the model calls, to summarize what they did. */
export function langchainStatusTool<C = unknown>(
  ledger: Ledger,
  options: StatusToolOptions<C> & { context?: LangChainContext<C> },
) {
  const check = statusTool<C>(ledger, options);
  return uncheckedTool(
    listedStatusInput("optional"),
    { name: STATUS_TOOL.name, description: STATUS_TOOL.description },
    options.context,
    (input, call) => check(input as StatusInput, call),
  );
}
