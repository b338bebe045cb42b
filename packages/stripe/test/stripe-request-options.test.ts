/**
 * stripe-node's request options (`idempotencyKey`, `apiKey`, `apiVersion`, `timeout`, …) are its
 * second argument; stripe-node 23 sends whatever is in the first, the params, as the request's
 * parameters, named as given (its `isOptionsHash` is no longer consulted). An option a caller puts in
 * an action's args is therefore sent to Stripe as a parameter (Stripe: 400 parameter_unknown), and
 * an SDK that did read it as an option would send the caller's `idempotencyKey` in place of ours,
 * defeating the dedupe. Refused up front, naming the field: nothing written, nothing sent.
 * On SQLite and Postgres.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { InvalidValueError } from "@idem/core";
import { openTestLedger, type TestLedgerOptions } from "@idem/core/testing";
import type { StripeSandbox } from "@idem/sandbox";
import { DIALECTS, ledgersFor } from "@idem/testkit";
import type { StripeActions } from "@idem/stripe";
import { CARD } from "./cards.js";
import { actionsOn, type SandboxServer, startSandbox } from "./sandbox.js";

/** stripe-node's request options, its older name for the version, and its client's address settings. */
const OPTIONS: [string, unknown][] = [
  ["idempotencyKey", "caller-chosen-key"],
  ["apiKey", "sk_test_other"],
  ["apiVersion", "2024-06-20"],
  ["stripeVersion", "2024-06-20"],
  ["maxNetworkRetries", 3],
  ["timeout", 1_000],
  ["host", "api.example.com"],
  ["headers", { "Idempotency-Key": "caller-chosen-key" }],
];

let sandbox: StripeSandbox;
let server: SandboxServer;
beforeAll(async () => {
  ({ sandbox, server } = await startSandbox());
});
afterAll(() => sandbox.close());

const stripe = () => actionsOn(server);
let n = 0;
const tenant = () => `t${++n}-${Math.random().toString(36).slice(2, 7)}`;

const ACTIONS: [string, (s: StripeActions) => StripeActions["customersCreate"], Record<string, unknown>][] = [
  ["paymentIntentsCreate", (s) => s.paymentIntentsCreate as never, { ...CARD }],
  ["post(/v1/products)", (s) => s.post("/v1/products") as never, { name: "Tea" }],
];

for (const dialect of DIALECTS) {
  describe(`stripe-node request options in args on ${dialect}`, () => {
    const db = ledgersFor(dialect, openTestLedger, { defaults: { poolSize: 2 } as TestLedgerOptions, prepare: true });

    for (const [name, pick, args] of ACTIONS)
      it.each(OPTIONS)(
        `${name}: %s in the args is refused, naming it; nothing written or sent`,
        async (option, value) => {
          const l = await db.open();
          const t = tenant();
          const sent = sandbox.requests.length;
          const refused = await l
            .run(pick(stripe()), { tenant: t, key: ["options", name, option], args: { ...args, [option]: value } })
            .then(
              (out) => ({ out, requests: sandbox.requests.slice(sent) }),
              (error: unknown) => error,
            );
          // Before: sent as a parameter of that name (Stripe answers 400 parameter_unknown).
          expect(refused).toBeInstanceOf(InvalidValueError);
          expect(refused).toMatchObject({
            path: `args.${option}`,
            reason: expect.stringContaining("stripe-node request option"),
          });
          expect(sandbox.requests.length).toBe(sent);
          expect(await l.admin.list({ tenant: t })).toEqual([]);
        },
      );

    it("idempotencyKey in args made by a function: failed as rejected before send, our key never replaced", async () => {
      const l = await db.open();
      const sent = sandbox.requests.length;
      const out = await l.run(stripe().paymentIntentsCreate, {
        tenant: tenant(),
        key: ["options-lazy"],
        args: () => ({ ...CARD, idempotencyKey: "caller-chosen-key" }) as typeof CARD,
      });
      expect(out).toMatchObject({
        status: "failed",
        error: { kind: "rejected", reason: expect.stringContaining("args.idempotencyKey") },
      });
      expect(sandbox.requests.length).toBe(sent);
    });
  });
}
