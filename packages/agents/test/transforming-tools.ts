/**
 * Tools whose input schema transforms what the model sends, for the framework tests: the
 * framework checks the input against the schema and hands its output to the tool, so neither
 * guard nor the ledger may apply the schema again. Applied twice, 12.50 euros went out as 125,000
 * cents, a day became "2026-12-24T09:00:00ZT09:00:00Z", and a schema that changes a type (a
 * string of euros to a number of cents) refused every valid call.
 */
import { expect } from "vitest";
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
