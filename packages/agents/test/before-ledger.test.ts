/**
 * The application's own code failing before the ledger reads anything (its tenant or key function,
 * an MCP server's `context`), or making a value the ledger refuses (an empty tenant, a key part no
 * key can hold), for work an earlier call did: this call did nothing, but whether the work was done
 * could not be read, so the model is not told it was not done. Effects are counted in the action.
 */
import { afterEach, describe, expect, it } from "vitest";
import { z } from "zod";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { InMemoryTransport } from "@modelcontextprotocol/sdk/inMemory.js";
import { McpServer } from "@modelcontextprotocol/sdk/server/mcp.js";
import type { CallToolResult } from "@modelcontextprotocol/sdk/types.js";
import { defineAction, openLedger, type LedgerOptions } from "@idem/core";
import { DIALECTS, ledgersFor } from "@idem/testkit";
import { guard, type ToolCall } from "@idem/agents";
import { registerGuardedTool } from "@idem/agents/mcp";

const connected: { client: Client; server: McpServer }[] = [];
afterEach(async () => {
  for (const { client, server } of connected.splice(0)) {
    await client.close();
    await server.close();
  }
});

/** A note tool whose sends are counted. */
function noteTool(type: string) {
  const sent: string[] = [];
  const tool = {
    name: "send_note",
    description: "Send a note, once per note id.",
    action: defineAction<{ text: string }, { id: string }>({
      type,
      capabilities: {},
      async execute(args) {
        sent.push(args.text);
        return { id: `n${sent.length}` };
      },
    }),
    input: z.object({ noteId: z.string().min(1), text: z.string() }),
    args: (i: { text: string }) => ({ text: i.text }),
    key: (i: { noteId: string }) => ["note", i.noteId],
  };
  return { tool, sent };
}

type Ctx = { tenantId?: string; thread?: { id: string }; revision?: string; agent?: string };
const rnd = () => Math.random().toString(36).slice(2, 7);

/** What the model reads of a call that failed before the ledger was read (`name`: the error's). */
const UNREAD = (name: string) =>
  new RegExp(
    `^Not confirmed: the tool failed \\(${name}\\) before whether this work was already done \\(by an earlier call\\) could be read; this call did nothing\\.`,
  );
/** What the model reads of a call whose setup the ledger refused (`field`: the value's path). */
const MISSET = (field: string) =>
  new RegExp(
    `^Not confirmed: the tool is not set up right \\(${field}: .+\\), so whether this work was already done \\(by an earlier call\\) could not be read; this call did nothing\\. Tell the user the tool is not set up right, not whether the work was done; do not change the input for it\\.`,
  );

for (const dialect of DIALECTS) {
  describe(`a tool whose application code fails, or makes a value the ledger refuses, before the ledger is read, for work done earlier, on ${dialect}`, () => {
    const db = ledgersFor(dialect, openLedger, { defaults: { poolSize: 2 } as LedgerOptions });

    const cases = [
      {
        name: "its tenant function throws (a run without the context it reads)",
        tenant: (c: ToolCall<Ctx>) => c.context.tenantId!.trim(),
        failing: (): Ctx => ({}),
        reads: UNREAD("TypeError"),
      },
      {
        name: "its key function throws (a run without the thread it keys on)",
        key: (i: { noteId: string }, c: ToolCall<Ctx>) => ["note", c.context.thread!.id, i.noteId],
        failing: (tenantId: string): Ctx => ({ tenantId }),
        reads: UNREAD("TypeError"),
      },
      {
        name: "its tenant function reads an empty tenant (a claim left blank)",
        tenant: (c: ToolCall<Ctx>) => c.context.tenantId ?? "",
        failing: (): Ctx => ({ tenantId: "" }),
        reads: MISSET("tenant"),
      },
      {
        name: "its key function makes a part no key can hold (NaN: a run without the revision it keys on)",
        key: (i: { noteId: string }, c: ToolCall<Ctx>) => ["note", i.noteId, Number(c.context.revision)],
        failing: (tenantId: string): Ctx => ({ tenantId }),
        reads: MISSET("key\\[2\\]"),
      },
      {
        name: "its actor function reads an empty actor",
        actor: (c: ToolCall<Ctx>) => c.context.agent ?? "",
        failing: (tenantId: string): Ctx => ({ tenantId, thread: { id: "t1" } }),
        reads: MISSET("actor"),
      },
    ];
    for (const c of cases)
      it(`${c.name}: not confirmed, not 'not performed'`, async () => {
        const ledger = await db.open();
        const tenantId = `before-${dialect}-${rnd()}`;
        const { tool, sent } = noteTool(`test.before-ledger-${rnd()}`);
        const run = guard(ledger, tool, {
          tenant: c.tenant ?? ((call: ToolCall<Ctx>) => call.context.tenantId!),
          ...(c.key && { key: c.key }),
          ...(c.actor && { actor: c.actor }),
        });
        const working = { tenantId, thread: { id: "t1" }, revision: "3", agent: "support-bot" };
        const input = { noteId: "n1", text: "hello" };
        expect(await run(input, { context: working, callId: "a" })).toMatchObject({ status: "done" });
        // The model asks again, in a run whose context lacks what the application's code reads.
        const again = await run(input, { context: c.failing(tenantId), callId: "b" });
        // Before: not_performed, "Not performed: the tool failed before doing anything (TypeError).
        // Tell the user; do not assume it happened" (over MCP, isError: nothing was done), of a
        // note sent; for a value the ledger refused, "Not performed: the tool is not set up right
        // (tenant: …). Nothing was done". The ledger was not read.
        expect(again).toMatchObject({ status: "unconfirmed" });
        expect(again.message).toMatch(c.reads);
        expect(again.message).not.toMatch(/not performed|was not done|nothing was done|Cannot read/i); // nor the error's text
        expect(sent).toEqual(["hello"]);
        // The work is where the first call left it: done, read as such once the code can run.
        expect(await run(input, { context: working, callId: "c" })).toMatchObject({ status: "already_done" });
        expect(await ledger.admin.list({ tenant: tenantId })).toHaveLength(1);
      });

    it("an MCP server's context function throws (a request without its authInfo): not confirmed, and not isError", async () => {
      const ledger = await db.open();
      const tenantId = `before-mcp-${dialect}-${rnd()}`;
      const { tool, sent } = noteTool(`test.before-ledger-mcp-${rnd()}`);
      let signedIn = true;
      const context = (): Ctx => {
        if (!signedIn) throw new Error("no bearer token in this request");
        return { tenantId };
      };
      const server = new McpServer({ name: "idem", version: "0.1.0" });
      registerGuardedTool(server, ledger, tool, { tenant: (c: ToolCall<Ctx>) => c.context.tenantId!, context });
      const [clientSide, serverSide] = InMemoryTransport.createLinkedPair();
      const client = new Client({ name: "idem-test", version: "1.0.0" });
      connected.push({ client, server });
      await server.connect(serverSide);
      await client.connect(clientSide);
      const callTool = async () =>
        (await client.callTool({ name: "send_note", arguments: { noteId: "n1", text: "hello" } })) as CallToolResult;
      expect((await callTool()).structuredContent).toMatchObject({ status: "done" });
      signedIn = false;
      const again = await callTool();
      // Before: not_performed and isError (nothing was done), "the tool failed before doing
      // anything (Error)", of a note sent: a host's model told the user it was not sent.
      expect({ outcome: again.structuredContent, isError: again.isError }).toMatchObject({
        outcome: { status: "unconfirmed", message: expect.stringMatching(UNREAD("Error")) },
        isError: false,
      });
      expect(JSON.stringify(again)).not.toMatch(/bearer|not performed/i);
      expect(sent).toEqual(["hello"]);
      signedIn = true;
      expect((await callTool()).structuredContent).toMatchObject({ status: "already_done" });
    });

    it("an MCP request whose tenant claim is empty (the ledger refuses it): not confirmed, and not isError", async () => {
      const ledger = await db.open();
      const tenantId = `misset-mcp-${dialect}-${rnd()}`;
      const { tool, sent } = noteTool(`test.misset-mcp-${rnd()}`);
      let claim = tenantId;
      const server = new McpServer({ name: "idem", version: "0.1.0" });
      registerGuardedTool(server, ledger, tool, {
        tenant: (c: ToolCall<Ctx>) => c.context.tenantId!,
        context: (): Ctx => ({ tenantId: claim }),
      });
      const [clientSide, serverSide] = InMemoryTransport.createLinkedPair();
      const client = new Client({ name: "idem-test", version: "1.0.0" });
      connected.push({ client, server });
      await server.connect(serverSide);
      await client.connect(clientSide);
      const callTool = async () =>
        (await client.callTool({ name: "send_note", arguments: { noteId: "n1", text: "hello" } })) as CallToolResult;
      expect((await callTool()).structuredContent).toMatchObject({ status: "done" });
      claim = "";
      const again = await callTool();
      // Before: not_performed and isError, "Not performed: the tool is not set up right (tenant:
      // …). Nothing was done", of a note sent: a host's model told the user it was not sent.
      expect({ outcome: again.structuredContent, isError: again.isError }).toMatchObject({
        outcome: { status: "unconfirmed", message: expect.stringMatching(MISSET("tenant")) },
        isError: false,
      });
      expect(JSON.stringify(again)).not.toMatch(/not performed|nothing was done/i);
      expect(sent).toEqual(["hello"]);
      claim = tenantId;
      expect((await callTool()).structuredContent).toMatchObject({ status: "already_done" });
    });
  });
}
