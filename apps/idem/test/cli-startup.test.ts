/**
 * What the idem command loads as it starts: a command that only reads or decides (`ls`, `show`,
 * `--help`), which scripts and cron jobs run often, does not load what only the daemon, the
 * console or the alert sinks use (the logger, prom-client, nodemailer, hono), which made each
 * start about a third slower; `--help` and `--version` load no ledger (@idem/core, kysely) and no
 * config reader (zod) either, and the daemon loads nodemailer only when it has an email sink. The
 * packages are heard by a module resolve hook in the child.
 */
import { spawn } from "node:child_process";
import { createRequire } from "node:module";
import { join } from "node:path";
import { pathToFileURL } from "node:url";
import { writeFileSync } from "node:fs";
import { afterEach, describe, expect, it } from "vitest";
import { openLedger } from "@idem/core";
import { DIALECTS, freshDatabase, scaled, tempDir } from "@idem/testkit";
import { CLI } from "./support.js";

const TSX = pathToFileURL(createRequire(import.meta.url).resolve("tsx")).href;
/** The packages only the daemon, the console, `idem mcp` or the alert sinks use. */
const HEAVY = ["pino", "prom-client", "nodemailer", "hono", "@hono/node-server", "rate-limiter-flexible"];
/** What only a command that reads a config or opens a ledger uses: `--help` and `--version` do neither. */
const LEDGER = ["@idem/core", "kysely", "zod", "p-retry"];
const MARK = "idem-startup-test resolved ";
// Each bare specifier the child resolves is said on its stderr (the hook runs on the loader's thread).
const HOOKS = `export async function resolve(specifier, context, next) {
  if (!/^(\\.|\\/|node:|file:|data:)/.test(specifier)) console.error(${JSON.stringify(MARK)} + specifier);
  return next(specifier, context);
}`;
const REGISTER = `data:text/javascript,${encodeURIComponent(
  `import { register } from "node:module"; register(${JSON.stringify(`data:text/javascript,${encodeURIComponent(HOOKS)}`)});`,
)}`;

/** The children still running: a test that failed before one exited kills it. */
const running = new Set<ReturnType<typeof spawn>>();
afterEach(() => {
  for (const p of running) p.kill("SIGKILL");
  running.clear();
});

/** Runs the command (sources, as `idem()` does) and returns its exit code and the packages it loaded. */
function loadedBy(args: string[]): Promise<{ code: number | null; packages: Set<string>; stderr: string }> {
  return new Promise((resolve, reject) => {
    const p = spawn(process.execPath, [
      "--conditions=idem-source",
      "--import",
      TSX,
      "--import",
      REGISTER,
      CLI,
      ...args,
    ]);
    running.add(p);
    let stderr = "";
    p.stdout.resume();
    p.stderr.on("data", (d) => (stderr += d));
    p.on("error", reject);
    p.on("exit", (code) => {
      running.delete(p);
      const packages = new Set(
        stderr
          .split("\n")
          .filter((l) => l.startsWith(MARK))
          .map((l) => l.slice(MARK.length)),
      );
      resolve({ code, packages, stderr });
    });
  });
}

const heavyIn = (packages: Set<string>) => HEAVY.filter((h) => packages.has(h));

for (const dialect of DIALECTS) {
  describe(`what idem loads as it starts, on ${dialect}`, { timeout: scaled(120_000) }, () => {
    it("ls, show, --help and --version load none of the daemon's, console's or alert sinks' packages, and --help and --version no ledger; the daemon loads its own but no nodemailer without an email sink", async () => {
      const ledger = await freshDatabase(dialect);
      await (await openLedger(ledger)).close(); // migrated
      const config = join(tempDir(), "idem.config.json");
      writeFileSync(config, JSON.stringify({ ledger, alerts: { log: true } }));

      const ls = await loadedBy(["--config", config, "ls", "--tenant", "acme"]);
      expect(ls.code, ls.stderr).toBe(0);
      expect(ls.packages.has("@idem/core"), "the hook hears the child's imports").toBe(true);
      expect(heavyIn(ls.packages)).toEqual([]);

      const show = await loadedBy(["--config", config, "show", "op_none", "--tenant", "acme"]);
      expect(show.code, show.stderr).toBe(3); // no such operation: the ledger was read
      expect(heavyIn(show.packages)).toEqual([]);

      for (const args of [["--help"], ["--version"]]) {
        const out = await loadedBy(args);
        expect(out.code, out.stderr).toBe(0);
        expect(out.packages.has("commander"), "the hook hears the child's imports").toBe(true);
        expect(heavyIn(out.packages), args[0]).toEqual([]);
        expect(
          LEDGER.filter((p) => out.packages.has(p)),
          args[0],
        ).toEqual([]);
      }

      // The control: the daemon's pass loads its logger and its metrics; with no email sink, no nodemailer.
      const pass = await loadedBy(["--config", config, "daemon", "--once"]);
      expect(pass.code, pass.stderr).toBe(0);
      expect(heavyIn(pass.packages)).toEqual(["pino", "prom-client"]);
    });
  });
}
