/**
 * A payment intent's answer arrives late: its lease ran out meanwhile, and the daemon's lookup
 * (Search, a day on: past Stripe's 24 h key window, where no dedupe by key covers the two) recorded
 * the intent it found. The lookup's receipt and the late answer's are built by different code
 * (stripe-reconcile.ts, stripe-actions.ts); the action's `effectId` must call them one effect when
 * they name one intent (no "two effects" alert), and two when the lookup found another intent with
 * our key (alerted, never a silent duplicate). Through the real stripe SDK to the Stripe sandbox,
 * counted at the target: the sandbox's payment intents with our key.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { operationKey } from "@idem/core";
import { openTestLedger, type TestLedgerOptions } from "@idem/core/testing";
import { StripeSandbox } from "@idem/sandbox";
import { DIALECTS, gatedProxy, ledgersFor, scaled } from "@idem/testkit";
import { stripeActions } from "@idem/stripe";
import { CARD } from "./cards.js";

const HOUR = 3_600_000;

let sandbox: StripeSandbox;
let server: { port: number; url: string; apiKey: string };
beforeAll(async () => {
  sandbox = new StripeSandbox();
  server = await sandbox.start();
});
afterAll(() => sandbox.close());

// The client waits longer than any hold: the answer is late, not lost.
const stripe = (port: number) =>
  stripeActions({ apiKey: server.apiKey, host: "127.0.0.1", port, protocol: "http", timeoutMs: scaled(60_000) });
const intentsWith = (key: string) =>
  sandbox.objects.all("payment_intents").filter((pi) => pi.metadata?.idem_operation === key);

for (const dialect of DIALECTS) {
  describe(`a late answer after a lookup, Stripe on ${dialect}`, () => {
    const db = ledgersFor(dialect, openTestLedger, { defaults: { poolSize: 2 } as TestLedgerOptions, prepare: true });

    /**
     * Holds the create's answer (`hold: "answer"`: the intent is made now) or the create itself
     * (`"request"`: made on release); meanwhile, a day on, the daemon settles the operation by
     * lookup; then lets the create go on. `meanwhile` runs before the lookup, with our key;
     * `before`, with our key too, before the operation begins. `ack`: the alert of the lookup's
     * settlement is delivered (acknowledged, as the daemon's sinks do) before the answer goes on.
     */
    async function lateCreate(
      hold: "answer" | "request",
      meanwhile?: (key: string) => Promise<void>,
      { before, ack = false }: { before?: (key: string) => Promise<void>; ack?: boolean } = {},
    ) {
      const proxy = await gatedProxy(server.url, { method: "POST", path: "/v1/payment_intents", hold });
      try {
        const s = stripe(proxy.port);
        let skew = 0;
        const l = await db.open({ clock: () => Date.now() + skew, actions: [s.paymentIntentsCreate] });
        const tenant = `late-${Math.random().toString(36).slice(2, 8)}`;
        const parts = ["order", "late"];
        await before?.(operationKey({ tenant, action: s.paymentIntentsCreate.type, parts }).hash);
        const run = l.run(s.paymentIntentsCreate, { tenant, key: parts, args: CARD });
        await proxy.held;
        const [op] = await l.admin.list({ tenant });
        await meanwhile?.(op!.key);
        skew += 25 * HOUR; // its lease long gone, and Stripe's key window: settled by Search, not a replay
        const found = await l.daemon.settle({ tenant, id: op!.id, actor: "daemon" });
        const alertedAtSettle = (await l.daemon.alertsDue({ limit: 1_000 })).find((a) => a.id === op!.id);
        if (ack && alertedAtSettle) await l.daemon.ackAlert(alertedAtSettle);
        proxy.release();
        const caller = await run;
        const { operation, events } = await l.get({ tenant, id: op!.id });
        const alerted = (await l.daemon.alertsDue({ limit: 1_000 })).some((a) => a.id === op!.id);
        const twoEffects = [operation.reason, ...events.map((e) => e.reason)].some((r) => /two effects/.test(r ?? ""));
        return { key: op!.key, found, caller, operation, alerted, alertedAtSettle: !!alertedAtSettle, twoEffects };
      } finally {
        await proxy.close();
      }
    }

    it("the lookup's receipt and the late answer name one intent: one effect, succeeded, not alerted", async () => {
      const out = await lateCreate("answer");
      const intents = intentsWith(out.key);
      expect(intents).toHaveLength(1);
      const id = intents[0]!.id;
      expect(out.found).toMatchObject({ status: "succeeded", receipt: { id, requestId: null } });
      expect(out.caller).toMatchObject({ status: "succeeded", receipt: { id, requestId: expect.any(String) } });
      expect({
        status: out.operation.status,
        id: (out.operation.result as { id: string }).id,
        alerted: out.alerted,
        twoEffects: out.twoEffects,
      }).toEqual({ status: "succeeded", id, alerted: false, twoEffects: false });
    });

    it("the lookup found another intent with our key, and ours commits late: two effects, alerted", async () => {
      const other = stripe(server.port).client;
      const out = await lateCreate("request", async (key) => {
        // Made out of band with our key (a person's manual charge, tagged to match): the lookup finds it.
        await other.paymentIntents.create({ ...CARD, metadata: { idem_operation: key } });
      });
      const intents = intentsWith(out.key);
      expect(intents).toHaveLength(2);
      const [first, second] = intents.map((pi) => pi.id);
      expect(out.found).toMatchObject({ status: "succeeded", receipt: { id: first } });
      // The caller is told its own request took effect; the row keeps the receipt it replays.
      expect(out.caller).toMatchObject({ status: "succeeded", receipt: { id: second } });
      expect({
        status: out.operation.status,
        id: (out.operation.result as { id: string }).id,
        alerted: out.alerted,
        twoEffects: out.twoEffects,
      }).toEqual({ status: "succeeded", id: first, alerted: true, twoEffects: true });
    });

    it("the lookup found two intents with our key, ours among them, and its answer comes late: one incident, alerted once; the receipt names both", async () => {
      const other = stripe(server.port).client;
      let earlier = "";
      const out = await lateCreate("answer", undefined, {
        // Made out of band with our key just before our request (another process): older than ours.
        before: async (key) => {
          earlier = (await other.paymentIntents.create({ ...CARD, metadata: { idem_operation: key } })).id;
        },
        ack: true,
      });
      const intents = intentsWith(out.key).map((pi) => pi.id);
      expect(intents).toHaveLength(2);
      const ours = intents.find((id) => id !== earlier)!;
      // The lookup settled on the older and alerted both: the incident, told once. Before: alerted
      // again once acknowledged ("two effects: attempt 1's request took effect too …") for the
      // second intent the first alert already named.
      expect({
        alertedAtSettle: out.alertedAtSettle,
        status: out.operation.status,
        reason: out.operation.reason,
        alerted: out.alerted,
      }).toEqual({
        alertedAtSettle: true,
        status: "succeeded",
        reason: expect.stringMatching(new RegExp(`^two effects: the lookup found .*${earlier}.*${ours}`)),
        alerted: false,
      });
      // The receipt recorded and replayed names both; the late caller is told its own request's.
      expect(out.found).toMatchObject({ status: "succeeded", receipt: { id: earlier, others: [ours] } });
      expect(out.operation.result).toMatchObject({ id: earlier, others: [ours] });
      expect(out.caller).toMatchObject({ status: "succeeded", receipt: { id: ours } });
    });
  });
}
