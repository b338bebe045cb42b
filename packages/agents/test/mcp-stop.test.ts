/**
 * An MCP call in flight when its client gives up on it: the server closes (`idem mcp` on SIGTERM,
 * or its client closed stdin), or the client cancels the request (`notifications/cancelled`). The
 * SDK aborts the handler's `extra.signal` either way. Handed to the ledger as the caller's
 * `signal`, it aborted the provider request under way: the outcome was unknown, and without a
 * lookup a person had to decide, after every restart (helper-117). It is the call's `stop` now:
 * the request in flight ends and is recorded, and nothing more is sent.
 */
import { afterEach, describe, expect, it } from "vitest";
import { z } from "zod";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { InMemoryTransport } from "@modelcontextprotocol/sdk/inMemory.js";
import { McpServer } from "@modelcontextprotocol/sdk/server/mcp.js";
import { defineAction, openLedger, type LedgerOptions } from "@idem/core";
import { DIALECTS, ledgersFor } from "@idem/testkit";
import { registerGuardedTool } from "@idem/agents/mcp";

const connected: { client: Client; server: McpServer }[] = [];
afterEach(async () => {
  for (const { client, server } of connected.splice(0)) {
    await client.close().catch(() => undefined);
    await server.close().catch(() => undefined);
  }
});

for (const dialect of DIALECTS) {
  describe(`an MCP call given up while its request is out, on ${dialect}`, () => {
    const db = ledgersFor(dialect, openLedger, { defaults: { poolSize: 4 } as LedgerOptions });

    for (const how of ["the server closes", "the client cancels"] as const)
      it(`${how}: the request in flight ends and is recorded, once`, async () => {
        const ledger = await db.open();
        const tenant = `stop-${dialect}-${Math.random().toString(36).slice(2, 7)}`;
        let started: () => void = () => {};
        const executing = new Promise<void>((r) => (started = r));
        let answer: () => void = () => {};
        const answered = new Promise<void>((r) => (answer = r));
        let sent = 0;
        let aborted = false;
        // A provider client that honours op.signal, as the ledger asks ("pass it to your provider's client").
        const post = defineAction<{ text: string }, { id: string }>({
          type: "test.post-stop",
          capabilities: {},
          async execute(_args, op) {
            sent++;
            started();
            await new Promise<void>((resolve, reject) => {
              const onAbort = () => {
                aborted = true;
                reject(op.signal.reason ?? new Error("aborted"));
              };
              if (op.signal.aborted) onAbort();
              op.signal.addEventListener("abort", onAbort, { once: true });
              void answered.then(resolve);
            });
            return { id: "p1" };
          },
        });
        const server = new McpServer({ name: "idem", version: "0.1.0" });
        registerGuardedTool(
          server,
          ledger,
          {
            name: "post",
            description: "Post once per id.",
            action: post,
            input: z.object({ postId: z.string(), text: z.string() }),
            args: (i: { text: string }) => ({ text: i.text }),
            key: (i: { postId: string }) => ["post", i.postId],
          },
          { tenant, actor: "idem-mcp@test" },
        );
        const [clientSide, serverSide] = InMemoryTransport.createLinkedPair();
        const client = new Client({ name: "host", version: "1" });
        connected.push({ client, server });
        await server.connect(serverSide);
        await client.connect(clientSide);

        const giveUp = new AbortController();
        const call = client
          .callTool({ name: "post", arguments: { postId: "p-1", text: "hi" } }, undefined, { signal: giveUp.signal })
          .catch((e: unknown) => e);
        await executing;
        if (how === "the server closes")
          await server.close(); // what serveMcp's `stop` does
        else giveUp.abort("the user pressed stop");
        await call;
        answer(); // the provider answers after the call was given up
        const [op] = await ledger.admin.list({ tenant });
        const settled = await ledger.wait({ tenant, id: op!.id, timeoutMs: 10_000 });
        // Before: the provider request was aborted, the row unknown, then needs_review.
        expect({ status: settled.status, aborted, sent }).toEqual({ status: "succeeded", aborted: false, sent: 1 });
      });
  });
}
