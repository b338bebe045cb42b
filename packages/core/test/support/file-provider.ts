/**
 * A provider whose effects are lines in a file, so that separate processes (and SIGKILLed ones)
 * share one target and the count is taken outside the ledger. `dedupe` answers a repeated key with
 * the first object, like Stripe; `lookup` can be searched by key, like a Sent folder; `neither`
 * is a plain mailer.
 */
import { appendFileSync, existsSync, readFileSync } from "node:fs";
import { defineAction, type ActionDefinition, type Capabilities, type LookupContract } from "@idem/core";

export type ProviderKind = "dedupe" | "lookup" | "neither";

export const CAPABILITIES: Record<ProviderKind, Capabilities> = {
  dedupe: { dedupe: { retentionMs: 24 * 3_600_000 } },
  lookup: { lookup: true },
  neither: {},
};

export function effectLines(file: string): { key: string; id: string }[] {
  if (!existsSync(file)) return [];
  return readFileSync(file, "utf8")
    .split("\n")
    .filter(Boolean)
    .map((l) => {
      const [key, id] = l.split(" ");
      return { key: key!, id: id! };
    });
}

/** The action; `afterEffect` runs once the line is written (a crash point, or a pause). */
export function fileAction(kind: ProviderKind, file: string, afterEffect: () => Promise<void> = async () => {}) {
  type Args = { note: string };
  type Receipt = { id: string };
  // `kind` picks the capabilities at run time; defineAction still checks lookup has its reconcile.
  return defineAction<Args, Receipt>({
    type: `file.${kind}`,
    capabilities: CAPABILITIES[kind],
    async execute(_args, op) {
      const earlier = kind === "dedupe" ? effectLines(file).find((e) => e.key === op.key) : undefined;
      if (earlier) return { id: earlier.id };
      const id = `eff_${process.pid}_${op.attempt}`;
      appendFileSync(file, `${op.key} ${id}\n`);
      await afterEffect();
      return { id };
    },
    async reconcile(_args, op) {
      const hit = effectLines(file).find((e) => e.key === op.key);
      return hit
        ? { found: true, receipt: { id: hit.id } }
        : { found: false, proof: "absent", reason: "no line for the key" };
    },
  } as ActionDefinition<Args, Receipt> & LookupContract<Args, Receipt>);
}
