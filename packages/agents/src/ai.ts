/**
 * Vercel AI SDK (v6; `ai` >= 6 < 8): guarded tools for `generateText`/`streamText`. The run
 * context is the call's `experimental_context`; the tool-call id is kept for the audit trail only.
 *
 * The SDK is shown the JSON Schema of the input the model fills in, and checks nothing: guard
 * applies the schema, once, so input it refuses reads as guard's "Refused: invalid input: …", a
 * value, not the SDK's validation error (a tool-error part full of the schema's internals). The
 * status tool reads its own input in the same way.
 *
 *   const charge = aiTool(ledger, stripeTools(stripe).charge, { tenant: (c) => c.context.tenantId });
 *   await generateText({ model, tools: { charge, operation_status: aiStatusTool(ledger, { tenant, tools: [stripeTools(stripe).charge] }) }, experimental_context: { tenantId } });
 */
import { asSchema, jsonSchema, tool, type Tool, type ToolExecutionOptions } from "ai";
import type { Action, Ledger } from "@idem/core";
import { guard, type GuardOptions, type ToolCall } from "./guard.js";
import type { Outcome } from "./outcome.js";
import { STATUS_TOOL, listedStatusInput, statusTool, type StatusInput, type StatusToolOptions } from "./status.js";
import { definitionOf, inputSchemaOf, type ToolDefinition } from "./tool.js";

/**
 * v6 passes the run context as `experimental_context`; v7 renamed it `context`. The SDK aborts
 * `abortSignal` when the run is aborted or times out: the call's `stop`, not its `signal`. An
 * abort cannot take back a request the provider already has; cutting it only leaves its outcome
 * unknown. So the request under way ends and is recorded, nothing more is sent, and the tool
 * answers once it has ended (the SDK waits for it).
 */
const callOf = <C>(o: ToolExecutionOptions): ToolCall<C> => ({
  context: (o.experimental_context ?? (o as { context?: unknown }).context) as C,
  callId: o.toolCallId,
  stop: o.abortSignal,
});

/**
 * The JSON Schema the SDK would have shown for `schema`, without its check (no `validate`). One
 * that cannot be listed (a Standard Schema without Standard JSON Schema) is refused when the tool
 * is made, not by the SDK when a run starts.
 */
function listedOnly(name: string, schema: unknown) {
  const described = asSchema(schema as never);
  try {
    void described.jsonSchema;
  } catch (error) {
    throw new TypeError(
      `tool ${name}: the AI SDK lists a tool's input to the model as JSON Schema, and this schema cannot be given as one: use zod, or a schema library with Standard JSON Schema`,
      { cause: error },
    );
  }
  return jsonSchema(() => described.jsonSchema) as never;
}

/** An AI SDK tool that performs `target` once per business identity and answers with an `Outcome`. */
export function aiTool<A, R, I, C = unknown>(
  ledger: Ledger,
  target: Action<A, R, I> | ToolDefinition<I, A, R>,
  options: GuardOptions<I, R, C> & { description?: string },
): Tool<I, Outcome> {
  const def = definitionOf(target);
  const run = guard(ledger, target, options);
  return tool({
    description: options.description ?? def.description,
    inputSchema: listedOnly(def.name, inputSchemaOf(def)),
    execute: (input: I, o: ToolExecutionOptions) => run(input, callOf<C>(o)),
  }) as Tool<I, Outcome>;
}

/** The status tool for the AI SDK: `operation_status({ operationId, waitMs? })`. */
export function aiStatusTool<C = unknown>(ledger: Ledger, options: StatusToolOptions<C>): Tool<StatusInput, Outcome> {
  const check = statusTool<C>(ledger, options);
  return tool({
    description: STATUS_TOOL.description,
    inputSchema: listedOnly(STATUS_TOOL.name, listedStatusInput("optional")),
    execute: (input: StatusInput, o: ToolExecutionOptions) => check(input, callOf<C>(o)),
  }) as Tool<StatusInput, Outcome>;
}
