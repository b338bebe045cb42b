/**
 * Stripe promises to keep an idempotency key at least 24 h, not to forget it then: "you can remove
 * keys from the system automatically after they're at least 24 hours old"
 * (docs.stripe.com/api/idempotent_requests). The sandbox prunes at 24 h by default; here it keeps
 * keys 72 h, a Stripe that prunes late. A payment whose first request began executing and failed
 * before its effect (a 500 saved under the key, nothing charged), looked up a day later: absent,
 * so it runs again with its key, and Stripe answers with the saved 500 again (Idempotent-Replayed).
 * Nothing is charged, nothing is reported done or failed, and a person decides rather than a loop
 * of replays of the same 500.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { openTestLedger, type TestLedgerOptions } from "@idem/core/testing";
import { StripeSandbox } from "@idem/sandbox";
import { ledgersFor } from "@idem/testkit";
import { stripeActions } from "@idem/stripe";
import { CARD } from "./cards.js";

const HOUR = 3_600_000;
let sandbox: StripeSandbox;
let server: { port: number; apiKey: string };
let skew = 0;
const advance = (ms: number) => {
  skew += ms;
  sandbox.advance(ms);
};
beforeAll(async () => {
  sandbox = new StripeSandbox({ keyRetentionMs: 72 * HOUR });
  server = await sandbox.start();
});
afterAll(() => sandbox.close());

const stripe = () =>
  stripeActions({ apiKey: server.apiKey, host: "127.0.0.1", port: server.port, protocol: "http", timeoutMs: 5_000 });

describe("a Stripe that keeps our key past 24 h", () => {
  const db = ledgersFor("sqlite", openTestLedger, { defaults: { poolSize: 2 } as TestLedgerOptions, prepare: true });

  it("a saved 500 with nothing charged, found absent a day later: the rerun with the key meets the 500 again, and a person decides", async () => {
    const s = stripe();
    const pay = s.paymentIntentsCreate;
    const l = await db.open({ clock: () => Date.now() + skew, budget: { attempts: 1 }, actions: [pay] });
    const t = `kk-${Math.random().toString(36).slice(2, 7)}`;
    const before = sandbox.count("payment_intents");
    sandbox.faults.add({ kind: "error_before_effect", match: { path: "/v1/payment_intents" } });
    const first = await l.run(pay, { tenant: t, key: ["invoice", "in_1"], args: { ...CARD } });
    expect(first).toMatchObject({ status: "pending_verification", state: "unknown" });
    const id = first.status === "pending_verification" ? first.operationId : "";
    const key = sandbox.requests.at(-1)!.idempotencyKey;
    const sent = () =>
      sandbox.requests
        .filter((r) => r.method === "POST" && r.path === "/v1/payment_intents" && r.idempotencyKey === key)
        .map((r) => `${r.status}${r.replayed ? " replayed" : ""}`);

    // A day later (past the 24 h Stripe promises), the lookup proves the payment absent and the
    // operation runs again with its key: Stripe, still holding it, replays the saved 500.
    advance(25 * HOUR);
    const again = await l.daemon.settle({ tenant: t, id });
    expect(again).toMatchObject({ status: "pending_verification", state: "unknown" });
    expect(again.status === "pending_verification" && again.reason).toMatch(
      /Stripe replayed what it saved under our key/,
    );
    expect(sent()).toEqual(["500", "500 replayed"]);

    // Absent again, and the key is known held: a person decides; no further replay is sent.
    advance(HOUR);
    const settled = await l.daemon.settle({ tenant: t, id });
    expect(settled).toMatchObject({ status: "pending_verification", state: "needs_review" });
    expect(settled.status === "pending_verification" && settled.reason).toMatch(/but Stripe holds our key/);
    advance(HOUR);
    await l.daemon.settle({ tenant: t, id });
    expect(sent()).toEqual(["500", "500 replayed"]);
    expect(sandbox.count("payment_intents") - before).toBe(0);
  });
});
