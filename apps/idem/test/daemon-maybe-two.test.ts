/**
 * An earlier attempt's late receipt proves the effect after a later attempt ran the operation
 * again (a lookup proved absence before the earlier request landed) and lost its answer: one
 * effect proven, a second one possible. The daemon says so (`maybe_two_effects`), once, not as
 * `two_effects` ("took effect twice ... undo the extra effect": none may exist). Through the log
 * sink, on SQLite and Postgres. Failed first: said as two_effects.
 */
import { describe, expect, it, vi } from "vitest";
import { defineAction } from "@idem/core";
import { DIALECTS, scaled } from "@idem/testkit";
import { alertingDaemon, gate } from "./support.js";

for (const dialect of DIALECTS) {
  describe(`an effect proven after the operation was run again, alerted by the daemon on ${dialect}`, () => {
    it(
      "is said as maybe_two_effects, once",
      async () => {
        let calls = 0;
        const out = gate();
        let landed = false;
        const send = defineAction<{ to: string }, { id: string }>({
          type: "mail.rerun",
          capabilities: { lookup: true },
          execute: async () => {
            calls += 1;
            if (calls > 1) throw new Error("the answer was lost"); // the rerun's request: its answer lost
            await out.passed; // attempt 1's request is out until released, then lands
            landed = true;
            return { id: "m-1" };
          },
          classify: () => ({ kind: "ambiguous", reason: "the answer was lost" }),
          reconcile: async () =>
            landed
              ? { found: true, receipt: { id: "m-1" } }
              : { found: false, proof: "absent", reason: "not in the mailbox" },
        });
        const { ledger, daemon, tenant, said, advance } = await alertingDaemon(dialect, "d-maybe-two", [send], {
          heldClock: true,
          budget: { attempts: 1 },
        });
        const first = ledger.run(send, { tenant, key: ["k"], args: { to: "a@example.com" } });
        await vi.waitFor(() => expect(calls).toBe(1));
        advance(31_000); // attempt 1's lease ran out; its request is still out
        const [op] = await ledger.admin.list({ tenant });
        const id = op!.id;
        // A lookup proves absence (the request has not landed) and the operation runs again: answer lost.
        expect(await ledger.daemon.settle({ tenant, id, actor: "daemon-a" })).toMatchObject({ state: "unknown" });
        expect(calls).toBe(2);
        out.open(); // attempt 1's request lands, and its receipt arrives
        expect(await first).toMatchObject({ status: "succeeded", receipt: { id: "m-1" } });
        await daemon.tick();
        await daemon.tick();
        const alerts = said(id);
        expect(alerts.map((l) => l.alert!.kind)).toEqual(["maybe_two_effects"]);
        expect(alerts[0]!.msg).toMatch(
          /may have taken effect twice: .*\(check the provider for a second effect, and undo it if there is one\): possibly two effects: attempt 1's receipt proves the effect happened/,
        );
      },
      scaled(60_000),
    );
  });
}
