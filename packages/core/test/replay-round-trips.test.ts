/**
 * A retry of a settled operation on Postgres is one statement: the plain read of its row. The
 * SQLite replay's fast path (`Store.settledNow`) asked Postgres' direct executor for an answer at
 * once; it cannot give one, so the read was sent, its answer dropped, and the read sent again:
 * two round trips a replay, and with the database down the dropped read's failure was an
 * unhandled rejection, which ends a Node process. Counted at the wire, by a proxy.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { defineAction, openLedger, LedgerUnavailableError, type Ledger } from "@idem/core";
import { freshDatabase, pgProxy } from "@idem/testkit";
import { uniqueTenant } from "./support/ledgers.js";

/**
 * A TCP proxy to Postgres counting the statements its clients execute (Bind messages of the
 * extended protocol, which pg sends for every query with values); `down()` refuses connections
 * and cuts the open ones.
 */
async function countingProxy(target: URL) {
  let binds = 0;
  const proxy = await pgProxy(target, (client, upstream) => {
    // The client's messages: the startup message has no type byte, every later one has.
    let buffered = Buffer.alloc(0);
    let started = false;
    client.on("data", (chunk) => {
      upstream.write(chunk);
      buffered = Buffer.concat([buffered, chunk]);
      for (;;) {
        const head = started ? 1 : 0;
        if (buffered.length < head + 4) break;
        const length = buffered.readInt32BE(head);
        if (buffered.length < head + length) break;
        if (started && buffered[0] === 0x42) binds += 1; // 'B'
        // An SSLRequest or the startup message: the startup (protocol 3.0) is the last untyped one.
        if (!started && buffered.readInt32BE(4) === 196608) started = true;
        buffered = buffered.subarray(head + length);
      }
    });
    upstream.on("data", (chunk) => client.write(chunk));
  });
  return { ...proxy, binds: () => binds };
}

describe("a replay of a settled operation on Postgres", () => {
  let proxy: Awaited<ReturnType<typeof countingProxy>>;
  const opened: Ledger[] = [];
  const noop = defineAction({ type: "replay.noop", capabilities: {}, execute: async () => ({ ok: true }) });

  beforeAll(async () => {
    const direct = await freshDatabase("postgres");
    await (await openLedger(direct)).close();
    proxy = await countingProxy(new URL(direct));
  });
  afterAll(async () => {
    for (const l of opened) await l.close().catch(() => {});
    await proxy?.close();
  });

  it("is one statement, for a key this ledger has seen and for one it has not", async () => {
    const ledger = await openLedger(proxy.url, { poolSize: 1, actions: [noop] });
    opened.push(ledger);
    const tenant = uniqueTenant();
    await ledger.run(noop, { tenant, key: ["k"], args: {} });
    // Every retry, the first (which prepares the read) and the ones after it.
    for (let retry = 1; retry <= 3; retry++) {
      const seen = proxy.binds();
      const again = await ledger.run(noop, { tenant, key: ["k"], args: {} });
      expect(again).toMatchObject({ status: "succeeded", replayed: true });
      expect(proxy.binds() - seen, `statements for retry ${retry} in the same process`).toBe(1);
    }

    const other = await openLedger(proxy.url, { poolSize: 1, actions: [noop] });
    opened.push(other);
    await other.run(noop, { tenant, key: ["warm-up"], args: {} }); // its connection open
    const before = proxy.binds();
    expect(await other.run(noop, { tenant, key: ["k"], args: {} })).toMatchObject({ replayed: true });
    expect(proxy.binds() - before, "statements for another process's retry").toBe(1);
  });

  it("with the database down: the caller is told so, and nothing fails unheard", async () => {
    const unheard: unknown[] = [];
    const listener = (reason: unknown) => void unheard.push(reason);
    process.on("unhandledRejection", listener);
    try {
      const ledger = await openLedger(proxy.url, { poolSize: 1, actions: [noop], connectTimeoutMs: 2_000 });
      opened.push(ledger);
      const tenant = uniqueTenant();
      await ledger.run(noop, { tenant, key: ["k"], args: {} });
      await ledger.run(noop, { tenant, key: ["k"], args: {} }); // the retry's read prepared
      proxy.down();
      const out = await ledger.run(noop, { tenant, key: ["k"], args: {} }).catch((e: unknown) => e);
      expect(out).toBeInstanceOf(LedgerUnavailableError);
      // A rejection left unhandled surfaces on a later turn of the event loop.
      await new Promise((r) => setTimeout(r, 50));
      expect(unheard.map(String)).toEqual([]);
    } finally {
      process.off("unhandledRejection", listener);
    }
  });
});
