/**
 * The packages as a user gets them, outside this repository. Every publishable package is packed
 * with `pnpm pack` from a tree without `dist` (so its prepack must build it; `workspace:` ranges
 * become versions), the tarballs are installed with npm into a fresh project under the system's
 * temp directory, and from there, with nothing of the monorepo in reach:
 * - an ESM script makes a guarded `ledger.run` on SQLite and on Postgres (and through
 *   `@idem/agents`' guard), and the packed `idem` command lists what it did;
 * - an ESM TypeScript file and a CommonJS TypeScript project (`module: node16`, which reaches the
 *   ESM-only packages with `await import()`, as their READMEs say) typecheck strictly against the
 *   packages' own declarations, and the CommonJS one runs;
 * - a package a user must add (a database driver, a provider, tsx, the MCP SDK) is named when missing;
 * - each package's code imports only the packages its manifest declares (installed alone, nothing
 *   hoisted by another would be there), and no source ships that its build leaves out (test-only code).
 * It needs the npm registry: when it cannot be reached the suite fails saying so, it never skips.
 */
import { spawn, type ChildProcess } from "node:child_process";
import {
  existsSync,
  mkdirSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  renameSync,
  rmSync,
  writeFileSync,
} from "node:fs";
import { builtinModules, createRequire } from "node:module";
import { tmpdir } from "node:os";
import { delimiter, join, relative, sep } from "node:path";
import type * as TypeScript from "typescript";
import { fileURLToPath } from "node:url";
import { afterAll, beforeAll, expect, it } from "vitest";
import { freshDatabase } from "@idem/testkit";

const REPO = fileURLToPath(new URL("../..", import.meta.url));
/** What a user installs beside the packages: the drivers, and the compiler and Node types for the typechecks. */
const EXTRAS = ["better-sqlite3@12.11.1", "pg@8.23.1", "typescript@5.9.3", "@types/node@20.19.43"];
/**
 * The oldest Node the packages run on, as their `engines` and READMEs say: 20.3 added
 * `AbortSignal.any`, which core's runner, the agents' status tool and the CLI's alerts call (every
 * dependency asks for 20.0 or later). Node 20.19 is needed only to `require()` the packages.
 */
const NODE_FLOOR = "20.3";
/** Generous: on a loaded two-core machine, packing builds six packages and npm compiles better-sqlite3. */
const LONG = 10 * 60_000;

const spawned = new Set<ChildProcess>();
const dirs: string[] = [];
/** Each command runs in its own process group, so npm's and pnpm's children (node-gyp, make, tsc) go with it. */
const killGroup = (p: ChildProcess) => {
  if (p.exitCode !== null || p.signalCode !== null || p.pid === undefined) return;
  try {
    process.kill(-p.pid, "SIGKILL");
  } catch {
    // already gone
  }
};
// A last resort if the worker exits without its hooks: synchronous, so it runs.
process.once("exit", () => spawned.forEach(killGroup));

/** The environment of a user's shell: nothing of pnpm's script environment, no repository bins on PATH. */
const env = (extra: Record<string, string> = {}): NodeJS.ProcessEnv => {
  const clean = Object.fromEntries(
    Object.entries(process.env).filter(([k]) => !/^(npm_|pnpm_|PNPM_|INIT_CWD$|NODE_OPTIONS$|VITEST|TEST$)/i.test(k)),
  );
  const path = (process.env.PATH ?? "")
    .split(delimiter)
    .filter((p) => p && !inRepo(p))
    .join(delimiter);
  // node-gyp finds Node's headers on this machine instead of downloading them (no network but the registry).
  return {
    ...clean,
    PATH: path,
    npm_config_nodedir: process.env.npm_config_nodedir ?? "/usr",
    npm_config_update_notifier: "false",
    ...extra,
  };
};
const inRepo = (p: string) => !relative(REPO, p).startsWith("..") && !relative(REPO, p).startsWith(sep);

interface Ran {
  code: number | null;
  signal: NodeJS.Signals | null;
  stdout: string;
  stderr: string;
}

/** Runs a command to its end (or kills its group after `timeoutMs`); resolves whatever its exit code. */
function run(
  cmd: string,
  args: string[],
  opts: { cwd: string; env?: Record<string, string>; timeoutMs?: number },
): Promise<Ran> {
  return new Promise((resolve, reject) => {
    const p = spawn(cmd, args, {
      cwd: opts.cwd,
      env: env(opts.env),
      stdio: ["ignore", "pipe", "pipe"],
      detached: true,
    });
    spawned.add(p);
    let stdout = "";
    let stderr = "";
    p.stdout!.on("data", (d) => (stdout += String(d)));
    p.stderr!.on("data", (d) => (stderr += String(d)));
    const timer = setTimeout(() => killGroup(p), opts.timeoutMs ?? LONG);
    p.once("error", (e) => {
      clearTimeout(timer);
      spawned.delete(p);
      reject(e);
    });
    p.once("close", (code, signal) => {
      clearTimeout(timer);
      spawned.delete(p);
      resolve({ code, signal, stdout, stderr });
    });
  });
}

/** Runs a command that must succeed; its output is in the error otherwise. */
async function ok(
  cmd: string,
  args: string[],
  opts: { cwd: string; env?: Record<string, string>; timeoutMs?: number },
): Promise<string> {
  const r = await run(cmd, args, opts);
  if (r.code !== 0)
    throw new Error(
      `${cmd} ${args.join(" ")} (in ${opts.cwd}) ended with ${r.code ?? r.signal}\n--- stdout\n${r.stdout.slice(-4000)}\n--- stderr\n${r.stderr.slice(-4000)}`,
    );
  return r.stdout;
}

function tempDir(prefix: string): string {
  const dir = mkdtempSync(join(tmpdir(), prefix));
  dirs.push(dir);
  return dir;
}

/** Moves installed packages away for the duration of `fn`, as if the user had not installed them. */
async function without<T>(project: string, names: string[], fn: () => Promise<T>): Promise<T> {
  const moved = names.map(
    (n) => [join(project, "node_modules", n), join(project, "node_modules", `.away-${n.replace("/", "+")}`)] as const,
  );
  for (const [from, to] of moved) renameSync(from, to);
  try {
    return await fn();
  } finally {
    for (const [from, to] of moved) renameSync(to, from);
  }
}

const write = (file: string, text: string) => {
  mkdirSync(join(file, ".."), { recursive: true });
  writeFileSync(file, text);
};

let project = "";
let packages: { name: string; dir: string }[] = [];
let sqliteUrl = "";
let postgresUrl = "";

beforeAll(async () => {
  const started = Date.now();
  // Every package of packages/* and apps/* that is not private is published.
  packages = ["packages", "apps"]
    .flatMap((group) => readdirSync(join(REPO, group)).map((d) => join(REPO, group, d)))
    .filter((dir) => existsSync(join(dir, "package.json")))
    .map((dir) => ({
      dir,
      manifest: JSON.parse(readFileSync(join(dir, "package.json"), "utf8")) as { name: string; private?: boolean },
    }))
    .filter(({ manifest }) => manifest.private !== true)
    .map(({ dir, manifest }) => ({ name: manifest.name, dir }));
  expect(packages.map((p) => p.name).sort()).toEqual([
    "@idem/agents",
    "@idem/cli",
    "@idem/core",
    "@idem/email",
    "@idem/hubspot",
    "@idem/stripe",
  ]);

  const tarballs = tempDir("idem-tarballs-");
  // Two at a time: each pack runs tsc, and the machine may have two cores.
  const queue = [...packages];
  await Promise.all(
    [0, 1].map(async () => {
      for (let p = queue.shift(); p; p = queue.shift()) {
        rmSync(join(p.dir, "dist"), { recursive: true, force: true }); // what ships is what prepack built
        await ok("pnpm", ["pack", "--pack-destination", tarballs], { cwd: p.dir });
      }
    }),
  );
  const packed = Date.now();
  const files = readdirSync(tarballs)
    .filter((f) => f.endsWith(".tgz"))
    .map((f) => join(tarballs, f));
  expect(files).toHaveLength(packages.length);

  project = tempDir("idem-consumer-");
  expect(inRepo(project), `${project} must be outside the repository`).toBe(false);
  write(
    join(project, "package.json"),
    JSON.stringify({ name: "idem-consumer", version: "1.0.0", private: true, type: "module" }, null, 2),
  );
  const install = await run(
    "npm",
    ["install", "--no-audit", "--no-fund", "--prefer-offline", "--loglevel=error", ...files, ...EXTRAS],
    { cwd: project },
  );
  if (install.code !== 0) {
    // npm's own error, not prebuild-install's warning that it cannot download a binary (it then compiles).
    const offline =
      /npm error (code (ENOTFOUND|EAI_AGAIN|ECONNREFUSED|ECONNRESET|ETIMEDOUT|ENETUNREACH)|network)/i.test(
        install.stderr,
      );
    throw new Error(
      (offline
        ? "the npm registry cannot be reached: this test installs the packed packages with npm and needs it\n"
        : "npm install of the packed packages failed\n") + install.stderr.slice(-6000),
    );
  }

  sqliteUrl = `sqlite:${join(project, "ledger.db")}`;
  postgresUrl = await freshDatabase("postgres");
  console.log(
    `packed ${packages.length} packages in ${Math.round((packed - started) / 1000)} s, installed them in ${Math.round((Date.now() - packed) / 1000)} s`,
  );
}, LONG);

afterAll(async () => {
  spawned.forEach(killGroup);
  for (const d of dirs.splice(0)) rmSync(d, { recursive: true, force: true });
});

it(
  "installs manifests a registry can take: versions for workspace ranges, engines as the READMEs say, repository, exports with types first and no workspace condition, no scripts, README, LICENSE, no tests",
  () => {
    for (const { name } of packages) {
      const dir = join(project, "node_modules", name);
      const text = readFileSync(join(dir, "package.json"), "utf8");
      const manifest = JSON.parse(text) as Record<string, any>;
      expect(text, name).not.toContain("workspace:");
      expect(manifest.engines, name).toEqual({ node: `>=${NODE_FLOOR}` });
      const readme = readFileSync(join(dir, "README.md"), "utf8");
      expect(readme, `${name} README`).toContain(`Node ${NODE_FLOOR} or later`);
      expect(readme, `${name} README`).not.toMatch(/Node 20 or later/);
      expect(manifest.repository?.url, name).toMatch(/^git\+https:/);
      expect(manifest.license, name).toBe("MIT");
      // The workspace's build scripts mean nothing to a user, and a lifecycle one would run at theirs.
      expect(manifest.scripts, `${name}: scripts are the workspace's`).toBeUndefined();
      // src/*.ts ships (dist's maps point at it), but under a workspace condition a user's bundler or
      // `node --conditions` would load TypeScript in place of the build.
      expect(text, `${name}: the workspace's idem-source condition`).not.toContain("idem-source");
      // Tools read a package's manifest through its exports (require.resolve("<name>/package.json")).
      expect(manifest.exports["./package.json"], name).toBe("./package.json");
      for (const [sub, conditions] of Object.entries(manifest.exports as Record<string, Record<string, string>>)) {
        if (sub === "./package.json") continue;
        const keys = Object.keys(conditions);
        expect(keys.indexOf("types"), `${name} ${sub}`).toBeGreaterThanOrEqual(0);
        expect(keys.indexOf("types"), `${name} ${sub}: types before default`).toBeLessThan(keys.indexOf("default"));
        expect(existsSync(join(dir, conditions.types!)), `${name} ${sub} types`).toBe(true);
        expect(existsSync(join(dir, conditions.default!)), `${name} ${sub} default`).toBe(true);
      }
      for (const f of ["README.md", "LICENSE"]) expect(existsSync(join(dir, f)), `${name} ${f}`).toBe(true);
      expect(readFileSync(join(dir, "LICENSE"), "utf8")).toContain("Copyright (c) 2026 the idem authors");
      expect(existsSync(join(dir, "test")), `${name} ships no tests`).toBe(false);
    }
    const core = JSON.parse(readFileSync(join(project, "node_modules/@idem/core/package.json"), "utf8"));
    expect(core.dependencies).not.toHaveProperty("better-sqlite3");
    expect(core.dependencies).not.toHaveProperty("pg");
    expect(core.peerDependenciesMeta).toEqual({
      "better-sqlite3": { optional: true },
      pg: { optional: true },
      "@opentelemetry/api": { optional: true },
    });
  },
  LONG,
);

it(
  "loads every entry point and each package's manifest as a user's tools do, under any conditions they pass",
  async () => {
    // A bundler or `node --conditions` may name any condition; the workspace's must not be one the
    // packages answer. Each entry point is loaded, and each manifest resolved, from the user's project.
    // Each spec: the file it resolves to (relative to its package) and what loading it gives.
    const script = `
import { createRequire } from "node:module";
import { join, relative } from "node:path";
import { fileURLToPath } from "node:url";
const require = createRequire(import.meta.url);
const out = {};
for (const spec of process.argv.slice(2)) {
  const pkg = join(process.cwd(), "node_modules", ...spec.split("/").slice(0, 2));
  let resolved, loaded;
  try {
    resolved = relative(pkg, fileURLToPath(import.meta.resolve(spec)));
    loaded = spec.endsWith("/package.json") ? require(require.resolve(spec)).name : "exports " + Object.keys(await import(spec)).length;
  } catch (error) {
    const missing = /Cannot find package '([^']+)'/.exec(error.message);
    loaded = error.code === "ERR_MODULE_NOT_FOUND" && missing ? "missing " + missing[1] : String(error.code ?? error);
  }
  out[spec] = { resolved, loaded };
}
console.log(JSON.stringify(out));
`;
    write(join(project, "entries.mjs"), script);
    const expected: Record<string, { resolved: unknown; loaded: unknown }> = {};
    for (const { name } of packages) {
      const dir = join(project, "node_modules", name);
      const manifest = JSON.parse(readFileSync(join(dir, "package.json"), "utf8")) as Record<string, any>;
      // An entry point of an optional peer the user did not install (the AI SDK's) says which.
      const absent = Object.keys(manifest.peerDependenciesMeta ?? {}).filter(
        (p) => !existsSync(join(project, "node_modules", p)),
      );
      for (const sub of Object.keys(manifest.exports).filter((s) => s !== "./package.json")) {
        expected[sub === "." ? name : `${name}/${sub.slice(2)}`] = {
          resolved: expect.stringMatching(/^dist\/[\w/-]+\.js$/),
          loaded: expect.stringMatching(
            new RegExp(`^(exports [1-9]\\d*|missing (${absent.map((p) => p.replace(/[./]/g, "\\$&")).join("|")}))$`),
          ),
        };
      }
      expected[`${name}/package.json`] = { resolved: "package.json", loaded: name };
    }
    for (const conditions of [[], ["--conditions=idem-source"]]) {
      const out = JSON.parse(
        await ok(process.execPath, [...conditions, "entries.mjs", ...Object.keys(expected)], {
          cwd: project,
          timeoutMs: 120_000,
        }),
      );
      expect(out, `node ${conditions.join(" ")}`).toEqual(expected);
    }
  },
  LONG,
);

/** Every file under `dir`, as paths relative to it. */
const filesUnder = (dir: string): string[] =>
  readdirSync(dir, { recursive: true, withFileTypes: true })
    .filter((e) => e.isFile())
    .map((e) => relative(dir, join(e.parentPath, e.name)));

it(
  "imports only packages its manifest declares, and ships no source file its build leaves out (test-only code)",
  () => {
    // Another package's dependency may be hoisted beside it here, so a run would not show a missing
    // one: a user who installs the package alone gets ERR_MODULE_NOT_FOUND. The compiler the user
    // installed reads each import, static or dynamic, as the emitted code and declarations have it.
    const ts = createRequire(join(project, "package.json"))("typescript") as typeof TypeScript;
    const builtin = new Set(builtinModules);
    for (const { name } of packages) {
      const dir = join(project, "node_modules", name);
      const manifest = JSON.parse(readFileSync(join(dir, "package.json"), "utf8")) as Record<string, any>;
      const declared = new Set(
        ["dependencies", "peerDependencies", "optionalDependencies"].flatMap((f) => Object.keys(manifest[f] ?? {})),
      );
      // npm may nest a dependency under the package (another version than the one hoisted).
      const files = filesUnder(dir).filter((f) => !f.startsWith(`node_modules${sep}`));
      const undeclared = new Set<string>();
      for (const file of files.filter((f) => !f.startsWith(`src${sep}`) && /\.(m?js|d\.ts)$/.test(f))) {
        const { importedFiles } = ts.preProcessFile(readFileSync(join(dir, file), "utf8"), true, true);
        for (const { fileName: spec } of importedFiles) {
          if (spec.startsWith(".") || spec.startsWith("node:") || builtin.has(spec)) continue;
          const pkg = spec
            .split("/")
            .slice(0, spec.startsWith("@") ? 2 : 1)
            .join("/");
          if (pkg !== name && !declared.has(pkg)) undeclared.add(`${pkg} (${file})`);
        }
      }
      expect([...undeclared], `${name} imports packages it does not declare`).toEqual([]);
      // src/ ships as the sources of dist's maps: a file with no build is not the package's code.
      const unbuilt = files.filter(
        (f) => f.startsWith(`src${sep}`) && !files.includes(f.replace(/^src/, "dist").replace(/\.ts$/, ".js")),
      );
      expect(unbuilt, `${name} ships sources it does not build`).toEqual([]);
    }
  },
  LONG,
);

it(
  "runs a guarded call on SQLite and on Postgres from an ESM script, and the idem command lists it",
  async () => {
    write(
      join(project, "ledger.mjs"),
      `
import { defineAction, describeResult, openLedger } from "@idem/core";
import { guard } from "@idem/agents";

const ledger = await openLedger(process.argv[2]);
try {
  let executions = 0;
  const sendInvoice = defineAction({
    type: "invoice.send",
    capabilities: {},
    async execute(args, op) {
      executions++;
      return { sent: args.invoiceId, key: op.key };
    },
  });
  const input = { tenant: "acme", key: ["invoice", "inv-1001"], args: { invoiceId: "inv-1001" } };
  const first = await ledger.run(sendInvoice, input);
  const second = await ledger.run(sendInvoice, input);
  const issue = guard(ledger, sendInvoice, { tenant: (call) => call.context.tenantId, key: (i) => ["invoice", i.invoiceId] });
  const tool = await issue({ invoiceId: "inv-1001" }, { context: { tenantId: "acme" }, callId: "call_1" });
  console.log(JSON.stringify({ first, second, executions, described: describeResult(second), tool: tool.status }));
} finally {
  await ledger.close();
}
`,
    );
    for (const url of [sqliteUrl, postgresUrl]) {
      const out = JSON.parse(await ok(process.execPath, ["ledger.mjs", url], { cwd: project, timeoutMs: 120_000 }));
      expect(out.first, url).toMatchObject({ status: "succeeded", replayed: false, receipt: { sent: "inv-1001" } });
      expect(out.second, url).toMatchObject({ status: "succeeded", replayed: true, receipt: out.first.receipt });
      expect(out.executions, url).toBe(1);
      expect(out.described, url).toMatch(/^already done earlier/);
      expect(out.tool, url).toBe("already_done");
    }

    const help = await run("npx", ["--no", "--", "idem", "--help"], { cwd: project, timeoutMs: 120_000 });
    expect(help.code, help.stderr).toBe(0);
    expect(help.stdout).toMatch(/Usage: idem/);
    const cli = JSON.parse(readFileSync(join(project, "node_modules/@idem/cli/package.json"), "utf8"));
    expect(await ok("npx", ["--no", "--", "idem", "--version"], { cwd: project, timeoutMs: 120_000 })).toBe(
      `${cli.version}\n`,
    );
    const listed = JSON.parse(
      await ok("npx", ["--no", "--", "idem", "--ledger", sqliteUrl, "--json", "ls", "--tenant", "acme"], {
        cwd: project,
        timeoutMs: 120_000,
      }),
    );
    expect(listed).toMatchObject([{ tenant: "acme", action: "invoice.send", status: "succeeded" }]);
  },
  LONG,
);

it(
  "typechecks an ESM TypeScript file strictly against the packages' declarations",
  async () => {
    write(
      join(project, "tsconfig.json"),
      JSON.stringify(
        {
          compilerOptions: {
            target: "ES2022",
            lib: ["ES2023"],
            module: "nodenext",
            moduleResolution: "nodenext",
            types: ["node"],
            noEmit: true,
            strict: true,
            noUncheckedIndexedAccess: true,
            exactOptionalPropertyTypes: true,
            verbatimModuleSyntax: true,
            skipLibCheck: false,
          },
          files: ["check.ts"],
        },
        null,
        2,
      ),
    );
    // Calls with wrong types must be errors (so the types did not fall back to any).
    write(
      join(project, "check.ts"),
      `
import { defineAction, describeResult, LedgerConfigError, openLedger, type Ledger, type RunResult } from "@idem/core";
import { stripeActions, stripeTools, type StripeReceipt } from "@idem/stripe";
import { emailActions } from "@idem/email";
import { hubspotActions } from "@idem/hubspot";
import { guard, type Outcome } from "@idem/agents";
import { parseConfig, type IdemConfig } from "@idem/cli";

export async function main(url: string): Promise<string> {
  const ledger: Ledger = await openLedger(url, { leaseMs: 30_000 });
  const greet = defineAction({
    type: "greeting.send",
    capabilities: {},
    async execute(args: { to: string }, op) {
      return { to: args.to, key: op.key };
    },
  });
  const out: RunResult<{ to: string; key: string }> = await ledger.run(greet, { tenant: "acme", key: ["greet", "ada"], args: { to: "ada" } });
  // @ts-expect-error the args are typed by the action
  await ledger.run(greet, { tenant: "acme", key: ["greet", "ada"], args: { to: 1 } });
  // A receipt is null only when a person resolved the operation without one (out.resolution says so).
  const receipt: string = out.status === "succeeded" && out.receipt !== null ? out.receipt.to : out.status;
  // @ts-expect-error the ledger is a closed object: no database handle
  void ledger.db;
  // @ts-expect-error an action that declares lookup must give reconcile
  defineAction({ type: "x.lookup", capabilities: { lookup: true }, async execute() { return 1; } });

  const stripe = stripeActions({ apiKey: "sk_test_x" });
  const charge: RunResult<StripeReceipt> = await ledger.run(stripe.paymentIntentsCreate, {
    tenant: "acme", key: ["order", "ord-42"], args: { amount: 2000, currency: "usd", payment_method: "pm_card_visa", confirm: true, automatic_payment_methods: { enabled: true, allow_redirects: "never" } },
  });
  const mail = emailActions({
    smtp: { host: "smtp.example.com", port: 587 }, imap: { host: "imap.example.com", port: 993, secure: true, auth: { user: "u", pass: "p" } },
    from: "reports@example.com", copy: { mode: "provider-saves" },
  });
  // @ts-expect-error journal mode needs the journal address
  emailActions({ smtp: { host: "h", port: 25 }, imap: { host: "h", port: 143, auth: { user: "u", pass: "p" } }, from: "a@b.c", copy: { mode: "journal" } });
  const crm = hubspotActions({ accessToken: "pat-x" });
  const tool = guard(ledger, stripeTools(stripe).charge, { tenant: (call: { context: { tenantId: string } }) => call.context.tenantId });
  const outcome: Outcome = await tool({ invoiceId: "inv-1", amount: 100, currency: "usd" }, { context: { tenantId: "acme" } });
  const config: IdemConfig = parseConfig({ ledger: url });
  try {
    await openLedger("mysql://nowhere");
  } catch (error) {
    if (!(error instanceof LedgerConfigError)) throw error;
  }
  await ledger.close();
  return [receipt, describeResult(charge), typeof mail.send.execute, typeof crm.create, outcome.status, config.ledger].join(" ");
}
`,
    );
    await ok(process.execPath, ["node_modules/typescript/bin/tsc", "-p", "."], { cwd: project });
  },
  LONG,
);

it(
  "typechecks and runs a CommonJS TypeScript project (module node16) that loads the packages with import()",
  async () => {
    const cjs = join(project, "cjs");
    write(
      join(cjs, "package.json"),
      JSON.stringify({ name: "idem-consumer-cjs", private: true, type: "commonjs" }, null, 2),
    );
    write(
      join(cjs, "tsconfig.json"),
      JSON.stringify(
        {
          compilerOptions: {
            target: "ES2022",
            lib: ["ES2023"],
            module: "node16",
            moduleResolution: "node16",
            types: ["node"],
            outDir: "dist",
            rootDir: ".",
            strict: true,
            noUncheckedIndexedAccess: true,
            exactOptionalPropertyTypes: true,
            skipLibCheck: false,
          },
          files: ["index.ts"],
        },
        null,
        2,
      ),
    );
    write(
      join(cjs, "index.ts"),
      `
import type { Ledger, RunResult } from "@idem/core" with { "resolution-mode": "import" };
import type { Outcome } from "@idem/agents" with { "resolution-mode": "import" };
// @ts-expect-error TS1479: under module node16 a CommonJS file cannot require() an ESM-only package (what the READMEs say)
import { openLedger as notFromCommonJs } from "@idem/core";

async function main(url: string): Promise<void> {
  const { defineAction, openLedger } = await import("@idem/core");
  const { guard } = await import("@idem/agents");
  const { stripeActions } = await import("@idem/stripe");
  const { emailActions } = await import("@idem/email");
  const { hubspotActions } = await import("@idem/hubspot");
  const { parseConfig } = await import("@idem/cli");
  const ledger: Ledger = await openLedger(url);
  try {
    const ping = defineAction({ type: "ping.send", capabilities: {}, async execute(args: { n: number }) { return { pong: args.n }; } });
    const out: RunResult<{ pong: number }> = await ledger.run(ping, { tenant: "acme", key: ["ping", 1], args: { n: 1 } });
    const tool = guard(ledger, ping, { tenant: "acme", key: (input: { n: number }) => ["ping", input.n] });
    const outcome: Outcome = await tool({ n: 1 }, { context: undefined });
    const loaded = [stripeActions, emailActions, hubspotActions, parseConfig].every((f) => typeof f === "function");
    console.log(JSON.stringify({ out, outcome: outcome.status, loaded }));
  } finally {
    await ledger.close();
  }
}

main(process.argv[2]!).catch((error: unknown) => {
  console.error(error);
  process.exitCode = 1;
});
`,
    );
    await ok(process.execPath, [join(project, "node_modules/typescript/bin/tsc"), "-p", "."], { cwd: cjs });
    const out = JSON.parse(
      await ok(process.execPath, ["dist/index.js", `sqlite:${join(cjs, "ledger.db")}`], {
        cwd: cjs,
        timeoutMs: 120_000,
      }),
    );
    expect(out).toMatchObject({
      out: { status: "succeeded", receipt: { pong: 1 } },
      outcome: "already_done",
      loaded: true,
    });
    // Node 20.19 and later also require() every package (none has a top-level await; the CLI's is in its bin).
    const libraries = packages.map((p) => p.name);
    const required = await ok(
      process.execPath,
      ["-e", `for (const p of ${JSON.stringify(libraries)}) console.log(p, typeof require(p))`],
      { cwd: cjs },
    );
    for (const name of libraries) expect(required).toContain(`${name} object`);
  },
  LONG,
);

it(
  "names the package to install when a driver, a provider, tsx or the MCP SDK is missing",
  async () => {
    write(
      join(project, "nodrivers.mjs"),
      `
import { LedgerConfigError, openLedger } from "@idem/core";
for (const url of process.argv.slice(2)) {
  try {
    await (await openLedger(url)).close();
    console.log("opened " + url);
  } catch (error) {
    console.log(error instanceof LedgerConfigError ? error.message : "unexpected: " + error);
  }
}
`,
    );
    const drivers = await without(project, ["better-sqlite3", "pg"], () =>
      ok(process.execPath, ["nodrivers.mjs", sqliteUrl, postgresUrl], { cwd: project, timeoutMs: 120_000 }),
    );
    expect(drivers).toContain(
      "a sqlite: ledger needs the better-sqlite3 package, which is not installed: npm install better-sqlite3",
    );
    expect(drivers).toContain("a postgres:// ledger needs the pg package, which is not installed: npm install pg");

    write(
      join(project, "stripe.config.json"),
      JSON.stringify({ ledger: sqliteUrl, providers: { stripe: { apiKeyEnv: "STRIPE_SECRET_KEY" } } }),
    );
    const provider = await without(project, ["@idem/stripe"], () =>
      run("npx", ["--no", "--", "idem", "--config", "stripe.config.json", "daemon", "--once"], {
        cwd: project,
        env: { STRIPE_SECRET_KEY: "sk_test_x" },
        timeoutMs: 120_000,
      }),
    );
    expect(provider.code, provider.stderr).toBe(2);
    expect(provider.stderr).toContain(
      "providers.stripe needs the @idem/stripe package, which is not installed: npm install @idem/stripe",
    );

    write(join(project, "idem.config.ts"), `export default { ledger: ${JSON.stringify(sqliteUrl)} };\n`);
    const ts = await run("npx", ["--no", "--", "idem", "--config", "idem.config.ts", "ls", "--tenant", "acme"], {
      cwd: project,
      timeoutMs: 120_000,
    });
    expect(ts.code, ts.stderr).toBe(2);
    expect(ts.stderr).toContain("needs the tsx package, which is not installed: npm install tsx");

    write(join(project, "mcp.config.json"), JSON.stringify({ ledger: sqliteUrl, mcp: { tenant: "acme" } }));
    const mcp = await run("npx", ["--no", "--", "idem", "--config", "mcp.config.json", "mcp"], {
      cwd: project,
      timeoutMs: 120_000,
    });
    expect(mcp.code, mcp.stderr).toBe(2);
    expect(mcp.stderr).toContain(
      "idem mcp needs the @modelcontextprotocol/sdk package, which is not installed: npm install @modelcontextprotocol/sdk",
    );
  },
  LONG,
);
