/**
 * A replay refused for good made the operation "failed", and its callers were told so; then an
 * earlier attempt's request, still out, landed and its receipt proved the effect. The row succeeds
 * with it, and the daemon says so (`failure_overruled`), once, not as `two_effects` (the ledger saw
 * one effect): a caller (a model) told "failed" may have sent the same work again under another
 * key. Through the log sink, on SQLite and Postgres. Failed first: not alerted at all.
 */
import { describe, expect, it, vi } from "vitest";
import { defineAction } from "@idem/core";
import { DIALECTS, scaled } from "@idem/testkit";
import { alertingDaemon, gate } from "./support.js";

const HOUR = 3_600_000;
class Refused extends Error {}

/**
 * A provider that dedupes on our key: attempt 1's request is out (its signal ignored) until
 * `land()`, then answers `receipt`; every later request (the replay, which arrives first) is
 * refused for good (validation). `calls()`: the requests made.
 */
function lateCharge<R>(type: string, receipt: R, effectId?: (r: R) => readonly string[]) {
  let calls = 0;
  const out = gate();
  const action = defineAction<{ amount: number }, R>({
    type,
    capabilities: { dedupe: { retentionMs: 24 * HOUR } },
    execute: async () => {
      if (++calls > 1) throw new Refused("validation: refused");
      await out.passed;
      return receipt;
    },
    classify: (e) =>
      e instanceof Refused ? { kind: "permanent", reason: e.message } : { kind: "ambiguous", reason: String(e) },
    ...(effectId && { effectId }),
  });
  return { action, land: out.open, calls: () => calls };
}

for (const dialect of DIALECTS) {
  describe(`a "failed" told to callers, contradicted by a late receipt, alerted by the daemon on ${dialect}`, () => {
    it(
      "is said as failure_overruled, once",
      async () => {
        const charge = lateCharge("charge.late", { id: "ch_1" });
        const { ledger, daemon, tenant, said, advance } = await alertingDaemon(
          dialect,
          "d-failure-overruled",
          [charge.action],
          { heldClock: true },
        );
        const input = { tenant, key: ["k"], args: { amount: 100 } };
        const first = ledger.run(charge.action, input);
        await vi.waitFor(() => expect(charge.calls()).toBe(1), { timeout: scaled(10_000) });
        advance(HOUR); // attempt 1's lease ran out; its request is still out, the key still retained
        expect(await ledger.run(charge.action, input)).toMatchObject({ status: "failed", attempt: 2 });
        charge.land(); // attempt 1's request lands, and its receipt arrives
        expect(await first).toMatchObject({ status: "succeeded", receipt: { id: "ch_1" } });
        await daemon.tick();
        await daemon.tick();
        const [op] = await ledger.admin.list({ tenant });
        const alerts = said(op!.id);
        expect(alerts.map((l) => l.alert!.kind)).toEqual(["failure_overruled"]);
        expect(alerts[0]!.msg).toMatch(
          /failed, and was replayed as "failed" to any caller since, but took effect after all: .*\): a "failed" replayed to its callers is overruled: attempt 1's receipt proves the effect happened, after attempt 2 failed/,
        );
        expect(charge.calls()).toBe(2);
      },
      scaled(60_000),
    );

    it(
      "a late receipt that names two effects, too large to store: said as two_effects, not only 'needs a person's review'",
      async () => {
        // As above, but attempt 1's request is answered with the two effects made under its key (its
        // ids name ch_1 and ch_2), in a receipt too large to store: the row goes to a person, its
        // reason saying callers were told "failed" first, then "attempt 1: two effects: …".
        const charge = lateCharge("charge.late.two", { ids: ["ch_1", "ch_2"], pad: "x".repeat(200) }, (r) => r.ids);
        const { ledger, daemon, tenant, said, advance } = await alertingDaemon(
          dialect,
          "d-failure-two",
          [charge.action],
          {
            heldClock: true,
            maxResultBytes: 100,
          },
        );
        const input = { tenant, key: ["k"], args: { amount: 100 } };
        const first = ledger.run(charge.action, input);
        await vi.waitFor(() => expect(charge.calls()).toBe(1), { timeout: scaled(10_000) });
        advance(HOUR);
        expect(await ledger.run(charge.action, input)).toMatchObject({ status: "failed", attempt: 2 });
        charge.land();
        await expect(first).rejects.toMatchObject({ name: "PayloadTooLargeError" });
        const [op] = await ledger.admin.list({ tenant });
        expect(op).toMatchObject({ status: "needs_review" });
        expect(op!.reason).toMatch(
          /^a "failed" replayed to its callers is overruled: attempt 1: two effects: the receipt names 2 effects \(ch_1, ch_2\)/,
        );
        await daemon.tick();
        await daemon.tick();
        const alerts = said(op!.id);
        // Before: ["needs_review"], "needs a person's review: …": two effects told, not said as such.
        expect(alerts.map((l) => l.alert!.kind)).toEqual(["two_effects"]);
        expect(alerts[0]!.msg).toMatch(
          /took effect twice .*: a "failed" replayed to its callers is overruled: attempt 1: two effects/,
        );
        expect(charge.calls()).toBe(2);
      },
      scaled(60_000),
    );

    it(
      "reopened for a person by an abandoned request, that alert delivered: the late receipt is said as failure_overruled after it",
      async () => {
        const charge = lateCharge("charge.late.reopened", { id: "ch_1" });
        const { ledger, daemon, tenant, said, advance } = await alertingDaemon(
          dialect,
          "d-failure-reopened",
          [charge.action],
          { heldClock: true },
        );
        const input = { tenant, key: ["k"], args: { amount: 100 } };
        const gaveUp = new AbortController();
        const first = ledger.run(charge.action, { ...input, signal: gaveUp.signal });
        await vi.waitFor(() => expect(charge.calls()).toBe(1), { timeout: scaled(10_000) });
        advance(HOUR);
        expect(await ledger.run(charge.action, input)).toMatchObject({ status: "failed", attempt: 2 });
        // Attempt 1's caller gives up; its request is abandoned: it may have committed after the
        // operation failed, so a person decides, and hears so.
        gaveUp.abort(new Error("the agent's turn ended"));
        expect(await first).toMatchObject({ status: "pending_verification", state: "needs_review" });
        await daemon.tick();
        const [op] = await ledger.admin.list({ tenant });
        expect(said(op!.id).map((l) => l.alert!.kind)).toEqual(["needs_review"]);
        expect(said(op!.id)[0]!.msg).toMatch(/still in flight when the operation failed, may have committed/);
        charge.land(); // attempt 1's request lands; its late answer is recorded
        await vi.waitFor(
          async () => expect((await ledger.admin.list({ tenant }))[0]).toMatchObject({ status: "succeeded" }),
          { timeout: scaled(30_000) },
        );
        await daemon.tick();
        await daemon.tick();
        // Before: ["needs_review"] only: the person heard "may have committed", never that it did,
        // nor that the callers told "failed" were told wrong.
        expect(said(op!.id).map((l) => l.alert!.kind)).toEqual(["needs_review", "failure_overruled"]);
        expect(said(op!.id)[1]!.msg).toMatch(
          /: a "failed" replayed to its callers is overruled: attempt 1's receipt proves the effect happened, after attempt 2 failed/,
        );
        expect(charge.calls()).toBe(2);
      },
      scaled(60_000),
    );
  });
}
