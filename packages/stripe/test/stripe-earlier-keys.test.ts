/**
 * An object with our key that is not this operation's effect (an earlier operation with the same
 * key, pruned from the ledger since), and a socket error that may follow the send (helper-61's
 * review; each test failed first). SQLite ledger, the real stripe SDK against the Stripe sandbox.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import http from "node:http";
import { createServer, type AddressInfo, type Socket } from "node:net";
import { openTestLedger, type TestLedgerOptions } from "@idem/core/testing";
import { StripeSandbox } from "@idem/sandbox";
import { ledgersFor } from "@idem/testkit";
import { stripeActions, type StripeConfig } from "@idem/stripe";
import { CARD } from "./cards.js";

const HOUR = 3_600_000;
const DAY = 24 * HOUR;

let sandbox: StripeSandbox;
let server: { port: number; apiKey: string };
let skew = 0;
const advance = (ms: number) => {
  skew += ms;
  sandbox.advance(ms);
};

// Every client socket stripe-node's keep-alive agent (an http.Agent) opens in this file, so test C
// can fail the one carrying its request.
const agentProto = http.Agent.prototype as unknown as { createConnection: (...a: unknown[]) => Socket };
const originalCreateConnection = agentProto.createConnection;
const clients = new Set<Socket>();
beforeAll(async () => {
  agentProto.createConnection = function (this: unknown, ...a: unknown[]) {
    const socket = originalCreateConnection.apply(this, a);
    clients.add(socket);
    socket.once("close", () => clients.delete(socket));
    return socket;
  };
  sandbox = new StripeSandbox();
  server = await sandbox.start();
});
afterAll(async () => {
  agentProto.createConnection = originalCreateConnection;
  await sandbox.close();
});

function stripe(extra: Partial<StripeConfig> = {}) {
  return stripeActions({
    apiKey: server.apiKey,
    host: "127.0.0.1",
    port: server.port,
    protocol: "http",
    timeoutMs: 5_000,
    ...extra,
  });
}
const piCount = () => sandbox.count("payment_intents");
let n = 0;
const tenant = () => `rv${++n}-${Math.random().toString(36).slice(2, 7)}`;

describe("Stripe: keys an earlier operation used, and errors after the send (sqlite)", () => {
  const db = ledgersFor("sqlite", openTestLedger, { defaults: { poolSize: 2 } as TestLedgerOptions, prepare: true });
  const ledger = (o: TestLedgerOptions = {}) => db.open({ clock: () => Date.now() + skew, ...o });

  // 2 min later (helper-112): the earlier intent is inside our attempts' window's slack, so only
  // its amount tells it from ours. Before, it was taken as ours: "succeeded" for 2000.
  for (const gap of [
    { ms: 2 * HOUR, said: "2 h" },
    { ms: 2 * 60_000, said: "2 min" },
  ])
    it(`B: a key reused with other params ${gap.said} later, inside Stripe's window (400 idempotency_error), is not read as done with the other request's intent`, async () => {
      // An app that keeps completed operations a short while (retentionMs); the same invoice is
      // charged again later with a corrected amount. The ledger row is gone, so no
      // ArgsMismatchError; Stripe still holds the key and answers 400 idempotency_error.
      const s = stripe();
      const l = await ledger({ retentionMs: gap.ms / 2, actions: [s.paymentIntentsCreate] });
      const t = tenant();
      const first = await l.run(s.paymentIntentsCreate, { tenant: t, key: ["charge", "in_1"], args: CARD });
      expect(first.status).toBe("succeeded");
      advance(gap.ms);
      expect(await l.admin.prune({ tenant: t })).toBe(1);
      const before = piCount();
      const again = await l.run(s.paymentIntentsCreate, {
        tenant: t,
        key: ["charge", "in_1"],
        args: { ...CARD, amount: 3000 },
      });
      expect(piCount() - before).toBe(0); // nothing was charged for 3000
      const id = again.status === "succeeded" ? again.receipt!.id : null;
      const charged = id ? sandbox.objects.get("payment_intents", id) : undefined;
      // Whatever the verdict, "succeeded" must not name an intent for another amount.
      expect({ status: again.status, amountOfReceipt: charged?.amount ?? null }).not.toMatchObject({
        status: "succeeded",
        amountOfReceipt: 2000,
      });
      // A person decides, told why.
      expect(again).toMatchObject({ status: "pending_verification", state: "needs_review" });
      const { operation } = await l.get({ tenant: t, id: again.operationId });
      if (gap.ms < HOUR) expect(operation.reason).toMatch(/for 2000 usd where this operation asks 3000 usd/);
    });

  it("B, a refund: a key reused with other params 2 min later (400 idempotency_error) is not read as done with the other request's refund", async () => {
    // As B for a charge: the app keeps completed operations a minute; order ord-9 is refunded
    // 1000, pruned, then refunded again with a corrected amount (2500). Stripe still holds the
    // key and answers 400 idempotency_error; the refund list shows the earlier refund with our key.
    const s = stripe();
    const l = await ledger({ retentionMs: 60_000, actions: [s.refundsCreate] });
    const t = tenant();
    const pi = await s.client.paymentIntents.create({ ...CARD, amount: 5000 });
    const first = await l.run(s.refundsCreate, {
      tenant: t,
      key: ["refund", "ord-9"],
      args: { payment_intent: pi.id, amount: 1000 },
    });
    expect(first.status).toBe("succeeded");
    advance(2 * 60_000);
    expect(await l.admin.prune({ tenant: t })).toBe(1);
    const before = sandbox.count("refunds");
    const again = await l.run(s.refundsCreate, {
      tenant: t,
      key: ["refund", "ord-9"],
      args: { payment_intent: pi.id, amount: 2500 },
    });
    expect(sandbox.count("refunds") - before).toBe(0); // nothing was refunded for 2500
    const id = again.status === "succeeded" ? again.receipt!.id : null;
    const refunded = id ? sandbox.objects.get("refunds", id) : undefined;
    // "succeeded" must not name a refund of another amount: the caller would read 2500 refunded.
    expect({ status: again.status, amountOfReceipt: refunded?.amount ?? null }).not.toMatchObject({
      status: "succeeded",
      amountOfReceipt: 1000,
    });
    expect(again).toMatchObject({ status: "pending_verification", state: "needs_review" });
  });

  it("B, a customer: a key reused with other params 2 min later (400 idempotency_error) is not read as done with the other request's customer", async () => {
    // As B for a charge: a customer for signup su-3 is created as a@example.com, pruned, then
    // created again with the corrected email. Stripe answers 400 idempotency_error; Search and the
    // list show the earlier customer with our key.
    const s = stripe();
    const l = await ledger({ retentionMs: 60_000, actions: [s.customersCreate] });
    const t = tenant();
    const first = await l.run(s.customersCreate, {
      tenant: t,
      key: ["signup", "su-3"],
      args: { email: "a@example.com" },
    });
    expect(first.status).toBe("succeeded");
    advance(2 * 60_000);
    expect(await l.admin.prune({ tenant: t })).toBe(1);
    const before = sandbox.count("customers");
    const again = await l.run(s.customersCreate, {
      tenant: t,
      key: ["signup", "su-3"],
      args: { email: "b@example.com" },
    });
    expect(sandbox.count("customers") - before).toBe(0); // no customer b@example.com was created
    const id = again.status === "succeeded" ? again.receipt!.id : null;
    const made = id ? sandbox.objects.get("customers", id) : undefined;
    // "succeeded" must not name a customer with another email: none with b@example.com exists.
    expect({ status: again.status, emailOfReceipt: made?.email ?? null }).not.toMatchObject({
      status: "succeeded",
      emailOfReceipt: "a@example.com",
    });
    expect(again).toMatchObject({ status: "pending_verification", state: "needs_review" });
  });

  it("A: past the key window, Search's hit on an older operation's intent (same key, pruned) is not taken as this operation's effect", async () => {
    // 31 days ago invoice in_2 was charged 2000 (default 30-day retention, then pruned). It is
    // charged again (README: a pruned key runs again) for 3000; the request times out before
    // reaching Stripe (nothing created). 25 h later the daemon looks it up.
    const s = stripe();
    const l = await ledger({ actions: [s.paymentIntentsCreate] });
    const t = tenant();
    const old = await l.run(s.paymentIntentsCreate, { tenant: t, key: ["charge", "in_2"], args: CARD });
    expect(old.status).toBe("succeeded");
    const oldId = old.status === "succeeded" ? old.receipt!.id : "";
    advance(31 * DAY);
    expect(await l.admin.prune({ tenant: t })).toBe(1);

    // A Stripe that takes the request and never answers: nothing is created.
    const sockets = new Set<Socket>();
    const hole = createServer((socket) => sockets.add(socket));
    await new Promise<void>((r) => hole.listen(0, "127.0.0.1", r));
    const lost = stripe({ port: (hole.address() as AddressInfo).port, timeoutMs: 300 });
    const before = piCount();
    let out: Awaited<ReturnType<typeof l.run>>;
    try {
      out = await l.run(lost.paymentIntentsCreate, {
        tenant: t,
        key: ["charge", "in_2"],
        args: { ...CARD, amount: 3000 },
        budget: { attempts: 1 },
      });
    } finally {
      for (const socket of sockets) socket.destroy();
      await new Promise((r) => hole.close(r));
    }
    expect(out).toMatchObject({ status: "pending_verification", state: "unknown" });
    expect(piCount() - before).toBe(0);
    advance(25 * HOUR);
    const settled = await l.daemon.settle({ tenant: t, id: out.operationId });
    // The old intent (31 days old, 2000) is not this operation's effect: absent in the attempt
    // window, so it is created once now (3000).
    const receipt = settled.status === "succeeded" ? (settled.receipt as { id: string }).id : settled.status;
    expect.soft(receipt, "receipt of this operation").not.toBe(oldId);
    expect.soft(piCount() - before, "intents created for the 3000 charge").toBe(1);
  });

  it("C: a connection that fails with EHOSTUNREACH after the charge committed is not read as 'not sent' (charged again past the key window)", async () => {
    const srv = (sandbox as unknown as { server: http.Server }).server;
    let lastPort = 0;
    const onRequest = (req: http.IncomingMessage) => {
      if (req.method === "POST" && req.url === "/v1/payment_intents") lastPort = req.socket.remotePort ?? 0;
    };
    srv.on("request", onRequest);
    // After the charge commits (the answer held back), the route to Stripe is lost: the client's
    // socket fails with EHOSTUNREACH, as the kernel reports an ICMP host-unreachable on a
    // connection whose request was already written.
    const onCommit = () => {
      for (const c of clients)
        if (c.localPort === lastPort)
          c.destroy(
            Object.assign(new Error("read EHOSTUNREACH"), { code: "EHOSTUNREACH", errno: -113, syscall: "read" }),
          );
    };
    sandbox.events.on("commit", onCommit);
    try {
      const s = stripe();
      const l = await ledger({ budget: { attempts: 1 }, actions: [s.paymentIntentsCreate] });
      const t = tenant();
      const before = piCount();
      sandbox.faults.add({ kind: "delay_after_commit", match: { path: "/v1/payment_intents" }, delayMs: 2_000 });
      const out = await l.run(s.paymentIntentsCreate, { tenant: t, key: ["unreachable"], args: CARD });
      sandbox.events.off("commit", onCommit);
      expect(piCount() - before).toBe(1); // the charge happened
      const op = await l.get({ tenant: t, id: out.operationId });
      const reasons = op.events.map((e) => `${e.to}: ${e.reason}`);
      advance(25 * HOUR); // Stripe has forgotten the key
      const settled = await l.run(s.paymentIntentsCreate, { tenant: t, key: ["unreachable"], args: CARD });
      expect.soft(settled.status).toBe("succeeded");
      expect.soft(piCount() - before, "payment intents created for one operation").toBe(1);
      expect.soft({ first: out.status, state: (out as { state?: string }).state, reasons }).toMatchObject({
        state: "unknown",
      });
    } finally {
      sandbox.events.off("commit", onCommit);
      srv.off("request", onRequest);
      sandbox.faults.clear();
    }
  });
});
