/**
 * The Stripe and HubSpot settings of the config that the agents' actions take too, handed to the
 * actions the daemon settles with: Stripe's `apiVersion` (an agent that pins one had the daemon's
 * replays with its key sent under the SDK's default), `deadlineMs` and `searchLagMs`, HubSpot's
 * `deadlineMs`. Seen where they act: the API version on the request the Stripe sandbox received,
 * a replay or a read cut at the configured deadline, the configured lag in a lookup's reason. A
 * bad value is refused, naming the setting. The daemon in this process, each test on a database
 * of its own (its tick claims only that test's rows), on SQLite and Postgres.
 */
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import { openLedger, type Ledger } from "@idem/core";
import { HubSpotSandbox, StripeSandbox } from "@idem/sandbox";
import { DIALECTS, freshDatabase, scaled } from "@idem/testkit";
import { hubspotActions } from "@idem/hubspot";
import { stripeActions } from "@idem/stripe";
import { pino } from "pino";
import { ConfigError, actionsOf, parseConfig, toolsOf } from "../src/config.js";
import { Daemon } from "../src/daemon.js";
import { DaemonMetrics } from "../src/metrics.js";
import { until } from "./support.js";

const silent = pino({ level: "silent" });
const STRIPE_KEY_ENV = "IDEM_TEST_CONFIG_STRIPE_KEY";
const HUBSPOT_TOKEN_ENV = "IDEM_TEST_CONFIG_HUBSPOT_TOKEN";
/** An API version other than stripe-node's default (2026-10-28.endive for stripe-node 23.1). */
const PINNED = "2024-06-20";
/**
 * The deadline configured here: 500 ms on a quiet machine, so that an answer the sandbox gives at
 * once is not cut on a loaded one.
 */
const DEADLINE_MS = scaled(500);
/** Held far past any deadline here (the sandboxes' timers do not hold the process). */
const HELD_MS = 60_000;

let stripe: StripeSandbox;
let stripeAt: { port: number; apiKey: string };
let hubspot: HubSpotSandbox;
let hubspotAt: { basePath: string; accessToken: string };
beforeAll(async () => {
  stripe = new StripeSandbox();
  hubspot = new HubSpotSandbox();
  [stripeAt, hubspotAt] = await Promise.all([stripe.start(), hubspot.start()]);
  process.env[STRIPE_KEY_ENV] = stripeAt.apiKey;
  process.env[HUBSPOT_TOKEN_ENV] = hubspotAt.accessToken;
  await hubspotActions({ accessToken: hubspotAt.accessToken, basePath: hubspotAt.basePath }).ensureSchema(["contacts"]);
});
const ledgers: Ledger[] = [];
afterEach(async () => {
  stripe.faults.clear();
  hubspot.faults.clear();
  for (const l of ledgers.splice(0)) await l.close();
});
afterAll(async () => {
  delete process.env[STRIPE_KEY_ENV];
  delete process.env[HUBSPOT_TOKEN_ENV];
  await Promise.all([stripe?.close(), hubspot?.close()]);
});

const stripeSection = (more: Record<string, unknown> = {}) => ({
  apiKeyEnv: STRIPE_KEY_ENV,
  host: "127.0.0.1",
  port: stripeAt.port,
  protocol: "http",
  ...more,
});
const hubspotSection = (more: Record<string, unknown> = {}) => ({
  accessTokenEnv: HUBSPOT_TOKEN_ENV,
  basePath: hubspotAt.basePath,
  objectTypes: ["contacts"],
  ...more,
});
const CARD = {
  amount: 2000,
  currency: "usd",
  payment_method: "pm_card_visa",
  confirm: true,
  automatic_payment_methods: { enabled: true, allow_redirects: "never" },
} as const;
let n = 0;
const tenant = () => `cp${++n}-${Math.random().toString(36).slice(2, 7)}`;

describe("providers.stripe and providers.hubspot settings, read", () => {
  it("takes apiVersion, deadlineMs and searchLagMs (Stripe) and deadlineMs (HubSpot) as the adapters do", () => {
    const config = parseConfig({
      providers: {
        stripe: stripeSection({ apiVersion: "2025-03-31.basil", deadlineMs: 30_000, searchLagMs: 0 }),
        hubspot: hubspotSection({ deadlineMs: 2_147_483_647 }),
      },
    });
    expect(config.providers.stripe).toMatchObject({
      apiVersion: "2025-03-31.basil",
      deadlineMs: 30_000,
      searchLagMs: 0,
    });
    expect(config.providers.hubspot).toMatchObject({ deadlineMs: 2_147_483_647 });
    // Before: each refused as an unknown key of its provider ("providers.stripe: Unrecognized key").
  });

  it("takes the agents' connected account (stripeAccount): the daemon's Stripe requests are sent on it", async () => {
    const account = "acct_1DaemonConfig";
    stripe.connectAccount(account);
    const config = parseConfig({ providers: { stripe: stripeSection({ stripeAccount: account }) } });
    expect(config.providers.stripe).toMatchObject({ stripeAccount: account });
    // The action an operation whose account was never recorded is sent with by the daemon: before,
    // the daemon's config could name no account, and such an operation was charged on the platform.
    const action = (await actionsOf(config)).find((a) => a.type === "stripe.paymentIntents.create")!;
    const ledger = await openLedger("sqlite::memory:", { actions: [action] });
    try {
      const t = tenant();
      const out = await ledger.run(action, { tenant: t, key: ["order", "on-account"], args: CARD });
      expect(out).toMatchObject({ status: "succeeded", receipt: { account } });
      const key = (await ledger.get({ tenant: t, id: out.operationId })).operation.key;
      expect(stripe.requests.filter((r) => r.idempotencyKey === key).map((r) => r.stripeAccount)).toEqual([account]);
    } finally {
      await ledger.close();
    }
  });

  it("refuses a bad value, naming the setting", () => {
    const bad: [Record<string, unknown>, string][] = [
      [{ stripe: stripeSection({ deadlineMs: 0 }) }, "stripe.deadlineMs"],
      [{ stripe: stripeSection({ deadlineMs: 1.5 }) }, "stripe.deadlineMs"],
      [{ stripe: stripeSection({ deadlineMs: 2 ** 31 }) }, "stripe.deadlineMs"],
      [{ stripe: stripeSection({ deadlineMs: "1000" }) }, "stripe.deadlineMs"],
      [{ stripe: stripeSection({ searchLagMs: -1 }) }, "stripe.searchLagMs"],
      [{ stripe: stripeSection({ searchLagMs: 0.5 }) }, "stripe.searchLagMs"],
      [{ stripe: stripeSection({ searchLagMs: 2 ** 31 }) }, "stripe.searchLagMs"],
      [{ stripe: stripeSection({ searchLagMs: Number.NaN }) }, "stripe.searchLagMs"],
      [{ stripe: stripeSection({ apiVersion: "latest" }) }, "stripe.apiVersion"],
      // A header value stripe-node would send as it is: a request Node refuses, or another header.
      [{ stripe: stripeSection({ apiVersion: `${PINNED}\r\nStripe-Account: acct_1` }) }, "stripe.apiVersion"],
      [{ stripe: stripeSection({ apiVersion: 20240620 }) }, "stripe.apiVersion"],
      [{ stripe: stripeSection({ stripeAccount: "acct 1" }) }, "stripe.stripeAccount"],
      [{ stripe: stripeSection({ stripeAccount: "cus_1" }) }, "stripe.stripeAccount"],
      [{ hubspot: hubspotSection({ deadlineMs: 0 }) }, "hubspot.deadlineMs"],
      [{ hubspot: hubspotSection({ deadlineMs: Number.POSITIVE_INFINITY }) }, "hubspot.deadlineMs"],
      [{ hubspot: hubspotSection({ deadlineMs: 2.5 }) }, "hubspot.deadlineMs"],
    ];
    for (const [providers, field] of bad) {
      const read = () => parseConfig({ providers });
      expect(read, JSON.stringify(providers)).toThrow(ConfigError);
      expect(read, JSON.stringify(providers)).toThrow(new RegExp(`\\n  providers\\.${field.replace(".", "\\.")}: `));
    }
  });

  it("refuses a Stripe apiVersion that is not a calendar date, naming the setting, before any request", async () => {
    // Well formed, so the schema takes it (it cannot load @idem/stripe, an optional peer, to ask):
    // the adapter's check does, when the daemon's (or `idem mcp`'s) Stripe actions are made.
    const refusal = async (apiVersion: string, of: typeof actionsOf | typeof toolsOf) => {
      const config = parseConfig({ providers: { stripe: stripeSection({ apiVersion }) } }, "idem.config.json");
      return of(config).then(
        () => undefined,
        (e: unknown) => e,
      );
    };
    const sent = stripe.requests.length;
    for (const [apiVersion, why] of [
      ["2024-13-45", "there is no month 13"],
      ["2024-02-30", "month 02 of 2024 has 29 days"],
      ["2025-02-29.basil", "month 02 of 2025 has 28 days"],
    ] as const)
      for (const of of [actionsOf, toolsOf]) {
        // Before: taken; Stripe refused the version at the daemon's first replay.
        const error = await refusal(apiVersion, of);
        expect(error, `${apiVersion} (${of.name})`).toBeInstanceOf(ConfigError);
        expect((error as ConfigError).message).toBe(
          `invalid config idem.config.json:\n  providers.stripe.apiVersion: ${apiVersion.slice(0, 10)} is not a calendar date: ${why}`,
        );
      }
    expect(await refusal("2024-02-29", actionsOf)).toBeUndefined();
    expect(stripe.requests.length).toBe(sent);
  });
});

for (const dialect of DIALECTS) {
  describe(`the daemon's Stripe and HubSpot actions take the config's settings, on ${dialect}`, () => {
    /**
     * A daemon on a database of its own, with the config's actions, and a ledger for the agent's
     * call (its own action, no action of the config's registered).
     */
    async function daemonWith(providers: Record<string, unknown>, name: string) {
      const url = await freshDatabase(dialect);
      const config = parseConfig({ ledger: url, providers });
      const ledger = await openLedger(url, { poolSize: 2, actions: await actionsOf(config) });
      ledgers.push(ledger);
      const agent = await openLedger(url, { poolSize: 2, budget: { attempts: 1, baseDelayMs: 10 } });
      ledgers.push(agent);
      const daemon = new Daemon(ledger, config, silent, new DaemonMetrics(ledger, 1_000), name);
      const actor = `idem-daemon:${name}`;
      /**
       * Ticks until a tick has settled the operation (a tick ends once its settlements have), then
       * the operation and the reasons of the daemon's moves of it.
       */
      const settledOnce = async (t: string, id: string) => {
        await until(
          async () => {
            await daemon.tick();
            return (await ledger.get({ tenant: t, id })).events.some((e) => e.actor === actor);
          },
          30_000,
          `the daemon's settlement of ${id}`,
        );
        const { operation, events } = await ledger.get({ tenant: t, id });
        return { operation, reasons: events.filter((e) => e.actor === actor).map((e) => e.reason) };
      };
      return { agent, settledOnce };
    }

    /** A charge at the Stripe sandbox left unknown by `fault` (the agent's own action, API version `apiVersion`). */
    async function unknownCharge(
      agent: Ledger,
      fault: "drop_after_commit" | "error_after_commit",
      apiVersion?: string,
    ): Promise<{ t: string; id: string }> {
      const action = stripeActions({
        apiKey: stripeAt.apiKey,
        host: "127.0.0.1",
        port: stripeAt.port,
        protocol: "http",
        ...(apiVersion && { apiVersion }),
      }).paymentIntentsCreate;
      const t = tenant();
      // Dropped twice: stripe-node sends again once by itself after a closed connection.
      const times = fault === "drop_after_commit" ? 2 : 1;
      stripe.faults.add({ kind: fault, match: { method: "POST", path: "/v1/payment_intents" }, times });
      const out = await agent.run(action, { tenant: t, key: ["order", fault], args: CARD });
      stripe.faults.clear();
      expect(out).toMatchObject({ status: "pending_verification", state: "unknown" });
      return { t, id: out.status === "pending_verification" ? out.operationId : "" };
    }

    it(
      "Stripe's apiVersion: the daemon's replay with the agent's key is sent under the agent's API version",
      async () => {
        const { agent, settledOnce } = await daemonWith(
          { stripe: stripeSection({ apiVersion: PINNED }) },
          `d-version-${dialect}`,
        );
        const { t, id } = await unknownCharge(agent, "drop_after_commit", PINNED);
        const { operation } = await settledOnce(t, id);
        const sent = stripe.requests
          .filter((r) => r.method === "POST" && r.idempotencyKey === operation.key)
          .map((r) => `${r.status}${r.replayed ? " replayed" : ""} ${r.stripeVersion}`);
        // The agent's request (dropped), stripe-node's own resend of it (dropped), the daemon's
        // replay. Without the setting, that replay went under stripe-node's default version
        // ("200 replayed 2026-10-28.endive"): another request than the agent's.
        expect({ status: operation.status, sent }).toEqual({
          status: "succeeded",
          sent: [`dropped ${PINNED}`, `dropped replayed ${PINNED}`, `200 replayed ${PINNED}`],
        });
      },
      scaled(60_000),
    );

    it(
      "Stripe's deadlineMs: the daemon's replay whose answer does not come is cut at the configured deadline",
      async () => {
        const { agent, settledOnce } = await daemonWith(
          { stripe: stripeSection({ deadlineMs: DEADLINE_MS }) },
          `d-deadline-${dialect}`,
        );
        const { t, id } = await unknownCharge(agent, "drop_after_commit");
        stripe.faults.add({
          kind: "delay_after_commit",
          match: { method: "POST", path: "/v1/payment_intents" },
          delayMs: HELD_MS,
        });
        const started = Date.now();
        const { operation, reasons } = await settledOnce(t, id);
        // Cut at the deadline (ambiguous: unknown), then the settlement's next replay with the key is
        // answered (the fault held one answer). With the adapter's deadline (2 min) and its
        // inactivity timeout (20 s), the held answer would have held the tick past the test's bound.
        expect({ status: operation.status, reasons }).toEqual({
          status: "succeeded",
          reasons: expect.arrayContaining([
            `ambiguous: connection cut after sending: no complete answer from Stripe within ${DEADLINE_MS} ms (deadlineMs)`,
          ]),
        });
        expect(Date.now() - started).toBeLessThan(scaled(15_000));
      },
      scaled(60_000),
    );

    it(
      "Stripe's searchLagMs: the daemon's lookup waits out the configured lag, not the adapter's 90 s",
      async () => {
        const { agent, settledOnce } = await daemonWith(
          { stripe: stripeSection({ searchLagMs: 45_000 }) },
          `d-lag-${dialect}`,
        );
        // A 500 saved under the key (after the intent was made): settled by a lookup, not a replay.
        const { t, id } = await unknownCharge(agent, "error_after_commit");
        const lag = stripe.searchLagMs;
        stripe.searchLagMs = 3_600_000; // Search does not show the intent yet
        try {
          const { operation, reasons } = await settledOnce(t, id);
          // With the adapter's default: "… it may lag 90000 ms".
          expect({ status: operation.status, reasons }).toEqual({
            status: "unknown",
            reasons: expect.arrayContaining(["inconclusive: not in Stripe Search yet; it may lag 45000 ms"]),
          });
        } finally {
          stripe.searchLagMs = lag;
        }
      },
      scaled(60_000),
    );

    it(
      "HubSpot's deadlineMs: the daemon's read by the key whose answer does not come is cut at the configured deadline",
      async () => {
        const { agent, settledOnce } = await daemonWith(
          { hubspot: hubspotSection({ deadlineMs: DEADLINE_MS, settleMs: 0 }) },
          `d-hs-deadline-${dialect}`,
        );
        const crm = hubspotActions({ accessToken: hubspotAt.accessToken, basePath: hubspotAt.basePath });
        const t = tenant();
        // The upsert's answer lost after HubSpot wrote the record: unknown.
        hubspot.faults.add({ kind: "drop_after_commit", match: { method: "POST" } });
        const out = await agent.run(crm.create("contacts"), {
          tenant: t,
          key: ["lead"],
          args: { properties: { email: `lead-${t}@example.test` } },
        });
        hubspot.faults.clear();
        expect(out).toMatchObject({ status: "pending_verification", state: "unknown" });
        const id = out.status === "pending_verification" ? out.operationId : "";
        hubspot.faults.add({
          kind: "delay_after_commit",
          match: { method: "GET", path: "/crm/v3/objects/contacts" },
          delayMs: HELD_MS,
        });
        const started = Date.now();
        const { operation, reasons } = await settledOnce(t, id);
        // An inconclusive check, cut at the deadline. With the adapter's deadline (2 min) and its
        // inactivity timeout (20 s), the held answer would have held the tick past the test's bound.
        expect({ status: operation.status, reasons }).toEqual({
          status: "unknown",
          reasons: expect.arrayContaining([
            expect.stringMatching(
              new RegExp(
                `^inconclusive: lookup failed: .*no complete answer from HubSpot within ${DEADLINE_MS} ms \\(deadlineMs\\)$`,
              ),
            ),
          ]),
        });
        expect(Date.now() - started).toBeLessThan(scaled(15_000));
      },
      scaled(60_000),
    );
  });
}
