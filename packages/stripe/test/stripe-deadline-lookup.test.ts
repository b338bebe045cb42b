/**
 * A lookup's request cut at the adapter's deadline (`deadlineMs`), told as that in the reason the
 * ledger stores. stripe-node words any request that ends with ETIMEDOUT as its own inactivity
 * timeout ("Request aborted due to timeout being reached (20000ms)", naming `timeoutMs`), the
 * deadline's cut too: an operator read a 20 s timeout that never ran out, and no word of the
 * deadline to raise. An execution's reason already names the deadline (stripe-classify.ts).
 * Stripe's answers are held here (the sandbox's delay, no byte sent) past a deadline of about 1 s,
 * far below the inactivity timeout of 20 s; through the real SDK, on SQLite and Postgres.
 */
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import { openTestLedger, type TestLedgerOptions } from "@idem/core/testing";
import { StripeSandbox } from "@idem/sandbox";
import { DIALECTS, ledgersFor, scaled } from "@idem/testkit";
import { stripeActions } from "@idem/stripe";
import { CARD } from "./cards.js";

/** 1 s on a quiet machine: a list Stripe answers at once is not cut on a loaded one. */
const DEADLINE_MS = scaled(1_000);
let sandbox: StripeSandbox;
let server: { port: number; apiKey: string };
beforeAll(async () => {
  sandbox = new StripeSandbox();
  server = await sandbox.start();
});
afterEach(() => sandbox.faults.clear());
afterAll(() => sandbox?.close());

const stripe = () =>
  stripeActions({
    apiKey: server.apiKey,
    host: "127.0.0.1",
    port: server.port,
    protocol: "http",
    timeoutMs: 20_000,
    deadlineMs: DEADLINE_MS,
  });
/** Held far past the deadline (the sandbox's timer does not hold the process). */
const HELD_MS = 60_000;
let n = 0;
const tenant = () => `dl${++n}-${Math.random().toString(36).slice(2, 7)}`;
const CUT = `the request was cut at its deadline: no complete answer from Stripe within ${DEADLINE_MS} ms (deadlineMs)`;

for (const dialect of DIALECTS) {
  describe(`a Stripe lookup cut at its deadline, on ${dialect}`, () => {
    const db = ledgersFor(dialect, openTestLedger, { defaults: { poolSize: 2 } as TestLedgerOptions });

    /** A charge left unknown by the 500 that `kind` saved under its key: settled by a lookup, not a replay. */
    async function unknownCharge(kind: "error_after_commit" | "error_before_effect") {
      const s = stripe();
      const l = await db.open({ budget: { attempts: 1 }, actions: [s.paymentIntentsCreate] });
      const t = tenant();
      sandbox.faults.add({ kind, match: { method: "POST", path: "/v1/payment_intents" } });
      const first = await l.run(s.paymentIntentsCreate, { tenant: t, key: ["order", kind], args: CARD });
      sandbox.faults.clear();
      expect(first).toMatchObject({ status: "pending_verification", state: "unknown" });
      return { l, t, id: first.status === "pending_verification" ? first.operationId : "" };
    }

    it(
      "Search and the list both cut: the check's stored reason names deadlineMs and its value, not stripe-node's timeout",
      async () => {
        const { l, t, id } = await unknownCharge("error_after_commit");
        sandbox.faults.add({
          kind: "delay_after_commit",
          match: { method: "GET", path: "/v1/payment_intents" },
          delayMs: HELD_MS,
          times: 10,
        });
        const started = Date.now();
        const settled = await l.daemon.settle({ tenant: t, id });
        const took = Date.now() - started;
        const { operation, events } = await l.get({ tenant: t, id });
        // Before: "inconclusive: lookup failed: Error: Request aborted due to timeout being reached
        // (20000ms)", after about 2 s (Search and the list, each cut at 1 s): no 20 s timeout ran out.
        expect({
          settled: settled.status === "pending_verification" ? settled.state : settled.status,
          stored: operation.reason,
          event: events.at(-1)?.reason,
        }).toEqual({
          settled: "unknown",
          stored: `inconclusive: lookup failed: StripeConnectionError: ${CUT}`,
          event: `inconclusive: lookup failed: StripeConnectionError: ${CUT}`,
        });
        expect(took).toBeLessThan(scaled(15_000));
      },
      scaled(60_000),
    );

    it(
      "Search cut, the list read: the stored reason of the absence says Search was cut at the deadline",
      async () => {
        // Nothing charged (the 500 came before the effect), and Stripe holds the key: a person decides.
        const { l, t, id } = await unknownCharge("error_before_effect");
        sandbox.faults.add({
          kind: "delay_after_commit",
          match: { method: "GET", path: "/v1/payment_intents/search" },
          delayMs: HELD_MS,
        });
        const settled = await l.daemon.settle({ tenant: t, id });
        const { operation } = await l.get({ tenant: t, id });
        // Before: "… (Stripe Search failed (Request aborted due to timeout being reached (20000ms)); …".
        expect(settled).toMatchObject({ status: "pending_verification", state: "needs_review" });
        expect(operation.reason).toContain(
          `absent at Stripe (Stripe Search failed (${CUT}); not in the list of the objects created around our attempts)`,
        );
        expect(operation.reason).not.toMatch(/timeout being reached/);
      },
      scaled(60_000),
    );
  });
}
