/**
 * The MCP adapter against an SDK that no longer has the module it lists zod 3 schemas with
 * (`server/zod-json-schema-compat.js`, reached only through the SDK's catch-all export): a later
 * 1.x may move it. Real resolution in a real process: a copy of the adapter's sources beside a
 * copy of the installed SDK's package.json whose exports leave that one path out (its files are
 * the installed ones), as a moved file would leave it.
 */
import {
  cpSync,
  mkdirSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  realpathSync,
  rmSync,
  symlinkSync,
  writeFileSync,
} from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { afterAll, describe, expect, it } from "vitest";
import { startChild } from "@idem/testkit";

const HERE = fileURLToPath(new URL(".", import.meta.url));
const AGENTS = join(HERE, "..");
const CHILD = join(HERE, "children", "mcp-register.ts");
const CONVERTER = "./server/zod-json-schema-compat.js";

const dirs: string[] = [];
afterAll(() => {
  for (const d of dirs) rmSync(d, { recursive: true, force: true });
});

/** The adapter's sources in a temp dir whose node_modules are @idem/agents' own, but for an SDK without the converter. */
function adapterBesideMovedSdk(): string {
  const root = mkdtempSync(join(tmpdir(), "idem-mcp-sdk-"));
  dirs.push(root);
  const modules = join(root, "node_modules");
  for (const entry of readdirSync(join(AGENTS, "node_modules"))) {
    const from = join(AGENTS, "node_modules", entry);
    const scoped = entry.startsWith("@");
    for (const name of scoped ? readdirSync(from) : [""]) {
      const target = realpathSync(join(from, name));
      const at = join(modules, entry, name);
      if (`${entry}/${name}` === "@modelcontextprotocol/sdk") {
        // The installed SDK, at a later version whose exports no longer reach the converter.
        mkdirSync(at, { recursive: true });
        const pkg = JSON.parse(readFileSync(join(target, "package.json"), "utf8"));
        pkg.version = "1.99.0";
        pkg.exports = { [CONVERTER]: null, ...pkg.exports };
        writeFileSync(join(at, "package.json"), JSON.stringify(pkg));
        symlinkSync(join(target, "dist"), join(at, "dist"));
      } else {
        mkdirSync(scoped ? join(modules, entry) : modules, { recursive: true });
        symlinkSync(target, at);
      }
    }
  }
  cpSync(join(AGENTS, "src"), join(root, "agents", "src"), { recursive: true });
  writeFileSync(join(root, "agents", "package.json"), JSON.stringify({ name: "agents-copy", type: "module" }));
  return join(root, "agents", "src", "mcp.ts");
}

describe("the MCP adapter and the SDK's internal zod 3 converter", () => {
  it("imports without it, lists zod 4 tools, and refuses a zod 3 schema with a typed error naming the SDK version", async () => {
    // Before: the adapter imported the converter at load time, so `import "@idem/agents/mcp"`
    // failed (ERR_PACKAGE_PATH_NOT_EXPORTED) for every application, zod 3 or not.
    const mcp = adapterBesideMovedSdk();
    const child = startChild(CHILD, [mcp]);
    const zod3 = await child.waitFor(/^zod3 /);
    expect(child.lines[0]).toBe("imported");
    expect(JSON.parse(zod3.slice("zod3 ".length))).toEqual({
      name: "McpSdkVersionError",
      tool: "pay_z3",
      module: "@modelcontextprotocol/sdk/server/zod-json-schema-compat.js",
      sdkVersion: "1.99.0",
      message: expect.stringMatching(/^tool pay_z3: .*@modelcontextprotocol\/sdk 1\.99\.0 does not provide: .*zod 4/),
      cause: "ERR_PACKAGE_PATH_NOT_EXPORTED",
    });
    const listed = await child.waitFor(/^listed /);
    expect(JSON.parse(listed.slice("listed ".length))).toEqual([["pay_z4", { invoice: { type: "string" } }]]);
    const { code, stderr } = await child.exited;
    expect(code, stderr).toBe(0);
  });

  it("with the installed SDK, the same process lists the zod 3 tool too", async () => {
    const child = startChild(CHILD, [join(AGENTS, "src", "mcp.ts")]);
    const zod3 = await child.waitFor(/^(zod3|listed) /);
    expect(zod3).toBe("zod3 registered");
    const listed = await child.waitFor(/^listed /);
    expect(JSON.parse(listed.slice("listed ".length))).toEqual([
      ["pay_z4", { invoice: { type: "string" } }],
      ["pay_z3", { invoice: { type: "string" } }],
    ]);
    expect((await child.exited).code).toBe(0);
  });
});
