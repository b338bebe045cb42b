/**
 * Work known not done that the provider refuses for now on every try (503 before executing, a
 * rate limit): each try counts, the daemon's tries back off as an unknown outcome's checks do
 * (doubling, capped at an hour) instead of coming back every tick at the first try's delay, and
 * past the daemon's `maxChecks` the work goes to a person, alerted, never tried again unasked.
 * An outcome that becomes unknown after such tries starts its own checks from nothing.
 */
import { describe, expect, it } from "vitest";
import { DIALECTS } from "@idem/testkit";
import { ledgers, uniqueTenant } from "./support/ledgers.js";
import { TestProvider } from "./support/provider.js";

const UNAVAILABLE = { when: "before", cls: { kind: "transient", reason: "503 service unavailable" } } as const;

for (const dialect of DIALECTS) {
  describe(`work the provider refuses on every try, ${dialect}`, () => {
    const db = ledgers(dialect);

    async function refusedOnce(p: TestProvider) {
      const mail = p.action("mail", { lookup: true });
      // One try per call or settlement: each settlement below is one try.
      const ledger = await db.open({ actions: [mail], budget: { attempts: 1 } });
      const tenant = uniqueTenant();
      p.faults.push(UNAVAILABLE);
      const out = await ledger.run(mail, { tenant, key: ["m"], args: { to: "x" } });
      expect(out).toMatchObject({ status: "pending_verification", state: "pending" });
      return { ledger, mail, tenant, id: out.operationId };
    }

    it("each try counts, and the daemon's tries wait longer each time (not every tick at the first try's delay)", async () => {
      const p = new TestProvider();
      const { ledger, tenant, id } = await refusedOnce(p);
      const seen: { checks: number; waitMs: number }[] = [];
      for (let i = 0; i < 8; i++) {
        p.faults.push(UNAVAILABLE);
        expect(await ledger.daemon.settle({ tenant, id, actor: "daemon" })).toMatchObject({ state: "pending" });
        const { operation: op } = await ledger.get({ tenant, id });
        seen.push({ checks: op.checks, waitMs: op.nextCheckAt! - op.updatedAt });
      }
      expect(p.calls).toBe(9);
      expect(seen.map((s) => s.checks)).toEqual([2, 3, 4, 5, 6, 7, 8, 9]);
      // 100 ms doubled per try and spread over [d/2, d]: the 9th try's wait is at least 12.8 s.
      // Before: checks stayed 0 and every wait was the first try's (at most 100 ms), so the daemon
      // tried again each tick for as long as the provider was down.
      expect(seen.at(-1)!.waitMs, JSON.stringify(seen)).toBeGreaterThanOrEqual(12_800);
      expect(seen.at(-1)!.waitMs).toBeGreaterThan(8 * seen[0]!.waitMs);
      expect(p.effects).toHaveLength(0);
    });

    it("past the daemon's maxChecks it goes to a person, alerted, without another try; a person's retry starts over", async () => {
      const p = new TestProvider();
      const { ledger, mail, tenant, id } = await refusedOnce(p);
      const escalate = { maxChecks: 3, maxAgeMs: 3_600_000 };
      for (let i = 0; i < 2; i++) {
        p.faults.push(UNAVAILABLE);
        expect(await ledger.daemon.settle({ tenant, id, actor: "daemon", escalate })).toMatchObject({
          state: "pending",
        });
      }
      expect(p.calls).toBe(3);
      // Before: tried again (a 4th call), and again each time it came due, for ever.
      const parked = await ledger.daemon.settle({ tenant, id, actor: "daemon", escalate });
      expect(parked).toMatchObject({
        status: "pending_verification",
        state: "needs_review",
        reason: expect.stringMatching(/^still not done after 3 tries.*a person must decide/),
      });
      expect(p.calls).toBe(3);
      const due = await ledger.daemon.alertsDue({ limit: 100 });
      expect(due.filter((op) => op.id === id)).toMatchObject([{ status: "needs_review" }]);
      // The provider is back; a person says run it again: it runs once.
      const back = await ledger.admin.retry({ tenant, id, actor: "ops", reason: "provider back" });
      expect(back).toMatchObject({ status: "pending", checks: 0 });
      expect(await ledger.run(mail, { tenant, key: ["m"], args: { to: "x" } })).toMatchObject({
        status: "succeeded",
        replayed: false,
      });
      expect(p.effects).toHaveLength(1);
    });

    it("an unknown outcome after refused tries starts its checks from nothing", async () => {
      const p = new TestProvider();
      const { ledger, tenant, id } = await refusedOnce(p);
      p.faults.push(UNAVAILABLE);
      await ledger.daemon.settle({ tenant, id, actor: "daemon" });
      expect((await ledger.get({ tenant, id })).operation).toMatchObject({ status: "pending", checks: 2 });
      // The next try times out after it was sent: the outcome is unknown, with no check made yet.
      p.faults.push({ when: "after", cls: { kind: "ambiguous", reason: "timeout after send" } });
      expect(await ledger.daemon.settle({ tenant, id, actor: "daemon" })).toMatchObject({ state: "unknown" });
      expect((await ledger.get({ tenant, id })).operation).toMatchObject({ status: "unknown", checks: 0 });
      expect(p.effects).toHaveLength(1);
    });
  });
}
