/**
 * A seeded simulation of existing rows of every status raced by everyone who may act on them:
 * each key starts fresh, succeeded, failed, pending (args stored, kept as a hash only, or lazy args
 * released before they were stored, their model still writing), unknown, needs_review, or running
 * with a live or an expired lease (its worker's request out, its answer late); then callers with
 * eager args, lazy args and `storeArgs: false` on two workers (now and then a third that shuts
 * down meanwhile), two daemons (claimDue and settle), a person (retry, `retry --now`, resolve,
 * with and without the view they decided on) and prune (a short retention) act at once, while the
 * database's answers come late and the clock jumps past leases. interleavings.test.ts explores
 * late commits at the provider on rows that callers create; this one explores who acts on rows
 * that already exist.
 *
 * The provider here commits when a request arrives, which is when it is sent: an effect exists from
 * the send on, and only its answer is late (a timeout after the commit, a lost answer, a receipt
 * after the lease ran out). Its answers: a receipt, a timeout after the commit, 409 "key in use"
 * (nothing committed), 503 and 429 before executing, a permanent refusal (only of a key with no
 * effect: a provider that has the key answers its first result or makes the effect). A request of
 * an unknown or needs_review row may have been queued (its answer a timeout): it lands later, inside
 * a settle window, or never, and the lookup says inconclusive meanwhile. Lookups
 * answer found, absent, fail, or inconclusive: an index that lags (a fresh effect not shown yet).
 *
 * Counted at the provider after each seed (see `check`), per operation (a key pruned and claimed
 * again is a new one): at most one effect, but for one made by a request sent past its attempt's
 * lease (a real worker's local deadline stops it; the virtual clock cannot) or decided by a person
 * whose look at the provider went stale before the decision was accepted; every request sent the
 * args stored for the operation; no two requests under one attempt (the fence); no operation
 * pending with its effect present once everyone has stopped; after the drain every operation
 * succeeded (with an effect's id), failed (no effect), needs_review (alerted), or pending without
 * args and without an effect (left to a caller that has them); every caller's answer agrees with
 * the final state; the history is a chain of transitions ending at the status. `SIM_STATS=1`
 * prints the starting statuses and the moves reached; `SIM_SEED=n` runs one seed, `SIM_SEEDS=k
 * SIM_SEED_FROM=n` k seeds from n, `SIM_DIALECT` one database, `SIM_DUMPS=n` the scripts of n
 * failing seeds (default 3).
 */
import { describe, expect, it } from "vitest";
import { sql } from "kysely";
import { setImmediate as yieldToLoop, setTimeout as sleep } from "node:timers/promises";
import {
  ArgsMismatchError,
  CompletionNotRecordedError,
  defineAction,
  InvalidTransitionError,
  isFailureOverruled,
  isPossiblyTwo,
  isVerdictOverruled,
  LedgerConfigError,
  LedgerUnavailableError,
  OperationNotFoundError,
  type ActionDefinition,
  type Classification,
  type Ledger,
  type LookupContract,
  type Operation,
  type RunResult,
} from "@idem/core";
import { databaseOf, openTestLedger, type TestLedgerOptions } from "@idem/core/testing";
import { DIALECTS, scaled, type TestDialect } from "@idem/testkit";
import { dialectFor, hooked } from "./support/dialects.js";
import { ledgers } from "./support/ledgers.js";
import { CAPS, dedupes, Fail, LEASE_MS, MAX_JUMP_MS, RETENTION_MS, rng, seedsOf, type Kind } from "./support/sim.js";

const SEEDS: Record<TestDialect, number> = { sqlite: 300, postgres: 200 };
/** How long a new effect stays out of the provider's search index (lookups answer inconclusive meanwhile). */
const LOOKUP_LAG_MS = 5_000;
/**
 * How long a request the provider queued (a mail server that accepted a message it delivers later)
 * may take to land; one not landed by then never does. Its lookup says so meanwhile (inconclusive).
 */
const SETTLE_MS = 4 * 60_000;
/** A real worker stops sending this long after its lease was granted (the local deadline: lease minus 2 s). */
const DEADLINE_MS = LEASE_MS - 2_000;

/** How a key's row is made before the race. */
const STARTS = [
  "fresh",
  "succeeded",
  "failed",
  "pending",
  "pending, args not stored",
  "pending, lazy args released",
  "unknown",
  "needs_review",
  "running, live lease",
  "running, expired lease",
] as const;
type Start = (typeof STARTS)[number];

/** What the next execute does when the setup forces it; `hang`: it stays out until the provider fiber answers it. */
type Forced =
  | "ok"
  | "permanent"
  | "transient"
  | "ambiguous, committed"
  | "ambiguous, lost"
  | "ambiguous, queued"
  | "hang, committed"
  | "hang, lost";

/** The provider's roll (see execute) that gives each forced answer. */
const FORCED_ROLL: Record<Exclude<Forced, "hang, committed" | "hang, lost" | "ambiguous, queued">, number> = {
  ok: 0.9,
  permanent: 0.17,
  transient: 0.02,
  "ambiguous, committed": 0.3,
  "ambiguous, lost": 0.06,
};

/** One request sent by an execute, as the provider saw it. */
interface Req {
  readonly n: number;
  readonly key: string;
  /** The operation it was sent for: a key pruned and claimed again is another operation. */
  readonly op: string;
  readonly name: string;
  readonly attempt: number;
  readonly args: string;
  readonly sentAt: number;
  /** The database time the action saw (`op.now`), read after the statement that granted the lease. */
  readonly grantedAt: number;
  committed: boolean;
  /** Queued by the provider (answered with a timeout at once): it lands, or is dropped, later. */
  queued?: boolean;
  /** When a queued request landed (its effect exists from then). */
  landedAt?: number;
  /** The effect it made (not a deduped replay of the first). */
  created?: string;
  effectId?: string;
  /** A request held out by the setup: its call has ended (its late answer is recorded or fenced). */
  settled?: boolean;
  answer?: (a: { receipt: { id: string } } | { cls: Classification }) => void;
}

interface Decision {
  readonly key: string;
  readonly verdict: Verdict;
  /**
   * Whether the operation they saw may have committed (unknown, or needs_review after an execution
   * whose outcome was not known), and whether they gave that view (`seen`: refused if it changed).
   */
  readonly mayHaveCommitted: boolean;
  readonly seen: boolean;
  /** When they looked at the provider. */
  readonly lookedAt: number;
  /** The key's effects when the person looked at the provider, and when the decision was accepted. */
  readonly looked: number;
  readonly accepted: number;
}

interface World {
  now: number;
  readonly t0: number;
  readonly random: () => number;
  readonly kind: Kind;
  readonly effects: Map<string, { id: string; at: number; by: number }[]>;
  readonly requests: Req[];
  readonly hung: Req[];
  /** Requests the provider queued, not landed yet. */
  readonly queued: Req[];
  /** Lazy generators the setup holds back (a model still writing while its caller's lease ran out). */
  readonly models: (() => void)[];
  readonly forced: Forced[];
  readonly decisions: Decision[];
  /** Keys whose lazy args differ per generation: an eager caller may meet args other than its own. */
  readonly varying: Set<string>;
  /** Operations deleted by prune, and when. */
  readonly pruned: Map<string, number>;
  readonly log: string[];
  phase: "setup" | "race" | "drain";
  n: number;
}

let world: World | undefined;
const stats: Record<string, number> = {};
function count(what: string, n = 1): void {
  stats[what] = (stats[what] ?? 0) + n;
}
const t = (w: World) => w.now - w.t0;
const note = (w: World, line: string) => w.log.push(`t=${t(w)} ${line}`);
const label = (op: { keyLabel: string | null }) => (op.keyLabel ? (JSON.parse(op.keyLabel) as string[])[0]! : "?");

async function yields(w: World, max: number): Promise<void> {
  for (let i = Math.floor(w.random() * max); i > 0; i--) await yieldToLoop();
}

function advance(w: World, ms: number, why: string): void {
  w.now += ms;
  if (ms > 1_000) note(w, `clock +${ms} (${why})`);
}

/** The request reaches the provider as it is sent: a new effect, or (deduping, key retained) the first one. */
function commit(w: World, r: Req): void {
  r.committed = true;
  const list = w.effects.get(r.key) ?? [];
  const first = list[0];
  if (dedupes(w.kind) && first && w.now - first.at < RETENTION_MS) r.effectId = first.id;
  else {
    const id = `eff_${++w.n}`;
    list.push({ id, at: w.now, by: r.n });
    w.effects.set(r.key, list);
    r.effectId = r.created = id;
  }
  note(w, `R${r.n} ${r.name} (a${r.attempt}) committed ${r.effectId}${r.created ? "" : " (deduped)"}`);
}

/** A queued request lands (its effect made now), or, past the settle window, is dropped for good. */
function land(w: World, r: Req): void {
  if (w.now - r.sentAt >= SETTLE_MS) {
    note(w, `R${r.n} ${r.name} (a${r.attempt}) dropped by the server`);
    count("queued requests dropped");
    return;
  }
  count("queued requests landed");
  r.landedAt = w.now;
  commit(w, r);
}

function simAction(kind: Kind) {
  type Args = { amount: number; draft?: number };
  type Receipt = { id: string };
  return defineAction<Args, Receipt>({
    type: `race.${kind}`,
    capabilities: CAPS[kind],
    async execute(args, op) {
      const w = world!;
      const req: Req = {
        n: w.requests.length + 1,
        key: op.key,
        op: op.id,
        name: label(op),
        attempt: op.attempt,
        args: JSON.stringify(args),
        sentAt: w.now,
        grantedAt: op.now,
        committed: false,
      };
      w.requests.push(req);
      const forced = w.phase === "setup" ? w.forced.shift() : undefined;
      note(w, `R${req.n} ${req.name} (a${req.attempt}) sent ${req.args}${forced ? ` (${forced})` : ""}`);
      // A request it queued under the key counts: refused only a key it holds nothing for.
      const has = (w.effects.get(op.key)?.length ?? 0) > 0 || w.queued.some((r) => r.key === op.key);
      if (forced === "hang, committed" || forced === "hang, lost") {
        if (forced === "hang, committed") commit(w, req);
        w.hung.push(req);
        const a = await new Promise<{ receipt: Receipt } | { cls: Classification }>((r) => (req.answer = r));
        if ("cls" in a) throw new Fail(a.cls);
        return a.receipt;
      }
      if (forced === "ambiguous, queued") {
        req.queued = true;
        w.queued.push(req);
        throw new Fail({ kind: "ambiguous", reason: "timeout after the server queued it" });
      }
      const roll = forced ? FORCED_ROLL[forced] : w.phase === "drain" ? 0.9 : w.random();
      if (roll < 0.05) throw new Fail({ kind: "transient", reason: "503 before execution" });
      if (roll < 0.08) throw new Fail({ kind: "ambiguous", reason: "409 idempotency_key_in_use" });
      if (roll < 0.11) throw new Fail({ kind: "rate_limited", reason: "429", retryAfterMs: 5 });
      if (roll < 0.18 && !has) throw new Fail({ kind: "permanent", reason: "validation: refused" });
      commit(w, req);
      await yields(w, 6);
      const r = { id: req.effectId! };
      if (roll < 0.35) throw new Fail({ kind: "ambiguous", reason: "timeout after the provider committed" });
      // The answer is so slow that the lease runs out: another worker may act before this one records it.
      if (roll < 0.42 && w.phase === "race") advance(w, LEASE_MS + 1, "a slow answer");
      await yields(w, 6);
      return r;
    },
    classify: (e) => (e instanceof Fail ? e.cls : { kind: "ambiguous", reason: String(e) }),
    ...(CAPS[kind].lookup && {
      async reconcile(_args: Args, op: { key: string }) {
        const w = world!;
        // One read, at one moment (answered a few turns later): the effects and the queue as they
        // were then. Read apart, a request that landed between the two was neither (absent).
        const hit = w.effects.get(op.key)?.[0];
        const queued = w.queued.some((r) => r.key === op.key);
        await yields(w, 4);
        // A request the provider queued has not landed yet: not found, but not absent either.
        if (!hit && queued)
          return { found: false, proof: "inconclusive", reason: "queued at the server", retryAfterMs: 5 } as const;
        const roll = w.phase === "race" ? w.random() : 0.9;
        // A search index that lags: an effect younger than the lag is not shown yet, and the action
        // says so (inconclusive), never "absent".
        if (hit && w.now - hit.at < LOOKUP_LAG_MS && roll < 0.5)
          return { found: false, proof: "inconclusive", reason: "index lags", retryAfterMs: 5 } as const;
        if (hit) return { found: true, receipt: { id: hit.id } } as const;
        if (roll < 0.25) return { found: false, proof: "inconclusive", reason: "index lags", retryAfterMs: 5 } as const;
        if (roll < 0.35) throw new Error("lookup unreachable");
        return { found: false, proof: "absent", reason: "not at the provider (a consistent read)" } as const;
      },
    }),
  } as ActionDefinition<Args, Receipt> & LookupContract<Args, Receipt>);
}

const ACTIONS = {
  dedupe: simAction("dedupe"),
  lookup: simAction("lookup"),
  both: simAction("both"),
  neither: simAction("neither"),
};

/** After each statement the caller yields a seeded number of turns (now and then many) while the race is on. */
async function openJittered(dialect: TestDialect, url: string, options: TestLedgerOptions): Promise<Ledger> {
  const jittered = hooked(await dialectFor(dialect, url, { synchronous: "OFF" }), {
    async query(_q, run) {
      const answer = await run();
      if (world?.phase === "race") await yields(world, world.random() < 0.1 ? 40 : 3);
      return answer;
    },
  });
  return openTestLedger(jittered, options);
}

type Verdict = "retry" | "resolve succeeded" | "resolve failed";

/** A person who checked the provider: what they decide on a status and on what they saw there. */
function verdictOn(status: Operation["status"], sawEffect: boolean, random: () => number): Verdict | undefined {
  if (status === "needs_review") return sawEffect ? "resolve succeeded" : random() < 0.5 ? "retry" : "resolve failed";
  if ((status === "failed" || status === "unknown") && !sawEffect) return random() < 0.6 ? "retry" : undefined;
  return undefined;
}

/** What a caller was told. */
interface Told {
  readonly key: string;
  readonly how: string;
  readonly out?: RunResult<unknown>;
  readonly notRecorded?: { id: string };
  readonly mismatch?: boolean;
  readonly operationId?: string;
  /** A held request of the operation was not settled yet when it was told: its late answer may still overrule a failure. */
  readonly unsettled?: boolean;
}

async function runSeed(
  [ledger, peer]: readonly [Ledger, Ledger],
  seed: number,
  dialect: TestDialect,
  openWorker: () => Promise<Ledger>,
): Promise<string[]> {
  const random = rng(seed);
  const kind = (["dedupe", "lookup", "both", "neither"] as const)[Math.floor(random() * 4)]!;
  const t0 = 1_700_000_000_000 + seed * 10_000_000;
  const w: World = {
    now: t0,
    t0,
    random,
    kind,
    effects: new Map(),
    requests: [],
    hung: [],
    queued: [],
    models: [],
    forced: [],
    decisions: [],
    varying: new Set(),
    pruned: new Map(),
    log: [],
    phase: "setup",
    n: 0,
  };
  world = w;
  const action = ACTIONS[kind];
  const tenant = `race-${dialect}-${seed}`;
  const problems: string[] = [];
  const told: Told[] = [];
  const racers: Promise<void>[] = [];
  const escalate = { maxChecks: 6, maxAgeMs: 3_600_000 };
  let drafts = 0;
  /** Calls that met their operation gone: pruned under them, or a ledger failure. */
  const gone: { how: string; key: string; e: LedgerUnavailableError }[] = [];
  /** A third worker that shuts down during the race (now and then): its calls end, none starts. */
  let closing: Ledger | undefined;

  /** A call of `key` whose answer is recorded in `told`. */
  const call = (key: string, how: "eager" | "lazy" | "hash only", args?: () => Promise<{ amount: number }>) => {
    const input = {
      tenant,
      key: [key],
      budget: { attempts: w.phase === "setup" ? 1 : 1 + Math.floor(random() * 3) },
      ...(how === "hash only" && { storeArgs: false }),
      args:
        how === "lazy"
          ? (args ??
            (async () => {
              await yields(w, 10);
              return w.varying.has(key) ? { amount: 100, draft: ++drafts } : { amount: 100 };
            }))
          : { amount: 100 },
    };
    const r = random();
    return (closing && r < 0.3 ? closing : r < 0.65 ? ledger : peer).run(action, input).then(
      (out) => {
        const unsettled = w.requests.some((r) => r.op === out.operationId && r.settled === false);
        told.push({ key, how, out, operationId: out.operationId, unsettled });
      },
      (e: unknown) => {
        if (e instanceof CompletionNotRecordedError)
          told.push({ key, how, notRecorded: e.receipt as { id: string }, operationId: e.operationId });
        else if (e instanceof ArgsMismatchError && w.varying.has(key)) told.push({ key, how, mismatch: true });
        else if (e instanceof LedgerConfigError && /closed|closing/.test(e.message)) count("calls refused: closed");
        // Its operation was pruned under it (a model that outlasted the retention): the ledger
        // reads a row gone as its own failure, before anything was sent (see fence.ts).
        // Judged once the race is over: the pruner notes what it deleted after its statement.
        else if (e instanceof LedgerUnavailableError && e.operationId) gone.push({ how, key, e });
        else problems.push(`${how} run of ${key} threw ${String(e)}`);
      },
    );
  };
  const opOf = async (key: string) => (await ledger.admin.list({ tenant })).find((op) => label(op) === key);
  const settle = (id: string, on = ledger) =>
    on.daemon
      .settle({ tenant, id, actor: "daemon", escalate })
      .then(() => undefined)
      .catch((e: unknown) => {
        // Pruned before or while it was settled (settle-pruned.test.ts): nothing left to settle.
        if (!(e instanceof OperationNotFoundError)) problems.push(`settle threw ${String(e)}`);
      });
  /** Waits until the setup's call in flight sent its request (or its generator holds it). */
  const until = async (ready: () => boolean) => {
    for (let i = 0; i < 2_000 && !ready(); i++) await sleep(1);
    if (!ready()) throw new Error(`seed ${seed}: the setup's call never got there`);
  };

  // Setup: each key's row, made by the ledger's own paths with the provider's answers forced.
  const keys = Array.from({ length: 1 + Math.floor(random() * 3) }, (_, i) => `k${i}`);
  const starts = new Map<string, Start>();
  for (const key of keys) {
    const start = STARTS[Math.floor(random() * STARTS.length)]!;
    starts.set(key, start);
    if (random() < 0.3) w.varying.add(key);
    const how = random() < 0.25 ? "lazy" : "eager";
    const once = async (forced: Forced, as: "eager" | "lazy" | "hash only" = how) => {
      w.forced.push(forced);
      await call(key, as);
      w.forced.length = 0;
    };
    switch (start) {
      case "fresh":
        break;
      case "succeeded":
        await once("ok");
        break;
      case "failed":
        await once("permanent");
        break;
      case "pending":
        await once("transient");
        break;
      case "pending, args not stored":
        await once("transient", "hash only");
        break;
      case "pending, lazy args released": {
        // The caller's model is still writing when its lease runs out; the daemon gives the row back.
        let write!: () => void;
        const model = new Promise<void>((r) => (write = r));
        w.models.push(write);
        racers.push(
          call(key, "lazy", async () => {
            await model;
            return w.varying.has(key) ? { amount: 100, draft: ++drafts } : { amount: 100 };
          }),
        );
        let op = await opOf(key);
        for (let i = 0; i < 2_000 && !op; i++) {
          await sleep(1);
          op = await opOf(key);
        }
        advance(w, LEASE_MS + 1, "the model outlasts the lease");
        if (op) await settle(op.id);
        break;
      }
      case "unknown":
      case "needs_review": {
        const r = random();
        await once(
          r < 0.3 ? "ambiguous, committed" : r < 0.55 ? "ambiguous, lost" : "ambiguous, queued",
          random() < 0.2 ? "hash only" : how,
        );
        const op = await opOf(key);
        if (start === "needs_review" && op?.status === "unknown") {
          advance(w, 1_000, "checks due");
          await ledger.daemon
            .settle({ tenant, id: op.id, actor: "daemon", escalate: { maxChecks: 0, maxAgeMs: 1 } })
            .catch((e: unknown) => void problems.push(`escalation threw ${String(e)}`));
        }
        break;
      }
      case "running, live lease":
      case "running, expired lease": {
        const sent = w.requests.length;
        w.forced.push(random() < 0.5 ? "hang, committed" : "hang, lost");
        const run = call(key, random() < 0.2 ? "hash only" : how);
        await until(() => w.requests.length > sent);
        const held = w.requests[sent]!;
        held.settled = false;
        racers.push(run.finally(() => (held.settled = true)));
        if (start === "running, expired lease") advance(w, LEASE_MS + 1, "its worker stalls");
        break;
      }
    }
    const op = await opOf(key);
    note(
      w,
      `${key} starts ${start}: ${op ? `${op.status}@${op.attempt}` : "no row"}${w.varying.has(key) ? " (drafts vary)" : ""}`,
    );
    count(`start ${start} -> ${op?.status ?? "none"}`);
  }

  // The race.
  if (random() < 0.3) closing = await openWorker();
  w.phase = "race";
  const callers = keys.flatMap((key) =>
    Array.from({ length: 2 + Math.floor(random() * 3) }, async () => {
      await yields(w, 30);
      const r = random();
      await call(key, r < 0.45 ? "eager" : r < 0.8 ? "lazy" : "hash only");
    }),
  );
  // Two daemons, one per worker: claims hide a row from the other, settlements are fenced.
  const daemon = async (on: Ledger) => {
    for (let i = 0; i < 3; i++) {
      await yields(w, 15);
      const due = (await on.daemon.claimDue({ limit: 10, claimMs: 30_000 })).filter((r) => r.tenant === tenant);
      for (const r of due) await settle(r.id, on);
    }
  };
  const clock = async () => {
    for (let i = 0; i < 8; i++) {
      await yields(w, 15);
      const r = random();
      advance(w, r < 0.5 ? Math.floor(random() * 200) : r < 0.85 ? LEASE_MS + 1 : MAX_JUMP_MS, "the clock");
    }
  };
  // The provider's side: answers what is out, and lets a held-back model finish.
  const provider = async () => {
    for (let step = 0; w.hung.length + w.models.length + w.queued.length > 0; step++) {
      await yields(w, 12);
      await yieldToLoop();
      if (step < 40 && random() < 0.7) continue;
      if (w.queued.length && random() < 0.4) {
        land(w, w.queued.shift()!);
        continue;
      }
      if (w.models.length && random() < 0.5) {
        note(w, "a model finishes writing");
        w.models.shift()!();
        continue;
      }
      const r = w.hung.shift();
      if (!r) continue;
      const roll = random();
      const a = r.committed
        ? roll < 0.6
          ? { receipt: { id: r.effectId! } }
          : { cls: { kind: "ambiguous", reason: "timeout after the body was sent" } as const }
        : roll < 0.5
          ? { cls: { kind: "ambiguous", reason: "timeout after the body was sent" } as const }
          : { cls: { kind: "transient", reason: "503 before execution" } as const };
      note(w, `R${r.n} ${r.name} (a${r.attempt}) answers ${"receipt" in a ? a.receipt.id : a.cls.reason}`);
      r.answer!(a);
    }
  };
  // A person: lists, loads one operation, checks the provider, decides a few steps later, with the
  // view as `seen` (refused if the operation changed) or, as a hurried operator does, without it.
  const person = async () => {
    const rounds = random() < 0.2 ? 0 : 1 + Math.floor(random() * 4);
    for (let i = 0; i < rounds; i++) {
      await yields(w, 30);
      // Half the time from the operator's queue: what a person may decide on.
      const queue = random() < 0.5 ? { status: ["needs_review", "failed", "unknown"] as const } : {};
      const ops = await ledger.admin.list({ tenant, ...queue });
      if (ops.length === 0) continue;
      const pick = ops[Math.floor(random() * ops.length)]!.id;
      const view = await ledger.get({ tenant, id: pick }).then(
        (got) => got.operation,
        (e: unknown) => {
          if (!(e instanceof OperationNotFoundError)) throw e;
        },
      );
      if (!view) continue; // pruned since the list
      const looked = w.effects.get(view.key)?.length ?? 0;
      const lookedAt = w.now;
      // What the ledger knows of it and the console does not show: whether it may have committed.
      const flag = await sql<{ maybe_committed: number }>`
        SELECT maybe_committed FROM idem_operations WHERE tenant_id = ${tenant} AND id = ${view.id}`.execute(
        databaseOf(ledger),
      );
      const mayHaveCommitted =
        view.status === "unknown" || (view.status === "needs_review" && Number(flag.rows[0]?.maybe_committed) === 1);
      const verdict = verdictOn(view.status, looked > 0, random);
      if (!verdict) continue;
      const withSeen = random() < 0.7;
      const name = label(view);
      note(w, `person views ${name} ${view.status}@${view.attempt} (${looked} effects), will ${verdict}`);
      await yields(w, 30);
      const ref = {
        tenant,
        id: view.id,
        actor: "alice",
        ...(withSeen && {
          seen: { status: view.status, attempt: view.attempt, checks: view.checks, updatedAt: view.updatedAt },
        }),
      };
      try {
        if (verdict === "retry") await ledger.admin.retry({ ...ref, reason: "nothing at the provider" });
        else
          await ledger.admin.resolve({
            ...ref,
            reason: looked ? "found at the provider" : "nothing at the provider",
            outcome: verdict === "resolve succeeded" ? "succeeded" : "failed",
            evidence: "checked the provider's dashboard",
          });
        const accepted = w.effects.get(view.key)?.length ?? 0;
        w.decisions.push({ key: view.key, verdict, mayHaveCommitted, seen: withSeen, lookedAt, looked, accepted });
        note(w, `person's ${verdict} of ${name} accepted${withSeen ? "" : " (no view given)"}`);
        count(
          `person ${verdict} of ${view.status}${mayHaveCommitted ? " (may have committed)" : ""} accepted${withSeen ? "" : " without seen"}`,
        );
        // `idem retry --now`: the daemon's settlement runs it at once, racing the callers.
        if (verdict === "retry" && random() < 0.5) await settle(view.id);
      } catch (e) {
        // Refused as stale, or pruned meanwhile: not decided either way.
        if (!(e instanceof InvalidTransitionError || e instanceof OperationNotFoundError))
          problems.push(`person's ${verdict} threw ${String(e)}`);
        else count(`person ${verdict} of ${view.status} refused`);
      }
    }
  };
  // Prune, as `idem prune` on a schedule: completed operations past their retention go, and a caller
  // of their key after that starts a new operation.
  const pruner = async () => {
    for (let i = random() < 0.5 ? 0 : 2; i > 0; i--) {
      await yields(w, 40);
      const before = await ledger.admin.list({ tenant });
      const n = await ledger.admin.prune({ tenant });
      if (n === 0) continue;
      const after = new Set((await ledger.admin.list({ tenant })).map((op) => op.id));
      for (const op of before)
        if (!after.has(op.id)) {
          w.pruned.set(op.id, w.now);
          note(w, `pruned ${label(op)} (${op.status}@${op.attempt})`);
          count(`pruned ${op.status}`);
        }
    }
  };
  const shutdown = async () => {
    if (!closing) return;
    await yields(w, 60);
    note(w, "a worker shuts down");
    await closing.close();
    count("workers closed");
  };
  await Promise.all([...callers, daemon(ledger), daemon(peer), clock(), person(), pruner(), provider(), shutdown()]);
  await Promise.all(racers);

  for (const { how, key, e } of gone)
    if (w.pruned.has(e.operationId!)) count("calls whose operation was pruned under them");
    else problems.push(`${how} run of ${key} threw ${String(e)}`);
  // Quiet: every call ended and every request answered. Nothing known not done has its effect. A
  // person's retry still to be looked up (look_first) is not known not done: its runner looks first.
  const toLook = await marked(ledger, tenant);
  for (const op of await ledger.admin.list({ tenant }))
    if (op.status === "pending" && effectsOf(w, op.id).length > 0 && !excusedByPerson(w, op.key) && !toLook.has(op.id))
      problems.push(`${kind}: ${label(op)} pending (known not done) with its effect present, nothing in flight`);

  // Drain: the provider behaves, time passes, the daemon settles what is due.
  w.phase = "drain";
  for (const r of w.queued.splice(0)) land(w, r);
  for (let round = 0; round < 40; round++) {
    advance(w, MAX_JUMP_MS, "drain");
    const due = (await ledger.daemon.claimDue({ limit: 50, claimMs: 30_000 })).filter((r) => r.tenant === tenant);
    if (due.length === 0) break;
    for (const r of due) await settle(r.id);
  }
  const ops = await ledger.admin.list({ tenant });
  problems.push(...(await check(w, ledger, tenant, ops, told)));
  if (process.env.SIM_STATS) {
    count("seeds");
    for (const op of ops)
      count(`final ${op.status}${op.status === "pending" && op.nextCheckAt !== null ? " (still due)" : ""}`);
    for (const a of told) count(`told ${a.how} ${a.out?.status ?? (a.mismatch ? "args mismatch" : "not recorded")}`);
    for (const l of w.effects.values())
      if (l.length > 1)
        count(
          l.slice(1).every((e) => stale(w.requests[e.by - 1]!))
            ? "second effects sent past the lease"
            : "second effects of a new operation (pruned) or a person's stale view",
        );
  }
  if (problems.length && Number(process.env.SIM_DUMPS ?? 3) > dumps++) {
    console.error(`seed ${seed} (${dialect}, ${kind}) script:\n  ${w.log.join("\n  ")}`);
    for (const op of ops) {
      const { events } = await ledger.get({ tenant, id: op.id });
      console.error(
        `seed ${seed} ${label(op)} ${op.status}:\n  ${events.map((e) => `${e.from}>${e.to}@${e.attempt} [${e.actor}] ${e.reason} t=${e.at - t0}`).join("\n  ")}`,
      );
    }
    console.error(
      `seed ${seed} told:\n  ${told.map((a) => `${a.key} ${a.how}: ${JSON.stringify(a.out ?? a)}`).join("\n  ")}`,
    );
  }
  // The seed's rows go: a row left due (work no daemon can run) would crowd later seeds' drains
  // out of claimDue's page, and every seed costs the same however many ran before it.
  await sql`DELETE FROM idem_operations WHERE tenant_id = ${tenant}`.execute(databaseOf(ledger));
  return problems;
}
let dumps = 0;

/**
 * A person's decision that the effect did not happen, taken on a view of the provider that went
 * stale: an effect appeared after they looked (made meanwhile, or a queued request that landed
 * later). Not a retry, decided on that view, of an outcome that may have committed (unknown, or
 * needs_review after it) of an action that can be looked up: the ledger looks the effect up before
 * such a retry runs (migration 0012).
 */
function excusedByPerson(w: World, key: string): boolean {
  const landedSince = (at: number) =>
    w.requests.some((r) => r.key === key && r.landedAt !== undefined && r.landedAt >= at);
  const looksFirst = (d: Decision) =>
    d.verdict === "retry" && d.mayHaveCommitted && d.seen && CAPS[w.kind].lookup === true;
  return w.decisions.some(
    (d) =>
      d.key === key &&
      d.verdict !== "resolve succeeded" &&
      (d.accepted > d.looked || landedSince(d.lookedAt)) &&
      !looksFirst(d),
  );
}

/** The effects of one operation: made by its requests, or the key's first one that its requests were answered (deduped). */
function effectsOf(w: World, id: string): { id: string; at: number; by: number }[] {
  const mine = w.requests.filter((r) => r.op === id);
  return [...w.effects.values()].flat().filter((e) => mine.some((r) => r.effectId === e.id));
}

/** The tenant's pending operations a person's retry left to be looked up first (`look_first`, migration 0012). */
async function marked(ledger: Ledger, tenant: string): Promise<Set<string>> {
  const { rows } = await sql<{ id: string }>`
    SELECT id FROM idem_operations WHERE tenant_id = ${tenant} AND status = 'pending' AND look_first = 1`.execute(
    databaseOf(ledger),
  );
  return new Set(rows.map((r) => r.id));
}

/** More than one effect made for one operation, but by a request a real worker would not have sent, or a person's stale decision. */
function secondEffects(w: World, id: string, name: string, excused: boolean): string[] {
  const made = [...w.effects.values()].flat().filter((e) => w.requests[e.by - 1]!.op === id);
  if (made.length < 2 || excused) return [];
  const later = made.slice(1).map((e) => w.requests[e.by - 1]!);
  if (later.every(stale)) return [];
  return [
    `${w.kind}: ${made.length} effects for ${name} (${later.map((r) => `R${r.n} a${r.attempt} granted ${r.grantedAt - w.t0} sent ${r.sentAt - w.t0}`).join(", ")})`,
  ];
}

/** Sent past its attempt's lease by the database clock: a real worker's local deadline would have stopped it. */
const stale = (r: Req) => r.sentAt - r.grantedAt >= DEADLINE_MS;

async function check(w: World, ledger: Ledger, tenant: string, ops: Operation[], told: Told[]): Promise<string[]> {
  const problems: string[] = [];
  const kind = w.kind;
  const byId = new Map(ops.map((op) => [op.id, op]));
  const rows = (
    await sql<{ id: string; args_json: string | null; alert_pending: number }>`
      SELECT id, args_json, alert_pending FROM idem_operations WHERE tenant_id = ${tenant}`.execute(databaseOf(ledger))
  ).rows;
  const stored = new Map(rows.map((r) => [r.id, r.args_json]));
  const toLook = await marked(ledger, tenant);
  const alerted = new Set(rows.filter((r) => Number(r.alert_pending) === 1).map((r) => r.id));
  for (const op of ops) {
    const name = label(op);
    const reqs = w.requests.filter((r) => r.op === op.id);
    const hit = effectsOf(w, op.id);
    const excused = excusedByPerson(w, op.key);
    if (op.status === "pending") {
      if (stored.get(op.id) !== null) problems.push(`${kind}: ${name} ended pending with its args stored`);
      // A person's retry whose args are not stored waits for a caller that has them, which looks first.
      if (hit.length > 0 && !excused && !toLook.has(op.id))
        problems.push(`${kind}: ${name} ended pending with its effect present`);
    } else if (!["succeeded", "failed", "needs_review"].includes(op.status))
      problems.push(`${kind}: ${name} ended ${op.status}`);
    if (op.status === "needs_review" && !alerted.has(op.id) && !op.reason?.startsWith("resolved"))
      problems.push(`${kind}: ${name} needs review, not alerted (${op.reason})`);
    const result = op.result as { id: string } | null;
    const atKey = w.effects.get(op.key) ?? [];
    if (op.status === "succeeded" && (result ? !atKey.some((e) => e.id === result.id) : hit.length === 0))
      problems.push(`${kind}: ${name} succeeded with ${JSON.stringify(result)}, target has ${JSON.stringify(hit)}`);
    if (op.status === "failed" && hit.length > 0 && !excused)
      problems.push(`${kind}: ${name} failed but the target has ${hit.map((e) => e.id).join(",")}`);
    problems.push(...secondEffects(w, op.id, name, excused));
    // What goes out under the key is what was stored for it: one content, whoever sends.
    const contents = new Set(reqs.map((r) => r.args));
    if (contents.size > 1) problems.push(`${kind}: ${name} sent ${[...contents].join(" and ")}`);
    // The fence: one request per attempt.
    const attempts = reqs.map((r) => r.attempt);
    if (new Set(attempts).size < attempts.length)
      problems.push(`${kind}: ${name} sent twice under one attempt (${attempts})`);
    // The history: a chain of transitions from the claim to the status. A fenced attempt's note
    // changes nothing and names the row as that attempt last read it, so it is no link.
    const { events } = await ledger.get({ tenant, id: op.id });
    let last: (typeof events)[number] | undefined;
    for (const [i, e] of events.entries()) {
      if (i > 0 && e.id !== events[i - 1]!.id + 1) last = undefined; // events elided between
      if (e.reason?.startsWith("fenced")) continue;
      if (last && e.from !== last.to)
        problems.push(`${kind}: ${name} event ${e.id} goes ${e.from}>${e.to} after ${last.to}`);
      last = e;
    }
    if (last && last.to !== op.status) problems.push(`${kind}: ${name} history ends ${last.to}, status ${op.status}`);
  }
  // A pruned operation's effects are counted as well: one, whoever made it.
  for (const id of w.pruned.keys()) {
    const r = w.requests.find((x) => x.op === id);
    if (r) problems.push(...secondEffects(w, id, `${r.name} (pruned)`, excusedByPerson(w, r.key)));
  }
  for (const a of told) {
    const op = a.operationId ? byId.get(a.operationId) : undefined;
    if (!op) continue;
    if (a.out?.status === "failed" && op.status === "needs_review" && (await reopenedAfterFailing(ledger, tenant, op)))
      continue;
    const hit = w.effects.get(op.key) ?? [];
    const final = op.result as { id: string } | null;
    const retried = w.decisions.some((d) => d.key === op.key && d.verdict === "retry");
    if (a.notRecorded) {
      if (!hit.some((e) => e.id === a.notRecorded!.id) || !["succeeded", "needs_review"].includes(op.status))
        problems.push(`${kind}: ${a.key} (${a.how}) got an unrecorded receipt ${a.notRecorded.id}; final ${op.status}`);
    } else if (a.out?.status === "succeeded") {
      const r = a.out.receipt as { id: string } | null;
      const second = r !== null && !a.out.replayed && op.reason?.startsWith("two effects:") === true;
      if (
        r !== null &&
        (!hit.some((e) => e.id === r.id) || op.status !== "succeeded" || (final?.id !== r.id && !second))
      )
        problems.push(
          `${kind}: ${a.key} (${a.how}) told succeeded ${r.id}; final ${op.status} ${JSON.stringify(final)}, target ${hit.map((e) => e.id)}`,
        );
      if (r === null && op.status !== "succeeded")
        problems.push(`${kind}: ${a.key} told succeeded (a verdict); final ${op.status}`);
    } else if (a.out?.status === "failed" && op.status !== "failed" && !retried && !a.unsettled)
      problems.push(`${kind}: ${a.key} (${a.how}) told failed; final ${op.status}`);
    else if (
      a.out?.status === "failed" &&
      op.status === "succeeded" &&
      !retried &&
      !(await personTold(ledger, op, alerted))
    )
      problems.push(`${kind}: ${a.key} (${a.how}) told failed; ${label(op)} succeeded "${op.reason}", no person told`);
  }
  return problems;
}

/**
 * A caller told "failed" of an operation that succeeded since, no person having asked a retry (a
 * late receipt or a lookup's finding overruled the failure while a request was unsettled): the
 * caller (a model) may have acted on it, so a person is told. After the first "failed" in its
 * history a write said so (a "failed" overruled, the provider's or a person's, or two effects)
 * and its alert is still due (nothing but a person clears one here), or it went to needs_review,
 * or a person decided on it since. As interleavings.test.ts's `overruledAlerted`.
 */
async function personTold(ledger: Ledger, op: Operation, alerted: ReadonlySet<string>): Promise<boolean> {
  const { events } = await ledger.get({ tenant: op.tenant, id: op.id });
  const since = events.slice(events.findIndex((e) => e.to === "failed") + 1);
  const said = (r: string | null) =>
    r !== null && (isFailureOverruled(r) || isVerdictOverruled(r) || r.startsWith("two effects") || isPossiblyTwo(r));
  const person = since.some((e) => e.to === "needs_review" || e.actor === "alice");
  const told = person || (alerted.has(op.id) && since.some((e) => said(e.reason)));
  count(`told failed, succeeded: ${person ? "with a person" : told ? "alerted" : "NOT TOLD"}`);
  return told;
}

/**
 * A failure the ledger voided afterwards, with an alert: an earlier attempt's request, out when a
 * later one was refused, ended without an answer (it may have committed). The caller told `failed`
 * was told the truth as it stood, and the row says so since (fence.ts, lost-moves.test.ts). Read
 * from the history, not from whether that request was answered when the caller's promise settled:
 * the caller may hear a few turns after the late answer was recorded (seed 70875 on Postgres).
 */
async function reopenedAfterFailing(ledger: Ledger, tenant: string, op: Operation): Promise<boolean> {
  const { events } = await ledger.get({ tenant, id: op.id });
  return events.some(
    (e) =>
      e.from === "failed" &&
      e.to === "needs_review" &&
      /still in flight when the operation failed/.test(e.reason ?? ""),
  );
}

for (const dialect of DIALECTS.filter((d) => !process.env.SIM_DIALECT || d === process.env.SIM_DIALECT)) {
  describe(`operators, callers and the daemon racing on existing rows, ${dialect}`, () => {
    const db = ledgers(dialect);
    const { only, from, seeds } = seedsOf(SEEDS, dialect);

    it(
      `${seeds} seeded schedules: never a second effect in silence, every operation settled, every answer true`,
      async () => {
        await db.open(); // migrates the file's database
        const options: TestLedgerOptions = {
          clock: () => (world ? ++world.now : Date.now()),
          leaseMs: LEASE_MS,
          // Short, by the virtual clock, so that prune has completed operations to delete during the race.
          retentionMs: 4 * 60_000,
          budget: { baseDelayMs: 1, maxDelayMs: 4, elapsedMs: 5_000 },
          actions: Object.values(ACTIONS),
        };
        const ledger = await openJittered(dialect, db.url(), options);
        const peer = await openJittered(dialect, db.url(), options);
        const failures: string[] = [];
        for (let i = 0; i < seeds; i++) {
          const seed = only ?? from + i;
          const problems = await runSeed([ledger, peer], seed, dialect, () => openJittered(dialect, db.url(), options));
          if (problems.length) failures.push(`seed ${seed} (SIM_SEED=${seed}): ${problems.slice(0, 4).join("; ")}`);
        }
        world = undefined;
        await ledger.close();
        await peer.close();
        if (failures.length) console.error(failures.join("\n"));
        if (process.env.SIM_STATS) console.error(dialect, JSON.stringify(stats, null, 1));
        expect(failures, `${failures.length} of ${seeds} seeds broke "once"`).toEqual([]);
      },
      scaled(600_000),
    );
  });
}
