/**
 * `idem_escalations_total`: each operation the daemon sends to a person because it passed the
 * daemon's limits (`maxChecks`, `maxAgeMs`) is counted once, whether or not the daemon's config
 * has its action. Before, a pending operation whose action the daemon lacks went to
 * a person past the limits, alerted, but uncounted. A review that passed no limit (nothing can
 * check the provider) and a row not yet past them are not counted.
 */
import { afterEach, describe, expect, it } from "vitest";
import { defineAction, openLedger, type Action } from "@idem/core";
import { openTestLedger } from "@idem/core/testing";
import { Daemon, DaemonMetrics, alertActions, parseConfig } from "@idem/cli";
import { pino } from "pino";
import { DIALECTS, freshDatabase, scaled } from "@idem/testkit";

const silent = pino({ level: "silent" });
const HOUR = 3_600_000;

/**
 * An action whose every request meets `answer`: a 503 before executing (known not done, pending)
 * or a socket closed after sending (unknown). Its lookup never proves anything.
 */
function provider(type: string, answer: "503" | "timeout", capabilities: Action<unknown, unknown>["capabilities"]) {
  return defineAction<{ note: string }, { id: string }>({
    type,
    capabilities,
    execute: async () => {
      throw new Error(answer === "503" ? "503 service unavailable" : "socket hang up");
    },
    classify: () =>
      answer === "503"
        ? { kind: "transient", reason: "503 service unavailable" }
        : { kind: "ambiguous", reason: "socket hang up after the request was sent" },
    reconcile: async () => ({ found: false, proof: "inconclusive", reason: "the provider's search lags" }),
  });
}

const cleanups: (() => Promise<unknown>)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c().catch(() => {});
});

for (const dialect of DIALECTS) {
  describe(`idem_escalations_total, ${dialect}`, () => {
    /**
     * An agent runs `action` once (its answer: pending or unknown); a daemon with `maxChecks` and a
     * day's `maxAgeMs`, whose ledger's clock `advance` moves on, has the action only if `registered`.
     */
    async function seeded(action: Action<{ note: string }, { id: string }>, registered: boolean, maxChecks = 20) {
      const url = await freshDatabase(dialect);
      const config = parseConfig({ ledger: url, alerts: { log: true }, daemon: { maxChecks, maxAgeMs: 24 * HOUR } });
      const agent = await openLedger(url, { poolSize: 1, budget: { attempts: 1 } });
      cleanups.push(() => agent.close());
      const out = await agent.run(action, { tenant: "t", key: ["job"], args: { note: "x" } });
      expect(out.status).toBe("pending_verification");
      let ahead = 0;
      const ledger = await openTestLedger(url, {
        poolSize: 2,
        budget: { attempts: 1 }, // one try a tick: the ticks below count them
        actions: [...alertActions(config, silent), ...(registered ? [action] : [])],
        clock: () => Date.now() + ahead,
      });
      cleanups.push(() => ledger.close());
      const metrics = new DaemonMetrics(ledger, 1_000);
      const daemon = new Daemon(ledger, config, silent, metrics, "d-escalations");
      return {
        daemon,
        advance: (ms: number) => {
          ahead += ms;
        },
        /** The row's status and reason, and the counter. */
        state: async () => {
          const { operation } = await ledger.get({ tenant: "t", id: out.operationId });
          const escalations = (await metrics.escalations.get()).values[0]?.value ?? 0;
          return { status: operation.status, reason: operation.reason, escalations };
        },
      };
    }

    it(
      "a pending operation whose action the daemon lacks, past maxAgeMs, goes to a person and is counted",
      async () => {
        const { daemon, advance, state } = await seeded(provider("crm.task", "503", {}), false);
        advance(25 * HOUR);
        await daemon.tick();
        // Before: { status: "needs_review", reason: "known not done, its last attempt 25 h ago …", escalations: 0 }.
        expect(await state()).toEqual({
          status: "needs_review",
          reason: expect.stringMatching(/^still not done after 25 h .*no action of type crm\.task is registered/),
          escalations: 1,
        });
      },
      scaled(60_000),
    );

    it(
      "an unknown outcome whose action the daemon lacks, past maxAgeMs, goes to a person and is counted",
      async () => {
        const { daemon, advance, state } = await seeded(provider("crm.note", "timeout", { lookup: true }), false);
        advance(25 * HOUR);
        await daemon.tick();
        expect(await state()).toEqual({
          status: "needs_review",
          reason: expect.stringMatching(/^still unknown after 25 h .*no action of type crm\.note is registered/),
          escalations: 1,
        });
      },
      scaled(60_000),
    );

    it(
      "an operation whose action the daemon lacks, within the limits, is left as it is and not counted",
      async () => {
        const { daemon, advance, state } = await seeded(provider("crm.task", "503", {}), false);
        advance(HOUR);
        expect(await daemon.tick()).toMatchObject({ failed: 1 }); // no action of type crm.task in the daemon's config
        expect(await state()).toMatchObject({ status: "pending", escalations: 0 });
      },
      scaled(60_000),
    );

    it(
      "work known not done that the provider refused maxChecks times goes to a person and is counted once",
      async () => {
        const { daemon, advance, state } = await seeded(provider("crm.task", "503", {}), true, 3);
        for (let tick = 0; tick < 4; tick++) {
          advance(2 * HOUR); // each try due, though the backoff doubles
          await daemon.tick();
        }
        expect(await state()).toEqual({
          status: "needs_review",
          reason: expect.stringMatching(/^still not done after 3 tries/),
          escalations: 1,
        });
      },
      scaled(60_000),
    );

    it(
      "an unknown outcome past maxAgeMs goes to a person and is counted",
      async () => {
        const { daemon, advance, state } = await seeded(provider("crm.note", "timeout", { lookup: true }), true);
        advance(25 * HOUR);
        await daemon.tick();
        expect(await state()).toEqual({
          status: "needs_review",
          reason: expect.stringMatching(/^still unknown after 25 h /),
          escalations: 1,
        });
      },
      scaled(60_000),
    );

    it(
      "an unknown outcome that nothing can check any more (its key forgotten, no lookup) goes to a person at once, no escalation",
      async () => {
        // Within the key's retention the daemon would replay it; an hour later the provider has forgotten the key.
        const keyed = provider("crm.keyed", "timeout", { dedupe: { retentionMs: HOUR, marginMs: 0 } });
        const { daemon, advance, state } = await seeded(keyed, true);
        advance(2 * HOUR);
        await daemon.tick();
        expect(await state()).toEqual({
          status: "needs_review",
          reason: expect.stringMatching(/^outcome unknown: key retention passed and the provider cannot be queried/),
          escalations: 0,
        });
      },
      scaled(60_000),
    );
  });
}
