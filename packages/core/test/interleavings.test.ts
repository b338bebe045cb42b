/**
 * A seeded simulation of the runner on existing rows: callers on two workers and a daemon race on
 * a few keys of one real ledger, the database's answers arrive late (now and then very late,
 * after the lease they granted ran out), and a scripted provider answers ok, times out after committing, refuses
 * before committing (503), answers 409 "key in use", works so slowly that its lease runs out
 * (the database clock jumps past it), or has its completion write fail once; lookups answer
 * found, absent, inconclusive or fail. The database clock is a virtual one (`clock`), so leases,
 * key windows and check backoffs expire when the script says, and every seed is fast.
 *
 * Counted at the target after each seed: a provider without dedupe never sees a second effect,
 * a deduping one never past its key window; once the daemon has drained everything, every
 * operation is succeeded (with the effect's id), failed (no effect) or needs_review.
 * A failing seed is printed; `SIM_SEED=n` runs that one alone (the schedule is seeded, the
 * database's and the event loop's timing are not: a seed may need a few runs to fail again);
 * `SIM_SEEDS=k SIM_SEED_FROM=n` searches k seeds from n, wider than CI does.
 */
import { describe, expect, it } from "vitest";
import { sql } from "kysely";
import { setImmediate as yieldToLoop } from "node:timers/promises";
import {
  CompletionNotRecordedError,
  defineAction,
  type ActionDefinition,
  type Capabilities,
  type Classification,
  type Ledger,
  type LookupContract,
} from "@idem/core";
import { databaseOf, openTestLedger, type TestLedgerOptions } from "@idem/core/testing";
import { DIALECTS, scaled, type TestDialect } from "@idem/testkit";
import { dialectFor, hooked } from "./support/dialects.js";
import { ledgers } from "./support/ledgers.js";

const SEEDS: Record<TestDialect, number> = { sqlite: 1_000, postgres: 600 };
// Virtual times. Leases expire only when the script jumps the clock (real heartbeats never fire:
// the real lease is long). No jump is longer than half the dedupe margin: the margin is what
// absorbs the time between a decision to replay and the request reaching the provider.
const LEASE_MS = 30_000;
const RETENTION_MS = 10 * 60_000;
const MARGIN_MS = 120_000;
const MAX_JUMP_MS = MARGIN_MS / 2;

/** mulberry32: a small seeded generator, so a seed replays the same script. */
function rng(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

class Fail extends Error {
  constructor(readonly cls: Classification) {
    super(cls.reason);
  }
}

type Kind = "dedupe" | "lookup" | "both" | "neither";
const CAPS: Record<Kind, Capabilities> = {
  dedupe: { dedupe: { retentionMs: RETENTION_MS, marginMs: MARGIN_MS } },
  lookup: { lookup: true },
  both: { dedupe: { retentionMs: RETENTION_MS, marginMs: MARGIN_MS }, lookup: true },
  neither: {},
};

interface World {
  now: number;
  readonly random: () => number;
  /** Every effect the provider performed, per key (what the target received). */
  readonly effects: Map<string, { id: string; at: number }[]>;
  /** The script may break the ledger's next completion write (a disk or connection failing once). */
  breakNextCompletion: () => Promise<void>;
  calm: boolean;
  n: number;
}

async function yields(w: World, max: number): Promise<void> {
  for (let i = Math.floor(w.random() * max); i > 0; i--) await yieldToLoop();
}

let dumped = 0;

/** The seed being run: the actions act in its world and the ledger's database clock reads its time. */
let world: World | undefined;

function simAction(kind: Kind) {
  const dedupes = kind === "dedupe" || kind === "both";
  const effect = (key: string) => {
    const w = world!;
    const list = w.effects.get(key) ?? [];
    const first = list[0];
    // A deduping provider answers its first result while it retains the key, and forgets it after.
    if (dedupes && first && w.now - first.at < RETENTION_MS) return { id: first.id };
    const id = `eff_${++w.n}`;
    list.push({ id, at: w.now });
    w.effects.set(key, list);
    return { id };
  };
  type Args = { amount: number };
  type Receipt = { id: string };
  // `kind` picks the capabilities at run time; defineAction still checks lookup has its reconcile.
  return defineAction<Args, Receipt>({
    type: `sim.${kind}`,
    capabilities: CAPS[kind],
    async execute(_args, op) {
      // The provider acts when the request arrives, which is when it is sent: no request stays in
      // flight past a lease (timeouts and the lease's local deadline stop it first).
      const w = world!;
      const roll = w.calm ? 0.9 : w.random();
      if (roll < 0.1) {
        await yields(w, 6);
        throw new Fail({ kind: "transient", reason: "503 before execution" });
      }
      if (roll < 0.16) {
        await yields(w, 6);
        throw new Fail({ kind: "ambiguous", reason: "409 idempotency_key_in_use" });
      }
      const r = effect(op.key);
      if (roll < 0.28) {
        await yields(w, 6);
        throw new Fail({ kind: "ambiguous", reason: "timeout after the provider committed" });
      }
      if (roll < 0.4) {
        // Committed, but the answer is so slow that the lease runs out: another worker may take
        // over (replay, look up) before this one finishes, late.
        w.now += LEASE_MS + 1;
        await yields(w, 12);
        return r;
      }
      if (roll < 0.43) await w.breakNextCompletion();
      await yields(w, 6);
      return r;
    },
    classify: (e) => (e instanceof Fail ? e.cls : { kind: "ambiguous", reason: String(e) }),
    ...(CAPS[kind].lookup && {
      async reconcile(_args: { amount: number }, op: { key: string }) {
        const w = world!;
        await yields(w, 4);
        const hit = w.effects.get(op.key)?.[0];
        if (hit) return { found: true, receipt: { id: hit.id } } as const;
        const roll = w.calm ? 0 : w.random();
        if (roll < 0.2) return { found: false, proof: "inconclusive", reason: "index lags", retryAfterMs: 5 } as const;
        if (roll < 0.3) throw new Error("lookup unreachable");
        return { found: false, proof: "absent", reason: "not at the provider (a consistent read)" } as const;
      },
    }),
  } as ActionDefinition<Args, Receipt> & LookupContract<Args, Receipt>);
}

/**
 * The scheduler at the database boundary: after each statement the caller yields a seeded number
 * of turns of the event loop, so other callers' steps (and the clock's jumps) land between this
 * caller's read and write, and between a lease being granted and the request being sent: the
 * runner must notice, by its local deadline on the same clock, a lease that ran out meanwhile.
 */
async function openJittered(dialect: TestDialect, url: string, options: TestLedgerOptions): Promise<Ledger> {
  const jittered = hooked(await dialectFor(dialect, url, { synchronous: "OFF" }), {
    async query(_q, run) {
      const answer = await run();
      // The answer is late, now and then very late: committed at the database, not yet read by the
      // caller, while the clock jumps and the other worker acts.
      if (world && !world.calm) await yields(world, world.random() < 0.1 ? 60 : 3);
      return answer;
    },
    async released() {
      if (world && !world.calm) await yields(world, 8);
    },
  });
  return openTestLedger(jittered, options);
}

const ACTIONS = {
  dedupe: simAction("dedupe"),
  lookup: simAction("lookup"),
  both: simAction("both"),
  neither: simAction("neither"),
};

async function breaker(ledger: Ledger, dialect: TestDialect): Promise<() => Promise<void>> {
  const db = databaseOf(ledger);
  // A real failing write, by the database itself: the next completion raises once.
  if (dialect === "sqlite") {
    await sql.raw(`CREATE TABLE IF NOT EXISTS sim_faults (armed INTEGER NOT NULL)`).execute(db);
    await sql
      .raw(`CREATE TRIGGER IF NOT EXISTS sim_break BEFORE UPDATE OF status ON idem_operations
      WHEN NEW.status = 'succeeded' AND (SELECT count(*) FROM sim_faults WHERE armed = 1) > 0
      BEGIN SELECT RAISE(ABORT, 'simulated I/O failure'); END`)
      .execute(db);
  } else {
    await sql.raw(`CREATE TABLE IF NOT EXISTS sim_faults (armed INTEGER NOT NULL)`).execute(db);
    await sql
      .raw(`CREATE OR REPLACE FUNCTION sim_break() RETURNS trigger LANGUAGE plpgsql AS $$
      BEGIN IF EXISTS (SELECT 1 FROM sim_faults WHERE armed = 1) THEN RAISE EXCEPTION 'simulated I/O failure'; END IF; RETURN NEW; END $$`)
      .execute(db);
    await sql.raw(`DROP TRIGGER IF EXISTS sim_break ON idem_operations`).execute(db);
    await sql
      .raw(`CREATE TRIGGER sim_break BEFORE UPDATE OF status ON idem_operations FOR EACH ROW
      WHEN (NEW.status = 'succeeded') EXECUTE FUNCTION sim_break()`)
      .execute(db);
  }
  return async () => {
    await sql.raw(`INSERT INTO sim_faults (armed) VALUES (1)`).execute(db);
    // Disarmed shortly after: the first write fails, the runner's retry succeeds.
    setTimeout(
      () =>
        void sql
          .raw(`DELETE FROM sim_faults`)
          .execute(db)
          .catch(() => {}),
      10,
    );
  };
}

async function runSeed(
  [ledger, peer]: readonly [Ledger, Ledger],
  seed: number,
  dialect: TestDialect,
  breakNext: () => Promise<void>,
): Promise<string[]> {
  const random = rng(seed);
  const w: World = {
    now: 1_700_000_000_000 + seed * 10_000_000,
    random,
    effects: new Map(),
    breakNextCompletion: breakNext,
    calm: false,
    n: 0,
  };
  world = w;
  const kind = (["dedupe", "lookup", "both", "neither"] as const)[Math.floor(random() * 4)]!;
  const action = ACTIONS[kind];
  const tenant = `sim-${dialect}-${seed}`;
  const keys = Array.from({ length: 1 + Math.floor(random() * 3) }, (_, i) => `k${i}`);
  const problems: string[] = [];
  const call = async (key: string) => {
    await yields(w, 20);
    try {
      // Two workers, each with its own connections: one may hold its answer while the other acts.
      await (random() < 0.5 ? ledger : peer).run(action, {
        tenant,
        key: [key],
        args: { amount: 100 },
        budget: { attempts: 1 + Math.floor(random() * 3) },
      });
    } catch (e) {
      if (!(CompletionNotRecordedError && e instanceof CompletionNotRecordedError))
        problems.push(`run threw ${String(e)}`);
    }
  };
  const daemon = async (rounds: number) => {
    for (let i = 0; i < rounds; i++) {
      await yields(w, 10);
      const due = (await ledger.daemon.claimDue({ limit: 10, claimMs: 30_000 })).filter((r) => r.tenant === tenant);
      for (const r of due)
        await ledger.daemon
          .settle({ tenant, id: r.id, actor: "daemon", escalate: { maxChecks: 8, maxAgeMs: 3_600_000 } })
          .catch((e) => problems.push(`settle threw ${String(e)}`));
    }
  };
  const clock = async () => {
    for (let i = 0; i < 12; i++) {
      await yields(w, 12);
      const r = random();
      w.now += r < 0.4 ? Math.floor(random() * 200) : r < 0.8 ? LEASE_MS + 1 : MAX_JUMP_MS;
    }
  };
  const callers = keys.flatMap((k) => Array.from({ length: 2 + Math.floor(random() * 3) }, () => call(k)));
  await Promise.all([...callers, daemon(4), clock()]);

  // Drain: time passes, the provider and its lookups behave, the daemon settles what is due.
  w.calm = true;
  for (let round = 0; round < 60; round++) {
    w.now += MAX_JUMP_MS;
    const due = (await ledger.daemon.claimDue({ limit: 50, claimMs: 30_000 })).filter((r) => r.tenant === tenant);
    if (due.length === 0) break;
    for (const r of due)
      await ledger.daemon
        .settle({ tenant, id: r.id, actor: "daemon", escalate: { maxChecks: 8, maxAgeMs: 3_600_000 } })
        .catch((e) => problems.push(`settle threw ${String(e)}`));
  }
  for (const [key, list] of w.effects) {
    if (list.length > 1) problems.push(`${kind}: ${list.length} effects for ${key}`);
  }
  if (problems.length && dumped++ < 3) {
    for (const op of await ledger.admin.list({ tenant })) {
      const { events } = await ledger.get({ tenant, id: op.id });
      console.error(
        `seed ${seed}`,
        op.keyLabel,
        op.status,
        events.map((e) => `${e.from}>${e.to}@${e.attempt} [${e.actor}] ${e.reason} t=${e.at}`).join("\n  "),
      );
    }
  }
  for (const op of await ledger.admin.list({ tenant })) {
    const key = op.keyLabel ? (JSON.parse(op.keyLabel) as string[])[0]! : "?";
    const hit = [...w.effects.entries()].find(([k]) => k === op.key)?.[1] ?? [];
    if (!["succeeded", "failed", "needs_review"].includes(op.status))
      problems.push(`${kind}: ${key} ended ${op.status}`);
    if (op.status === "succeeded" && (hit.length !== 1 || (op.result as { id: string }).id !== hit[0]!.id)) {
      problems.push(
        `${kind}: ${key} succeeded with ${JSON.stringify(op.result)} but the target has ${JSON.stringify(hit)}`,
      );
    }
  }
  return problems;
}

for (const dialect of DIALECTS) {
  describe(`interleavings on existing rows, ${dialect}`, () => {
    const db = ledgers(dialect);
    const only = process.env.SIM_SEED === undefined ? undefined : Number(process.env.SIM_SEED);
    const from = Number(process.env.SIM_SEED_FROM ?? 1);
    const seeds = only === undefined ? Number(process.env.SIM_SEEDS ?? SEEDS[dialect]) : 1;

    it(
      `${seeds} seeded schedules: never a second effect, every operation settled`,
      async () => {
        await db.open(); // migrates the file's database
        const options: TestLedgerOptions = {
          // Time moves a millisecond per read, so a backoff of a few virtual ms runs out; the script jumps it further.
          clock: () => (world ? ++world.now : Date.now()),
          leaseMs: LEASE_MS,
          budget: { baseDelayMs: 1, maxDelayMs: 4, elapsedMs: 5_000 },
          actions: Object.values(ACTIONS),
        };
        const ledger = await openJittered(dialect, db.url(), options);
        const peer = await openJittered(dialect, db.url(), options);
        const breakNext = await breaker(ledger, dialect);
        const failures: string[] = [];
        for (let i = 0; i < seeds; i++) {
          const seed = only ?? from + i;
          const problems = await runSeed([ledger, peer], seed, dialect, breakNext);
          if (problems.length) failures.push(`seed ${seed} (SIM_SEED=${seed}): ${problems.slice(0, 4).join("; ")}`);
        }
        await ledger.close();
        await peer.close();
        if (failures.length) console.error(failures.slice(0, 20).join("\n"));
        expect(failures, `${failures.length} of ${seeds} seeds broke "once"`).toEqual([]);
      },
      scaled(600_000),
    );
  });
}
