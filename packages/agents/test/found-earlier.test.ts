/**
 * A fresh operation whose effect the provider found already done before it began (its key came
 * again after the ledger pruned the first operation): the model reads "already done earlier"
 * with the receipt's summary, not "Done". A record or copy found after this operation's own
 * answer was lost is this operation's doing: "done". Through the real frameworks (the AI SDK's
 * generateText with its mock model, an MCP client and server in memory) against the sandboxes.
 */
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import { setTimeout as sleep } from "node:timers/promises";
import { generateText, type ToolSet } from "ai";
import { MockLanguageModelV3 } from "ai/test";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { InMemoryTransport } from "@modelcontextprotocol/sdk/inMemory.js";
import { McpServer } from "@modelcontextprotocol/sdk/server/mcp.js";
import { openLedger, type LedgerOptions } from "@idem/core";
import { openTestLedger } from "@idem/core/testing";
import { emailActions, emailTools } from "@idem/email";
import { hubspotActions, hubspotTools, type HubSpotConfig } from "@idem/hubspot";
import { HubSpotSandbox, JOURNAL, MailSandbox, SENDER } from "@idem/sandbox";
import { DIALECTS, ledgersFor } from "@idem/testkit";
import { aiStatusTool, aiTool } from "@idem/agents/ai";
import { registerGuardedTool, registerStatusTool } from "@idem/agents/mcp";
import type { Outcome } from "@idem/agents";
// The core's test dialect with hooks around each statement (to refuse the completion's write).
import { dialectFor, hooked } from "../../core/test/support/dialects.js";

let hub: HubSpotSandbox;
let hubServer: { basePath: string; accessToken: string };
let mail: MailSandbox;
let ports: { smtp: number; imap: number };
beforeAll(async () => {
  hub = new HubSpotSandbox();
  hubServer = await hub.start();
  await hubspotActions({ accessToken: hubServer.accessToken, basePath: hubServer.basePath }).ensureSchema(["contacts"]);
  mail = new MailSandbox({ mode: "journal" });
  const s = await mail.start();
  ports = { smtp: s.smtp.port, imap: s.imap.port };
}, 60_000);
afterAll(async () => {
  await hub.close();
  await mail?.close();
});

const connected: { client: Client; server: McpServer }[] = [];
afterEach(async () => {
  for (const { client, server } of connected.splice(0)) {
    await client.close();
    await server.close();
  }
  hub.faults.clear();
  mail.faults.clear();
});

/** A client linked in memory to `server`, closed (with the server) after the test. */
async function connect(server: McpServer): Promise<Client> {
  const [clientSide, serverSide] = InMemoryTransport.createLinkedPair();
  const client = new Client({ name: "idem-test", version: "1.0.0" });
  connected.push({ client, server });
  await server.connect(serverSide);
  await client.connect(clientSide);
  return client;
}

const rnd = () => Math.random().toString(36).slice(2, 8);

type Call = { toolName: string; input: unknown };
/** The AI SDK's mock model making these tool calls, one step per entry, then stopping. */
function scriptedModel(steps: Call[][]) {
  let step = 0;
  const usage = {
    inputTokens: { total: 1, noCache: 1, cacheRead: 0, cacheWrite: 0 },
    outputTokens: { total: 1, text: 1, reasoning: 0 },
  };
  return new MockLanguageModelV3({
    doGenerate: async () => {
      const calls = steps[step++];
      if (!calls)
        return {
          content: [{ type: "text", text: "finished" }],
          finishReason: { unified: "stop", raw: "stop" },
          usage,
          warnings: [],
        };
      return {
        content: calls.map((c, i) => ({
          type: "tool-call" as const,
          toolCallId: `call_${step}_${i}_${rnd()}`,
          toolName: c.toolName,
          input: JSON.stringify(c.input),
        })),
        finishReason: { unified: "tool-calls", raw: "tool_calls" },
        usage,
        warnings: [],
      };
    },
  });
}

/** What the model read of its first tool call. */
async function firstRead(tools: ToolSet, call: Call) {
  const { steps } = await generateText({ model: scriptedModel([[call]]), tools, prompt: "go" });
  return steps[0]!.toolResults[0]!.output as Outcome & { operationId?: string; result?: Record<string, unknown> };
}

for (const dialect of DIALECTS) {
  describe(`found already done before the operation began, on ${dialect}`, () => {
    const db = ledgersFor(dialect, openLedger, { defaults: { poolSize: 2 } as LedgerOptions });
    const crm = (more: Partial<HubSpotConfig> = {}) =>
      hubspotActions({ accessToken: hubServer.accessToken, basePath: hubServer.basePath, ...more });
    /**
     * A ledger (closed by the test) whose database fails every write of `tenant`'s completions while
     * `refuse()` says so: after a lease of retries, the run ends in CompletionNotRecordedError.
     */
    const refusingCompletions = async (tenant: string, refuse: () => boolean, options: LedgerOptions = {}) =>
      openTestLedger(
        hooked(await dialectFor(dialect, db.url()), {
          async query(q, run) {
            const completion = q.sql.startsWith('update "idem_operations"') && q.parameters.includes("succeeded");
            if (refuse() && completion && q.parameters.includes(tenant)) throw new Error("connection reset (test)");
            return run();
          },
        }),
        { leaseMs: 300, ...options },
      );

    for (const mode of ["upsert", "create"] as const) {
      it(`HubSpot (${mode}): a contact an earlier operation made (pruned since) reads already done, also to the status tool`, async () => {
        // Before: the upsert's `_new: false` (create mode: the conflict read back) on this
        // operation's first request read "Done", as if this call had made the contact.
        const l = await db.open({ retentionMs: 1 } as LedgerOptions);
        const tenant = `hs-${dialect}-${rnd()}`;
        const createContact = hubspotTools(crm({ mode })).createContact;
        const tools = {
          create_contact: aiTool(l, createContact, { tenant }),
          operation_status: aiStatusTool(l, { tenant, tools: [createContact] }),
        };
        const call = { toolName: "create_contact", input: { email: `ada-${rnd()}@example.com`, firstname: "Ada" } };
        const before = hub.count("contacts");
        expect(await firstRead(tools, call)).toMatchObject({ status: "done", result: { new: true } });
        await sleep(20);
        expect(await l.admin.prune({ tenant })).toBe(1); // its retention passed (30 days by default)

        // Under other names: nothing is written, and the model reads so (before: only "already done",
        // and it would tell the user Augusta is in the CRM, where the contact is still Ada).
        const again = await firstRead(tools, { ...call, input: { ...call.input, firstname: "Augusta" } });
        expect(hub.count("contacts") - before).toBe(1); // the CRM kept one record
        expect(again, JSON.stringify(again)).toMatchObject({
          status: "already_done",
          result: {
            id: expect.any(String),
            new: false,
            note: "the contact was already there: the names given were not written, it is as it was",
          },
        });
        expect(hub.crm.get("contacts", again.result!.id as string)?.properties.firstname).toBe("Ada");
        expect(again.message).toMatch(/^Already done earlier; not repeated \(operation op_\w+\)\.$/);
        const checked = await firstRead(tools, {
          toolName: "operation_status",
          input: { operationId: again.operationId },
        });
        expect(checked).toMatchObject({ status: "already_done", result: again.result });
      });
    }

    it("HubSpot: a contact found already there whose receipt the ledger could not record reads already done, not done", async () => {
      // The effect's receipt is on CompletionNotRecordedError when the database fails after it.
      // Before: that path did not ask foundEarlier, and the model read "Done", as if this call had
      // made a contact HubSpot showed was there before the operation began.
      const tenant = `hs-cnr-${dialect}-${rnd()}`;
      let refuse = false;
      const l = await refusingCompletions(tenant, () => refuse, { retentionMs: 1 });
      try {
        const createContact = hubspotTools(crm()).createContact;
        const tools = { create_contact: aiTool(l, createContact, { tenant }) };
        const call = { toolName: "create_contact", input: { email: `dee-${rnd()}@example.com`, firstname: "Dee" } };
        const before = hub.count("contacts");
        expect(await firstRead(tools, call)).toMatchObject({ status: "done", result: { new: true } });
        await sleep(20);
        expect(await l.admin.prune({ tenant })).toBe(1);

        refuse = true; // the database fails once HubSpot has answered
        const again = await firstRead(tools, call);
        expect(hub.count("contacts") - before).toBe(1);
        expect(again, JSON.stringify(again)).toMatchObject({
          status: "already_done",
          operationId: expect.stringMatching(/^op_/),
          result: { id: expect.any(String), new: false },
        });
        expect(again.message).toMatch(
          /^Already done earlier; not repeated \(operation op_\w+\); recording it is delayed\. Do not repeat it\.$/,
        );
        const [op] = await l.admin.list({ tenant });
        expect(op).toMatchObject({ id: again.operationId, status: "running" }); // settled later, by its lease's end
      } finally {
        await l.close();
      }
    });

    it("HubSpot: a contact this call created whose receipt the ledger could not record: done, recording delayed", async () => {
      const tenant = `hs-cnr-${dialect}-${rnd()}`;
      const l = await refusingCompletions(tenant, () => true);
      try {
        const createContact = hubspotTools(crm()).createContact;
        const read = await firstRead(
          { create_contact: aiTool(l, createContact, { tenant }) },
          { toolName: "create_contact", input: { email: `eve-${rnd()}@example.com`, firstname: "Eve" } },
        );
        expect(read, JSON.stringify(read)).toMatchObject({ status: "done", result: { new: true } });
        expect(read.message).toMatch(/^Done \(operation op_\w+\); recording it is delayed\. Do not repeat it\.$/);
      } finally {
        await l.close();
      }
    });

    it("HubSpot: a contact this call created, its answer lost and settled by the read, reads done without `new: false`", async () => {
      const l = await db.open();
      const tenant = `hs-${dialect}-${rnd()}`;
      hub.faults.add({
        kind: "delay_after_commit",
        match: { method: "POST", path: "/crm/v3/objects/contacts" },
        delayMs: 5_000,
      });
      const before = hub.count("contacts");
      const read = await firstRead(
        { create_contact: aiTool(l, hubspotTools(crm({ timeoutMs: 300 })).createContact, { tenant }) },
        { toolName: "create_contact", input: { email: `bob-${rnd()}@example.com`, firstname: "Bob" } },
      );
      expect(hub.count("contacts") - before).toBe(1);
      // Before: "new: false" told the model the contact existed already; this call's request made it.
      expect(read, JSON.stringify(read)).toMatchObject({ status: "done", result: { id: expect.any(String) } });
      expect(read.result).not.toHaveProperty("new");
    });

    it("HubSpot: an address a person entered (no idem key on it) fails with HubSpot's conflict, not already done", async () => {
      const l = await db.open();
      const email = `carol-${rnd()}@example.com`;
      hub.crm.create("contacts", { email, firstname: "Carol" });
      const before = hub.count("contacts");
      const read = await firstRead(
        { create_contact: aiTool(l, hubspotTools(crm()).createContact, { tenant: `hs-${dialect}-${rnd()}` }) },
        { toolName: "create_contact", input: { email, firstname: "Carol" } },
      );
      expect(hub.count("contacts")).toBe(before);
      expect(read, JSON.stringify(read)).toMatchObject({ status: "failed" });
      expect(JSON.stringify(read)).not.toContain(hubServer.accessToken);
    });

    describe("send_email over MCP (journal mode)", () => {
      const actions = () =>
        emailActions({
          smtp: { host: "127.0.0.1", port: ports.smtp, auth: SENDER, timeoutMs: 2_500, requireTLS: false },
          imap: { host: "127.0.0.1", port: ports.imap, auth: SENDER, requireTLS: false },
          from: SENDER.user,
          copy: {
            mode: "journal",
            address: JOURNAL.user,
            imap: { host: "127.0.0.1", port: ports.imap, auth: JOURNAL, requireTLS: false },
          },
          settleMs: 300,
        });

      it("an email an earlier operation sent (pruned since) reads already done, also to the status tool", async () => {
        // Before: the check before sending found the journal's copy (`sent: false`) and the model read "Done".
        const l = await db.open({ retentionMs: 1 } as LedgerOptions);
        const tenant = `em-${dialect}-${rnd()}`;
        const send = emailTools(actions()).send;
        const server = new McpServer({ name: "idem", version: "0.1.0" });
        registerGuardedTool(server, l, send, { tenant });
        registerStatusTool(server, l, { tenant, tools: [send] });
        const client = await connect(server);
        const args = { to: "client@example.test", reference: `ord-${rnd()}`, subject: "Your order", text: "Shipped." };
        const first = await client.callTool({ name: "send_email", arguments: args });
        expect(first.structuredContent).toMatchObject({ status: "done" });
        const { messageId } = (first.structuredContent as { result: { messageId: string } }).result;
        await sleep(20);
        expect(await l.admin.prune({ tenant })).toBe(1);

        const again = await client.callTool({ name: "send_email", arguments: args });
        expect(mail.count(messageId)).toBe(1); // found in the journal: not sent twice
        expect(again.structuredContent, JSON.stringify(again)).toMatchObject({
          status: "already_done",
          result: { messageId },
        });
        expect(again.isError).toBe(false);
        const operationId = (again.structuredContent as { operationId: string }).operationId;
        const checked = await client.callTool({ name: "operation_status", arguments: { operationId } });
        expect(checked.structuredContent).toMatchObject({ status: "already_done", result: { messageId } });
      });

      it("an email an earlier operation sent (pruned since), its journal copy gone: sent again, as the description says", async () => {
        // Past the ledger's retention only the check before sending guards the send, and the
        // journal's own retention archives or deletes copies. Before, the description promised
        // "Safe to call again: the same reference and recipient is never emailed twice".
        const l = await db.open({ retentionMs: 1 } as LedgerOptions);
        const tenant = `em-${dialect}-${rnd()}`;
        const send = emailTools(actions()).send;
        const server = new McpServer({ name: "idem", version: "0.1.0" });
        registerGuardedTool(server, l, send, { tenant });
        const client = await connect(server);
        const listed = (await client.listTools()).tools.find((t) => t.name === "send_email");
        expect(listed!.description).toMatch(/while the ledger keeps the operation \(30 days by default\)/);
        const args = { to: "client@example.test", reference: `ord-${rnd()}`, subject: "Your order", text: "Shipped." };
        const first = await client.callTool({ name: "send_email", arguments: args });
        const { messageId } = (first.structuredContent as { result: { messageId: string } }).result;
        await sleep(20);
        expect(await l.admin.prune({ tenant })).toBe(1);
        const imap = mail.imap(JOURNAL); // the journal's retention takes the copy out of the mailbox searched
        await imap.connect();
        try {
          const lock = await imap.getMailboxLock("INBOX");
          try {
            expect(await imap.messageDelete({ header: { "message-id": messageId } })).toBe(true);
          } finally {
            lock.release();
          }
        } finally {
          await imap.logout();
        }
        const again = await client.callTool({ name: "send_email", arguments: args });
        expect(again.structuredContent).toMatchObject({ status: "done" });
        expect(mail.count(messageId)).toBe(2);
      });

      it("a journal address the server refuses: failed, not sent, without the journal's address", async () => {
        // The journal is a Bcc the recipient never sees, an operator's compliance mailbox: the
        // model (which repeats it to the user) reads "the journal address". Before: its address.
        const l = await db.open();
        const server = new McpServer({ name: "idem", version: "0.1.0" });
        registerGuardedTool(server, l, emailTools(actions()).send, { tenant: `em-${dialect}-${rnd()}` });
        const client = await connect(server);
        mail.faults.add({ kind: "reject_rcpt", match: { path: JOURNAL.user } });
        const before = mail.count();
        const out = await client.callTool({
          name: "send_email",
          arguments: { to: "client@example.test", reference: `ord-${rnd()}`, subject: "Hi", text: "Hello." },
        });
        expect(mail.count()).toBe(before);
        expect(out.structuredContent, JSON.stringify(out)).toMatchObject({
          status: "failed",
          reason: expect.stringMatching(/^the server refused the journal address \(550\): not sent/),
        });
        expect(JSON.stringify(out)).not.toContain(JOURNAL.user);
      });

      it("a recipient the server refuses: failed, not done", async () => {
        const l = await db.open();
        const server = new McpServer({ name: "idem", version: "0.1.0" });
        registerGuardedTool(server, l, emailTools(actions()).send, { tenant: `em-${dialect}-${rnd()}` });
        const client = await connect(server);
        mail.faults.add({ kind: "reject_rcpt", match: { path: "nobody@example.test" } });
        const out = await client.callTool({
          name: "send_email",
          arguments: { to: "nobody@example.test", reference: `ord-${rnd()}`, subject: "Hi", text: "Hello." },
        });
        expect(out.structuredContent, JSON.stringify(out)).toMatchObject({ status: "failed" });
        expect(out.isError).toBe(true);
      });
    });
  });
}
