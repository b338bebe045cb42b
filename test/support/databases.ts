/**
 * A fresh ledger database per test file, on each dialect: a SQLite file in a temp dir, or a new
 * Postgres database on the suite's server, dropped when the file's tests end.
 */
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { randomBytes } from "node:crypto";
import pg from "pg";
import { afterAll, afterEach, beforeAll, inject } from "vitest";

export const DIALECTS = ["sqlite", "postgres"] as const;
export type TestDialect = (typeof DIALECTS)[number];

const cleanups: (() => Promise<void>)[] = [];

// Registered as this module loads, while vitest collects the test file that imports it (each file
// loads it anew): a hook registered later, from inside a beforeAll or a test, where freshDatabase
// is called, is never run, and every file's databases and temp dirs were left behind.
try {
  afterAll(async () => {
    for (const f of cleanups.splice(0).reverse()) await f();
  });
} catch {
  // Loaded outside a test file (a script importing the testkit): nothing it makes is cleaned up.
}

function onFileEnd(fn: () => Promise<void>): void {
  cleanups.push(fn);
}

/** A new, empty database for this test file; its URL for `openLedger`. */
export async function freshDatabase(dialect: TestDialect): Promise<string> {
  if (dialect === "sqlite") {
    const dir = mkdtempSync(join(tmpdir(), "idem-sqlite-"));
    onFileEnd(async () => rmSync(dir, { recursive: true, force: true }));
    return `sqlite:${join(dir, "ledger.db")}`;
  }
  const admin = inject("pgAdminUrl");
  const name = `idem_test_${randomBytes(6).toString("hex")}`;
  const client = new pg.Client({ connectionString: admin });
  await client.connect();
  try {
    await client.query(`CREATE DATABASE ${name}`);
  } finally {
    await client.end();
  }
  onFileEnd(async () => {
    const c = new pg.Client({ connectionString: admin });
    await c.connect();
    try {
      await c.query(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`);
    } finally {
      await c.end();
    }
  });
  const url = new URL(admin);
  url.pathname = `/${name}`;
  return url.toString();
}

/** A temp directory removed when the file's tests end. */
export function tempDir(prefix = "idem-"): string {
  const dir = mkdtempSync(join(tmpdir(), prefix));
  onFileEnd(async () => rmSync(dir, { recursive: true, force: true }));
  return dir;
}

/**
 * A test file's ledgers on one fresh database: `open` opens one with the given opener (so the
 * testkit needs no dependency on the core) and every ledger a test opened is closed after it.
 * `prepare: true` opens one before the tests (migrating the schema for worker processes that open
 * with `migrate: false`) and closes it at the end.
 */
export function ledgersFor<L extends { close(): Promise<void> }, O extends object>(
  dialect: TestDialect,
  opener: (url: string, options: O) => Promise<L>,
  settings: { defaults: O; prepare?: boolean },
): { url(): string; open(options?: O): Promise<L> } {
  let url = "";
  let prepared: L | undefined;
  const opened: L[] = [];
  beforeAll(async () => {
    url = await freshDatabase(dialect);
    if (settings.prepare) prepared = await opener(url, settings.defaults);
  });
  afterEach(async () => {
    for (const l of opened.splice(0)) await l.close();
  });
  afterAll(async () => {
    await prepared?.close();
  });
  return {
    url: () => url,
    async open(options?: O): Promise<L> {
      const l = await opener(url, { ...settings.defaults, ...options });
      opened.push(l);
      return l;
    },
  };
}
