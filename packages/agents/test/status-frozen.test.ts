/**
 * The status tool while the ledger's database hangs (a frozen server, a network that drops
 * packets): it answers by the end of its wait and a few seconds more, "could not check now",
 * rather than when the database client gives up on the read (statement timeout + 5 s), which can
 * be past an MCP client's 60 s request timeout. Postgres only: a SQLite file does not freeze.
 */
import { afterEach, describe, expect, it } from "vitest";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { InMemoryTransport } from "@modelcontextprotocol/sdk/inMemory.js";
import { McpServer } from "@modelcontextprotocol/sdk/server/mcp.js";
import { defineAction, openLedger, type Ledger } from "@idem/core";
import { freshDatabase, pgProxy, scaled, type PgProxy } from "@idem/testkit";
import { registerStatusTool } from "@idem/agents/mcp";

let cleanup: (() => Promise<void>)[] = [];
afterEach(async () => {
  for (const c of cleanup.reverse()) await c();
  cleanup = [];
});

describe("the status tool while the ledger's database hangs, on postgres", () => {
  it("answers 'could not check now' by the end of its wait, not when the database client gives up", async () => {
    let frozen = false;
    // Once frozen, nothing the ledger sends reaches the server: each statement waits for an
    // answer that never comes, as with a SIGSTOPped server.
    const proxy: PgProxy = await pgProxy(new URL(await freshDatabase("postgres")), (client, upstream) => {
      client.on("data", (d: Buffer) => void (frozen || upstream.write(d)));
      upstream.pipe(client);
    });
    // Statements may run 5 min (long admin reads): the client gives up on one 305 s after sending it.
    const ledger: Ledger = await openLedger(proxy.url, { statementTimeoutMs: 300_000 });
    cleanup.push(async () => {
      proxy.down(); // ends the statements that wait, so the close does not wait for them
      await ledger.close();
      await proxy.close();
    });
    const tenant = "frozen";
    const send = defineAction({ type: "note.send", capabilities: {}, execute: async () => ({ id: "n1" }) });
    const done = await ledger.run(send, { tenant, key: ["n1"], args: {} });

    const server = new McpServer({ name: "idem", version: "0.1.0" });
    registerStatusTool(server, ledger, { tenant });
    const [clientSide, serverSide] = InMemoryTransport.createLinkedPair();
    const client = new Client({ name: "idem-test", version: "1.0.0" });
    await server.connect(serverSide);
    await client.connect(clientSide);
    cleanup.push(async () => {
      await client.close();
      await server.close();
    });

    frozen = true;
    const noAnswer = Symbol("no answer");
    let timer: NodeJS.Timeout | undefined;
    const out = await Promise.race([
      client.callTool(
        { name: "operation_status", arguments: { operationId: done.operationId, waitMs: 1_000 } },
        undefined,
        { timeout: scaled(120_000) },
      ),
      // Well before the client's read timeout (305 s), on a loaded machine too.
      new Promise<typeof noAnswer>((r) => (timer = setTimeout(() => r(noAnswer), scaled(30_000)))),
    ]).finally(() => clearTimeout(timer));
    // Before: no answer until the read failed, 305 s in (an MCP client gives up at 60 s).
    expect(out).not.toBe(noAnswer);
    expect((out as { structuredContent?: unknown }).structuredContent).toMatchObject({
      status: "unconfirmed",
      message: expect.stringMatching(/^Could not check operation "op_\w+" now .*do not repeat the original action/),
    });
  }, 400_000);
});
