/**
 * Stripe keeps an idempotency key for 24 h from the first request that carried it
 * (docs.stripe.com/api/idempotent_requests), not from the operation's creation. An operation whose
 * first request left a day after it was created (left pending by a 429 and a spent budget, or a
 * person's retry) and whose answer was lost is replayed with its key while Stripe holds it (the
 * ledger's `first_execution_at`, `op.firstSentAt`). Before: a generic POST went to a person at
 * once ("key retention passed and the provider cannot be queried"), counted from creation.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { openTestLedger, type TestLedgerOptions } from "@idem/core/testing";
import { StripeSandbox } from "@idem/sandbox";
import { ledgersFor } from "@idem/testkit";
import { stripeActions } from "@idem/stripe";

const HOUR = 3_600_000;
let sandbox: StripeSandbox;
let server: { port: number; apiKey: string };
let skew = 0;
const advance = (ms: number) => {
  skew += ms;
  sandbox.advance(ms);
};
beforeAll(async () => {
  sandbox = new StripeSandbox();
  server = await sandbox.start();
});
afterAll(() => sandbox.close());

const stripe = () =>
  stripeActions({ apiKey: server.apiKey, host: "127.0.0.1", port: server.port, protocol: "http", timeoutMs: 5_000 });

describe("review: Stripe's key window counts from the key's first request, not the operation's creation", () => {
  const db = ledgersFor("sqlite", openTestLedger, { defaults: { poolSize: 2 } as TestLedgerOptions, prepare: true });

  it("a generic POST first sent a day after its operation was created, its answer lost: replayed, not a person's question", async () => {
    const s = stripe();
    const products = s.post("/v1/products");
    const l = await db.open({ clock: () => Date.now() + skew, budget: { attempts: 1 }, actions: [products] });
    const t = `kw-${Math.random().toString(36).slice(2, 7)}`;
    const args = { name: "Gold plan" };
    // Rate limited before anything ran (429, not saved under the key): known not done, pending.
    sandbox.faults.add({ kind: "rate_limit", match: { path: "/v1/products" }, retryAfterSec: 1 });
    const first = await l.run(products, { tenant: t, key: ["product", "gold"], args });
    expect(first).toMatchObject({ status: "pending_verification", state: "pending" });
    const before = sandbox.count("products");

    advance(25 * HOUR); // nobody retried it for a day; Stripe has never seen the key
    // Now the request leaves for the first time, commits, and its answer is lost (twice:
    // stripe-node retries a reset connection once by itself).
    sandbox.faults.add({ kind: "drop_after_commit", match: { path: "/v1/products" }, times: 2 });
    const out = await l.run(products, { tenant: t, key: ["product", "gold"], args });
    expect(sandbox.count("products") - before).toBe(1);
    const made = sandbox.objects.all("products").at(-1)!;
    // Stripe holds the key for 24 h more: the replay with it returns the product.
    const settled =
      out.status === "pending_verification" && out.state !== "needs_review"
        ? await l.daemon.settle({ tenant: t, id: out.operationId })
        : out;
    // Before a fix: { status: "pending_verification", state: "needs_review",
    //   reason: "…key retention passed and the provider cannot be queried" }
    expect(settled.status === "pending_verification" ? `${settled.state}: ${settled.reason}` : settled.status).toBe(
      "succeeded",
    );
    expect(settled).toMatchObject({ status: "succeeded", receipt: { id: made.id } });
    expect(sandbox.count("products") - before).toBe(1);
  });
});
