/**
 * OpenAI Agents SDK (`@openai/agents` 0.14, the last line for Node 20): guarded function tools.
 * The run context is `run(agent, input, { context })`'s; `toolCall.callId` is kept for the audit
 * trail only. The input schema must be a zod object; in the SDK's strict mode optional fields
 * are written `.nullable()`. The SDK checks the input with it, except for one that transforms
 * (euros to cents), which it cannot describe: it gets the JSON Schema of the input the model
 * fills in, and guard applies the schema. Either way it is applied once.
 *
 * `errorFunction` replaces the SDK's default ("An error occurred … Please try again."), which
 * invites a model to repeat an effect: a guarded tool never throws, so it is reached only when
 * the SDK could not run the tool at all (bad arguments), and says that nothing was done.
 */
import { UserError, tool, type RunContext } from "@openai/agents";
import { z } from "zod";
import type { Action, Ledger } from "@idem/core";
import { guard, type GuardOptions, type ToolCall } from "./guard.js";
import { MAX_WAIT_MS, STATUS_TOOL, statusTool, type StatusToolOptions } from "./status.js";
import { definitionOf, inputSchemaOf, type ToolDefinition } from "./tool.js";

type Details = { toolCall?: { callId?: string }; signal?: AbortSignal } | undefined;
const callOf = <C>(runContext: RunContext<unknown> | undefined, details: Details, inputParsed = true): ToolCall<C> => ({
  context: runContext?.context as C,
  callId: details?.toolCall?.callId,
  signal: details?.signal,
  inputParsed, // by the tool's parameters, when they are the zod schema
});

/** What the model reads when the SDK could not run the tool (its arguments did not parse). */
export function idemErrorFunction(_context: RunContext<unknown>, error: unknown): string {
  const why = error instanceof Error ? error.message.split("\n")[0] : "the tool could not run";
  return JSON.stringify({
    status: "not_performed",
    message: `Not performed: ${why}. Nothing was done; fix the input before calling again.`,
  });
}

/** An OpenAI Agents function tool that performs `target` once per business identity. */
export function openaiTool<A, R, I, C = unknown>(
  ledger: Ledger,
  target: Action<A, R, I> | ToolDefinition<I, A, R>,
  options: GuardOptions<I, R, C> & { name?: string; description?: string },
) {
  const def = definitionOf(target);
  const run = guard(ledger, target, options);
  const schema = inputSchemaOf(def);
  const build = (parameters: unknown, inputParsed: boolean) =>
    tool({
      name: options.name ?? def.name,
      description: options.description ?? def.description,
      parameters: parameters as z.ZodObject,
      execute: (input: unknown, runContext?: RunContext<unknown>, details?: Details) =>
        run(input as I, callOf<C>(runContext, details, inputParsed)),
      errorFunction: idemErrorFunction,
    });
  try {
    return build(schema, true);
  } catch (error) {
    // The SDK describes a zod schema by its output, so it refuses one that transforms ("Transforms
    // cannot be represented in JSON Schema"): the model fills in its input, and guard parses it.
    if (!(error instanceof UserError)) throw error;
    let input: unknown;
    try {
      input = z.toJSONSchema(schema as unknown as z.ZodType, { io: "input", target: "draft-7" });
    } catch {
      throw error;
    }
    return build(input, false);
  }
}

/** The status tool (`operation_status`) for the OpenAI Agents SDK. */
export function openaiStatusTool<C = unknown>(ledger: Ledger, options: StatusToolOptions<C>) {
  const check = statusTool<C>(ledger, options);
  return tool({
    name: STATUS_TOOL.name,
    description: STATUS_TOOL.description,
    parameters: z.object({ operationId: z.string(), waitMs: z.number().int().min(0).max(MAX_WAIT_MS).nullable() }),
    execute: (input, runContext, details) => check(input, callOf<C>(runContext, details as Details)),
    errorFunction: idemErrorFunction,
  });
}
