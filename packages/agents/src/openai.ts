/**
 * OpenAI Agents SDK (`@openai/agents` 0.14, the last line for Node 20): guarded function tools.
 * The run context is `run(agent, input, { context })`'s; `toolCall.callId` is kept for the audit
 * trail only. The input schema is an object's: zod's (3 or 4), or a Standard JSON Schema library's
 * (valibot, arktype). The model is shown what the SDK itself makes of a zod one in strict mode
 * (every field required, an optional one nullable), or, for a schema that transforms (euros to
 * cents), which the SDK cannot describe, or another library's, the JSON Schema of its input. The
 * SDK checks nothing: it parses the JSON and reads a null sent for an optional field as no value,
 * and guard applies the schema, once, so input it refuses reads as guard's "Refused: invalid
 * input: …", as in the AI SDK and MCP adapters.
 *
 * `errorFunction` replaces the SDK's default ("An error occurred … Please try again."), which
 * invites a model to repeat an effect: a guarded tool never throws and the SDK applies no schema,
 * so it is reached only when arguments did not parse outside a run (in a run, the runner answers
 * arguments that are not JSON itself, before the tool: "Please try again with valid JSON"), and
 * refuses the input, saying that nothing was done; the status tool's, that nothing was checked.
 */
import { tool, type RunContext } from "@openai/agents";
import type { z } from "zod";
import type { Action, Ledger } from "@idem/core";
import { guard, type GuardOptions, type ToolCall } from "./guard.js";
import { refusedInput, type Outcome } from "./outcome.js";
import {
  STATUS_TOOL,
  listedStatusInput,
  refusedStatusInput,
  statusTool,
  type StatusInput,
  type StatusToolOptions,
} from "./status.js";
import { definitionOf, inputJsonSchema, inputSchemaOf, isZod, type ToolDefinition } from "./tool.js";

type Details = { toolCall?: { callId?: string }; signal?: AbortSignal } | undefined;
/**
 * The SDK aborts `details.signal` when the run's `signal` aborts, when a sibling tool of the same
 * turn fails, and at a tool's `timeoutMs`: the call's `stop`, not its `signal`. An abort cannot
 * take back a request the provider already has; cutting it only leaves its outcome unknown. So
 * the request under way ends and is recorded, nothing more is sent, and the tool answers once it
 * has ended (the SDK waits for a turn's tools; past a tool's `timeoutMs` it answers without it).
 */
const callOf = <C>(runContext: RunContext<unknown> | undefined, details: Details): ToolCall<C> => ({
  context: runContext?.context as C,
  callId: details?.toolCall?.callId,
  stop: details?.signal,
});

/**
 * What the model reads when the SDK could not run the tool (its arguments did not parse): its
 * input refused, nothing done, as guard says of input its schema refuses.
 */
export function idemErrorFunction(_context: RunContext<unknown>, error: unknown): string {
  const why = error instanceof Error ? error.message.split("\n")[0] : undefined;
  return JSON.stringify(refusedInput(`the arguments could not be read${why ? ` (${why})` : ""}`));
}

/** An OpenAI Agents function tool that performs `target` once per business identity. */
export function openaiTool<A, R, I, C = unknown>(
  ledger: Ledger,
  target: Action<A, R, I> | ToolDefinition<I, A, R>,
  options: GuardOptions<I, R, C> & { name?: string; description?: string },
) {
  const def = definitionOf(target);
  const run = guard(ledger, target, options);
  return uncheckedTool(
    inputSchemaOf(def),
    { name: options.name ?? def.name, description: options.description ?? def.description },
    (input: unknown, call: ToolCall<C>) => run(input as I, call),
  );
}

/**
 * A function tool whose input the SDK does not check: `run` applies `schema` itself (once) and
 * answers input it refuses with an outcome. The SDK is given the JSON Schema of the schema's
 * input, so it only parses the JSON and, in strict mode, reads a null the model sent for an
 * optional field as no value (as it does before checking a zod schema). The model is shown what
 * the SDK makes of a zod schema itself (zod 3's too), as when it checked it; another library's is
 * shown as it describes itself (Standard JSON Schema). Given a zod 3 schema, the SDK checked it
 * and the model read "the arguments could not be read", not what was wrong; given another
 * library's, it failed to copy it. A schema that cannot be listed is refused when the tool is made.
 */
function uncheckedTool<C>(
  schema: unknown,
  about: { name: string; description: string },
  run: (input: unknown, call: ToolCall<C>) => Promise<Outcome>,
  errorFunction = idemErrorFunction,
) {
  const build = (parameters: unknown) =>
    tool({
      ...about,
      parameters: parameters as z.ZodObject,
      execute: (input: unknown, runContext?: RunContext<unknown>, details?: Details) =>
        run(input, callOf<C>(runContext, details)),
      errorFunction,
    });
  let own: unknown;
  try {
    // The SDK describes a zod schema by its output, so it refuses one that transforms ("Transforms
    // cannot be represented in JSON Schema"): the model is then shown the input's JSON Schema.
    own = isZod(schema) ? build(schema).parameters : undefined;
  } catch {
    own = undefined;
  }
  const listed = inputJsonSchema(schema) ?? own;
  if (!listed)
    throw new TypeError(
      `tool ${about.name}: the OpenAI Agents SDK lists a tool's input to the model as JSON Schema, and this schema cannot be given as one: use zod, or a schema library with Standard JSON Schema`,
    );
  const unchecked = build(listed);
  return own ? { ...unchecked, parameters: own as typeof unchecked.parameters } : unchecked;
}

/** What the model reads when the SDK could not run the status tool (its arguments did not parse): nothing was checked. */
function statusErrorFunction(_context: RunContext<unknown>, error: unknown): string {
  const why = error instanceof Error ? error.message.split("\n")[0] : undefined;
  return JSON.stringify(refusedStatusInput(`the arguments could not be read${why ? ` (${why})` : ""}`));
}

/** The status tool (`operation_status`) for the OpenAI Agents SDK. */
export function openaiStatusTool<C = unknown>(ledger: Ledger, options: StatusToolOptions<C>) {
  const check = statusTool<C>(ledger, options);
  return uncheckedTool(
    listedStatusInput("nullable"),
    { name: STATUS_TOOL.name, description: STATUS_TOOL.description },
    (input: unknown, call: ToolCall<C>) => check(input as StatusInput, call),
    statusErrorFunction,
  );
}
