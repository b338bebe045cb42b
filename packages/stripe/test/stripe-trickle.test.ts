/**
 * An answer that keeps coming and never ends: Stripe (or a proxy in front of it) commits the
 * request, sends the answer's head and then one byte of its body every 200 ms, never the last.
 * stripe-node's only guard is `req.setTimeout` (`timeoutMs`), a socket inactivity timeout that
 * each byte resets: a charge's `execute` then never returns, its heartbeat renews the lease, the
 * row stays `running` and `run` never comes back, though the intent exists. A lookup's request
 * (Search) is given up by the runner after the settlement's time bound, but its socket trickles
 * on, never closed. Now each request has a deadline (`deadlineMs`) from its start: past it the
 * request is cut, ambiguous as a timeout is, and the replay with our key (or the lookup) finds
 * the intent. Through the real stripe SDK to the Stripe sandbox (its `trickle_after_commit` fault),
 * on SQLite and Postgres.
 */
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import { setTimeout as sleep } from "node:timers/promises";
import { openTestLedger, type TestLedgerOptions } from "@idem/core/testing";
import { StripeSandbox } from "@idem/sandbox";
import { DIALECTS, ledgersFor, scaled } from "@idem/testkit";
import { stripeActions } from "@idem/stripe";
import { CARD } from "./cards.js";

const HOUR = 3_600_000;

let sandbox: StripeSandbox;
let server: { port: number; apiKey: string };
let skew = 0; // how far the ledger's clock is moved forward, with the sandbox's
const advance = (ms: number) => {
  skew += ms;
  sandbox.advance(ms);
};

beforeAll(async () => {
  sandbox = new StripeSandbox();
  server = await sandbox.start();
});
// A test that failed must not leave its call waiting on a trickle (the ledger's close awaits it).
afterEach(() => cut());
afterAll(() => sandbox?.close());

/** Trickles nothing more, and ends every answer still trickling. */
function cut() {
  sandbox.faults.clear();
  sandbox.trickling.cut();
}

/**
 * Answers still trickling once those the client closed are seen closed here (a close reaches
 * the sandbox a moment after the client's): each is a connection the client holds open.
 */
const stillTrickling = () => sandbox.trickling.countAfter(scaled(1_000));

const stripe = () =>
  stripeActions({
    apiKey: server.apiKey,
    host: "127.0.0.1",
    port: server.port,
    protocol: "http",
    timeoutMs: 1_000,
    deadlineMs: 2_000,
  });
const intentsWith = (key: string) =>
  sandbox.objects.all("payment_intents").filter((pi) => pi.metadata?.idem_operation === key);
let n = 0;
const tenant = () => `trickle${++n}-${Math.random().toString(36).slice(2, 7)}`;

for (const dialect of DIALECTS) {
  describe(`Stripe answering with a body that never ends, on ${dialect}`, () => {
    const db = ledgersFor(dialect, openTestLedger, { defaults: { poolSize: 2 } as TestLedgerOptions });
    const ledger = (o: TestLedgerOptions = {}) => db.open({ clock: () => Date.now() + skew, ...o });

    it("a charge whose answer trickles for ever after Stripe made the intent: the call ends (unknown, then the replay with our key), not running for ever", async () => {
      const s = stripe();
      const l = await ledger({ budget: { attempts: 2, baseDelayMs: 10 }, actions: [s.paymentIntentsCreate] });
      const t = tenant();
      sandbox.faults.add({ kind: "trickle_after_commit", match: { method: "POST", path: "/v1/payment_intents" } });
      const started = Date.now();
      const run = l.run(s.paymentIntentsCreate, { tenant: t, key: ["order", "trickle"], args: CARD });
      // Bounded here: a hang fails in seconds, not at the test's timeout.
      const bound = scaled(15_000);
      const out = await Promise.race([run, sleep(bound).then(() => "still running" as const)]);
      const [row] = await l.admin.list({ tenant: t });
      const open = await stillTrickling();
      cut();
      await run.catch(() => undefined);
      const intents = intentsWith(row!.key);
      expect(intents).toHaveLength(1); // Stripe made it at once
      const { events } = await l.get({ tenant: t, id: row!.id });
      // Before: "still running" (for ever), the row running under a renewed lease, the answer open.
      // Cut at the deadline (ambiguous: unknown), then the replay with our key answers the intent.
      expect({
        out: out === "still running" ? out : out.status,
        receipt: out !== "still running" && out.status === "succeeded" ? out.receipt?.id : undefined,
        row: row?.status,
        open,
        unknown: events.find((e) => e.to === "unknown")?.reason,
      }).toEqual({
        out: "succeeded",
        receipt: intents[0]!.id,
        row: "succeeded",
        open: 0,
        unknown: expect.stringMatching(
          /connection cut after sending: no complete answer from Stripe within 2000 ms \(deadlineMs\)/,
        ),
      });
      expect(Date.now() - started).toBeLessThan(bound);
    });

    it("a lookup whose answers trickle for ever (Search and the list, past the key window): cut at the deadline, their sockets closed, unknown, then the intent found", async () => {
      const s = stripe();
      // The settlement's time bound, at which the runner gives a lookup up; far past the deadline.
      const limit = scaled(10_000);
      const l = await ledger({ budget: { attempts: 1, elapsedMs: limit }, actions: [s.paymentIntentsCreate] });
      const t = tenant();
      // Unknown: the create committed, its connection dropped (twice: stripe-node resends once by itself).
      sandbox.faults.add({ kind: "drop_after_commit", match: { path: "/v1/payment_intents" }, times: 2 });
      const first = await l
        .run(s.paymentIntentsCreate, { tenant: t, key: ["order", "lookup"], args: CARD })
        .finally(() => sandbox.faults.clear());
      expect(first).toMatchObject({ status: "pending_verification", state: "unknown" });
      advance(25 * HOUR); // past Stripe's key window: settled by Search, not a replay
      // Search, and the consistent list that answers when Search fails: both trickle.
      sandbox.faults.add({
        kind: "trickle_after_commit",
        match: { method: "GET", path: "/v1/payment_intents" },
        times: 10,
      });
      const started = Date.now();
      const settling = l.daemon.settle({ tenant: t, id: first.operationId, timeoutMs: limit });
      const settled = await Promise.race([settling, sleep(limit + scaled(5_000)).then(() => "still running" as const)]);
      const took = Date.now() - started;
      // Before: the runner gave the lookup up at `limit`, but its request (Search) was still open
      // at the sandbox, a socket trickling for ever (one more every settlement). Now Search is cut
      // at the deadline, then the list: an inconclusive check, its reason the deadline.
      const open = await stillTrickling();
      cut();
      await settling.catch(() => undefined);
      expect({
        open,
        beforeTheBound: took < limit,
        settled: settled === "still running" ? settled : settled.status,
        reason: settled !== "still running" && settled.status === "pending_verification" ? settled.reason : undefined,
      }).toEqual({
        open: 0,
        beforeTheBound: true,
        settled: "pending_verification",
        // Said as the cut it was (stripe-node words it as its own timeout, naming `timeoutMs`).
        reason: expect.stringMatching(/lookup failed: .*the request was cut at its deadline: .*\(deadlineMs\)/),
      });
      // Answered in full this time: the intent, found by Search.
      const again = await l.daemon.settle({ tenant: t, id: first.operationId });
      const intents = intentsWith((await l.get({ tenant: t, id: first.operationId })).operation.key);
      expect(intents).toHaveLength(1);
      expect(again).toMatchObject({ status: "succeeded", receipt: { id: intents[0]!.id } });
    });
  });
}
