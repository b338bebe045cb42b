/**
 * `idem migrate` and the flags that say which ledger a command acts on, as an operator's script
 * runs them: an unset variable, a config file that holds nothing, a second ledger in another
 * Postgres schema of the same database.
 */
import { describe, expect, it } from "vitest";
import { existsSync, readdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { defineAction, openLedger } from "@idem/core";
import { databaseOf } from "@idem/core/testing";
import { DIALECTS, freshDatabase, scaled, tempDir } from "@idem/testkit";
import { idem } from "./support.js";

/** What `idem ls` says of a ledger nobody migrated: refused either way, nothing written to it. */
const UNTOUCHED = /needs migrations 0001-init|no SQLite ledger at/;

for (const dialect of DIALECTS) {
  describe(`which ledger idem acts on, on ${dialect}`, { timeout: scaled(180_000) }, () => {
    it("an empty --ledger or --config (a script's unset variable) is refused (exit 2, naming the flag): no ./idem.db made and migrated, the config's ledger left alone", async () => {
      const url = await freshDatabase(dialect); // the ledger the directory's config names: not migrated
      const bare = tempDir(); // no config: the defaults would be sqlite:./idem.db here
      const configured = tempDir();
      writeFileSync(join(configured, "idem.config.json"), JSON.stringify({ ledger: url }));
      const runs = [bare, configured].flatMap((cwd) =>
        (
          [
            ["--ledger", "--ledger <url>"],
            ["--config", "--config <path>"],
          ] as const
        ).map(async ([flag, name]) => ({ flag, name, cwd, out: await idem([flag, "", "migrate"], {}, { cwd }) })),
      );
      for (const { flag, name, cwd, out } of await Promise.all(runs)) {
        expect(out.code, `${flag} "" in ${cwd}: ${out.stdout}${out.stderr}`).toBe(2);
        expect(out.stderr).toContain(`${name}' argument '' is invalid`);
        expect(out.stdout).toBe("");
      }
      expect(readdirSync(bare)).toEqual([]);
      expect(readdirSync(configured)).toEqual(["idem.config.json"]);
      const after = await idem(["--ledger", url, "ls", "--tenant", "acme"]);
      expect(after.code).toBe(2);
      expect(after.stderr).toMatch(UNTOUCHED);
    });

    it("a JSON config file holding null (a template that rendered nothing) is refused naming it, not run on the defaults", async () => {
      const cwd = tempDir();
      writeFileSync(join(cwd, "idem.config.json"), "null\n");
      const out = await idem(["migrate"], {}, { cwd });
      expect(out.code, out.stdout + out.stderr).toBe(2);
      expect(out.stderr).toMatch(/invalid config .*idem\.config\.json:\n {2}\(root\): .*null/);
      expect(existsSync(join(cwd, "idem.db"))).toBe(false);
    });
  });
}

describe("idem migrate of ledgers in several schemas of one Postgres database", { timeout: scaled(180_000) }, () => {
  it("a ledger in another schema (search_path in the URL) is migrated and used apart from the one in public", async () => {
    const base = await freshDatabase("postgres");
    const inSchema = (schema: string) => {
      const u = new URL(base);
      u.searchParams.set("options", `-c search_path=${schema}`);
      return u.toString();
    };
    // The ledger that was there first, in public; then one for another environment beside it.
    const first = await openLedger(base);
    await databaseOf(first).schema.createSchema("staging").execute();
    const done = defineAction({ type: "sms.send", capabilities: {}, execute: async () => ({ ok: true }) });
    await first.run(done, { tenant: "acme", key: ["in public"], args: {} });
    await first.close();
    const migrated = await idem(["--ledger", inSchema("staging"), "--json", "migrate"]);
    expect(migrated.code, migrated.stderr).toBe(0);
    expect(JSON.parse(migrated.stdout).applied[0]).toBe("0001-init");
    const again = await idem(["--ledger", inSchema("staging"), "--json", "migrate"]);
    expect([again.code, again.stdout]).toEqual([0, `${JSON.stringify({ applied: [] })}\n`]);
    const staging = await openLedger(inSchema("staging"), { migrate: false, create: false });
    try {
      expect(await staging.admin.pendingMigrations()).toEqual([]);
      await staging.run(done, { tenant: "acme", key: ["in staging"], args: {} });
    } finally {
      await staging.close();
    }
    for (const [url, label] of [
      [base, "in public"],
      [inSchema("staging"), "in staging"],
    ] as const) {
      const out = await idem(["--ledger", url, "--json", "ls", "--tenant", "acme"]);
      expect(out.code, out.stderr).toBe(0);
      expect(JSON.parse(out.stdout).map((o: { keyLabel: string }) => o.keyLabel)).toEqual([JSON.stringify([label])]);
    }
  });
});
