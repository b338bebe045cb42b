/**
 * Values from outside the ledger that become stored times: a provider's Retry-After (off the
 * network) and a caller's retry budget. One past what the database holds (Postgres's bigint) failed
 * its transition as an outage of the ledger database ("the ledger database failed: value … is out
 * of range for type bigint"), retried for the whole lease, leaving the operation running.
 */
import { describe, expect, it } from "vitest";
import { InvalidValueError, LedgerConfigError, defineAction } from "@idem/core";
import { databaseOf } from "@idem/core/testing";
import { DIALECTS } from "@idem/testkit";
import { ledgers, uniqueTenant } from "./support/ledgers.js";

/** The longest wait the ledger keeps (MAX_WAIT_MS), plus the jitter it adds. */
const LONGEST = 2 ** 31 - 1 + 1_000;

for (const dialect of DIALECTS) {
  describe(`times the database cannot hold on ${dialect}`, () => {
    const db = ledgers(dialect);

    /** An action the provider answers with `cls`: nothing committed (rate limited) or maybe (ambiguous). */
    function answered(type: string, cls: { kind: "rate_limited" | "ambiguous"; retryAfterMs: number }) {
      let sent = 0;
      const action = defineAction({
        type,
        capabilities: {},
        async execute() {
          sent += 1;
          throw new Error("429 Too Many Requests");
        },
        classify: () => ({ ...cls, reason: "429 Too Many Requests" }),
      });
      return { action, sent: () => sent };
    }

    async function nextCheck(ledger: Awaited<ReturnType<typeof db.open>>, id: string) {
      const row = await databaseOf(ledger)
        .selectFrom("idem_operations")
        .select(["status", "next_check_at", "updated_at"])
        .where("id", "=", id)
        .executeTakeFirstOrThrow();
      return { ...row, next_check_at: Number(row.next_check_at), updated_at: Number(row.updated_at) };
    }

    it("a provider's Retry-After far past any date (HubSpot's Retry-After: 1e17 s): pending at once, checked again within the longest wait, not an outage", async () => {
      const { action, sent } = answered("limited", { kind: "rate_limited", retryAfterMs: 1e20 });
      const ledger = await db.open({ leaseMs: 2_000 });
      const tenant = uniqueTenant();
      const out = await ledger.run(action, { tenant, key: ["r"], args: { n: 1 } });
      // Before: LedgerUnavailableError "the ledger database failed: value "100000000000000000000" is
      // out of range for type bigint" after 2 s (the lease) on Postgres; on SQLite a row never due.
      expect(out).toMatchObject({ status: "pending_verification", state: "pending" });
      expect(sent()).toBe(1);
      const row = await nextCheck(ledger, out.operationId);
      expect(row.status).toBe("pending");
      expect(row.next_check_at - row.updated_at).toBeGreaterThanOrEqual(2 ** 31 - 1);
      expect(row.next_check_at - row.updated_at).toBeLessThanOrEqual(LONGEST);
    });

    it("an ambiguous answer with a Retry-After that is no number of ms (NaN): unknown, checked again by our backoff", async () => {
      const action = defineAction({
        type: "limited-nan",
        capabilities: { lookup: true },
        async execute(): Promise<{ id: string }> {
          throw new Error("socket hang up");
        },
        classify: () => ({ kind: "ambiguous", reason: "socket hang up", retryAfterMs: Number.NaN }),
        reconcile: async () => ({ found: false, proof: "inconclusive", reason: "search lags" }),
      });
      const ledger = await db.open({ leaseMs: 2_000 });
      const out = await ledger.run(action, { tenant: uniqueTenant(), key: ["n"], args: { n: 1 } });
      expect(out).toMatchObject({ status: "pending_verification", state: "unknown" });
      const row = await nextCheck(ledger, out.operationId);
      expect(row.status).toBe("unknown");
      expect(row.next_check_at - row.updated_at).toBeGreaterThanOrEqual(0);
      expect(row.next_check_at - row.updated_at).toBeLessThanOrEqual(3_600_000);
    });

    it("a retry budget whose delays no stored time can hold: refused before anything is written", async () => {
      const { action, sent } = answered("limited-budget", { kind: "rate_limited", retryAfterMs: 10 });
      const ledger = await db.open({ leaseMs: 2_000 });
      const tenant = uniqueTenant();
      for (const budget of [{ maxDelayMs: 1e20, baseDelayMs: 1e20 }, { baseDelayMs: Number.NaN }]) {
        const refused = await ledger.run(action, { tenant, key: ["b"], args: { n: 1 }, budget }).catch((e) => e);
        expect(refused).toBeInstanceOf(InvalidValueError);
        expect((refused as Error).message).toMatch(/^budget\.(maxDelayMs|baseDelayMs): must be a number of ms from 0/);
      }
      expect(sent()).toBe(0);
      expect(await ledger.admin.list({ tenant })).toEqual([]);
      await expect(db.open({ budget: { maxDelayMs: Number.POSITIVE_INFINITY } })).rejects.toThrow(LedgerConfigError);
      await expect(ledger.daemon.settle({ id: "op_x", tenant, budget: { maxDelayMs: 1e20 } })).rejects.toThrow(
        InvalidValueError,
      );
    });
  });
}
