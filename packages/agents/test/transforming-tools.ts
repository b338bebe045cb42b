/**
 * Tools whose input schema transforms what the model sends, for the framework tests: the
 * framework checks the input against the schema and hands its output to the tool, so neither
 * guard nor the ledger may apply the schema again. Applied twice, 12.50 euros went out as 125,000
 * cents, a day became "2026-12-24T09:00:00ZT09:00:00Z", and a schema that changes a type (a
 * string of euros to a number of cents) refused every valid call.
 */
import type { StandardSchemaV1 } from "@standard-schema/spec";
import { expect } from "vitest";
import { z as z3 } from "zod/v3";
import { z } from "zod";
import { defineAction, type Ledger } from "@idem/core";
import { defineTool, type ToolDefinition } from "@idem/agents";

/** What the model sends to each tool, once. */
export const CALLS = {
  charge: { invoice: "inv-c", euros: 12.5 },
  bill: { invoice: "inv-b", euros: 12.5 },
  remind: { at: "2026-12-24" },
  pay: { invoice: "inv-p", amount: "12.50" },
} as const;

/** The tools (named as in `CALLS`) and every `execute` call they receive. */
export function transformingTools() {
  const executed: { action: string; args: unknown }[] = [];
  const record = (action: string, args: unknown) => {
    executed.push({ action, args });
    return { ok: true as const };
  };
  // The definition's schema (number to number), mapped to the action's args: guard's path.
  const charge = defineTool({
    name: "charge",
    description: "Charge an invoice in euros.",
    action: defineAction<{ cents: number; invoice: string }, { ok: true }>({
      type: "test.charge",
      capabilities: {},
      execute: async (a) => record("test.charge", a),
    }),
    input: z.object({ invoice: z.string(), euros: z.number().transform((e) => Math.round(e * 100)) }),
    args: (i: { invoice: string; euros: number }) => ({ cents: i.euros, invoice: i.invoice }),
    key: (i: { invoice: string }) => ["charge", i.invoice],
  });
  // The same in place (zod's `overwrite`): a schema the OpenAI Agents SDK can describe, so it checks the input itself.
  const bill = defineTool({
    name: "bill",
    description: "Bill an invoice in euros.",
    action: defineAction<{ cents: number; invoice: string }, { ok: true }>({
      type: "test.bill",
      capabilities: {},
      execute: async (a) => record("test.bill", a),
    }),
    input: z.object({ invoice: z.string(), euros: z.number().overwrite((e) => Math.round(e * 100)) }),
    args: (i: { invoice: string; euros: number }) => ({ cents: i.euros, invoice: i.invoice }),
    key: (i: { invoice: string }) => ["bill", i.invoice],
  });
  // The action's own schema, whose output is its args: the ledger's path. A day becomes a timestamp.
  const remindAction = defineAction<{ at: string }, { ok: true }, { at: string }>({
    type: "test.remind",
    capabilities: {},
    input: z.object({ at: z.string().transform((d) => `${d}T09:00:00Z`) }),
    execute: async (a) => record("test.remind", a),
  });
  const remind = defineTool({
    name: "remind",
    description: "Remind on a day.",
    action: remindAction,
    key: (i: { at: string }) => ["remind", i.at],
  });
  // The action's own schema changing a type: a string of euros becomes a number of cents.
  const payAction = defineAction<
    { invoice: string; amount: number },
    { ok: true },
    { invoice: string; amount: string }
  >({
    type: "test.pay",
    capabilities: {},
    input: z.object({
      invoice: z.string(),
      amount: z
        .string()
        .regex(/^\d+(\.\d{1,2})?$/, "euros, such as 12.50")
        .transform((s) => Math.round(Number(s) * 100)),
    }),
    execute: async (a) => record("test.pay", a),
  });
  const pay = defineTool({
    name: "pay",
    description: "Pay an invoice; the amount in euros, as a string.",
    action: payAction,
    key: (i: { invoice: string }) => ["pay", i.invoice],
  });
  // Each with its own input type: as guarded tools, a list of any.
  const tools: ToolDefinition<any, any, any>[] = [charge, bill, remind, pay];
  return { tools, executed };
}

/** Each tool's effect ran once with its input transformed once, and the ledger holds one succeeded operation per tool. */
export async function expectAppliedOnce(
  ledger: Ledger,
  tenant: string,
  executed: readonly { action: string; args: unknown }[],
): Promise<void> {
  const expected = [
    { action: "test.bill", args: { cents: 1250, invoice: "inv-b" } },
    { action: "test.charge", args: { cents: 1250, invoice: "inv-c" } },
    { action: "test.pay", args: { invoice: "inv-p", amount: 1250 } },
    { action: "test.remind", args: { at: "2026-12-24T09:00:00Z" } },
  ];
  const byAction = (a: { action: string }, b: { action: string }) => a.action.localeCompare(b.action);
  expect([...executed].sort(byAction)).toEqual(expected); // the calls ran in any order
  const operations = await ledger.admin.list({ tenant });
  const recorded = await Promise.all(
    operations.map(async (o) => ({ action: o.action, args: (await ledger.get({ tenant, id: o.id })).args })),
  );
  expect(recorded.sort(byAction)).toEqual(expected);
  expect(operations.map((o) => o.status)).toEqual(expected.map(() => "succeeded"));
}

/**
 * A pay tool whose input schema is not zod 4's: a zod 3 one, or another library's (valibot,
 * arktype: a Standard Schema, listed by its `jsonSchema` when it has one). Both turn "12.50" euros
 * into 1250 cents: applied twice, the cents (a number) are refused.
 */
export function otherSchemaTools() {
  const executed: unknown[] = [];
  const action = defineAction<{ invoice: string; cents: number }, { ok: true }>({
    type: "test.pay-other-schema",
    capabilities: {},
    async execute(args) {
      executed.push(args);
      return { ok: true };
    },
  });
  type Input = { invoice: string; cents: number };
  const listed = {
    type: "object",
    properties: { invoice: { type: "string", pattern: "^\\S+$" }, euros: { type: "string" } },
    required: ["invoice", "euros"],
  };
  const validate = (v: unknown): StandardSchemaV1.Result<Input> => {
    const o = v as { invoice?: unknown; euros?: unknown };
    if (typeof o?.invoice !== "string" || /\s/.test(o.invoice))
      return { issues: [{ message: "must be an invoice id, without spaces", path: ["invoice"] }] };
    if (typeof o.euros !== "string") return { issues: [{ message: "must be a string of euros", path: ["euros"] }] };
    return { value: { invoice: o.invoice, cents: Math.round(Number(o.euros) * 100) } };
  };
  const standard = (jsonSchema: boolean) =>
    ({
      "~standard": {
        version: 1,
        vendor: "other",
        validate,
        ...(jsonSchema && { jsonSchema: { input: () => listed, output: () => listed } }),
      },
    }) as StandardSchemaV1<unknown, Input>;
  const zod3 = z3.object({
    invoice: z3.string().regex(/^\S+$/, "must be an invoice id, without spaces"),
    euros: z3.string().transform((e) => Math.round(Number(e) * 100)),
  }) as unknown as StandardSchemaV1<unknown, { invoice: string; euros: number }>;
  const common = { description: "Pay an invoice.", action, key: (i: { invoice: string }) => ["pay", i.invoice] };
  return {
    executed,
    zod3: {
      ...common,
      name: "pay_z3",
      input: zod3,
      args: (i: { invoice: string; euros: number }) => ({ invoice: i.invoice, cents: i.euros }),
    },
    standard: { ...common, name: "pay_std", input: standard(true) },
    undescribed: { ...common, name: "pay_bare", input: standard(false) },
  };
}
