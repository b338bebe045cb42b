/**
 * A guarded call's deadline (`deadlineMs`): the model reads a truthful answer by then, whatever
 * the ledger or the provider is doing, never its host's timeout error. A frozen database is a
 * Postgres whose server stops answering (behind a TCP proxy that stops forwarding) or a SQLite
 * file whose write lock another connection holds; statement and busy timeouts of 5 min stand for
 * whatever the application set. Effects are counted in the action.
 */
import { createRequire } from "node:module";
import { join } from "node:path";
import { afterEach, describe, expect, it } from "vitest";
import { z } from "zod";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { InMemoryTransport } from "@modelcontextprotocol/sdk/inMemory.js";
import { McpServer } from "@modelcontextprotocol/sdk/server/mcp.js";
import { defineAction, openLedger, type LedgerOptions } from "@idem/core";
import { DIALECTS, freshDatabase, ledgersFor, orLate, pgProxy, scaled, tempDir, type TestDialect } from "@idem/testkit";
import { guard, type Outcome } from "@idem/agents";
import { registerGuardedTool } from "@idem/agents/mcp";

/** better-sqlite3, core's driver (the agents package does not depend on it): a second connection to hold the lock. */
const Database = createRequire(new URL("../../core/package.json", import.meta.url))("better-sqlite3") as new (
  path: string,
  options: { timeout: number },
) => { exec(sql: string): void; close(): void };

let cleanup: (() => Promise<void>)[] = [];
afterEach(async () => {
  for (const c of cleanup.reverse()) await c();
  cleanup = [];
});

/** A note tool whose sends are counted; `gate`, when given, holds each send until it resolves. */
function noteTool(type: string, gate?: Promise<void>) {
  const sent: string[] = [];
  const cut: boolean[] = []; // whether each send saw its request cut (`op.signal` aborted)
  const tool = {
    name: "send_note",
    description: "Send a note, once per note id.",
    action: defineAction<{ text: string }, { id: string }>({
      type,
      capabilities: {},
      async execute(args, op) {
        sent.push(args.text);
        await gate;
        cut.push(op.signal.aborted);
        return { id: `n${sent.length}` };
      },
    }),
    input: z.object({ noteId: z.string().min(1), text: z.string() }),
    args: (i: { text: string }) => ({ text: i.text }),
    key: (i: { noteId: string }) => ["note", i.noteId],
  };
  return { tool, sent, cut };
}

/**
 * A ledger on a database that can be frozen: `freeze()` makes every later statement (Postgres) or
 * write (SQLite) wait for an answer that does not come, until `thaw()` (Postgres: the connections
 * are cut, so the statements waiting fail; SQLite: the lock is released, so they go on).
 */
async function freezable(dialect: TestDialect) {
  if (dialect === "postgres") {
    let frozen = false;
    const proxy = await pgProxy(new URL(await freshDatabase("postgres")), (client, upstream) => {
      client.on("data", (d: Buffer) => void (frozen || upstream.write(d)));
      upstream.pipe(client);
    });
    // The client gives up on a statement 305 s after sending it.
    const ledger = await openLedger(proxy.url, { statementTimeoutMs: 300_000 });
    let thawed = false;
    const thaw = async () => {
      if (!thawed) proxy.down();
      thawed = true;
    };
    cleanup.push(async () => {
      await thaw();
      await ledger.close();
      await proxy.close();
    });
    const freeze = () => {
      frozen = true;
    };
    return { ledger, freeze, thaw };
  }
  const path = join(tempDir(), "ledger.db");
  // A write waits 5 min for the lock before it fails.
  const ledger = await openLedger(`sqlite:${path}`, { busyTimeoutMs: 300_000 });
  let other: InstanceType<typeof Database> | undefined;
  const thaw = async () => {
    other?.exec("ROLLBACK");
    other?.close();
    other = undefined;
  };
  cleanup.push(async () => {
    await thaw();
    await ledger.close();
  });
  const freeze = () => {
    other = new Database(path, { timeout: 0 });
    other.exec("BEGIN IMMEDIATE");
  };
  return { ledger, freeze, thaw };
}

const noAnswer = Symbol("no answer");

/** The answer to the deadline passing: the ledger read no answer in time. */
const LATE =
  /^Not confirmed: no answer within 2 s, so it may or may not have happened \(by this call or an earlier one\); this call sends nothing more\. Do not tell the user either way; calling this tool again later with the same input is safe/;

for (const dialect of DIALECTS) {
  describe(`a guarded call's deadline, its database frozen, on ${dialect}`, () => {
    it("new work: 'not confirmed' by the deadline, not when the database client gives up; nothing sent after it", async () => {
      const { ledger, freeze, thaw } = await freezable(dialect);
      const { tool, sent } = noteTool("test.deadline-new");
      const run = guard(ledger, tool, { tenant: "acme", deadlineMs: 2_000 });
      freeze();
      const started = performance.now();
      // Before: no answer until the claim failed, 5 min in (an MCP client gives up at 60 s).
      const out = await orLate(
        run({ noteId: "n1", text: "hello" }, { context: {}, callId: "a" }),
        scaled(20_000),
        noAnswer,
      );
      const tookMs = performance.now() - started;
      expect(out).not.toBe(noAnswer);
      expect(out).toMatchObject({ status: "unconfirmed", message: expect.stringMatching(LATE) });
      expect((out as Outcome).message).not.toMatch(/not performed|was not done/i);
      expect(tookMs).toBeGreaterThanOrEqual(1_900);
      // The claim still waiting ends once the database answers again: it sends nothing (it was
      // stopped at the deadline), and the same input later does the work, once.
      await thaw();
      if (dialect === "sqlite") {
        const again = await run({ noteId: "n1", text: "hello" }, { context: {}, callId: "b" });
        expect(again).toMatchObject({ status: "done" });
        expect(sent).toEqual(["hello"]);
      } else {
        await ledger.close(); // waits for the call still in flight
        expect(sent).toEqual([]);
      }
    }, 400_000);
  });
}

describe("a guarded call's deadline, its database frozen after the work was done, on postgres", () => {
  it("work done before: 'not confirmed' by the deadline, never 'not done'", async () => {
    const { ledger, freeze } = await freezable("postgres");
    const { tool, sent } = noteTool("test.deadline-done");
    const run = guard(ledger, tool, { tenant: "acme", deadlineMs: 2_000 });
    expect(await run({ noteId: "d1", text: "hello" }, { context: {}, callId: "a" })).toMatchObject({ status: "done" });
    freeze();
    const out = await orLate(
      run({ noteId: "d1", text: "hello" }, { context: {}, callId: "b" }),
      scaled(20_000),
      noAnswer,
    );
    expect(out).not.toBe(noAnswer);
    expect(out).toMatchObject({ status: "unconfirmed", message: expect.stringMatching(LATE) });
    expect(sent).toEqual(["hello"]);
  }, 400_000);

  it("a describe that reads the ledger while its database freezes: the outcome as it was, by the deadline", async () => {
    const { ledger, freeze } = await freezable("postgres");
    const { tool, sent } = noteTool("test.deadline-describe");
    let reworded = 0;
    // The application's rewording names how many attempts the operation took: a read of the
    // ledger, which the database stops answering (frozen as the rewording begins).
    const describe = async (o: Outcome): Promise<Outcome> => {
      if (!("operationId" in o) || o.operationId === undefined) return o;
      freeze();
      const { operation } = await ledger.get({ tenant: "acme", id: o.operationId });
      reworded += 1;
      return { ...o, message: `${o.message} (attempts: ${operation.attempt})` };
    };
    const run = guard(ledger, tool, { tenant: "acme", deadlineMs: 2_000, describe });
    const started = performance.now();
    // Before: no answer until the read failed, 305 s in (an MCP client gives up at 60 s).
    const out = await orLate(
      run({ noteId: "w1", text: "hello" }, { context: {}, callId: "a" }),
      scaled(20_000),
      noAnswer,
    );
    expect(out).not.toBe(noAnswer);
    // The ledger had answered: what happened is known, and the model reads it, unreworded.
    expect(out).toMatchObject({ status: "done", message: expect.stringMatching(/^Done \(operation op_\w+\)\.$/) });
    expect(performance.now() - started).toBeLessThan(scaled(10_000));
    expect([reworded, sent]).toEqual([0, ["hello"]]);
  }, 400_000);

  it("over MCP with the default deadline: answered before the client's own request timeout (60 s)", async () => {
    const { ledger, freeze } = await freezable("postgres");
    const { tool } = noteTool("test.deadline-mcp");
    const server = new McpServer({ name: "idem", version: "0.1.0" });
    registerGuardedTool(server, ledger, tool, { tenant: "acme" });
    const [clientSide, serverSide] = InMemoryTransport.createLinkedPair();
    const client = new Client({ name: "idem-test", version: "1.0.0" });
    await server.connect(serverSide);
    await client.connect(clientSide);
    cleanup.push(async () => {
      await client.close();
      await server.close();
    });
    freeze();
    const started = performance.now();
    // The client's default timeout. Before: it gave up ("Request timed out"), and its host showed
    // the model that error, not an answer.
    const out = await client.callTool({ name: "send_note", arguments: { noteId: "m1", text: "hi" } });
    expect(performance.now() - started).toBeLessThan(60_000);
    expect(out.isError).toBe(false);
    expect(out.structuredContent).toMatchObject({
      status: "unconfirmed",
      message: expect.stringMatching(/^Not confirmed: no answer within 45 s, so it may or may not have happened/),
    });
  }, 400_000);
});

for (const dialect of DIALECTS) {
  describe(`a guarded call's deadline, the ledger answering, on ${dialect}`, () => {
    const db = ledgersFor(dialect, openLedger, { defaults: { poolSize: 4 } as LedgerOptions });

    it("a provider request still out at the deadline: 'not confirmed', the request not cut, its effect recorded once", async () => {
      const ledger = await db.open();
      const tenant = "acme-slow";
      let release!: () => void;
      const { tool, sent, cut } = noteTool("test.deadline-slow", new Promise<void>((r) => (release = r)));
      cleanup.push(async () => release());
      const run = guard(ledger, tool, { tenant, deadlineMs: 2_000 });
      const out = await orLate(
        run({ noteId: "s1", text: "hello" }, { context: {}, callId: "a" }),
        scaled(20_000),
        noAnswer,
      );
      expect(out).not.toBe(noAnswer);
      expect(out).toMatchObject({ status: "unconfirmed", message: expect.stringMatching(LATE) });
      // The provider answers after the model was told: its effect is recorded, not left unknown.
      release();
      const [op] = await ledger.admin.list({ tenant });
      expect(await ledger.wait({ tenant, id: op!.id, timeoutMs: scaled(20_000) })).toMatchObject({
        status: "succeeded",
      });
      expect(cut).toEqual([false]);
      const again = await run({ noteId: "s1", text: "hello" }, { context: {}, callId: "b" });
      expect(again).toMatchObject({ status: "already_done", operationId: op!.id });
      expect(sent).toEqual(["hello"]);
    }, 120_000);

    it("a retry waiting out the provider's wait at the deadline: the ledger's own answer (pending, its operation), nothing sent again", async () => {
      const ledger = await db.open({ budget: { attempts: 3, elapsedMs: 120_000 } } as LedgerOptions);
      let attempts = 0;
      const busy = {
        ...noteTool("unused").tool,
        action: defineAction<{ text: string }, { id: string }>({
          type: "test.deadline-retry",
          capabilities: {},
          async execute() {
            attempts += 1;
            throw new Error("503 try again in 20 s");
          },
          // Refused before the provider did anything, and asked to wait 20 s.
          classify: () => ({ kind: "transient", reason: "provider busy", retryAfterMs: 20_000 }),
        }),
      };
      const run = guard(ledger, busy, { tenant: "acme-retry", deadlineMs: 2_000 });
      // Before: no answer until every attempt's wait had passed (40 s).
      const out = await orLate(
        run({ noteId: "r1", text: "x" }, { context: {}, callId: "a" }),
        scaled(15_000),
        noAnswer,
      );
      expect(out).not.toBe(noAnswer);
      expect(out).toMatchObject({ status: "pending_verification", state: "pending" });
      expect((out as { operationId?: string }).operationId).toMatch(/^op_/);
      expect(attempts).toBe(1);
    }, 120_000);
  });
}

describe("deadlineMs is checked when the tool is made", () => {
  it("refuses what is not a whole number of ms from 1 to 2147483647", async () => {
    const ledger = await openLedger(`sqlite:${join(tempDir(), "ledger.db")}`);
    cleanup.push(() => ledger.close());
    const { tool } = noteTool("test.deadline-setting");
    for (const deadlineMs of [0, -1, 1.5, Number.NaN, Number.POSITIVE_INFINITY, 2 ** 31, "45000"])
      expect(() => guard(ledger, tool, { tenant: "acme", deadlineMs: deadlineMs as number })).toThrow(
        /^guard\(send_note\): deadlineMs must be a whole number of ms from 1 to 2147483647/,
      );
    expect(() => guard(ledger, tool, { tenant: "acme", deadlineMs: 1 })).not.toThrow();
  });
});
