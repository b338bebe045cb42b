/**
 * Structured evidence on a failed outcome, on both databases: what a permanent classification or
 * a lookup's refusal names as fields (the provider's ids and codes) reaches the caller's failed
 * result, its replay and the stored operation, and evidence over the bounds is dropped without
 * keeping the failure from being recorded.
 */
import { describe, expect, it } from "vitest";
import { defineAction, describeResult, type Classification } from "@idem/core";
import { DIALECTS } from "@idem/testkit";
import { ledgers, uniqueTenant } from "./support/ledgers.js";

/** A provider that refuses every request with `cls`, counting what reached it. */
function refusing(type: string, cls: () => Classification) {
  const sent = { n: 0 };
  const action = defineAction<{ to: string }, { id: string }>({
    type,
    capabilities: {},
    execute: async () => {
      sent.n += 1;
      throw new Error("402 declined");
    },
    classify: () => cls(),
  });
  return { action, sent };
}

const DECLINED = { payment_intent: "pi_123", code: "card_declined", decline_code: "insufficient_funds" };

for (const dialect of DIALECTS) {
  describe(`evidence on ${dialect}`, () => {
    const db = ledgers(dialect);

    it("a permanent answer's evidence is a field of the failure: on the caller's result, its replay and the stored operation", async () => {
      const ledger = await db.open();
      const { action, sent } = refusing("card.evidence", () => ({
        kind: "permanent",
        reason: "card declined",
        providerRequestId: "req_1",
        evidence: DECLINED,
      }));
      const input = { tenant: uniqueTenant(), key: ["declined"], args: { to: "x" } };
      const out = await ledger.run(action, input);
      expect(out).toMatchObject({
        status: "failed",
        replayed: false,
        error: { kind: "permanent", reason: "card declined", providerRequestId: "req_1", evidence: DECLINED },
      });
      expect(out.status === "failed" && out.error.evidenceDropped).toBeUndefined();
      expect(await ledger.run(action, input)).toMatchObject({
        status: "failed",
        replayed: true,
        error: { evidence: DECLINED },
      });
      const { operation } = await ledger.get({ tenant: input.tenant, id: out.operationId });
      expect(operation.error).toEqual({
        kind: "permanent",
        reason: "card declined",
        providerRequestId: "req_1",
        evidence: DECLINED,
      });
      // What a model is told names them too, without parsing the reason.
      expect(describeResult(out)).toBe(
        "failed: card declined (payment_intent: pi_123; code: card_declined; decline_code: insufficient_funds)",
      );
      expect(sent.n).toBe(1);
    });

    it("a lookup's refusal carries its evidence to the failure it records", async () => {
      const ledger = await db.open();
      const card = defineAction<{ to: string }, { id: string }>({
        type: "card.evidence-lookup",
        capabilities: { lookup: true },
        execute: async () => {
          throw new Error("socket closed after the request");
        },
        classify: () => ({ kind: "ambiguous", reason: "socket closed after the request" }),
        reconcile: async () => ({
          found: false,
          proof: "refused",
          reason: "the provider's record shows it declined",
          evidence: DECLINED,
        }),
      });
      const input = { tenant: uniqueTenant(), key: ["declined-found"], args: { to: "x" } };
      const out = await ledger.run(card, input);
      expect(out).toMatchObject({ status: "failed", error: { kind: "permanent", evidence: DECLINED } });
      const { operation } = await ledger.get({ tenant: input.tenant, id: out.operationId });
      expect(operation).toMatchObject({ status: "failed", error: { evidence: DECLINED } });
      expect(await ledger.run(card, input)).toMatchObject({
        status: "failed",
        replayed: true,
        error: { evidence: DECLINED },
      });
    });

    it("evidence over the bounds is dropped entry by entry, counted, and the failure is still recorded", async () => {
      const ledger = await db.open();
      const many: Record<string, unknown> = {};
      for (let i = 1; i <= 10; i += 1) many[`k${i}`] = `v${i}`;
      many.k2 = "x".repeat(201); // too long: dropped whole, never cut (a cut id names another object)
      many.k3 = 42; // not a string
      many.k4 = "two\nlines"; // a control character would forge a line in a log or a model's text
      many[`${"k".repeat(201)}`] = "v"; // a key too long
      many.k11 = "one\u2028line"; // a line separator breaks a line as a newline does
      many.k12 = "pi_\u202e1"; // a bidi override makes the text read otherwise than it is
      const { action } = refusing("card.evidence-bounds", () => ({
        kind: "permanent",
        reason: "declined",
        evidence: many as Record<string, string>,
      }));
      const input = { tenant: uniqueTenant(), key: ["bounds"], args: { to: "x" } };
      const out = await ledger.run(action, input);
      // The acceptable entries (at most eight), in the action's order; the six others are counted.
      const kept = { k1: "v1", k5: "v5", k6: "v6", k7: "v7", k8: "v8", k9: "v9", k10: "v10" };
      expect(out).toMatchObject({
        status: "failed",
        error: { reason: "declined", evidence: kept, evidenceDropped: 6 },
      });
      expect(out.status === "failed" && Object.keys(out.error.evidence ?? {})).toEqual(Object.keys(kept));
      const { operation } = await ledger.get({ tenant: input.tenant, id: out.operationId });
      expect(operation.error).toMatchObject({ evidence: kept, evidenceDropped: 6 });

      // More than eight good entries: the first eight are kept, the rest counted.
      const nine: Record<string, string> = {};
      for (let i = 1; i <= 9; i += 1) nine[`e${i}`] = `pi_${i}`;
      const over = refusing("card.evidence-nine", () => ({ kind: "permanent", reason: "declined", evidence: nine }));
      const overOut = await ledger.run(over.action, { tenant: input.tenant, key: ["nine"], args: { to: "x" } });
      expect(overOut.status === "failed" && Object.keys(overOut.error.evidence ?? {})).toHaveLength(8);
      expect(overOut).toMatchObject({ status: "failed", error: { evidenceDropped: 1 } });

      // Not a record at all, or one whose reading throws: none kept, the failure recorded.
      const hostile = Object.defineProperty({}, "payment_intent", {
        enumerable: true,
        get() {
          throw new Error("getter");
        },
      });
      for (const [name, evidence] of [
        ["list", ["pi_1"]],
        ["text", "pi_1"],
        ["throws", hostile],
      ] as const) {
        const bad = refusing(`card.evidence-${name}`, () => ({
          kind: "permanent",
          reason: "declined",
          evidence: evidence as unknown as Record<string, string>,
        }));
        const res = await ledger.run(bad.action, { tenant: input.tenant, key: [name], args: { to: "x" } });
        expect(res, name).toMatchObject({ status: "failed", error: { reason: "declined", evidenceDropped: 1 } });
        expect(res.status === "failed" && res.error.evidence, name).toBeUndefined();
      }
    });
  });
}
