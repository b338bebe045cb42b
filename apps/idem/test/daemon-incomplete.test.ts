/**
 * An operation that took effect but not in full (its action's `attention`: a sent mail whose Sent
 * copy was not filed) is alerted as `incomplete`, once, never as `two_effects` (whose text tells
 * the operator to undo the extra effect); one whose receipt names two effects still is. Through
 * the log sink, on SQLite and Postgres. Failed first: said as two_effects.
 */
import { describe, expect, it } from "vitest";
import { defineAction } from "@idem/core";
import { DIALECTS, scaled } from "@idem/testkit";
import { alertingDaemon } from "./support.js";

interface Receipt {
  readonly id: string;
  readonly ids?: readonly string[];
  readonly copyMissing?: boolean;
}

/** Each run makes one effect; its receipt names two when `ids` says so (two effects). */
const partial = defineAction<{ twice?: boolean }, Receipt>({
  type: "mail.partial",
  capabilities: {},
  execute: async (args, op) =>
    args.twice ? { id: op.id, ids: [op.id, "earlier"], copyMissing: true } : { id: op.id, copyMissing: true },
  effectId: (r) => (r.ids && r.ids.length > 1 ? r.ids : r.id),
  attention: (r) => (r.copyMissing ? "sent, but its copy was not filed" : undefined),
});

for (const dialect of DIALECTS) {
  describe(`an effect not done in full, alerted by the daemon on ${dialect}`, () => {
    it(
      "is said as incomplete, once; a replay does not alert again; two effects are still two_effects",
      async () => {
        const { ledger, daemon, tenant, said } = await alertingDaemon(dialect, "d-incomplete", [partial]);
        const once = await ledger.run(partial, { tenant, key: ["once"], args: {} });
        const twice = await ledger.run(partial, { tenant, key: ["twice"], args: { twice: true } });
        expect([once.status, twice.status]).toEqual(["succeeded", "succeeded"]);
        await daemon.tick();
        expect(said(once.operationId).map((l) => l.alert!.kind)).toEqual(["incomplete"]);
        expect(said(once.operationId)[0]!.msg).toMatch(
          /took effect, but not in full \(nothing to undo; see to the part that is missing\): sent, but its copy was not filed\. See: idem show/,
        );
        expect(said(once.operationId)[0]!.alert).toMatchObject({ status: "succeeded" });
        expect(said(twice.operationId).map((l) => l.alert!.kind)).toEqual(["two_effects"]);
        expect(said(twice.operationId)[0]!.msg).toMatch(/took effect twice .*: two effects: .*; sent, but its copy/);
        // Replayed, and ticked again: nothing more is said.
        expect(await ledger.run(partial, { tenant, key: ["once"], args: {} })).toMatchObject({ replayed: true });
        await daemon.tick();
        expect(said(once.operationId)).toHaveLength(1);
        expect(said(twice.operationId)).toHaveLength(1);
      },
      scaled(60_000),
    );
  });
}
