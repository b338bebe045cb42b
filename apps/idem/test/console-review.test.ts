/**
 * Defects of the console found in review (helper-143), over real HTTP against the console server
 * on SQLite and Postgres; each test failed first: the queue hid unknown outcomes its checks could
 * not settle behind newer ones not checked yet, a retry's evidence was dropped from the audit
 * trail (then kept only inside its reason, cut to fit: now in the retry's own audit event), and a
 * bulk selection naming one operation twice said it was both decided and not.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { openLedger, type Ledger } from "@idem/core";
import { databaseOf } from "@idem/core/testing";
import { DIALECTS, freshDatabase, scaled } from "@idem/testkit";
import type { ConsoleServer } from "../src/console/server.js";
import { browserOn, parked, serveFor } from "./console-support.js";

const TOKEN = "alice-token-review-0147";

for (const dialect of DIALECTS) {
  describe(`the console's review on ${dialect}`, { timeout: scaled(120_000) }, () => {
    let ledger: Ledger;
    let web: ConsoleServer;
    beforeAll(async () => {
      const url = await freshDatabase(dialect);
      ledger = await openLedger(url);
      web = await serveFor(ledger, url, [{ name: "alice", token: TOKEN, tenants: "*" }]);
    }, scaled(60_000));
    afterAll(async () => {
      await web?.close();
      await ledger?.close();
    });

    const browser = browserOn(() => web.url);
    const session = () => browser.session(TOKEN);
    const { get, post, noteAfter } = browser;
    const seenOf = async (tenant: string, id: string) => {
      const { operation: o } = await ledger.get({ tenant, id });
      return { status: o.status, attempt: o.attempt, checks: o.checks, updatedAt: o.updatedAt };
    };

    it("the queue shows an unknown outcome its checks could not settle, even behind 500 newer ones not checked yet", async () => {
      const tenant = `t-unknown-${dialect}`;
      const checked = await ledger.run(parked, { tenant, key: ["checked"], args: {} });
      // An outage at the provider: 500 newer sends of the tenant, their outcome unknown, not checked yet.
      for (let i = 0; i < 500; i++) await ledger.run(parked, { tenant, key: ["fresh", i], args: {} });
      await databaseOf(ledger)
        .updateTable("idem_operations")
        .set({ status: "unknown", checks: 0 } as never)
        .where("tenant_id", "=", tenant)
        .execute();
      // The older one: three checks could not settle it.
      await databaseOf(ledger)
        .updateTable("idem_operations")
        .set({ checks: 3 } as never)
        .where("tenant_id", "=", tenant)
        .where("id", "=", checked.operationId)
        .execute();
      const cookie = await session();
      for (const path of [`/?tenant=${tenant}`, `/?tenant=${tenant}&status=unknown`, "/"]) {
        const page = await (await get(cookie, path)).text();
        expect(page, path).toContain(`data-operation="${checked.operationId}"`);
        expect(page, path).toContain("outcome unknown after 3 checks");
      }
    });

    it("a retry decided with evidence keeps it in the retry's audit event, apart from the reason, and its page shows it", async () => {
      const tenant = `t-evidence-${dialect}`;
      const op = await ledger.run(parked, { tenant, key: ["sms"], args: {} });
      const cookie = await session();
      const evidence = "SMS log searched for +15550100, 09:00-10:00: nothing";
      const res = await post(cookie, `/op/${tenant}/${op.operationId}/decide`, [
        ["seen", JSON.stringify(await seenOf(tenant, op.operationId))],
        ["outcome", "retry"],
        ["reason", "not in the provider's log"],
        ["evidence", evidence],
      ]);
      expect(await noteAfter(cookie, res)).toBe(
        "Marked not done: it will run again with the same key (looked up first where its last run may have done it).",
      );
      const { operation, events } = await ledger.get({ tenant, id: op.operationId });
      expect(operation.status).toBe("pending");
      expect(events.at(-1)).toMatchObject({
        to: "pending",
        reason: "retry asked: not in the provider's log",
        evidence,
      });
      const page = await (await get(cookie, `/op/${tenant}/${op.operationId}`)).text();
      expect(page).toContain(`<small data-testid="event-evidence">evidence: ${evidence}</small>`);
    });

    it("a retry's reason written to its limit keeps the person's evidence whole, not cut to fit the reason", async () => {
      // helper-144's review: the evidence appended to a reason of 1,990 characters passed core's
      // 2,000 and the retry was refused; then it was cut to fit. Kept apart, neither is cut.
      const tenant = `t-evidence-long-${dialect}`;
      const op = await ledger.run(parked, { tenant, key: ["sms"], args: {} });
      const cookie = await session();
      const reason = `not in the provider's log ${"x".repeat(1_960)}`;
      const evidence = `SMS log searched for +15550100, 09:00-10:00: nothing ${"y".repeat(900)}`;
      const res = await post(cookie, `/op/${tenant}/${op.operationId}/decide`, [
        ["seen", JSON.stringify(await seenOf(tenant, op.operationId))],
        ["outcome", "retry"],
        ["reason", reason],
        ["evidence", evidence],
      ]);
      expect(await noteAfter(cookie, res)).toBe(
        "Marked not done: it will run again with the same key (looked up first where its last run may have done it).",
      );
      const { operation, events } = await ledger.get({ tenant, id: op.operationId });
      expect(operation.status).toBe("pending");
      expect(events.at(-1)).toMatchObject({ reason: `retry asked: ${reason}`, evidence });
    });

    it("a retry's evidence past a verdict's 1,000 characters is refused, as a verdict's is, nothing decided", async () => {
      const tenant = `t-evidence-over-${dialect}`;
      const op = await ledger.run(parked, { tenant, key: ["sms"], args: {} });
      const cookie = await session();
      const res = await post(cookie, `/op/${tenant}/${op.operationId}/decide`, [
        ["seen", JSON.stringify(await seenOf(tenant, op.operationId))],
        ["outcome", "retry"],
        ["reason", "not in the provider's log"],
        ["evidence", "z".repeat(1_001)],
      ]);
      expect(res.status).toBe(409);
      expect(await res.text()).toContain("Refused: evidence: must be a string of at most 1000 characters");
      expect((await ledger.get({ tenant, id: op.operationId })).operation.status).toBe("needs_review");
    });

    it("a bulk selection naming an operation twice decides it once and says so, not that it was refused", async () => {
      const tenant = `t-twice-${dialect}`;
      const op = await ledger.run(parked, { tenant, key: ["sms"], args: {} });
      const pick = JSON.stringify({ tenant, id: op.operationId, seen: await seenOf(tenant, op.operationId) });
      const cookie = await session();
      const res = await post(cookie, "/bulk", [
        ["outcome", "succeeded"],
        ["reason", "found in the provider's log"],
        ["ops", pick],
        ["ops", pick],
      ]);
      expect(await noteAfter(cookie, res)).toBe("1 of 1 selected was decided: Resolved as succeeded.");
      expect((await ledger.get({ tenant, id: op.operationId })).operation.status).toBe("succeeded");
    });
  });
}
