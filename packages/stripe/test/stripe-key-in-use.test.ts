/**
 * Stripe answers 409 `idempotency_key_in_use` to a request whose key another request is still
 * executing with (our earlier attempt, its lease lost meanwhile). That says nothing of the earlier
 * attempt's outcome: the operation is unknown, never "failed" (nothing done) nor pending (safe to
 * send anew), and a replay with the key once Stripe finished settles it to the one intent. Through
 * the real stripe SDK and the sandbox, on SQLite and Postgres.
 */
import { once } from "node:events";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { openTestLedger, type TestLedgerOptions } from "@idem/core/testing";
import { StripeSandbox } from "@idem/sandbox";
import { DIALECTS, ledgersFor } from "@idem/testkit";
import { stripeActions } from "@idem/stripe";
import { CARD } from "./cards.js";

let sandbox: StripeSandbox;
let server: { port: number; apiKey: string };
let skew = 0;
beforeAll(async () => {
  sandbox = new StripeSandbox();
  server = await sandbox.start();
});
afterAll(() => sandbox.close());

for (const dialect of DIALECTS) {
  describe(`our key still executing at Stripe on ${dialect}`, () => {
    const db = ledgersFor(dialect, openTestLedger, { defaults: { poolSize: 2 } as TestLedgerOptions, prepare: true });

    it("a takeover meets 409 idempotency_key_in_use: unknown, never failed or pending; the replay settles it to the one intent", async () => {
      // The held request's own timeout is past the test's: it ends when the sandbox lets it go.
      const s = stripeActions({
        apiKey: server.apiKey,
        host: "127.0.0.1",
        port: server.port,
        protocol: "http",
        timeoutMs: 60_000,
      });
      const l = await db.open({ clock: () => Date.now() + skew, leaseMs: 60_000, actions: [s.paymentIntentsCreate] });
      const call = { tenant: `t-${dialect}-${Math.random().toString(36).slice(2, 7)}`, key: ["in-use"], args: CARD };
      const before = sandbox.count("payment_intents");
      sandbox.faults.add({ kind: "delay_before_commit", match: { path: "/v1/payment_intents" }, delayMs: 60_000 });
      const held = once(sandbox.events, "held");
      const first = l.run(s.paymentIntentsCreate, call);
      await held;
      skew += 120_000; // the first attempt's lease ran out (on the ledger's clock) while Stripe executes it

      const second = await l.run(s.paymentIntentsCreate, call);
      expect(sandbox.requests.filter((r) => r.status === 409)).not.toHaveLength(0);
      expect(second).toMatchObject({ status: "pending_verification", state: "unknown" });

      expect(sandbox.releaseHeldRequests()).toBe(1);
      await first;
      const operationId = second.status === "pending_verification" ? second.operationId : "";
      const settled = await l.daemon.settle({ tenant: call.tenant, id: operationId });
      const made = sandbox.objects.all("payment_intents").at(-1)!;
      expect(settled).toMatchObject({ status: "succeeded", receipt: { id: made.id } });
      expect(sandbox.count("payment_intents") - before).toBe(1);
    });
  });
}
