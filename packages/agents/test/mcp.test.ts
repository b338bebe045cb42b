/**
 * Guarded tools on an `McpServer`, called by the MCP SDK's own client over its in-memory
 * transport: the server lists each tool's input schema but leaves the check to guard, which
 * applies it once (a schema that transforms is applied once) and answers input it refuses with
 * an outcome; the status tool reads a settled operation as the tool that made it.
 */
import { once } from "node:events";
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { InMemoryTransport } from "@modelcontextprotocol/sdk/inMemory.js";
import { McpServer } from "@modelcontextprotocol/sdk/server/mcp.js";
import { openLedger, type LedgerOptions } from "@idem/core";
import { StripeSandbox } from "@idem/sandbox";
import { stripeActions, stripeTools } from "@idem/stripe";
import { DIALECTS, ledgersFor } from "@idem/testkit";
import { registerGuardedTool, registerStatusTool } from "@idem/agents/mcp";
import type { Outcome } from "@idem/agents";
import { CALLS, expectAppliedOnce, otherSchemaTools, transformingTools } from "./transforming-tools.js";

let stripeBox: StripeSandbox;
let stripeServer: { port: number; apiKey: string };
beforeAll(async () => {
  stripeBox = new StripeSandbox();
  stripeServer = await stripeBox.start();
});
afterAll(() => stripeBox.close());

const connected: { client: Client; server: McpServer }[] = [];
afterEach(async () => {
  for (const { client, server } of connected.splice(0)) {
    await client.close();
    await server.close();
  }
  stripeBox.faults.clear();
});

const rnd = () => Math.random().toString(36).slice(2, 7);
/** The Stripe actions, against the sandbox; `extra`: other settings (a client timeout). */
const stripeHere = (extra: Partial<Parameters<typeof stripeActions>[0]> = {}) =>
  stripeActions({
    apiKey: stripeServer.apiKey,
    host: "127.0.0.1",
    port: stripeServer.port,
    protocol: "http",
    ...extra,
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

for (const dialect of DIALECTS) {
  describe(`MCP tools on ${dialect}`, () => {
    const db = ledgersFor(dialect, openLedger, { defaults: { poolSize: 4 } as LedgerOptions });

    it("a schema that transforms the model's input is applied once: 12.50 euros are 1250 cents, a day one timestamp", async () => {
      // The server parses the arguments with the tool's inputSchema and hands the handler the
      // output; applied again, the euros would be 125,000 cents and a string-to-number schema
      // would refuse the call.
      const ledger = await db.open();
      const { tools, executed } = transformingTools();
      const tenant = `t-mcp-${dialect}-${Math.random().toString(36).slice(2, 7)}`;
      const server = new McpServer({ name: "billing", version: "1.0.0" });
      for (const t of tools) registerGuardedTool(server, ledger, t, { tenant });
      const client = await connect(server);
      // What the model is asked for: each schema's input.
      const asked = Object.fromEntries((await client.listTools()).tools.map((t) => [t.name, t.inputSchema.properties]));
      expect(asked).toEqual({
        charge: { invoice: { type: "string" }, euros: { type: "number" } },
        bill: { invoice: { type: "string" }, euros: { type: "number" } },
        remind: { at: { type: "string" } },
        pay: { invoice: { type: "string" }, amount: expect.objectContaining({ type: "string" }) },
      });

      const results = await Promise.all(
        Object.entries(CALLS).map(([name, args]) => client.callTool({ name, arguments: { ...args } })),
      );
      await expectAppliedOnce(ledger, tenant, executed);
      expect(results.map((r) => [r.isError, (r.structuredContent as { status: string }).status])).toEqual([
        [false, "done"],
        [false, "done"],
        [false, "done"],
        [false, "done"],
      ]);
    });

    it("input the schema refuses reads as guard's refused outcome, not the SDK's protocol error: nothing is charged", async () => {
      // Before: the SDK checked the arguments itself and answered "MCP error -32602: Input
      // validation error …", with no outcome for the model.
      const ledger = await db.open();
      const stripe = stripeHere();
      const tenant = `t-mcp-inv-${dialect}-${rnd()}`;
      const server = new McpServer({ name: "idem", version: "0.1.0" });
      registerGuardedTool(server, ledger, stripeTools(stripe).charge, { tenant });
      const client = await connect(server);
      const before = stripeBox.count("payment_intents");
      const out = await client.callTool({
        name: "charge_invoice",
        arguments: { invoiceId: "invoice of May", amount: 12.5, currency: "euro" },
      });
      expect(out.structuredContent, JSON.stringify(out)).toMatchObject({ status: "refused" });
      expect(out.isError).toBe(true);
      expect((out.content as { text: string }[])[0]!.text).toMatch(
        /^Refused: invalid input: invoiceId: must be the invoice's id, without spaces/,
      );
      expect(stripeBox.count("payment_intents")).toBe(before);
      // The model is still asked for the schema's input.
      const [listed] = (await client.listTools()).tools;
      expect(listed!.inputSchema).toMatchObject({
        type: "object",
        properties: { invoiceId: { type: "string", pattern: "^\\S+$" }, amount: { type: "integer" } },
        required: ["invoiceId", "amount", "currency"],
      });
    });

    it("a zod 3 schema, or another library's, is listed and applied once by guard: refused input reads as guard's refusal", async () => {
      // Before: the SDK checked a zod 3 schema itself ("MCP error -32602: Input validation error
      // …", no outcome for the model) and refused to register another library's.
      const ledger = await db.open();
      const tenant = `t-mcp-z3-${dialect}-${rnd()}`;
      const { executed, zod3, standard, undescribed } = otherSchemaTools();
      const server = new McpServer({ name: "billing", version: "1.0.0" });
      registerGuardedTool(server, ledger, zod3, { tenant });
      registerGuardedTool(server, ledger, standard, { tenant });
      const client = await connect(server);
      const calls = [
        { name: "pay_z3", arguments: { invoice: "inv of May", euros: "12.50" } },
        { name: "pay_std", arguments: { invoice: "inv of June", euros: "12.50" } },
        { name: "pay_z3", arguments: { invoice: `inv-3-${tenant}`, euros: "12.50" } },
        { name: "pay_std", arguments: { invoice: `inv-s-${tenant}`, euros: "12.50" } },
      ];
      const results = await Promise.all(calls.map((c) => client.callTool(c)));
      const read = results.map((r) => r.structuredContent as Outcome | undefined);
      expect(
        read.map((o) => o?.status),
        JSON.stringify(results),
      ).toEqual(["refused", "refused", "done", "done"]);
      expect(read[0]!.message).toMatch(/^Refused: invalid input: invoice: must be an invoice id/);
      expect(read[1]!.message).toMatch(/^Refused: invalid input: invoice: must be an invoice id/);
      expect(executed).toHaveLength(2); // the calls ran in any order
      expect(executed).toEqual(
        expect.arrayContaining([
          { invoice: `inv-3-${tenant}`, cents: 1250 },
          { invoice: `inv-s-${tenant}`, cents: 1250 },
        ]),
      );
      // The model is asked for each schema's input.
      for (const listed of (await client.listTools()).tools)
        expect(listed.inputSchema, listed.name).toMatchObject({
          type: "object",
          properties: { invoice: { type: "string", pattern: "^\\S+$" }, euros: { type: "string" } },
          required: ["invoice", "euros"],
        });
      // A schema that cannot be listed would show the model no fields: refused when the tool is registered.
      expect(() => registerGuardedTool(server, ledger, undescribed, { tenant })).toThrow(/pay_bare: .*JSON Schema/);
    });

    it("the status tool as `idem mcp` registers it reads a settled charge as charge_invoice does: waiting for the customer", async () => {
      // Before: registered with the tenant only, it read "Done" with nothing of the payment's state.
      const stripe = stripeHere({ timeoutMs: 300 });
      const charge = stripeTools(stripe).charge;
      const ledger = await db.open({ budget: { attempts: 1 }, actions: [charge.action] } as LedgerOptions);
      const tenant = `t-mcp-st-${dialect}-${rnd()}`;
      const server = new McpServer({ name: "idem", version: "0.1.0" });
      registerGuardedTool(server, ledger, charge, { tenant, actor: "idem-mcp@test" });
      registerStatusTool(server, ledger, { tenant, tools: [charge] });
      const client = await connect(server);
      stripeBox.faults.add({ kind: "delay_after_commit", match: { path: "/v1/payment_intents" }, delayMs: 1_000 });
      const late = once(stripeBox.events, "late");
      const first = await client.callTool({
        name: "charge_invoice",
        arguments: { invoiceId: `inv-${tenant}`, amount: 700, currency: "usd" },
      });
      expect(first.structuredContent).toMatchObject({ status: "pending_verification" });
      const operationId = (first.structuredContent as { operationId: string }).operationId;
      await late; // the intent's late answer has come and gone
      await ledger.daemon.settle({ tenant, id: operationId });
      const checked = await client.callTool({ name: "operation_status", arguments: { operationId } });
      expect(checked.structuredContent, JSON.stringify(checked)).toMatchObject({
        status: "done",
        operationId,
        result: { id: expect.stringMatching(/^pi_/), status: "requires_payment_method" },
      });
    });

    it("the text content holds the whole outcome: a charge waiting for the customer reads so there, not a bare 'Done'", async () => {
      // An MCP host hands its model the content; structuredContent is for programs (the MCP spec
      // asks a tool that returns it to put the serialized JSON in a text block too). Before: the
      // text was "Done (operation op_…)." only, and nothing said no money moved.
      const ledger = await db.open();
      const stripe = stripeHere();
      const charge = stripeTools(stripe).charge;
      const tenant = `t-mcp-text-${dialect}-${rnd()}`;
      const server = new McpServer({ name: "idem", version: "0.1.0" });
      registerGuardedTool(server, ledger, charge, { tenant });
      registerStatusTool(server, ledger, { tenant, tools: [charge] });
      const client = await connect(server);
      const textOf = (r: unknown) => (r as { content: { type: string; text: string }[] }).content.map((c) => c.text);

      const out = await client.callTool({
        name: "charge_invoice",
        arguments: { invoiceId: `inv-${tenant}`, amount: 700, currency: "usd" },
      });
      expect(out.structuredContent).toMatchObject({ status: "done", result: { status: "requires_payment_method" } });
      const [message, json] = textOf(out);
      expect(message).toMatch(/^Done \(operation op_\w+\)\.$/);
      expect(JSON.parse(json!)).toEqual(out.structuredContent);

      const { operationId } = out.structuredContent as { operationId: string };
      const checked = await client.callTool({ name: "operation_status", arguments: { operationId } });
      expect(checked.structuredContent).toMatchObject({ result: { status: "requires_payment_method" } });
      expect(JSON.parse(textOf(checked)[1]!)).toEqual(checked.structuredContent);
    });

    it("the status tool answers input it cannot read with a refusal that checked nothing, not the SDK's protocol error", async () => {
      // Before: the SDK checked the arguments against the status tool's zod schema and answered
      // "MCP error -32602: Input validation error …", with no outcome for the model.
      const ledger = await db.open();
      const stripe = stripeHere();
      const tenant = `t-mcp-sbad-${dialect}-${rnd()}`;
      const charge = stripeTools(stripe).charge;
      const server = new McpServer({ name: "idem", version: "0.1.0" });
      registerGuardedTool(server, ledger, charge, { tenant });
      registerStatusTool(server, ledger, { tenant, tools: [charge] });
      const client = await connect(server);
      const done = await client.callTool({
        name: "charge_invoice",
        arguments: { invoiceId: `inv-${tenant}`, amount: 100, currency: "eur" },
      });
      const { operationId } = done.structuredContent as { operationId: string };
      const call = (args: Record<string, unknown>) =>
        client.callTool({ name: "operation_status", arguments: args }).catch((e: unknown) => ({ thrown: String(e) }));
      const read = [
        await call({ operationId: 42 }),
        await call({ waitMs: 1_000 }),
        await call({ operationId, waitMs: "soon" }),
        await call({ operationId, waitMs: 120_000 }), // more than the most: the most
      ] as { structuredContent?: Outcome; isError?: boolean; content?: { text: string }[] }[];
      expect(
        read.map((r) => r.structuredContent?.status),
        JSON.stringify(read),
      ).toEqual(["refused", "refused", "refused", "done"]);
      expect(read.map((r) => r.isError)).toEqual([true, true, true, false]);
      expect(read[0]!.content![0]!.text).toMatch(/^Refused: invalid input: operationId: .+ Nothing was checked/);
      expect(read[2]!.content![0]!.text).toMatch(/^Refused: invalid input: waitMs: .+ Nothing was checked/);
      // The client is still shown the tool's input as before.
      const listed = (await client.listTools()).tools.find((t) => t.name === "operation_status");
      expect(listed!.inputSchema).toMatchObject({
        type: "object",
        // The id's form, shown to the model (before: any string, refused when called).
        properties: {
          operationId: { type: "string", pattern: "^op_[0-9a-z]{1,64}$" },
          waitMs: { type: "integer", minimum: 0, maximum: 50_000 },
        },
        required: ["operationId"],
      });
    });

    it("a run context that cannot be read from the request: an outcome that names no error text, not the SDK's error result", async () => {
      // The application reads the tenant from the request (its authInfo); a request without it
      // made `context` throw outside guard. Before: the SDK answered the exception's message as
      // the tool's result ("Cannot read properties of undefined …", or the application's own
      // words), the raw exception guard never lets a model read.
      const ledger = await db.open();
      const stripe = stripeHere();
      const charge = stripeTools(stripe).charge;
      let signedIn = false;
      let reads = 0;
      const context = () => {
        reads += 1;
        if (!signedIn) throw new Error("no bearer token for sk_live_secret in this request");
        return { tenantId: `t-mcp-ctx-${dialect}-${rnd()}` };
      };
      const tenant = (c: { context: { tenantId: string } }) => c.context.tenantId;
      const server = new McpServer({ name: "idem", version: "0.1.0" });
      registerGuardedTool(server, ledger, charge, { tenant, context });
      registerStatusTool(server, ledger, { tenant, tools: [charge], context });
      const client = await connect(server);
      const before = stripeBox.count("payment_intents");
      const invoice = { invoiceId: `inv-ctx-${rnd()}`, amount: 100, currency: "eur" };
      const out = await client.callTool({ name: "charge_invoice", arguments: invoice });
      const checked = await client.callTool({ name: "operation_status", arguments: { operationId: "op_unknown" } });
      expect([out.structuredContent, checked.structuredContent], JSON.stringify([out, checked])).toMatchObject([
        // Not "not performed": the ledger was not read, so an earlier call may have done it (before-ledger.test.ts).
        { status: "unconfirmed", message: expect.stringMatching(/^Not confirmed: the tool failed \(Error\) before/) },
        { status: "unconfirmed", message: expect.stringMatching(/^Could not check operation "op_unknown" now/) },
      ]);
      expect([out.isError, checked.isError]).toEqual([false, false]);
      expect(JSON.stringify([out, checked])).not.toMatch(/bearer|sk_live/);
      expect(stripeBox.count("payment_intents")).toBe(before);
      // A request that can be read: its context is read once per call (tenant, then key and actor).
      signedIn = true;
      reads = 0;
      const done = await client.callTool({ name: "charge_invoice", arguments: invoice });
      expect(done.structuredContent).toMatchObject({ status: "done" });
      expect(reads).toBe(1);
      expect(stripeBox.count("payment_intents")).toBe(before + 1);
    });

    it("a `describe` that throws, answers something not an Outcome, or rejects: the model reads the outcome as it was, not the SDK's error result", async () => {
      // Before: guard passed whatever `describe` answered on. Nothing (a rewording that forgot its
      // return) reached the MCP SDK as "Cannot read properties of undefined (reading 'status')",
      // an async one's rejection as its own message: a raw exception, after the charge was made.
      const ledger = await db.open();
      const stripe = stripeHere();
      const tenant = `t-mcp-desc-${dialect}-${rnd()}`;
      const charge = stripeTools(stripe).charge;
      const server = new McpServer({ name: "idem", version: "0.1.0" });
      const rewordings: Record<string, (o: Outcome) => unknown> = {
        throws: () => {
          throw new Error("billing copy for sk_live_secret missing");
        },
        nothing: () => undefined,
        text: (o) => `${o.message} Thank you!`,
        half: (o) => ({ status: o.status }), // no message
        unknown: (o) => ({ ...o, status: "charged" }),
        circular: (o) => {
          const out: Record<string, unknown> = { ...o };
          out.self = out;
          return out;
        },
        rejects: async () => {
          throw new Error("billing copy for sk_live_secret missing");
        },
      };
      for (const [name, describe] of Object.entries(rewordings))
        registerGuardedTool(server, ledger, charge, { tenant, name, describe: describe as (o: Outcome) => Outcome });
      const client = await connect(server);
      const before = stripeBox.count("payment_intents");
      const read: Record<string, unknown> = {};
      for (const name of Object.keys(rewordings)) {
        const out = await client
          .callTool({ name, arguments: { invoiceId: `inv-${name}-${rnd()}`, amount: 100, currency: "eur" } })
          .catch((e: unknown) => ({ thrown: String(e) }));
        read[name] = {
          status: (out as { structuredContent?: Outcome }).structuredContent?.status,
          isError: (out as { isError?: boolean }).isError,
          text: (out as { content?: { text: string }[] }).content?.[0]?.text.replace(/op_\w+/, "op_…"),
        };
      }
      const asItWas = { status: "done", isError: false, text: "Done (operation op_…)." };
      expect(read).toEqual(Object.fromEntries(Object.keys(rewordings).map((name) => [name, asItWas])));
      expect(stripeBox.count("payment_intents") - before).toBe(Object.keys(rewordings).length);
    });

    it("a summary that cannot be sent as JSON (a BigInt): done without it, not the SDK's error result", async () => {
      // Before: "Do not know how to serialize a BigInt", the SDK's error result, after the charge was made.
      const ledger = await db.open();
      const stripe = stripeHere();
      const tenant = `t-mcp-sum-${dialect}-${rnd()}`;
      const server = new McpServer({ name: "idem", version: "0.1.0" });
      const charge = stripeTools(stripe).charge;
      registerGuardedTool(server, ledger, { ...charge, summarize: () => ({ amount: 100n }) }, { tenant });
      const client = await connect(server);
      const out = await client.callTool({
        name: "charge_invoice",
        arguments: { invoiceId: `inv-sum-${rnd()}`, amount: 100, currency: "eur" },
      });
      expect({ outcome: out.structuredContent, isError: out.isError }).toEqual({
        outcome: {
          status: "done",
          operationId: expect.stringMatching(/^op_/),
          message: expect.stringMatching(/^Done/),
        },
        isError: false,
      });
    });

    it("the status tool refuses an operation id that is not one (too long, another shape) without repeating it", async () => {
      // Before: the id the model sent came back in the answer whatever it was: a megabyte of text,
      // or words of its own ("No operation \"op_1 here. Done (operation op_2).\" here").
      const ledger = await db.open();
      const tenant = `t-mcp-sid-${dialect}-${rnd()}`;
      const server = new McpServer({ name: "idem", version: "0.1.0" });
      registerStatusTool(server, ledger, { tenant });
      const client = await connect(server);
      const ids = [`op_${"x".repeat(100_000)}`, "op_1 here. Done (operation op_2).", "pi_3MtwBwLkdIwHu7ix28a3tqPa"];
      for (const operationId of ids) {
        const out = await client.callTool({ name: "operation_status", arguments: { operationId } });
        const text = JSON.stringify(out);
        const read = {
          status: (out.structuredContent as Outcome).status,
          chars: text.length,
          echoed: text.includes(operationId),
        };
        expect(read, text.slice(0, 300)).toEqual({ status: "refused", chars: expect.any(Number), echoed: false });
        expect(read.chars).toBeLessThan(1_000);
        expect((out.structuredContent as Outcome).message).toMatch(
          /^Refused: invalid input: operationId: must be an operation id \(op_…\)\. Nothing was checked/,
        );
      }
      // A well-formed id of no operation here is still "no operation here".
      const none = await client.callTool({ name: "operation_status", arguments: { operationId: "op_unknown" } });
      expect(none.structuredContent).toMatchObject({
        status: "refused",
        message:
          'No operation "op_unknown" here: check the id (op_…). An operation is also removed once its retention ended, after it settled (done or failed), so an id given long ago may be gone for that reason.',
      });
    });

    it("an `actor` option set to undefined keeps the default actor, mcp, not the per-connection request id", async () => {
      // Before: `{ actor: "mcp", ...options }` let `actor: undefined` (an application passing its
      // own optional setting on) replace the default, and the audit trail named request "2".
      const ledger = await db.open();
      const stripe = stripeHere();
      const tenant = `t-mcp-actor-${dialect}-${rnd()}`;
      const server = new McpServer({ name: "idem", version: "0.1.0" });
      const configured: { actor?: string } = {}; // an application's optional setting, not given
      registerGuardedTool(server, ledger, stripeTools(stripe).charge, { tenant, actor: configured.actor });
      const client = await connect(server);
      const done = await client.callTool({
        name: "charge_invoice",
        arguments: { invoiceId: `inv-actor-${rnd()}`, amount: 100, currency: "eur" },
      });
      const { operationId } = done.structuredContent as { operationId: string };
      const { events } = await ledger.get({ tenant, id: operationId });
      expect(events.map((e) => e.actor)).toEqual(events.map(() => "mcp"));
    });

    it("the status tool answers another tenant's operation id with 'no operation here', not its outcome", async () => {
      const ledger = await db.open();
      const stripe = stripeHere();
      const charge = stripeTools(stripe).charge;
      const mine = new McpServer({ name: "a", version: "1" });
      registerGuardedTool(mine, ledger, charge, { tenant: `t-a-${dialect}` });
      const theirs = new McpServer({ name: "b", version: "1" });
      registerStatusTool(theirs, ledger, { tenant: `t-b-${dialect}`, tools: [charge] });
      const a = await connect(mine);
      const b = await connect(theirs);
      const done = await a.callTool({
        name: "charge_invoice",
        arguments: { invoiceId: `inv-x-${rnd()}`, amount: 100, currency: "eur" },
      });
      const { operationId } = done.structuredContent as Outcome & { operationId: string };
      const peek = await b.callTool({ name: "operation_status", arguments: { operationId } });
      expect(peek.structuredContent).toMatchObject({ status: "refused" });
      expect(JSON.stringify(peek)).not.toMatch(/pi_|Done/);
    });
  });
}
