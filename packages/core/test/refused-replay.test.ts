/**
 * A replay of an outcome that may have committed, refused for our setup (a revoked credential, an
 * API version the provider does not know): the refusal says nothing of the earlier attempt, so
 * the outcome stays unknown and a person hears of it. The same call does not replay again into
 * the same refusal within its budget: nothing changes until a person fixes the setup.
 */
import { describe, expect, it } from "vitest";
import { DIALECTS } from "@idem/testkit";
import { ledgers, uniqueTenant } from "./support/ledgers.js";
import { TestProvider } from "./support/provider.js";

const REVOKED = { when: "before", cls: { kind: "permanent", reason: "401 api key revoked", alert: true } } as const;

for (const dialect of DIALECTS) {
  describe(`a replay refused for our setup, ${dialect}`, () => {
    const db = ledgers(dialect);

    it("is sent once per settlement, not once per attempt of the budget; unknown, alerted; then replayed once fixed", async () => {
      const p = new TestProvider();
      const post = p.action("post", { dedupe: { retentionMs: 24 * 3_600_000 } });
      // The agent's call tries once; the daemon's settlement has a budget of three.
      const agent = await db.open({ actions: [post], budget: { attempts: 1 } });
      const ledger = await db.open({ actions: [post], budget: { attempts: 3, baseDelayMs: 10 } });
      const tenant = uniqueTenant();
      p.faults.push({ when: "after", cls: { kind: "ambiguous", reason: "socket closed after the body" } });
      const out = await agent.run(post, { tenant, key: ["k"], args: { to: "a" } });
      expect(out).toMatchObject({ status: "pending_verification", state: "unknown" });
      expect(p.calls).toBe(1);
      p.faults.push(REVOKED, REVOKED, REVOKED);
      const settled = await ledger.daemon.settle({ tenant, id: out.operationId, actor: "daemon" });
      expect(settled).toMatchObject({ status: "pending_verification", state: "unknown" });
      // Before: 4 (the settlement replayed three times into the same refusal).
      expect(p.calls).toBe(2);
      const due = await ledger.daemon.alertsDue({ limit: 100 });
      expect(due.map((op) => op.id)).toContain(out.operationId);
      // The key is fixed: the next replay returns the first result, one effect.
      p.faults.length = 0;
      expect(await ledger.daemon.settle({ tenant, id: out.operationId, actor: "daemon" })).toMatchObject({
        status: "succeeded",
      });
      expect(p.effects).toHaveLength(1);
    });
  });
}
