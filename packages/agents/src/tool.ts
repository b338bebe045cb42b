/**
 * A ready tool: the action, the input the model fills in, the suggested business identity and
 * what the model should read of a receipt. Provider packages ship these (a Stripe charge, an
 * email, a CRM record), so that a guarded tool is a few lines in any framework.
 */
import type { StandardJSONSchemaV1, StandardSchemaV1 } from "@standard-schema/spec";
import { z } from "zod";
import type { Action, KeyPart } from "@idem/core";

export interface ToolDefinition<I, A, R> {
  /** The tool's name as the model sees it (letters, digits, _ and -). */
  readonly name: string;
  /** What it does and when to call it, for the model. */
  readonly description: string;
  readonly action: Action<A, R, any>;
  /** The model's input (a Standard Schema: zod, valibot, arktype); without it, the action's `input` schema. */
  readonly input?: StandardSchemaV1<unknown, I>;
  /** Maps the checked input to the action's args (default: the input is the args). */
  readonly args?: (input: I) => A;
  /** The suggested business identity of the work, from the checked input. */
  readonly key?: (input: I) => readonly KeyPart[];
  /** What the model reads of a receipt: ids it may need later, never the provider's raw answer. */
  readonly summarize?: (receipt: R) => unknown;
  /**
   * Whether a receipt shows the provider found the effect already done before this operation
   * began (an upsert that found the record, a copy of the email already in Sent): the model then
   * reads "already done earlier", not "done". `attempt` is the operation's attempt that settled
   * it: on attempt 1 nothing of this operation had reached the provider before; on a later one a
   * found effect is most likely this operation's own earlier attempt, and must not read as
   * another's. Default: never (a fresh operation reads "done").
   */
  readonly foundEarlier?: (receipt: R, settled: { readonly attempt: number }) => boolean;
}

/** Declares a tool definition (types only: checked when it is used). */
export function defineTool<I, A, R>(definition: ToolDefinition<I, A, R>): ToolDefinition<I, A, R> {
  return definition;
}

/** A bare action as a tool definition: its type as the name (dots made underscores), its input schema. */
export function definitionOf<I, A, R>(target: Action<A, R, I> | ToolDefinition<I, A, R>): ToolDefinition<I, A, R> {
  if ("action" in target) return target;
  return { name: target.type.replace(/[^A-Za-z0-9_-]/g, "_"), description: target.type, action: target };
}

/** The schema the model fills in: the definition's, else the action's. */
export function inputSchemaOf<I, A, R>(def: ToolDefinition<I, A, R>): StandardSchemaV1<unknown, unknown> {
  const schema = def.input ?? def.action.input;
  if (!schema)
    throw new TypeError(`tool ${def.name}: an input schema is needed (the action's \`input\` or the definition's)`);
  return schema as StandardSchemaV1<unknown, unknown>;
}

/**
 * The JSON Schema of `schema`'s input, as zod 4 writes it (a field with a default is optional:
 * the model may leave it out), else as the schema describes itself (Standard JSON Schema: valibot,
 * arktype), without its `$schema` (a framework writes its own). Undefined for a schema that
 * describes itself in neither way (a zod 3 one, a hand-written Standard Schema).
 */
export function inputJsonSchema(schema: unknown): Record<string, unknown> | undefined {
  const described = () => {
    try {
      return z.toJSONSchema(schema as z.ZodType, { io: "input", target: "draft-7" });
    } catch {
      const own = (schema as Partial<StandardJSONSchemaV1>)["~standard"]?.jsonSchema;
      return own?.input({ target: "draft-07" });
    }
  };
  let listed: unknown;
  try {
    listed = described();
  } catch {
    return undefined;
  }
  if (typeof listed !== "object" || listed === null) return undefined;
  const { $schema: _dialect, ...shape } = listed as Record<string, unknown>;
  return shape;
}

/** Whether `schema` is zod's (3 or 4): the frameworks list and check zod schemas themselves. */
export const isZod = (schema: unknown): boolean =>
  (schema as Partial<StandardSchemaV1> | undefined)?.["~standard"]?.vendor === "zod";

/**
 * What a framework that checks a zod object schema itself (MCP) is given as a tool's input
 * schema: an object schema that accepts any arguments (a refusal would be the framework's error,
 * not guard's outcome), listed as `json`, the JSON Schema of the tool's input (the framework lists
 * a schema's metadata with it).
 */
export function listedOnly(json: Record<string, unknown>): z.ZodObject {
  return z.looseObject({}).meta(json) as unknown as z.ZodObject;
}
