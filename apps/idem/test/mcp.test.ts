/**
 * `idem mcp` as a real MCP server over stdio, with the SDK's own client: a tool called twice, in
 * parallel, and with other arguments does its effect once (counted in a file); every answer is a
 * truthful result, never a protocol error; the status tool reports the operation. A stop (SIGTERM,
 * or the client gone) with a call whose provider does not answer ends within mcp.stopTimeoutMs,
 * exit 1, naming the operation left in flight on stderr, its row left running under its lease, and
 * who settles it (a daemon, or a later call with the same key). A stop while the ledger is still
 * opening is bounded from the signal too.
 */
import { afterEach, describe, expect, it } from "vitest";
import { spawn, type ChildProcessWithoutNullStreams } from "node:child_process";
import { existsSync } from "node:fs";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { ReadBuffer, serializeMessage } from "@modelcontextprotocol/sdk/shared/stdio.js";
import type { Transport } from "@modelcontextprotocol/sdk/shared/transport.js";
import { openLedger } from "@idem/core";
import { DIALECTS, freshDatabase, pgProxy, scaled, tempDir, type TestDialect } from "@idem/testkit";
import { lines } from "./fixtures/file-actions.js";
import { CLI, Database, idem, unopenable, until } from "./support.js";

const MCP_CONFIG = fileURLToPath(new URL("./fixtures/mcp.config.ts", import.meta.url));
type Result = {
  isError?: boolean;
  content: { type: string; text?: string }[];
  structuredContent?: Record<string, unknown>;
};

const clients: Client[] = [];
const cleanup: (() => Promise<void>)[] = [];
afterEach(async () => {
  for (const c of cleanup.splice(0).reverse()) await c(); // a frozen ledger thawed first: the server then ends at once
  for (const c of clients.splice(0)) await c.close(); // closes stdin and ends the server process
});

/**
 * A migrated ledger whose database can be frozen: after `freeze()`, every statement (Postgres,
 * behind a proxy that stops forwarding) or write (SQLite, its write lock held) waits for an
 * answer that does not come until the test ends (the connections cut, the lock released).
 */
async function freezable(dialect: TestDialect): Promise<{ url: string; freeze: () => void }> {
  const url = await freshDatabase(dialect);
  await (await openLedger(url)).close(); // migrated: idem mcp never migrates
  if (dialect === "sqlite") {
    let other: InstanceType<typeof Database> | undefined;
    cleanup.push(async () => {
      other?.exec("ROLLBACK");
      other?.close();
    });
    const freeze = () => {
      other = new Database(url.slice("sqlite:".length), { timeout: 0 });
      other.exec("BEGIN IMMEDIATE");
    };
    return { url, freeze };
  }
  let frozen = false;
  const proxy = await pgProxy(new URL(url), (client, upstream) => {
    client.on("data", (d: Buffer) => void (frozen || upstream.write(d)));
    upstream.pipe(client);
  });
  cleanup.push(async () => {
    proxy.down();
    await proxy.close();
  });
  return { url: proxy.url, freeze: () => (frozen = true) };
}

async function connect(env: Record<string, string>, flags: string[] = []): Promise<Client> {
  const transport = new StdioClientTransport({
    command: process.execPath,
    args: ["--conditions=idem-source", "--import", "tsx", CLI, "--config", MCP_CONFIG, "mcp", ...flags],
    env: { ...(process.env as Record<string, string>), ...env },
    stderr: "pipe",
  });
  const client = new Client({ name: "idem-test", version: "1.0.0" });
  clients.push(client);
  await client.connect(transport, { timeout: scaled(120_000) });
  return client;
}

for (const dialect of DIALECTS) {
  describe(`idem mcp on ${dialect}`, () => {
    it("serves the config's tools: one effect per note, truthful answers, the status tool", async () => {
      const dir = tempDir();
      const url = await freshDatabase(dialect);
      await (await openLedger(url)).close(); // migrated: idem mcp, like every command but migrate, never migrates
      const client = await connect({ LEDGER_URL: url, EFFECT_DIR: dir, TENANT: "acme" });
      const { tools } = await client.listTools();
      expect(tools.map((t) => t.name).sort()).toEqual(["operation_status", "send_note"]);
      expect(tools.find((t) => t.name === "send_note")!.annotations).toMatchObject({ idempotentHint: true });

      const call = (args: Record<string, unknown>, name = "send_note") =>
        client.callTool({ name, arguments: args }) as Promise<Result>;
      const first = await call({ noteId: "n1", text: "hello" });
      const again = await call({ noteId: "n1", text: "hello" });
      const [p1, p2] = await Promise.all([call({ noteId: "n2", text: "hi" }), call({ noteId: "n2", text: "hi" })]);
      const other = await call({ noteId: "n1", text: "something else" });
      const invalid = await call({ noteId: "", text: "x" });

      expect(first.structuredContent).toMatchObject({ status: "done", result: { id: expect.any(String) } });
      expect(first.isError).toBe(false);
      expect(first.content[0]!.text).toMatch(/^Done \(operation op_/);
      // An MCP host hands its model the content: the receipt's summary (the note's id) is there too,
      // the outcome as JSON text. Before: only "Done (operation op_…).", the id in structuredContent.
      expect(first.content[1]).toMatchObject({ type: "text" });
      expect(JSON.parse(first.content[1]!.text!)).toEqual(first.structuredContent);
      expect(again.structuredContent).toMatchObject({
        status: "already_done",
        operationId: first.structuredContent!.operationId,
      });
      expect([p1.structuredContent!.status, p2.structuredContent!.status].sort()).toEqual(["already_done", "done"]);
      expect(other).toMatchObject({ isError: true, structuredContent: { status: "refused" } });
      expect(other.content[0]!.text).toMatch(/this work \(note n1\) was already done with different arguments/);
      // Bad input is refused by guard's check of the tool's schema, as an outcome: before, the
      // SDK's own check answered with its protocol error, no `structuredContent`.
      expect(invalid).toMatchObject({ isError: true, structuredContent: { status: "refused" } });
      expect(invalid.content[0]!.text).toMatch(/^Refused: invalid input: noteId/);

      const effects = lines(`${dir}/effects`);
      expect(effects).toHaveLength(2); // n1 once, n2 once

      const status = await call({ operationId: first.structuredContent!.operationId }, "operation_status");
      // Summarized as send_note summarizes its receipt: before, the status tool had no tool's summary.
      expect(status.structuredContent).toMatchObject({
        status: "done",
        operationId: first.structuredContent!.operationId,
        result: first.structuredContent!.result,
      });
      expect(JSON.parse(status.content[1]!.text!)).toEqual(status.structuredContent);
    });
  });
}

for (const dialect of DIALECTS) {
  describe(`idem mcp's deadline (mcp.deadlineMs), its ledger frozen, on ${dialect}`, () => {
    it("a call answers 'not confirmed' by the config's deadline, not the default 45 s", async () => {
      const { url, freeze } = await freezable(dialect);
      const dir = tempDir();
      const client = await connect({ LEDGER_URL: url, EFFECT_DIR: dir, TENANT: "acme", MCP_DEADLINE_MS: "1500" });
      freeze();
      const started = Date.now();
      // Well before the default deadline (45 s), on a loaded machine too.
      const out = (await client.callTool({ name: "send_note", arguments: { noteId: "f1", text: "hi" } }, undefined, {
        timeout: scaled(30_000),
      })) as Result;
      // Before: the config was refused at start ("Unrecognized key: deadlineMs"): no server.
      expect(out.structuredContent, JSON.stringify(out)).toMatchObject({
        status: "unconfirmed",
        message: expect.stringMatching(/^Not confirmed: no answer within 1\.5 s, so it may or may not have happened/),
      });
      expect(out.isError).toBe(false);
      expect(Date.now() - started).toBeGreaterThanOrEqual(1_500);
      expect(lines(`${dir}/effects`)).toHaveLength(0);
    });
  });
}

describe("idem mcp's config", () => {
  it("an mcp.deadlineMs that is not a whole number of ms from 1 to 2147483647 is refused at start (exit 2), naming it", async () => {
    const url = await freshDatabase("sqlite");
    await (await openLedger(url)).close(); // migrated: idem mcp never migrates
    const env = { LEDGER_URL: url, EFFECT_DIR: tempDir(), TENANT: "acme" };
    for (const bad of ["0", "1.5", "2147483648", '"45s"', "null"]) {
      const out = await idem(["--config", MCP_CONFIG, "mcp"], { ...env, MCP_DEADLINE_MS: bad }, { noInput: true });
      expect(out.code, out.stderr).toBe(2);
      expect(out.stderr, bad).toMatch(/mcp\.deadlineMs: must be a whole number of ms from 1 to 2147483647 \(/);
      expect(out.stdout).toBe(""); // nothing served
    }
  });
});

describe("idem mcp's stop bound", () => {
  it("an mcp.stopTimeoutMs that is not a whole number of ms from 1 to 2147483647 is refused at start (exit 2), naming it", async () => {
    const url = await freshDatabase("sqlite");
    await (await openLedger(url)).close(); // migrated: idem mcp never migrates
    const env = { LEDGER_URL: url, EFFECT_DIR: tempDir(), TENANT: "acme" };
    for (const bad of ["0", "1.5", "2147483648", '"20s"']) {
      const out = await idem(["--config", MCP_CONFIG, "mcp"], { ...env, MCP_STOP_TIMEOUT_MS: bad }, { noInput: true });
      // As daemon.stopTimeoutMs. Before: "Unrecognized key" for any value, a good one too.
      expect(out.code, out.stderr).toBe(2);
      expect(out.stderr, bad).toMatch(/\n {2}mcp\.stopTimeoutMs: /);
      expect(out.stdout).toBe(""); // nothing served
    }
  });
});

describe("idem mcp's tenant", () => {
  it("an IDEM_TENANT that differs from the config's mcp.tenant is refused (exit 2, naming both); --tenant chooses", async () => {
    const dir = tempDir();
    const url = await freshDatabase("sqlite");
    const ledger = await openLedger(url); // migrated: idem mcp never migrates
    try {
      const env = { LEDGER_URL: url, EFFECT_DIR: dir, TENANT: "acme" };
      // Its stdin ends at once: a server that starts serves nothing and ends too.
      const refused = await idem(["--config", MCP_CONFIG, "mcp"], { ...env, IDEM_TENANT: "globex" }, { noInput: true });
      // Before: it served tenant globex, the operator's shell variable overriding the config.
      expect(refused.code, refused.stderr).toBe(2);
      expect(refused.stderr).toMatch(/IDEM_TENANT is "globex" but the config's mcp\.tenant is "acme"/);
      expect(refused.stdout).toBe(""); // no protocol message: nothing served
      // The same tenant in both is no conflict; --tenant is the operator's explicit choice.
      for (const [more, flags, tenant] of [
        [{ IDEM_TENANT: "acme" }, [], "acme"],
        [{ IDEM_TENANT: "acme" }, ["--tenant", "globex"], "globex"],
      ] as const) {
        const client = await connect({ ...env, ...more }, [...flags]);
        const out = (await client.callTool({ name: "send_note", arguments: { noteId: tenant, text: "hi" } })) as Result;
        expect(out.structuredContent, JSON.stringify(out)).toMatchObject({ status: "done" });
        const id = out.structuredContent!.operationId as string;
        expect((await ledger.get({ tenant, id })).operation.status).toBe("succeeded");
      }
    } finally {
      await ledger.close();
    }
  });

  it("a --tenant or IDEM_TENANT no ledger can hold (a tab or newline from a secret file) is refused at start (exit 2), not served", async () => {
    const dir = tempDir();
    const url = await freshDatabase("sqlite");
    await (await openLedger(url)).close(); // migrated: idem mcp never migrates
    const env = { LEDGER_URL: url, EFFECT_DIR: dir }; // no TENANT: no mcp.tenant, the operator's value is the tenant
    for (const [flags, more] of [
      [["--tenant", "acme\t"], {}],
      [[], { IDEM_TENANT: "acme\n" }],
    ] as const) {
      const out = await idem(["--config", MCP_CONFIG, "mcp", ...flags], { ...env, ...more }, { noInput: true });
      // Before: exit 0 after serving: every call read "not set up right", every status check
      // "could not check now, check again later", for as long as the server ran.
      expect(out.code, out.stderr).toBe(2);
      expect(out.stderr).toMatch(/tenant.*must be a non-empty printable string/);
      expect(out.stdout).toBe(""); // nothing served
    }
  });
});

describe("idem mcp stopped", () => {
  it("a host that stops reading its output (EPIPE) stops the server as a client gone, not an unhandled error", async () => {
    const url = await freshDatabase("sqlite");
    await (await openLedger(url)).close(); // migrated: idem mcp never migrates
    const child = spawn(
      process.execPath,
      ["--conditions=idem-source", "--import", "tsx", CLI, "--config", MCP_CONFIG, "mcp"],
      { env: { ...process.env, LEDGER_URL: url, EFFECT_DIR: tempDir(), TENANT: "acme" } },
    );
    try {
      let stderr = "";
      child.stderr.on("data", (d) => (stderr += d));
      const exited = new Promise<number | null>((resolve) => child.once("exit", resolve));
      // The host's end of the server's output closed: the server's first answer meets EPIPE. Its
      // input stays open, so only that tells the server its client is gone.
      child.stdout.destroy();
      const initialize = {
        jsonrpc: "2.0",
        id: 1,
        method: "initialize",
        params: { protocolVersion: "2025-06-18", capabilities: {}, clientInfo: { name: "t", version: "1" } },
      };
      child.stdin.write(`${JSON.stringify(initialize)}\n`);
      // Before: "Unhandled 'error' event ... EPIPE", exit 1, with any call in flight cut short.
      expect(await exited, stderr).toBe(0);
      expect(stderr).not.toMatch(/Unhandled|EPIPE/);
    } finally {
      child.kill("SIGKILL");
    }
  });

  it("on SIGTERM with a call in flight records its effect before it exits: the row is not left running for the daemon", async () => {
    const dir = tempDir();
    const url = await freshDatabase("sqlite");
    const ledger = await openLedger(url); // migrated: idem mcp never migrates
    const transport = new StdioClientTransport({
      command: process.execPath,
      args: ["--conditions=idem-source", "--import", "tsx", CLI, "--config", MCP_CONFIG, "mcp"],
      env: { ...(process.env as Record<string, string>), LEDGER_URL: url, EFFECT_DIR: dir, TENANT: "acme" },
      stderr: "pipe",
    });
    const client = new Client({ name: "idem-test", version: "1.0.0" });
    clients.push(client);
    try {
      await client.connect(transport, { timeout: scaled(120_000) });
      const pid = transport.pid!;
      // The server's exit closes its stdout: the client hears the transport close then.
      const exited = new Promise<void>((resolve) => (client.onclose = resolve));
      const call = client
        .callTool({ name: "send_note", arguments: { noteId: "n9", text: "hi" } })
        .catch(() => undefined);
      // The effect is done (a line in the file) and the action still in flight (its 300 ms pause).
      const deadline = Date.now() + scaled(60_000);
      while (lines(`${dir}/effects`).length === 0) {
        if (Date.now() > deadline) throw new Error("the tool never did its effect");
        await new Promise((r) => setTimeout(r, 10));
      }
      process.kill(pid, "SIGTERM");
      await exited;
      await call;
      const [op] = await ledger.admin.list({ tenant: "acme" });
      // Before: Node's default SIGTERM ended the process mid-call, the row left running until
      // its lease passed and the daemon looked it up.
      expect(op).toMatchObject({ status: "succeeded" });
      expect(lines(`${dir}/effects`)).toHaveLength(1);
    } finally {
      await ledger.close();
    }
  });
});

/**
 * The SDK's client transport over a server process the test spawned: as StdioClientTransport, but
 * the process (its exit code, its signals) is the test's.
 */
function overChild(child: ChildProcessWithoutNullStreams): Transport {
  const buffer = new ReadBuffer();
  const transport: Transport = {
    async start() {
      child.stdout.on("data", (chunk: Buffer) => {
        buffer.append(chunk);
        for (let m = buffer.readMessage(); m; m = buffer.readMessage()) transport.onmessage?.(m);
      });
      child.once("close", () => transport.onclose?.());
    },
    async send(message) {
      child.stdin.write(serializeMessage(message));
    },
    async close() {
      child.stdin.end();
    },
  };
  return transport;
}

/** `idem mcp` spawned with the test config, served over `overChild`; its stderr collected, its exit awaited. */
async function served(env: Record<string, string>) {
  const child = spawn(
    process.execPath,
    ["--conditions=idem-source", "--import", "tsx", CLI, "--config", MCP_CONFIG, "mcp"],
    { env: { ...process.env, ...env } },
  );
  cleanup.push(async () => void child.kill("SIGKILL"));
  // "close", not "exit": its stderr read to the end.
  const out = { child, stderr: "", exited: new Promise<number | null>((r) => child.once("close", r)) };
  child.stderr.on("data", (d) => (out.stderr += d));
  const client = new Client({ name: "idem-test", version: "1.0.0" });
  await client.connect(overChild(child), { timeout: scaled(120_000) });
  return Object.assign(out, { client }); // the same object: its stderr still growing
}

for (const dialect of DIALECTS) {
  describe(`idem mcp stopped with a call that does not end, on ${dialect}`, () => {
    for (const [how, stop] of [
      ["SIGTERM", (c: ChildProcessWithoutNullStreams) => c.kill("SIGTERM")],
      ["the client gone (its input ended)", (c: ChildProcessWithoutNullStreams) => c.stdin.end()],
    ] as const)
      it(
        `${how}: exits 1 within mcp.stopTimeoutMs, naming the operation left in flight on stderr; its row stays running`,
        async () => {
          const dir = tempDir();
          const url = await freshDatabase(dialect);
          const ledger = await openLedger(url); // migrated: idem mcp never migrates
          cleanup.push(() => ledger.close());
          // The provider did the effect and answers in an hour: its timer holds the process open, as a socket would.
          const server = await served({
            LEDGER_URL: url,
            EFFECT_DIR: dir,
            TENANT: "acme",
            AFTER_EFFECT_MS: "3600000",
            MCP_STOP_TIMEOUT_MS: "8000",
          });
          void server.client
            .callTool({ name: "send_note", arguments: { noteId: "h1", text: "hi" } }, undefined, {
              timeout: scaled(120_000),
            })
            .catch(() => undefined);
          const deadline = Date.now() + scaled(60_000);
          while (lines(`${dir}/effects`).length === 0) {
            if (Date.now() > deadline) throw new Error("the tool never did its effect");
            await new Promise((r) => setTimeout(r, 10));
          }
          const [op] = await ledger.admin.list({ tenant: "acme" });
          stop(server.child);
          // The bound (8 s) and generous room for a loaded machine to end a process; well below a
          // lease (30 s), which the close waited before, and the hour the provider holds it open.
          // The bound keeps 800 ms (a tenth) for the close's end and its lines: a loaded machine needs them.
          const bound = 8_000 + scaled(5_000);
          const code = await Promise.race([
            server.exited,
            new Promise<string>((r) => setTimeout(() => r(`still running ${bound} ms after the stop`), bound).unref()),
          ]);
          // Before: no exit within the bound (the close waited a lease, then the provider's timer held it), nothing named.
          expect(code, server.stderr).toBe(1);
          const said = server.stderr
            .split("\n")
            .filter((l) => l.startsWith("{"))
            .map((l) => JSON.parse(l) as { level: number; msg: string; inFlight?: unknown })
            .filter((l) => l.inFlight !== undefined);
          expect(said).toEqual([
            expect.objectContaining({
              level: 50,
              inFlight: [{ tenant: "acme", id: op!.id }],
              msg: expect.stringContaining(
                `the ledger closed with 1 call(s) still in flight (${op!.id}): the stop's bound (mcp.stopTimeoutMs) ended the wait`,
              ),
            }),
          ]);
          // Who settles it: idem mcp runs no replay policy of its own. Before: "settled by the replay
          // policy once that expires", as if something would, with no daemon on this ledger.
          expect(said[0]!.msg).toContain(
            "once that expires, is settled by the replay policy when a daemon (idem daemon) runs on this ledger or a later call with the same key comes",
          );
          // Before: "their outcomes not recorded", though a write already on its way may have recorded one.
          expect(server.stderr).toContain(
            `idem: the ledger closed with 1 call(s) still in flight, their outcomes may not be recorded (${op!.id}): check each with idem show; see the log`,
          );
          // Left to its lease, for the replay policy once that expires: not guessed either way.
          expect((await ledger.get({ tenant: "acme", id: op!.id })).operation.status).toBe("running");
        },
        scaled(120_000),
      );
  });
}

describe("idem mcp's client gone with nothing in flight", () => {
  it("exits 0 and says nothing of calls left", async () => {
    const url = await freshDatabase("sqlite");
    await (await openLedger(url)).close(); // migrated: idem mcp never migrates
    const server = await served({
      LEDGER_URL: url,
      EFFECT_DIR: tempDir(),
      TENANT: "acme",
      MCP_STOP_TIMEOUT_MS: "8000",
    });
    const out = (await server.client.callTool({
      name: "send_note",
      arguments: { noteId: "g1", text: "hi" },
    })) as Result;
    expect(out.structuredContent, JSON.stringify(out)).toMatchObject({ status: "done" });
    server.child.stdin.end();
    expect(await server.exited, server.stderr).toBe(0);
    expect(server.stderr).not.toMatch(/in flight|late answer|idem:/);
  });
});

/**
 * `idem mcp` on a migrated ledger that no one can open until the test ends (support.ts
 * `unopenable`), once its config is loaded: the stop signals are heard, and the ledger's open is
 * next. `stderr()`: what it said so far.
 */
async function mcpOpening(
  dialect: TestDialect,
  stopTimeoutMs: number,
): Promise<{ child: ChildProcessWithoutNullStreams; stderr(): string; exited: Promise<number | null> }> {
  const { url, release } = await unopenable(dialect);
  cleanup.push(release);
  const loaded = join(tempDir(), "loaded");
  const child = spawn(
    process.execPath,
    ["--conditions=idem-source", "--import", "tsx", CLI, "--config", MCP_CONFIG, "mcp"],
    {
      env: {
        ...process.env,
        LEDGER_URL: url,
        EFFECT_DIR: tempDir(),
        TENANT: "acme",
        MCP_STOP_TIMEOUT_MS: String(stopTimeoutMs),
        LOADED_FILE: loaded,
      },
    },
  );
  cleanup.push(async () => void child.kill("SIGKILL"));
  let stderr = "";
  child.stderr.on("data", (d) => (stderr += d));
  const exited = new Promise<number | null>((r) => child.once("close", r));
  await until(() => existsSync(loaded), 60_000, "idem mcp to load its config");
  return { child, stderr: () => stderr, exited };
}

for (const dialect of DIALECTS) {
  describe(`idem mcp stopped while its ledger is still opening, on ${dialect}`, () => {
    it(
      "SIGTERM: exits 1 within mcp.stopTimeoutMs of the signal, saying the ledger did not open, not when the open gives up",
      async () => {
        const { child, stderr, exited } = await mcpOpening(dialect, 1500);
        child.kill("SIGTERM");
        // Before: the bound started only once serving ended, after the open: the process waited
        // for the open to give up (10 s), then said why it failed, not that it was stopped.
        expect(await exited, stderr()).toBe(1);
        expect(stderr()).toContain(
          "the ledger did not open within 1500 ms of the stop (the database not answering, or a loaded machine): exiting; nothing was served",
        );
        expect(stderr()).not.toMatch(/cannot (open|connect)/);
      },
      scaled(120_000),
    );

    it(
      "Ctrl-C again: exits at once (130), saying nothing was served, not that a call in flight was left to its lease",
      async () => {
        const { child, stderr, exited } = await mcpOpening(dialect, scaled(60_000));
        // Ctrl-C until one past the first is heard as another (stop-signals.ts REPEAT_SIGNAL_MS).
        await until(
          () => {
            if (child.exitCode === null && child.signalCode === null) child.kill("SIGINT");
            return stderr().includes("interrupted again") || child.exitCode !== null;
          },
          60_000,
          "a Ctrl-C after the first to be heard",
        );
        expect(await exited, stderr()).toBe(130);
        // Before: "…; a call in flight is left to its lease, and once that expires, is settled by …".
        expect(stderr()).toContain(
          "interrupted again while stopping: exiting at once; the ledger was still opening: nothing was served",
        );
        expect(stderr()).not.toContain("left to its lease");
      },
      scaled(120_000),
    );
  });
}
