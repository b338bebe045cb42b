/**
 * A person resolved an operation as failed, and an earlier attempt's late receipt then proves the
 * effect: the row succeeds with it, and the person, who may have acted on "failed" (told the
 * customer, done the work by hand), hears that their verdict was contradicted. The daemon says so
 * (`verdict_overruled`), once, not as `two_effects` (the ledger saw one effect). Through the log
 * sink, on SQLite and Postgres. Failed first: not alerted at all.
 */
import { describe, expect, it, vi } from "vitest";
import { defineAction } from "@idem/core";
import { DIALECTS, scaled } from "@idem/testkit";
import { alertingDaemon, gate } from "./support.js";

/**
 * An SMS nothing can check (an expired lease goes to a person): attempt 1's request is out until
 * `land()`, then answers `receipt`. `calls()`: the requests made.
 */
function lateSms<R>(type: string, receipt: R, effectId?: (r: R) => readonly string[]) {
  let calls = 0;
  const out = gate();
  const action = defineAction<{ to: string }, R>({
    type,
    capabilities: { lookup: false },
    execute: async () => {
      calls += 1;
      await out.passed;
      return receipt;
    },
    classify: () => ({ kind: "ambiguous", reason: "the answer was lost" }),
    ...(effectId && { effectId }),
  });
  return { action, land: out.open, calls: () => calls };
}

for (const dialect of DIALECTS) {
  describe(`a person's verdict "failed" contradicted by a late receipt, alerted by the daemon on ${dialect}`, () => {
    it(
      "is said as verdict_overruled, once",
      async () => {
        const send = lateSms("sms.late", { id: "s-1" });
        const { ledger, daemon, tenant, said, advance } = await alertingDaemon(dialect, "d-overruled", [send.action], {
          heldClock: true,
        });
        const first = ledger.run(send.action, { tenant, key: ["k"], args: { to: "+15550100" } });
        await vi.waitFor(() => expect(send.calls()).toBe(1));
        advance(31_000); // attempt 1's lease ran out; its request is still out
        const [op] = await ledger.admin.list({ tenant });
        const id = op!.id;
        expect(await ledger.daemon.settle({ tenant, id, actor: "daemon-a" })).toMatchObject({ state: "needs_review" });
        await ledger.admin.resolve({ tenant, id, outcome: "failed", reason: "not in the SMS log", actor: "ann" });
        send.land(); // attempt 1's request lands, and its receipt arrives
        expect(await first).toMatchObject({ status: "succeeded", receipt: { id: "s-1" } });
        await daemon.tick();
        await daemon.tick();
        const alerts = said(id);
        expect(alerts.map((l) => l.alert!.kind)).toEqual(["verdict_overruled"]);
        expect(alerts[0]!.msg).toMatch(
          /a person's verdict "failed" was contradicted: it took effect after all \(check whether anything was done on that verdict, such as the work redone by hand\): a person's verdict "failed" is overruled: attempt 1's receipt proves the effect happened/,
        );
        expect(send.calls()).toBe(1);
      },
      scaled(60_000),
    );

    it(
      "a late receipt that names two effects, too large to store: said as two_effects, not only 'needs a person's review'",
      async () => {
        // As above, but attempt 1's request is answered with two effects (its ids name s-1 and s-2),
        // in a receipt too large to store: the row goes back to a person, its reason saying their
        // verdict is overruled first, then "attempt 1: two effects: …".
        const send = lateSms("sms.late.two", { ids: ["s-1", "s-2"], pad: "x".repeat(200) }, (r) => r.ids);
        const { ledger, daemon, tenant, said, advance } = await alertingDaemon(
          dialect,
          "d-overruled-two",
          [send.action],
          {
            heldClock: true,
            maxResultBytes: 100,
          },
        );
        const first = ledger.run(send.action, { tenant, key: ["k"], args: { to: "+15550100" } });
        await vi.waitFor(() => expect(send.calls()).toBe(1));
        advance(31_000);
        const [op] = await ledger.admin.list({ tenant });
        const id = op!.id;
        expect(await ledger.daemon.settle({ tenant, id, actor: "daemon-a" })).toMatchObject({ state: "needs_review" });
        await ledger.admin.resolve({ tenant, id, outcome: "failed", reason: "not in the SMS log", actor: "ann" });
        send.land();
        await expect(first).rejects.toMatchObject({ name: "PayloadTooLargeError" });
        const [parked] = await ledger.admin.list({ tenant });
        expect(parked).toMatchObject({ status: "needs_review" });
        expect(parked!.reason).toMatch(
          /^a person's verdict "failed" is overruled: attempt 1: two effects: the receipt names 2 effects \(s-1, s-2\)/,
        );
        await daemon.tick();
        await daemon.tick();
        const alerts = said(id);
        // Before: ["needs_review"], "needs a person's review: …": two effects told, not said as such.
        expect(alerts.map((l) => l.alert!.kind)).toEqual(["two_effects"]);
        expect(alerts[0]!.msg).toMatch(
          /took effect twice .*: a person's verdict "failed" is overruled: attempt 1: two effects/,
        );
        expect(send.calls()).toBe(1);
      },
      scaled(60_000),
    );
  });
}
