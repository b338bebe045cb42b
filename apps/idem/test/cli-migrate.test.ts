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
import { parseConfig } from "../src/config.js";
import { idem } from "./support.js";

/** kysely's migration lock (an advisory lock on Postgres), as another process migrating holds it. */
const MIGRATION_LOCK = "3853314791062309107";

/**
 * Holds the locks `take` takes in a transaction of its own (a table a long report reads, kysely's
 * migration lock), as another process would, until the returned function commits it.
 */
async function heldElsewhere(
  db: ReturnType<typeof databaseOf>,
  take: (trx: ReturnType<typeof databaseOf>) => Promise<unknown>,
): Promise<() => Promise<void>> {
  let release!: () => void;
  const released = new Promise<void>((resolve) => (release = resolve));
  let taken!: () => void;
  const holding = new Promise<void>((resolve) => (taken = resolve));
  const done = db.transaction().execute(async (trx) => {
    await take(trx);
    taken();
    await released;
  });
  await Promise.race([holding, done]);
  return async () => {
    release();
    await done;
  };
}

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

  it("a schema first in the search path, with public after it, is read as its own ledger: not migrated, then migrated, never public's", async () => {
    const base = await freshDatabase("postgres");
    const first = await openLedger(base); // a ledger in public, as most have
    await databaseOf(first).schema.createSchema("tenant_b").execute();
    const done = defineAction({ type: "sms.send", capabilities: {}, execute: async () => ({ ok: true }) });
    await first.run(done, { tenant: "acme", key: ["in public"], args: {} });
    await first.close();
    const u = new URL(base);
    u.searchParams.set("options", "-c search_path=tenant_b,public");
    const inB = u.toString();
    // Before: the version was read from public's idem_migration (tenant_b has none yet), so the
    // ledger in tenant_b passed for migrated: ls listed public's operations, and migrate said
    // "the ledger is up to date", creating nothing in tenant_b.
    const ls = await idem(["--ledger", inB, "ls", "--tenant", "acme"]);
    expect(ls.code, ls.stdout + ls.stderr).toBe(2);
    expect(ls.stderr).toMatch(/needs migrations 0001-init, .*run `idem migrate` first/);
    const migrated = await idem(["--ledger", inB, "--json", "migrate"]);
    expect(migrated.code, migrated.stderr).toBe(0);
    expect(JSON.parse(migrated.stdout).applied[0]).toBe("0001-init");
    const listed = await idem(["--ledger", inB, "--json", "ls", "--tenant", "acme"]);
    expect([listed.code, listed.stdout]).toEqual([0, "[]\n"]);
    const inPublic = await idem(["--ledger", base, "--json", "ls", "--tenant", "acme"]);
    expect(JSON.parse(inPublic.stdout).map((o: { keyLabel: string }) => o.keyLabel)).toEqual([
      JSON.stringify(["in public"]),
    ]);
  });
});

describe("how long idem migrate waits, on Postgres (migrations in the config, flags of idem migrate)", {
  timeout: scaled(240_000),
}, () => {
  it("migrations.lockPatienceMs or --lock-patience bounds the wait for a table's lock (a long transaction reading it): exit 1 saying so, not the built-in minute", async () => {
    const url = await freshDatabase("postgres");
    const ledger = await openLedger(url);
    let release: (() => Promise<void>) | undefined;
    try {
      // A ledger one migration behind (0013 adds a column to idem_operations), and a long report
      // reading idem_operations: the migration cannot take the table meanwhile.
      const db = databaseOf(ledger);
      await db
        .deleteFrom("idem_migration" as never)
        .where("name" as never, "=", "0013-rerun-attempt" as never)
        .execute();
      await db.schema.alterTable("idem_operations").dropColumn("rerun_attempt").execute();
      release = await heldElsewhere(db, (trx) =>
        trx
          .selectFrom("idem_operations")
          .select((eb) => eb.fn.countAll().as("n"))
          .execute(),
      );
      const file = join(tempDir(), "idem.config.json");
      writeFileSync(file, JSON.stringify({ ledger: url, migrations: { lockPatienceMs: 1_000 } }));
      // Before: the config's section refused as unknown (exit 2), the flag unknown (exit 2), and no
      // way to wait other than 60 s.
      for (const args of [
        ["--config", file, "migrate"],
        ["--ledger", url, "migrate", "--lock-patience", "1s"],
      ]) {
        const started = Date.now();
        const out = await idem(args);
        expect(out.code, `${args.join(" ")}: ${out.stderr}`).toBe(1);
        expect(out.stderr).toMatch(/the migration's locks were not free within 1000 ms/);
        // What the command's user sets, not the library's option they never see.
        expect(out.stderr).toContain("(--lock-patience of idem migrate, or migrations.lockPatienceMs in the config)");
        expect(out.stderr).not.toContain("migrationLockPatienceMs");
        expect(Date.now() - started, args.join(" ")).toBeLessThan(45_000); // the built-in patience is 60 s
      }
      await release();
      release = undefined;
      const migrated = await idem(["--ledger", url, "--json", "migrate", "--lock-patience", "1s"]);
      expect([migrated.code, migrated.stdout], migrated.stderr).toEqual([
        0,
        `${JSON.stringify({ applied: ["0013-rerun-attempt"] })}\n`,
      ]);
    } finally {
      await release?.();
      await ledger.close();
    }
  });

  it("migrations.timeoutMs or --timeout bounds a migration statement without an answer (another process holding the migration lock): exit 1 saying so, not 10 minutes", async () => {
    const url = await freshDatabase("postgres");
    const other = await openLedger(url, { migrate: false }); // not migrated: no table made
    // Another process migrating, and taking its time.
    const release = await heldElsewhere(databaseOf(other), (trx) =>
      trx
        .selectNoFrom((eb) => eb.fn("pg_advisory_xact_lock", [eb.cast(eb.val(MIGRATION_LOCK), "bigint")]).as("held"))
        .execute(),
    );
    try {
      const file = join(tempDir(), "idem.config.json");
      writeFileSync(file, JSON.stringify({ ledger: url, migrations: { timeoutMs: 2_000 } }));
      // Before: the config's section refused as unknown (exit 2), the flag unknown; the built-in bound is 10 minutes.
      for (const args of [
        ["--config", file, "migrate"],
        ["--ledger", url, "migrate", "--timeout", "2s"],
      ]) {
        const started = Date.now();
        const out = await idem(args);
        expect(out.code, `${args.join(" ")}: ${out.stderr}`).toBe(1);
        expect(out.stderr).toMatch(
          /a migration statement had no answer within 2000 ms \(--timeout of idem migrate, or migrations\.timeoutMs in the config\)/,
        );
        // Before: ended with the lock release's failure on the connection the timeout had ended.
        expect(out.stderr).not.toMatch(/not queryable|migrationTimeoutMs/);
        expect(Date.now() - started, args.join(" ")).toBeLessThan(60_000);
      }
    } finally {
      await release();
      await other.close();
    }
  });

  it("refuses a migrations setting or flag past 2^31-1 ms, naming it (exit 2)", async () => {
    for (const field of ["timeoutMs", "lockPatienceMs"])
      expect(() => parseConfig({ migrations: { [field]: 2 ** 31 } })).toThrow(new RegExp(`migrations\\.${field}: `));
    const out = await idem(["--ledger", "sqlite::memory:", "migrate", "--timeout", "30d"]);
    expect(out.code, out.stderr).toBe(2);
    expect(out.stderr).toMatch(/--timeout <duration>' argument '30d' is invalid/);
  });
});
