/**
 * A seeded simulation of a worker that closes its ledger (`close({ waitMs })`, a process shutting
 * down) while its calls are in flight, and opens it again, as a peer worker and its daemon go on
 * with the same keys of one real ledger. Between the steps of the schedule another process takes
 * and lets go the ledger's write lock (SQLite's, or a lock on the Postgres table), so claims and
 * outcomes wait for it as the close stops waiting; the provider's requests are answered, lost
 * or refused at later steps; the database clock (a virtual one) jumps past the leases.
 *
 * Each request commits as it is sent or never (a lookup reads the truth), so a second effect can
 * only be the ledger's own doing. Counted after each seed:
 * - every row a closed ledger left `running` under its own lease is named by that close
 *   (`Closed.inFlight` or `lateAnswers`): nothing it left is silent, however the close met the
 *   lock (before, a claim that waited for it was committed after the close, unnamed);
 * - no request is sent by a ledger once its close began;
 * - at most one effect per key at the target;
 * - every receipt a caller was told (succeeded, or `CompletionNotRecordedError`) is an effect.
 * `SIM_SEED=n` runs one seed, `SIM_SEEDS=k SIM_SEED_FROM=n` searches k seeds from n (the schedule
 * is seeded; the database's and the event loop's timing are not), `SIM_STATS=1` prints how often
 * a close met the lock and left calls in flight. Against the core before 9812ccd it failed 1 of
 * 100 SQLite seeds and 3 of 100 Postgres seeds (a claim committed after the close, unnamed): the
 * CI range may not reach it, close.test.ts holds that case on its own.
 */
import { setImmediate as yieldToLoop } from "node:timers/promises";
import Database from "better-sqlite3";
import { describe, expect, it } from "vitest";
import {
  type ActionDefinition,
  type Closed,
  CompletionNotRecordedError,
  defineAction,
  type Ledger,
  LedgerUnavailableError,
  type LookupContract,
} from "@idem/core";
import { DIALECTS, lockTable, scaled, type TestDialect } from "@idem/testkit";
import { ledgers, uniqueTenant } from "./support/ledgers.js";
import { CAPS, dedupes, Fail, type Kind, LEASE_MS, rng, seedsOf } from "./support/sim.js";

const KEYS = ["k1", "k2", "k3"];
const KINDS: Kind[] = ["dedupe", "lookup", "both", "neither"];

/** A request out at the provider: committed as it was sent or never; answered by the script. */
interface Request {
  answer(how: "ok" | "lost" | "refused"): void;
}

/** How often the runs reached what they are for (`SIM_STATS=1` prints them). */
const stats = {
  seeds: 0,
  closes: 0,
  closesUnderLock: 0,
  leftInFlight: 0,
  named: 0,
  effects: 0,
  calls: 0,
  /** Calls answered by their close while they waited for a connection (Postgres, ending-pool.ts). */
  waitedForConnection: 0,
};

/** A close of one worker's ledger, and what it said once it returned. */
interface Closing {
  readonly owner: string;
  closed?: Closed;
  failed?: unknown;
}

async function holdLock(dialect: TestDialect, url: string): Promise<{ release(): Promise<void> } | undefined> {
  if (dialect === "postgres") return lockTable(url, "idem_operations");
  const other = new Database(url.slice("sqlite:".length), { timeout: 0 });
  try {
    other.exec("BEGIN IMMEDIATE");
  } catch {
    other.close(); // a commit of the ledger's under way: no lock this step
    return undefined;
  }
  return {
    release: async () => {
      other.exec("ROLLBACK");
      other.close();
    },
  };
}

async function runSeed(
  dialect: TestDialect,
  url: string,
  open: ReturnType<typeof ledgers>["open"],
  seed: number,
): Promise<string[]> {
  const random = rng(seed);
  const pick = <T>(xs: readonly T[]) => xs[Math.floor(random() * xs.length)]!;
  const kind = pick(KINDS);
  const tenant = uniqueTenant();
  const problems: string[] = [];
  const effects = new Map<string, string[]>();
  const out = new Set<Request>();
  let now = Date.now();
  let sent = 0;

  /** The action as the ledger of `owner` runs it: a request sent after its close began is a problem. */
  const actionOf = (owner: string, closing: () => Closing | undefined) =>
    defineAction<{ to: string }, { id: string }>({
      type: `pay.${kind}`,
      capabilities: CAPS[kind],
      execute: (_args, op) => {
        const c = closing();
        if (c) problems.push(`${owner} sent a request for ${op.key} after its close began`);
        const arrived = random() < 0.7;
        let id: string | undefined;
        if (arrived) {
          const done = effects.get(op.key) ?? [];
          if (dedupes(kind) && done.length > 0) id = done[0]!;
          else {
            id = `e${++sent}`;
            effects.set(op.key, [...done, id]);
          }
        }
        return new Promise((resolve, reject) => {
          const request: Request = {
            answer(how) {
              if (!out.delete(request)) return;
              if (how === "ok" && id !== undefined) resolve({ id });
              else if (how === "refused" && id === undefined)
                reject(new Fail({ kind: "transient", reason: "503, nothing done" }));
              else reject(new Fail({ kind: "ambiguous", reason: "no answer: the request may have been done" }));
            },
          };
          out.add(request);
          op.signal.addEventListener("abort", () => request.answer("lost"), { once: true });
        });
      },
      classify: (error) => (error instanceof Fail ? error.cls : { kind: "ambiguous", reason: String(error) }),
      ...(CAPS[kind].lookup && {
        reconcile: async (_args, op) => {
          const [id] = effects.get(op.key) ?? [];
          return id === undefined
            ? ({ found: false, proof: "absent", reason: "not at the provider (a consistent read)" } as const)
            : ({ found: true, receipt: { id } } as const);
        },
      }),
    } as ActionDefinition<{ to: string }, { id: string }> & LookupContract<{ to: string }, { id: string }>);

  const options = {
    clock: () => ++now,
    leaseMs: LEASE_MS,
    waitMs: 0,
    busyTimeoutMs: 60_000,
    lockTimeoutMs: 60_000,
    // Postgres: two connections, so that calls wait for one while claims wait for the lock, and a
    // connect timeout past the run's end, so that only the close can answer such a wait.
    ...(dialect === "postgres" && { poolSize: 2, connectTimeoutMs: 120_000 }),
  };
  const peerAction = actionOf("peer", () => undefined);
  const peer = await open({ ...options, owner: "peer", actions: [peerAction] });
  const closings: Closing[] = [];
  const calls: Promise<void>[] = [];
  let generation = 0;
  let worker: { ledger: Ledger; owner: string; action: ReturnType<typeof actionOf> } | undefined;
  const openWorker = async () => {
    generation += 1;
    const owner = `closer${generation}`;
    let closing: Closing | undefined;
    const ledger = await open({ ...options, owner });
    worker = { ledger, owner, action: actionOf(owner, () => closing) };
    return (c: Closing) => (closing = c);
  };
  let markClosing = await openWorker();
  let lock: { release(): Promise<void> } | undefined;

  const call = (ledger: Ledger, action: ReturnType<typeof actionOf>, who: string, key: string) => {
    stats.calls += 1;
    calls.push(
      ledger
        .run(action, {
          tenant,
          key: [key],
          args: { to: key },
          budget: { attempts: 2, baseDelayMs: 1, maxDelayMs: 5, elapsedMs: 2_000 },
        })
        .then(
          (r) => {
            if (r.status === "succeeded" && r.receipt !== null && !effectsAll(effects).has(r.receipt.id))
              problems.push(`${who}'s caller of ${key} was told receipt ${r.receipt.id}, which is no effect`);
          },
          (error: unknown) => {
            if (error instanceof CompletionNotRecordedError) {
              const id = (error.receipt as { id: string }).id;
              if (!effectsAll(effects).has(id))
                problems.push(`${who}'s caller of ${key}: not recorded, receipt ${id} is no effect`);
            } else if (!(error instanceof LedgerUnavailableError && error.closed) && !isRefusedAtClose(error))
              problems.push(`${who}'s caller of ${key} threw ${String(error)}`);
            if (causes(error).some((e) => (e as { name?: unknown }).name === "PoolEndedError"))
              stats.waitedForConnection += 1;
          },
        ),
    );
  };
  const settleDue = async () => {
    const due = (await peer.daemon.claimDue({ limit: 10, claimMs: 30_000 })).filter((r) => r.tenant === tenant);
    // Not awaited: a settlement's request waits for the script to answer it.
    for (const r of due)
      calls.push(
        peer.daemon.settle({ tenant, id: r.id, actor: "daemon", escalate: { maxChecks: 4, maxAgeMs: 3_600_000 } }).then(
          () => {},
          (e: unknown) => void problems.push(`settle threw ${String(e)}`),
        ),
      );
  };

  for (let step = 0; step < 40; step++) {
    const r = random();
    if (r < 0.3) {
      const onWorker = worker !== undefined && random() < 0.7;
      if (onWorker) call(worker!.ledger, worker!.action, worker!.owner, pick(KEYS));
      else call(peer, peerAction, "peer", pick(KEYS));
    } else if (r < 0.5) {
      if (out.size > 0) pick([...out]).answer(pick(["ok", "ok", "lost", "refused"] as const));
    } else if (r < 0.58) {
      lock ??= await holdLock(dialect, url);
    } else if (r < 0.66) {
      // Let go in the background: Postgres's release waits for the statements it held to end.
      const held = lock;
      lock = undefined;
      await held?.release();
    } else if (r < 0.76) {
      if (worker) {
        const closing: Closing = { owner: worker.owner };
        if (lock) stats.closesUnderLock += 1;
        markClosing(closing);
        closings.push(closing);
        worker.ledger.close({ waitMs: pick([0, 20, 200]) }).then(
          (c) => (closing.closed = c),
          (e: unknown) => (closing.failed = e),
        );
        worker = undefined;
      }
    } else if (r < 0.82) {
      if (!worker && closings.every((c) => c.closed || c.failed)) markClosing = await openWorker();
    } else if (r < 0.9) {
      now += LEASE_MS + 1;
    } else if (!lock) {
      await settleDue();
    }
    for (let i = Math.floor(random() * 4); i > 0; i--) await yieldToLoop();
  }

  // The end: the lock let go, every request answered, every call and close ended.
  await lock?.release();
  if (worker) {
    const closing: Closing = { owner: worker.owner };
    markClosing(closing);
    closings.push(closing);
    await worker.ledger.close({ waitMs: pick([0, 20, 200]) }).then(
      (c) => (closing.closed = c),
      (e: unknown) => (closing.failed = e),
    );
  }
  let ended = false;
  const all = Promise.all(calls).finally(() => (ended = true));
  // A call whose ledger closed under it may be answered a moment after the close (context.ts).
  const deadline = Date.now() + scaled(30_000);
  while (!ended || closings.some((c) => !c.closed && !c.failed)) {
    for (const request of [...out]) request.answer("ok");
    // A call on a row it left pending waits for the row to be due, by the database's clock.
    now += 10;
    await yieldToLoop();
    if (Date.now() > deadline) {
      problems.push("calls or closes never ended");
      break;
    }
  }
  await all;

  stats.seeds += 1;
  stats.effects += effectsAll(effects).size;
  for (const c of closings) {
    stats.closes += 1;
    if (c.closed?.inFlight.length) stats.leftInFlight += 1;
    stats.named += c.closed ? c.closed.inFlight.length + c.closed.lateAnswers.length : 0;
    if (c.failed) problems.push(`${c.owner}'s close failed: ${String(c.failed)}`);
    if (!c.closed) continue;
    const named = new Set([...c.closed.inFlight, ...c.closed.lateAnswers].map((o) => o.id));
    for (const op of await peer.admin.list({ tenant, status: "running" }))
      if (op.leaseOwner?.startsWith(`${c.owner}/`) && !named.has(op.id))
        problems.push(`${op.id} (${op.keyLabel}) is left running under ${c.owner}'s lease, not named by its close`);
  }
  for (const [key, ids] of effects)
    if (ids.length > 1) problems.push(`${ids.length} effects for ${key}: ${ids.join(", ")}`);
  // A request an abandoned execute left out is a late answer the close waits for: answered too.
  let peerClosed = false;
  const closingPeer = peer.close().finally(() => (peerClosed = true));
  while (!peerClosed) {
    for (const request of [...out]) request.answer("ok");
    await yieldToLoop();
  }
  await closingPeer;
  return problems.map((p) => `seed ${seed} (${kind}): ${p}`);
}

/** An error and the causes it wraps, outermost first. */
function causes(error: unknown): unknown[] {
  const out: unknown[] = [];
  for (let e = error; e instanceof Error && out.length < 8; e = e.cause) out.push(e);
  return out;
}

function effectsAll(effects: Map<string, string[]>): Set<string> {
  return new Set([...effects.values()].flat());
}

/** A call started as its ledger began closing: refused before it claimed anything. */
function isRefusedAtClose(error: unknown): boolean {
  return error instanceof Error && /the ledger is clos(ing|ed)/.test(error.message);
}

for (const dialect of DIALECTS) {
  describe(`closing a worker's ledger while calls, a peer and a lock race, on ${dialect}`, () => {
    const db = ledgers(dialect);
    const { only, from, seeds } = seedsOf({ sqlite: 40, postgres: 25 }, dialect);
    it(
      `${seeds} seeded schedules: every row a close left running is named, no request after a close began, never a second effect`,
      async () => {
        await db.open(); // migrates the file's database
        for (const k of Object.keys(stats) as (keyof typeof stats)[]) stats[k] = 0;
        const problems: string[] = [];
        for (let i = 0; i < seeds; i++)
          problems.push(...(await runSeed(dialect, db.url(), db.open, (only ?? from) + i)));
        if (problems.length) console.error(problems.join("\n"));
        if (process.env.SIM_STATS) console.error(dialect, JSON.stringify(stats));
        expect(problems).toEqual([]);
      },
      scaled(600_000),
    );
  });
}
