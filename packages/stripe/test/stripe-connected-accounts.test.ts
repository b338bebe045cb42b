/**
 * Connect's connected accounts (stripe-node's `stripeAccount`, and `stripeContext`, sent as the
 * `Stripe-Account` / `Stripe-Context` header) are not supported: the adapter sends every request,
 * the write, its replay and every lookup, on the API key's own account. A JavaScript caller who
 * names one anyway, in the adapter's config or in a request's args (where stripe-node's per-request
 * options go: stripe-node would send it as a parameter), is refused with an `InvalidValueError`
 * naming the option, nothing written and nothing sent; never charged on the platform account.
 * On SQLite and Postgres.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { InvalidValueError } from "@idem/core";
import { openTestLedger, type TestLedgerOptions } from "@idem/core/testing";
import { StripeSandbox } from "@idem/sandbox";
import { DIALECTS, ledgersFor } from "@idem/testkit";
import { stripeActions, type StripeActions, type StripeConfig } from "@idem/stripe";
import { CARD } from "./cards.js";

const OPTIONS = ["stripeAccount", "stripeContext"] as const;
const ACCOUNT = "acct_1ConnectedAcct";

let sandbox: StripeSandbox;
let server: { port: number; apiKey: string };
beforeAll(async () => {
  sandbox = new StripeSandbox();
  server = await sandbox.start();
});
afterAll(() => sandbox.close());

/** The actions as a JavaScript caller makes them: with settings TypeScript would not let through. */
const stripe = (more: Record<string, unknown> = {}) =>
  stripeActions({
    apiKey: server.apiKey,
    host: "127.0.0.1",
    port: server.port,
    protocol: "http",
    timeoutMs: 5_000,
    ...more,
  } as StripeConfig);
const piCount = () => sandbox.count("payment_intents");
let n = 0;
const tenant = () => `t${++n}-${Math.random().toString(36).slice(2, 7)}`;

/** Each action with args it would send, and how a caller would add stripe-node's option to them. */
const ACTIONS: [string, (s: StripeActions) => StripeActions["customersCreate"], Record<string, unknown>][] = [
  ["customersCreate", (s) => s.customersCreate, { email: "a@example.com" }],
  ["paymentIntentsCreate", (s) => s.paymentIntentsCreate as never, { ...CARD }],
  ["refundsCreate", (s) => s.refundsCreate as never, { payment_intent: "pi_123" }],
  ["post(/v1/products)", (s) => s.post("/v1/products") as never, { name: "Tea" }],
];

for (const dialect of DIALECTS) {
  describe(`a connected account on ${dialect}`, () => {
    const db = ledgersFor(dialect, openTestLedger, { defaults: { poolSize: 2 } as TestLedgerOptions, prepare: true });

    it.each(OPTIONS)(
      "%s in the adapter's config is refused when the actions are made, naming it; nothing is sent",
      async (option) => {
        const l = await db.open();
        const t = tenant();
        const before = piCount();
        const sent = sandbox.requests.length;
        let refused: unknown;
        let out: unknown;
        try {
          const s = stripe({ [option]: ACCOUNT });
          out = await l.run(s.paymentIntentsCreate, { tenant: t, key: ["connected-charge"], args: CARD });
        } catch (error) {
          refused = error;
        }
        // Before: taken and ignored; the card charged on the platform account (no Stripe-Account).
        expect({ out, charged: piCount() - before, requests: sandbox.requests.slice(sent) }).toEqual({
          out: undefined,
          charged: 0,
          requests: [],
        });
        expect(refused).toBeInstanceOf(InvalidValueError);
        expect(refused).toMatchObject({
          path: option,
          reason: expect.stringContaining("connected accounts are not supported"),
        });
        expect(await l.admin.list({ tenant: t })).toEqual([]);
      },
    );

    it("an absent account (undefined) is the platform account, as stripe-node reads it", async () => {
      const l = await db.open();
      const s = stripe({ stripeAccount: undefined });
      const out = await l.run(s.paymentIntentsCreate, { tenant: tenant(), key: ["platform"], args: CARD });
      expect(out).toMatchObject({ status: "succeeded" });
      expect(sandbox.requests.at(-1)).toMatchObject({ status: 200, stripeAccount: undefined });
    });

    for (const [name, pick, args] of ACTIONS)
      it.each(OPTIONS)(`${name}: %s in the args is refused before anything is written or sent`, async (option) => {
        const l = await db.open();
        const t = tenant();
        const before = piCount();
        const sent = sandbox.requests.length;
        const run = l.run(pick(stripe()), {
          tenant: t,
          key: ["connected", name],
          args: { ...args, [option]: ACCOUNT },
        });
        const refused = await run.then(
          (out) => ({ out, charged: piCount() - before, requests: sandbox.requests.slice(sent) }),
          (error: unknown) => error,
        );
        // Before: sent as a parameter named so; the sandbox, as a lenient Stripe, made the object on
        // the platform account (Stripe itself answers 400 parameter_unknown).
        expect(refused).toMatchObject({
          code: "INVALID_VALUE",
          path: `args.${option}`,
          reason: expect.stringContaining("connected accounts are not supported"),
        });
        expect(refused).toBeInstanceOf(InvalidValueError);
        expect(sandbox.requests.length).toBe(sent);
        expect(await l.admin.list({ tenant: t })).toEqual([]);
      });

    it("stripeAccount in args made by a function: failed as rejected before send, nothing sent", async () => {
      const l = await db.open();
      const t = tenant();
      const sent = sandbox.requests.length;
      const before = piCount();
      const out = await l.run(stripe().paymentIntentsCreate, {
        tenant: t,
        key: ["connected-lazy"],
        args: () => ({ ...CARD, stripeAccount: ACCOUNT }) as typeof CARD,
      });
      // Before: succeeded, the card charged on the platform account.
      expect({ out, charged: piCount() - before }).toMatchObject({
        out: { status: "failed", error: { kind: "rejected", reason: expect.stringContaining("args.stripeAccount") } },
        charged: 0,
      });
      expect(sandbox.requests.length).toBe(sent);
    });
  });
}
