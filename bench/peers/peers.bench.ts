/**
 * idem against its peers, side by side in one process run (pnpm bench:peers), in the style of
 * bench/ledger.bench.ts: alternating rounds, medians, ratios idem ops/s / peer ops/s.
 *
 *  - DBOS Transact: one workflow of one no-op step, on the same Postgres server as idem's ledger
 *    (its system database beside idem's database). Target (issue 16): idem at least 2x.
 *  - Powertools idempotency on Redis (its cache persistence layer), on a redis-server started here
 *    with every write fsynced (appendfsync always). Reported, no target.
 *
 * Three scenarios against each: one call at a time on fresh keys; 16 calls in flight on fresh
 * keys; the replay of a completed key, one at a time. Each side's no-op counts its executions:
 * fresh keys must run it once each and a replay never (checked, or the run fails).
 *
 * Postgres: DATABASE_URL, or an embedded server started here; fresh databases for the run,
 * dropped after. Everything started is stopped in a finally block and on SIGINT.
 */
import { randomBytes } from "node:crypto";
import { readFileSync } from "node:fs";
import { cpus, loadavg } from "node:os";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { createClient } from "@redis/client";
import { type Contestant, type Row, concurrentRate, rate, sideBySide, table } from "./harness.js";
import { launchDbos } from "./dbos-contestant.js";
import { openIdem } from "./idem-contestant.js";
import { connectPowertools } from "./powertools-contestant.js";
import { startPostgres } from "./postgres-server.js";
import { startRedis } from "./redis-server.js";
import { Teardown } from "./teardown.js";

const ROUNDS = 5;
const IN_FLIGHT = 16;
/** Calls per round, one at a time, on fresh keys. */
const SINGLE = 200;
/** Calls per worker and round at IN_FLIGHT, on fresh keys. */
const PER_WORKER = 40;
/** Completed keys replayed in turn, and replays per round. */
const REPLAY_KEYS = 200;
const REPLAYS = 1000;
const WARM_UP = 30;
/** idem must be at least this much faster than DBOS in every scenario (issue 16). */
const DBOS_TARGET = 2;

const here = dirname(fileURLToPath(import.meta.url));
const versionOf = (name: string): string =>
  (JSON.parse(readFileSync(join(here, "node_modules", name, "package.json"), "utf8")) as { version: string }).version;
const message = (e: unknown) => (e instanceof Error ? e.message : String(e)).split("\n")[0]!;

/** Throws unless `c` ran its no-op exactly `expected` times since `since`. */
function checkExecutions(c: Contestant, since: number, expected: number, what: string): void {
  const ran = c.executions() - since;
  if (ran !== expected) throw new Error(`${c.name} ran its no-op ${ran} times for ${expected} ${what}`);
}

/** The three scenarios, idem against `peer`; keys are prefixed by the peer's name. */
async function compare(idem: Contestant, peer: Contestant, target: number | undefined): Promise<Row[]> {
  const tag = peer.name.toLowerCase();
  const rows: Row[] = [];
  const start = [idem.executions(), peer.executions()] as const;
  for (let i = 0; i < WARM_UP; i++) {
    await idem.call(`${tag}-warm-${i}`);
    await peer.call(`${tag}-warm-${i}`);
  }
  rows.push(
    await sideBySide("one at a time, fresh keys", ROUNDS, idem, peer, target, (c, r) =>
      rate(SINGLE, (i) => c.call(`${tag}-one-${r}-${i}`)),
    ),
  );
  rows.push(
    await sideBySide(`${IN_FLIGHT} in flight, fresh keys`, ROUNDS, idem, peer, target, (c, r) =>
      concurrentRate(IN_FLIGHT, PER_WORKER, (w, i) => c.call(`${tag}-many-${r}-${w}-${i}`)),
    ),
  );
  for (let i = 0; i < REPLAY_KEYS; i++) {
    await idem.call(`${tag}-replay-${i}`);
    await peer.call(`${tag}-replay-${i}`);
  }
  const fresh = WARM_UP + ROUNDS * (SINGLE + IN_FLIGHT * PER_WORKER) + REPLAY_KEYS;
  checkExecutions(idem, start[0], fresh, "fresh keys");
  checkExecutions(peer, start[1], fresh, "fresh keys");
  rows.push(
    await sideBySide("replay of a completed key, one at a time", ROUNDS, idem, peer, target, (c) =>
      rate(REPLAYS, (i) => c.call(`${tag}-replay-${i % REPLAY_KEYS}`)),
    ),
  );
  checkExecutions(idem, start[0], fresh, "fresh keys and then replays");
  checkExecutions(peer, start[1], fresh, "fresh keys and then replays");
  return rows;
}

const teardown = new Teardown();
let interrupted = false;
process.once("SIGINT", () => {
  interrupted = true;
  console.error("\ninterrupted: stopping what the benchmark started");
  void teardown.run().finally(() => process.exit(130));
});

const rows: Row[] = [];
const failures: { peer: string; reason: string }[] = [];
/** Records why a peer could not run; calls cut short by an interrupt are not failures. */
function failed(peer: string, e: unknown): void {
  if (interrupted) return;
  console.error(e);
  failures.push({ peer, reason: message(e) });
}
const notes: string[] = [
  `node ${process.version}, ${cpus().length} cores, load average at start ${loadavg()
    .map((x) => x.toFixed(2))
    .join(" ")}`,
  `peers: @dbos-inc/dbos-sdk ${versionOf("@dbos-inc/dbos-sdk")}, @aws-lambda-powertools/idempotency ${versionOf(
    "@aws-lambda-powertools/idempotency",
  )} with @redis/client ${versionOf("@redis/client")}`,
  `medians of ${ROUNDS} alternating rounds; per round: ${SINGLE} calls one at a time, ${IN_FLIGHT} x ${PER_WORKER} calls in flight, ${REPLAYS} replays of ${REPLAY_KEYS} completed keys`,
];
try {
  const postgres = await startPostgres(teardown);
  const durability = await postgres.durability();
  notes.push(
    `Postgres (idem and DBOS): ${postgres.description}; ${Object.entries(durability)
      .map(([k, v]) => `${k}=${v}`)
      .join(", ")}`,
  );
  if (durability.fsync !== "on" || durability.synchronous_commit !== "on") {
    notes.push("WARNING: this Postgres server does not fsync every commit; the durable rows are not comparable");
  }
  const run = `idem_peers_${randomBytes(4).toString("hex")}`;
  const idem = await openIdem(await postgres.createDatabase(run), IN_FLIGHT);
  teardown.add("closing idem's ledger", () => idem.close());
  console.log(notes.join("\n"));

  try {
    const dbos = await launchDbos(await postgres.createDatabase(`${run}_dbos`), IN_FLIGHT);
    let closed: Promise<void> | undefined;
    const close = () => (closed ??= dbos.close());
    teardown.add("shutting DBOS down", close);
    try {
      rows.push(...(await compare(idem, dbos, DBOS_TARGET)));
    } finally {
      await close();
    }
  } catch (e) {
    failed("DBOS", e);
  }

  try {
    const redis = await startRedis(teardown);
    const admin = await createClient({ url: redis.url }).connect();
    const config = { ...(await admin.configGet("appendonly")), ...(await admin.configGet("appendfsync")) };
    await admin.quit();
    const line = `Redis (Powertools): redis-server ${redis.version} started here at ${redis.url}; ${Object.entries(
      config,
    )
      .map(([k, v]) => `${k}=${v}`)
      .join(", ")}`;
    notes.push(line);
    console.log(line);
    const powertools = await connectPowertools(redis.url);
    let closed: Promise<void> | undefined;
    const close = () => (closed ??= powertools.close());
    teardown.add("closing the Powertools Redis client", close);
    try {
      rows.push(...(await compare(idem, powertools, undefined)));
    } finally {
      await close();
    }
  } catch (e) {
    failed("Powertools", e);
  }
} catch (e) {
  failed("(setup)", e);
} finally {
  await teardown.run();
}

if (interrupted) process.exit(130); // the teardown is done: nothing to report
console.log(`\n${notes.map((n) => `- ${n}`).join("\n")}\n\n${table(rows, failures)}`);
if (failures.length > 0) process.exitCode = 1;
