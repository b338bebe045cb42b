/**
 * Opening a ledger that cannot be opened: a clear `LedgerConfigError` in bounded time, and nothing
 * left behind. A file that is not a database, a Postgres that accepts connections and never answers
 * (a frozen server, a wrong port behind a proxy), with the timeout from the options or the URL.
 * Descriptors are counted in /proc/self/fd: one leaked per failed open keeps a mount busy and,
 * for a process that retries, runs out.
 */
import { readdirSync, readlinkSync, writeFileSync } from "node:fs";
import { createServer, type Socket } from "node:net";
import { join } from "node:path";
import { afterEach, describe, expect, it } from "vitest";
import { LedgerConfigError, openLedger } from "@idem/core";
import { tempDir } from "@idem/testkit";

const fds = () => readdirSync("/proc/self/fd");
const fdsOn = (path: string) => fds().filter((fd) => { try { return readlinkSync(`/proc/self/fd/${fd}`).startsWith(path); } catch { return false; } });

async function refusal(p: Promise<unknown>): Promise<{ error: unknown; ms: number }> {
  const started = performance.now();
  try {
    await p;
  } catch (error) {
    return { error, ms: performance.now() - started };
  }
  throw new Error("expected the open to fail");
}

describe("a SQLite file that cannot be opened", () => {
  it("is refused with LedgerConfigError and keeps no descriptor, open after open", async () => {
    const dir = tempDir();
    const path = join(dir, "not-a-ledger.db");
    writeFileSync(path, Buffer.alloc(8192, "not a database, just bytes. "));
    for (let i = 0; i < 20; i++) {
      const { error } = await refusal(openLedger(`sqlite:${path}`));
      expect(error).toBeInstanceOf(LedgerConfigError);
      expect((error as Error).message).toMatch(/not a database/);
    }
    expect(fdsOn(path)).toEqual([]);
  });
});

describe("a Postgres that accepts connections and never answers", () => {
  const held: Socket[] = [];
  let close: () => Promise<void> = async () => {};
  afterEach(async () => close());

  /** A listener that takes every connection and says nothing, like a frozen server. */
  async function silent(): Promise<number> {
    const server = createServer((s) => held.push(s));
    await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
    close = async () => {
      for (const s of held.splice(0)) s.destroy();
      await new Promise((r) => server.close(r));
    };
    return (server.address() as { port: number }).port;
  }

  it("gives up after connectTimeoutMs, with the password masked", async () => {
    const port = await silent();
    const { error, ms } = await refusal(openLedger(`postgres://idem:s3cret@127.0.0.1:${port}/ledger`, { connectTimeoutMs: 500 }));
    expect(error).toBeInstanceOf(LedgerConfigError);
    expect((error as Error).message).toMatch(/no answer within 500 ms/);
    expect((error as Error).message).not.toMatch(/s3cret/);
    expect(held.length).toBeGreaterThan(0); // it did connect, and waited for an answer
    expect(ms).toBeGreaterThanOrEqual(450);
    expect(ms).toBeLessThan(10_000);
  });

  it("honours connect_timeout (seconds) from the URL, as libpq and pg users write it", async () => {
    const port = await silent();
    const { error, ms } = await refusal(openLedger(`postgres://idem:pw@127.0.0.1:${port}/ledger?connect_timeout=1`));
    expect(error).toBeInstanceOf(LedgerConfigError);
    expect((error as Error).message).toMatch(/no answer within 1000 ms/);
    expect(ms).toBeGreaterThanOrEqual(900);
    expect(ms).toBeLessThan(10_000);
  });

  it("leaves no socket behind after failed opens", async () => {
    const port = await silent();
    const before = fds().length;
    for (let i = 0; i < 5; i++) await refusal(openLedger(`postgres://idem:pw@127.0.0.1:${port}/ledger`, { connectTimeoutMs: 200 }));
    await close(); // the listener's own ends of the connections
    // The client ends close as the sockets are destroyed; give the event loop a turn to reap them.
    const deadline = Date.now() + 5_000;
    while (fds().length > before && Date.now() < deadline) await new Promise((r) => setImmediate(r));
    expect(fds().length).toBeLessThanOrEqual(before);
  });

  it("refuses timeouts that are not durations", async () => {
    await expect(openLedger("postgres://idem:pw@127.0.0.1:1/ledger?connect_timeout=soon")).rejects.toThrow(/connect_timeout/);
    await expect(openLedger("postgres://idem:pw@127.0.0.1:1/ledger", { statementTimeoutMs: -1 })).rejects.toThrow(/statementTimeoutMs/);
  });
});
