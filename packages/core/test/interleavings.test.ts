/**
 * A seeded simulation of the runner on existing rows: callers on two workers and a daemon race on
 * a few keys of one real ledger, the database's answers arrive late (now and then very late,
 * after the lease they granted ran out), and a scripted provider answers ok, times out after committing, refuses
 * before committing (503), answers 409 "key in use", works so slowly that its lease runs out
 * (the database clock jumps past it), or has its completion write fail once; lookups answer
 * found, absent, inconclusive or fail. The database clock is a virtual one (`clock`), so leases,
 * key windows and check backoffs expire when the script says, and every seed is fast.
 *
 * Late answers: now and then a request (an execute or a lookup) is HELD in flight. A provider
 * fiber then moves it at later steps of the schedule, across clock jumps past its lease: an
 * execute arrives at the provider (commits, or is refused) or is lost (never commits), and
 * separately answers (a receipt, a timeout after the body was sent, a 503 or a permanent
 * refusal); a timeout may come before the request arrives (it commits after the caller was told
 * "unknown"). A lookup reads the provider at one step and answers what it read at a later one.
 * A person (an operator who checks the provider) loads an operation with get(), looks at the
 * provider, and at a later step resolves it succeeded / failed or asks a retry, with `seen` from
 * that get(): the ledger must refuse a decision on a view that an answer since made stale.
 *
 * Counted after each seed (see `check` for the precise statements): at most one effect per key
 * at the target, unless the later request was sent while the other could commit unseen
 * (`excuses`: it committed after the lookup that proved absence, and nothing told the ledger
 * since) or a person asked a retry on a view taken while a request of the key was unsettled; once
 * the daemon has drained everything, every operation is succeeded (with an effect's id, or a
 * person's verdict with an effect present), failed (no effect, but for one the ledger was never
 * told of) or needs_review; once every call has ended and every request is over, no operation is
 * pending ("known not done") with its effect present; every caller's answer agrees with the
 * final state (but a caller whose own request made a second effect: told its own receipt, with
 * the operation alerting of two effects; and a caller told "failed" of an operation a late answer
 * made succeeded, no person asking a retry: a person is told, `overruledAlerted`, which the ranges
 * rarely reach); a key the ledger was TOLD two distinct effects of (the receipts executes
 * answered, the effects lookups read: a lookup that reads two answers the first with `twice`)
 * ends alerted of two (needs_review, or a reason of two effects) or with a person
 * (`alertedOfTwo`). How many seeds told the ledger of two is printed after the run, not asserted:
 * whether a seed reaches it is timing, not the schedule, and a run may reach none (the oracle
 * then proved nothing that run; `SIM_SEEDS` searches wider); `SIM_DUMP_TWO=1` prints
 * their scripts. `SIM_STATS=1` prints how often the moves were reached; `SIM_DUMPS=n` prints
 * the script and events of up to n failing seeds (default 3). A failing seed is printed with its
 * script; `SIM_SEED=n` runs that one alone (the schedule is seeded, the database's and the event
 * loop's timing are not: a seed may need a few runs to fail again); `SIM_SEEDS=k
 * SIM_SEED_FROM=n` searches k seeds from n, wider than CI does; `SIM_DIALECT=sqlite|postgres`
 * runs one database only.
 */
import { afterAll, describe, expect, it } from "vitest";
import { sql } from "kysely";
import { AsyncLocalStorage } from "node:async_hooks";
import { setImmediate as yieldToLoop } from "node:timers/promises";
import {
  CompletionNotRecordedError,
  defineAction,
  InvalidTransitionError,
  isFailureOverruled,
  twoEffectsTold,
  isVerdictOverruled,
  LedgerUnavailableError,
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
import {
  CAPS,
  dedupes,
  Fail,
  LEASE_MS,
  MARGIN_MS,
  MAX_JUMP_MS,
  RETENTION_MS,
  rng,
  seedsOf,
  type Kind,
} from "./support/sim.js";

const SEEDS: Record<TestDialect, number> = { sqlite: 1_000, postgres: 600 };
/** How often a request is held in flight (an execute, a lookup), outside the drain. */
const HOLD_EXECUTE = 0.3;
const HOLD_LOOKUP = 0.3;
/** The provider fiber's steps before it answers whatever is still held at once (so every caller ends). */
const PROVIDER_STEPS = 60;

/** A run or a settle: the requests its attempts sent, so we know when the runner went past their answers. */
interface CallToken {
  readonly reqs: Req[];
  readonly reads: Read[];
  /**
   * The keys with a request unsettled when the database last answered this call: what a caller is
   * told was read then, and its answer may reach it only after (the answer is late), when that
   * request's answer was recorded meanwhile (seed 154: told "failed" as read while a receipt was
   * on its way to the row, and the receipt recorded before the answer arrived).
   */
  unsettledAtRead?: ReadonlySet<string>;
}

/** A lookup's read of the provider, and when its runner went past its answer (recorded it, or was fenced). */
interface Read {
  readonly key: string;
  readonly at: number;
  readonly absent: boolean;
  recordedAt?: number;
}
const currentCall = new AsyncLocalStorage<CallToken>();

/** How a held execute answers: with a receipt or a thrown classification. */
type Answer = { receipt: { id: string } } | { cls: Classification };

/** One request sent by an attempt's execute (held or not), as the provider and the script see it. */
interface Req {
  readonly n: number;
  readonly key: string;
  /** The key's label, for the script. */
  readonly name: string;
  readonly attempt: number;
  /** Test-clock time the request was sent. */
  readonly sentAt: number;
  /**
   * An upper bound of the attempt's lease end (the database time of the statement that granted it,
   * read after it, plus the lease; heartbeats never fire here): from then on the ledger may deem it dead.
   */
  readonly leaseEnd: number;
  /** Test-clock time of the statement that granted this attempt's lease (its decision was made on a snapshot before). */
  readonly grantedAt: number;
  readonly held: boolean;
  /** At the provider: committed (an effect, maybe the deduped first one), or refused / lost (never commits). */
  outcome?: "committed" | "refused" | "lost";
  resolvedAt?: number;
  /** Committed after its lease ended (by the test clock). */
  late: boolean;
  /** This request made a new effect (not a dedupe replay of the first). */
  created?: string;
  effectId?: string;
  /** The execute returned or threw (test-clock time). */
  answered: boolean;
  answeredAt?: number;
  /**
   * It answered before it reached the provider (a timeout while it was still on its way): said when
   * the answer is given, since a commit in the same millisecond may come after it (a tie of times).
   */
  early?: boolean;
  /** The runner went past the answer (its call sent again, looked up, or ended): it is recorded or fenced. */
  recorded: boolean;
  recordedAt?: number;
  deliver?: ((a: Answer) => void) | undefined;
}

interface HeldLookup {
  readonly n: number;
  readonly key: string;
  readonly attempt: number;
  read?:
    | { found: true; id: string; ids: string[] }
    | { found: false; proof: "absent" | "inconclusive" }
    | { error: string };
  deliver: (v: NonNullable<HeldLookup["read"]>) => void;
  readonly call: CallToken | undefined;
}

interface World {
  now: number;
  readonly random: () => number;
  readonly kind: Kind;
  /** Every effect the provider performed, per key (what the target received). */
  readonly effects: Map<string, { id: string; at: number; by: number }[]>;
  /** Every request sent, in order. */
  readonly requests: Req[];
  /**
   * The effects the ledger was TOLD of, per key, by effect id: the receipts executes answered (the
   * request's effectId) and the effects each lookup that answered read (all of them: a lookup that
   * reads two answers the first with `twice`).
   */
  readonly told: Map<string, Map<string, { how: string; at: number }>>;
  /** When lookups read the provider, in time order. */
  readonly reads: Read[];
  /** Held executes and lookups the provider fiber still has to move. */
  readonly held: Req[];
  readonly lookups: HeldLookup[];
  /** Accepted decisions of persons: a retry while a request of the key was unsettled excuses a second effect. */
  readonly decisions: { verdict: string; key: string; seq: number; unsettled: boolean; sawEffect: boolean }[];
  /** The script, for a failing seed's report. */
  readonly log: string[];
  /** The script may break the ledger's next completion write (a disk or connection failing once). */
  breakNextCompletion: () => Promise<void>;
  calm: boolean;
  n: number;
  seq: number;
  readonly t0: number;
}

async function yields(w: World, max: number): Promise<void> {
  for (let i = Math.floor(w.random() * max); i > 0; i--) await yieldToLoop();
}

let dumped = 0;

/** `SIM_STATS=1`: how often the schedules reached the late-answer moves (printed after the run). */
const stats: Record<string, number> = {};
function count(what: string, n = 1): void {
  stats[what] = (stats[what] ?? 0) + n;
}

/** The seed being run: the actions act in its world and the ledger's database clock reads its time. */
let world: World | undefined;

const t = (w: World) => w.now - w.t0;
const label = (op: { keyLabel: string | null }) => (op.keyLabel ? (JSON.parse(op.keyLabel) as string[])[0]! : "?");
const note = (w: World, line: string) => w.log.push(`t=${t(w)} ${line}`);

/**
 * An effect the ledger could not know of when it sent another request: `s` (sent before `r`)
 * committed after the lookup read that proved the key's effect absent before `r`'s attempt was
 * granted (or, with no such read, after that grant: a request still on its way, or one
 * committed past its lease), and between its commit and that grant neither did its runner record
 * an answer given after the commit nor did a lookup that read the provider after it answer
 * and have its answer recorded. A timeout answered before
 * the request arrived tells nothing of the commit that followed. Such a second effect is what no
 * lease, lookup or fence can prevent, so it is excused; any other is the ledger's.
 */
function excuses(w: World, s: Req, r: Req): boolean {
  if (s === r || s.key !== r.key || s.sentAt > r.sentAt || s.outcome !== "committed") return false;
  const c = s.resolvedAt!;
  // A read that found the key absent came before every commit of the key, even one in its millisecond.
  const proof = w.reads.filter((x) => x.key === r.key && x.absent && x.at <= r.grantedAt).at(-1);
  if (proof ? c < proof.at : c <= r.grantedAt) return false;
  const told = s.answered && !s.early && s.recordedAt !== undefined && s.recordedAt <= r.grantedAt;
  const read = w.reads.some((x) => toldBy(x, s) && x.recordedAt !== undefined && x.recordedAt <= r.grantedAt);
  return !told && !read;
}

/** A read that saw the key's effect once `s` had committed: found, at the commit's millisecond or later. */
function toldBy(x: Read, s: Req): boolean {
  return x.key === s.key && !x.absent && x.at >= s.resolvedAt!;
}

/** The ledger was never told of `s`'s effect: it answered before it committed, and no lookup that read after the commit had its answer recorded. */
function unseen(w: World, s: Req): boolean {
  return s.early === true && !w.reads.some((x) => toldBy(x, s) && x.recordedAt !== undefined);
}

/** The runner of `call` went past the answers it had: they are recorded (or fenced) by now. */
function markRecorded(w: World, call: CallToken | undefined): void {
  for (const r of call?.reqs ?? [])
    if (!r.recorded) {
      r.recorded = true;
      r.recordedAt = w.now;
    }
  for (const r of call?.reads ?? []) r.recordedAt ??= w.now;
}

/** A request not yet settled: not at the provider yet, or its answer not yet recorded by its runner. */
const isUnsettled = (r: Req) => r.outcome === undefined || !r.recorded;

/** A request of the key not yet settled. */
function unsettled(w: World, key: string): boolean {
  return w.requests.some((r) => r.key === key && isUnsettled(r));
}

/** The ledger is told of the key's effects `ids` (an execute's receipt, or what a lookup read), `how` for the script. */
function tell(w: World, key: string, ids: readonly string[], how: string): void {
  const known = w.told.get(key) ?? new Map<string, { how: string; at: number }>();
  for (const id of ids) if (!known.has(id)) known.set(id, { how, at: w.now });
  w.told.set(key, known);
}

/** The lookup's answer for what it read: the first effect, and with two or more, `twice` naming them all. */
function found(ids: readonly string[]) {
  return ids.length > 1
    ? ({ found: true, receipt: { id: ids[0]! }, twice: ids.join(", ") } as const)
    : ({ found: true, receipt: { id: ids[0]! } } as const);
}

/** The request reaches the provider: commits (a new effect, or the deduped first one), or is refused / lost. */
function arrive(w: World, r: Req, outcome: "committed" | "refused" | "lost"): void {
  // A provider refuses (validation, policy) only a request it has no effect for: one that arrives
  // when the key's effect exists commits (deduped, or a second effect) instead.
  if (outcome === "refused" && (w.effects.get(r.key)?.length ?? 0) > 0) outcome = "committed";
  r.outcome = outcome;
  r.resolvedAt = w.now;
  if (outcome !== "committed") {
    note(w, `R${r.n} ${r.name} (a${r.attempt}) ${outcome} at the provider`);
    return;
  }
  r.late = w.now >= r.leaseEnd;
  const list = w.effects.get(r.key) ?? [];
  const first = list[0];
  // A deduping provider answers its first result while it retains the key, and forgets it after.
  if (dedupes(w.kind) && first && w.now - first.at < RETENTION_MS) r.effectId = first.id;
  else {
    const id = `eff_${++w.n}`;
    list.push({ id, at: w.now, by: r.n });
    w.effects.set(r.key, list);
    r.effectId = r.created = id;
  }
  note(
    w,
    `R${r.n} ${r.name} (a${r.attempt}) committed ${r.effectId}${r.created ? "" : " (deduped)"}${r.late ? " LATE" : ""}`,
  );
}

/** Moves the clock; a deduping provider's request never arrives later than half its margin after it was sent. */
function advance(w: World, ms: number, why: string): void {
  if (dedupes(w.kind))
    for (const r of w.requests)
      if (r.outcome === undefined && w.now + ms >= r.sentAt + MARGIN_MS / 2)
        arrive(w, r, w.random() < 0.6 ? "committed" : "lost");
  w.now += ms;
  if (ms > 1_000) note(w, `clock +${ms} (${why})`);
}

/** The answer a held execute gives once it is over at the provider (or before, for a timeout). */
function answerOf(w: World, r: Req): Answer {
  const roll = w.random();
  if (r.outcome === "committed")
    return roll < 0.6
      ? { receipt: { id: r.effectId! } }
      : { cls: { kind: "ambiguous", reason: "timeout after the body was sent" } };
  if (r.outcome === "refused")
    return roll < 0.5
      ? { cls: { kind: "transient", reason: "503 before execution" } }
      : { cls: { kind: "permanent", reason: "validation: refused" } };
  return { cls: { kind: "ambiguous", reason: "timeout after the body was sent" } };
}

function deliver(w: World, r: Req, a: Answer): void {
  r.early = r.outcome === undefined;
  note(
    w,
    `R${r.n} ${r.name} (a${r.attempt}) answers ${"receipt" in a ? `receipt ${a.receipt.id}` : `${a.cls.kind}: ${a.cls.reason}`}`,
  );
  r.deliver!(a);
  r.deliver = undefined;
}

function simAction(kind: Kind) {
  type Args = { amount: number };
  type Receipt = { id: string };
  // `kind` picks the capabilities at run time; defineAction still checks lookup has its reconcile.
  return defineAction<Args, Receipt>({
    type: `sim.${kind}`,
    capabilities: CAPS[kind],
    async execute(_args, op) {
      const w = world!;
      const call = currentCall.getStore();
      // This call's earlier requests: the runner went past their answers, so it recorded them.
      markRecorded(w, call);
      const req: Req = {
        n: w.requests.length + 1,
        key: op.key,
        name: label(op),
        attempt: op.attempt,
        sentAt: w.now,
        leaseEnd: op.now + LEASE_MS,
        grantedAt: op.now,
        held: !w.calm && w.random() < HOLD_EXECUTE,
        late: false,
        answered: false,
        recorded: false,
      };
      w.requests.push(req);
      call?.reqs.push(req);
      // For the script: the key's requests still on their way to the provider.
      const strays = w.requests.filter((s) => s !== req && s.key === req.key && !s.outcome).map((s) => `R${s.n}`);
      try {
        if (req.held) {
          // The request is out: the provider fiber decides when (and whether) it arrives and when it answers.
          note(
            w,
            `R${req.n} ${label(op)} (a${req.attempt}) sent, held${strays.length ? ` (out: ${strays.join(",")})` : ""}`,
          );
          w.held.push(req);
          const a = await new Promise<Answer>((resolve) => (req.deliver = resolve));
          if ("cls" in a) throw new Fail(a.cls);
          tell(w, req.key, [a.receipt.id], `R${req.n}'s receipt`);
          return a.receipt;
        }
        // Otherwise the provider acts when the request arrives, which is when it is sent.
        note(w, `R${req.n} ${label(op)} (a${req.attempt}) sent${strays.length ? ` (out: ${strays.join(",")})` : ""}`);
        const roll = w.calm ? 0.9 : w.random();
        if (roll < 0.1) {
          arrive(w, req, "lost");
          await yields(w, 6);
          throw new Fail({ kind: "transient", reason: "503 before execution" });
        }
        if (roll < 0.16) {
          arrive(w, req, "lost");
          await yields(w, 6);
          throw new Fail({ kind: "ambiguous", reason: "409 idempotency_key_in_use" });
        }
        arrive(w, req, "committed");
        const r = { id: req.effectId! };
        if (roll < 0.28) {
          await yields(w, 6);
          throw new Fail({ kind: "ambiguous", reason: "timeout after the provider committed" });
        }
        if (roll < 0.4) {
          // Committed, but the answer is so slow that the lease runs out: another worker may take
          // over (replay, look up) before this one finishes, late.
          advance(w, LEASE_MS + 1, "a slow answer");
          await yields(w, 12);
          tell(w, req.key, [r.id], `R${req.n}'s receipt`);
          return r;
        }
        if (roll < 0.43) await w.breakNextCompletion();
        await yields(w, 6);
        tell(w, req.key, [r.id], `R${req.n}'s receipt`);
        return r;
      } finally {
        req.answered = true;
        req.answeredAt = w.now;
      }
    },
    classify: (e) => (e instanceof Fail ? e.cls : { kind: "ambiguous", reason: String(e) }),
    ...(CAPS[kind].lookup && {
      async reconcile(_args: { amount: number }, op: { key: string; keyLabel: string | null; attempt: number }) {
        const w = world!;
        const call = currentCall.getStore();
        markRecorded(w, call);
        if (!w.calm && w.random() < HOLD_LOOKUP) {
          // A lookup in flight: it reads the provider at one later step and answers at another.
          const n = w.lookups.length + w.requests.length + 1;
          note(w, `L${n} ${label(op)} (a${op.attempt}) lookup sent, held`);
          const v = await new Promise<NonNullable<HeldLookup["read"]>>((deliver) =>
            w.lookups.push({ n, key: op.key, attempt: op.attempt, deliver, call }),
          );
          if ("error" in v) throw new Error(v.error);
          if (v.found) {
            tell(w, op.key, v.ids, `L${n}'s finding`);
            return found(v.ids);
          }
          if (v.proof === "inconclusive")
            return { found: false, proof: "inconclusive", reason: "index lags", retryAfterMs: 5 } as const;
          return { found: false, proof: "absent", reason: "not at the provider (a consistent read)" } as const;
        }
        await yields(w, 4);
        const ids = (w.effects.get(op.key) ?? []).map((e) => e.id);
        const read: Read = { key: op.key, at: w.now, absent: ids.length === 0 };
        w.reads.push(read);
        call?.reads.push(read);
        if (ids.length > 0) {
          tell(w, op.key, ids, `a lookup (a${op.attempt})'s finding`);
          return found(ids);
        }
        const roll = w.calm ? 0 : w.random();
        if (roll < 0.2) return { found: false, proof: "inconclusive", reason: "index lags", retryAfterMs: 5 } as const;
        if (roll < 0.3) throw new Error("lookup unreachable");
        return { found: false, proof: "absent", reason: "not at the provider (a consistent read)" } as const;
      },
    }),
  } as ActionDefinition<Args, Receipt> & LookupContract<Args, Receipt>);
}

/** What a held lookup reads at the provider now. */
function readNow(w: World, l: HeldLookup): NonNullable<HeldLookup["read"]> {
  const ids = (w.effects.get(l.key) ?? []).map((e) => e.id);
  const read: Read = { key: l.key, at: w.now, absent: ids.length === 0 };
  w.reads.push(read);
  l.call?.reads.push(read);
  if (ids.length > 0) return { found: true, id: ids[0]!, ids };
  const roll = w.random();
  return roll < 0.15
    ? { error: "lookup unreachable" }
    : { found: false, proof: roll < 0.3 ? "inconclusive" : "absent" };
}

/**
 * One move of the provider fiber on what is held: an execute arrives (commits, is refused) or is
 * lost, or answers (a timeout may come before it arrived); a lookup reads, or answers what it read.
 * `flush`: end everything now (every request settled at the provider, every answer given).
 */
function providerMove(w: World, flush: boolean): void {
  const nHeld = w.held.length;
  const total = nHeld + w.lookups.length;
  if (total === 0) return;
  const i = Math.floor(w.random() * total);
  if (i < nHeld) {
    const r = w.held[i]!;
    const roll = w.random();
    // Time passes while it is out: its lease runs out (the clock fiber's jumps may all have come
    // before a slow database let this request go out).
    if (!flush && roll < 0.12 && w.now < r.leaseEnd) {
      advance(w, r.leaseEnd - w.now + 1, "a held request's lease");
      return;
    }
    if (r.outcome === undefined) {
      if (flush || roll < 0.6) {
        const to = w.random();
        arrive(w, r, to < 0.6 ? "committed" : to < 0.8 ? "refused" : "lost");
      } else if (roll < 0.8 && r.deliver) {
        // The caller's timeout fires while the request is still on its way: it may commit after.
        deliver(w, r, { cls: { kind: "ambiguous", reason: "timeout after the body was sent" } });
      }
    } else if (r.deliver && (flush || roll < 0.7)) deliver(w, r, answerOf(w, r));
    if (r.outcome !== undefined && !r.deliver) w.held.splice(w.held.indexOf(r), 1);
    if (flush) providerMove(w, true);
    return;
  }
  const l = w.lookups[i - nHeld]!;
  if (!l.read) {
    l.read = readNow(w, l);
    note(w, `L${l.n} (a${l.attempt}) reads ${JSON.stringify(l.read)}`);
    if (!flush) return;
  }
  if (flush || w.random() < 0.6) {
    w.lookups.splice(w.lookups.indexOf(l), 1);
    note(w, `L${l.n} (a${l.attempt}) answers`);
    l.deliver(l.read);
  }
  if (flush) providerMove(w, true);
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
      // What the call is told was read here, before the lateness below: the keys unsettled now.
      const token = currentCall.getStore();
      if (world && token) token.unsettledAtRead = new Set(world.requests.filter(isUnsettled).map((r) => r.key));
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

/**
 * What a caller was told, and whether a request of its key was unsettled then (a late answer may
 * still overrule it): when the database answered what it was told, or when the answer arrived.
 */
interface Told {
  readonly key: string;
  readonly seq: number;
  readonly unsettled: boolean;
  /** Unsettled when the database answered, settled by the time the answer arrived (`SIM_STATS`). */
  readonly settledSinceRead?: true;
  readonly out?: RunResult<unknown>;
  readonly notRecorded?: { id: string };
  readonly operationId?: string;
}

type Verdict = "retry" | "resolve succeeded" | "resolve failed";

/** An operator who checks the provider: what they decide on a view of the operation and of the provider. */
function verdictOn(status: Operation["status"], sawEffect: boolean, random: () => number): Verdict | undefined {
  if (status === "needs_review") return sawEffect ? "resolve succeeded" : random() < 0.5 ? "retry" : "resolve failed";
  if (status === "failed") return sawEffect || random() < 0.5 ? undefined : "retry";
  if (status === "unknown") return sawEffect || random() < 0.6 ? undefined : "retry";
  return undefined;
}

async function runSeed(
  [ledger, peer]: readonly [Ledger, Ledger],
  seed: number,
  dialect: TestDialect,
  breakNext: () => Promise<void>,
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
    told: new Map(),
    reads: [],
    held: [],
    lookups: [],
    decisions: [],
    log: [],
    breakNextCompletion: breakNext,
    calm: false,
    n: 0,
    seq: 0,
  };
  world = w;
  const action = ACTIONS[kind];
  const tenant = `sim-${dialect}-${seed}`;
  const keys = Array.from({ length: 1 + Math.floor(random() * 3) }, (_, i) => `k${i}`);
  const problems: string[] = [];
  const told: Told[] = [];
  const call = async (key: string) => {
    await yields(w, 20);
    const token: CallToken = { reqs: [], reads: [] };
    const answered = (x: Omit<Told, "seq" | "unsettled" | "key">) => {
      markRecorded(w, token);
      // The key's hash (what the provider sees), once an attempt of it was sent.
      const hash = w.requests.find((r) => r.name === key)?.key;
      // Unsettled when told: when the database gave the call what it answers (its last answer,
      // the row it read or the write it made), or now.
      const now = hash !== undefined && unsettled(w, hash);
      const atRead = hash !== undefined && token.unsettledAtRead?.has(hash) === true;
      told.push({
        ...x,
        key,
        seq: ++w.seq,
        unsettled: now || atRead,
        ...(atRead && !now && { settledSinceRead: true }),
      });
    };
    try {
      // Two workers, each with its own connections: one may hold its answer while the other acts.
      const out = await currentCall.run(token, () =>
        (random() < 0.5 ? ledger : peer).run(action, {
          tenant,
          key: [key],
          args: { amount: 100 },
          budget: { attempts: 1 + Math.floor(random() * 3) },
        }),
      );
      answered({ out, operationId: out.operationId });
    } catch (e) {
      if (e instanceof CompletionNotRecordedError)
        answered({ notRecorded: e.receipt as { id: string }, operationId: e.operationId });
      else {
        markRecorded(w, token);
        problems.push(`run threw ${String(e)}`);
      }
    }
  };
  const settle = async (id: string) => {
    const token: CallToken = { reqs: [], reads: [] };
    await currentCall
      .run(token, () =>
        ledger.daemon.settle({ tenant, id, actor: "daemon", escalate: { maxChecks: 8, maxAgeMs: 3_600_000 } }),
      )
      .catch((e) => problems.push(`settle threw ${String(e)}`))
      .finally(() => markRecorded(w, token));
  };
  const daemon = async (rounds: number) => {
    for (let i = 0; i < rounds; i++) {
      await yields(w, 10);
      const due = (await ledger.daemon.claimDue({ limit: 10, claimMs: 30_000 })).filter((r) => r.tenant === tenant);
      for (const r of due) await settle(r.id);
    }
  };
  const clock = async () => {
    for (let i = 0; i < 12; i++) {
      await yields(w, 12);
      const r = random();
      advance(w, r < 0.4 ? Math.floor(random() * 200) : r < 0.8 ? LEASE_MS + 1 : MAX_JUMP_MS, "the clock");
    }
  };
  // An operator: loads an operation (get), checks the provider at once, decides at a later step with
  // `seen` from that get. The ledger must refuse the decision if the operation changed since.
  const person = async () => {
    const rounds = random() < 0.4 ? 0 : 1 + Math.floor(random() * 4);
    for (let i = 0; i < rounds; i++) {
      await yields(w, 40);
      const ops = await ledger.admin.list({ tenant });
      if (ops.length === 0) continue;
      const { operation: view } = await ledger.get({ tenant, id: ops[Math.floor(random() * ops.length)]!.id });
      const sawEffect = (w.effects.get(view.key)?.length ?? 0) > 0;
      // Requests still on their way (or unrecorded) when the person looked: what they saw may not last.
      const busyAtView = unsettled(w, view.key);
      const verdict = verdictOn(view.status, sawEffect, random);
      if (!verdict) continue;
      const name = label(view);
      note(
        w,
        `person views ${name} ${view.status}@${view.attempt} (effect ${sawEffect ? "present" : "absent"}), will ${verdict}`,
      );
      await yields(w, 40);
      const seen = { status: view.status, attempt: view.attempt, checks: view.checks, updatedAt: view.updatedAt };
      const ref = { tenant, id: view.id, actor: "alice", seen };
      try {
        if (verdict === "retry") await ledger.admin.retry({ ...ref, reason: "nothing at the provider" });
        else
          await ledger.admin.resolve({
            ...ref,
            reason: sawEffect ? "found at the provider" : "nothing at the provider",
            outcome: verdict === "resolve succeeded" ? "succeeded" : "failed",
            evidence: "checked the provider's dashboard",
          });
        const busy = busyAtView || unsettled(w, view.key);
        w.decisions.push({ verdict, key: view.key, seq: ++w.seq, unsettled: busy, sawEffect });
        note(w, `person's ${verdict} of ${name} accepted${busy ? " (a request of the key is unsettled)" : ""}`);
      } catch (e) {
        // Refused as stale, or the database failed (the script's broken write): not decided either way.
        if (e instanceof InvalidTransitionError || e instanceof LedgerUnavailableError)
          note(w, `person's ${verdict} of ${name} refused (${(e as Error).name})`);
        else problems.push(`person's ${verdict} threw ${String(e)}`);
      }
    }
  };
  // The provider: moves what is held at its own steps; past PROVIDER_STEPS it ends everything at once.
  let activeDone = false;
  const provider = async () => {
    for (let step = 0; !activeDone; step++) {
      if (w.held.length + w.lookups.length === 0) await new Promise((r) => setTimeout(r, 1));
      else await yieldToLoop();
      await yields(w, 8);
      // Now and then only: what is held stays out while the clock jumps past its lease.
      if (step >= PROVIDER_STEPS || random() < 0.4) providerMove(w, step >= PROVIDER_STEPS);
    }
    while (w.held.length + w.lookups.length > 0) providerMove(w, true);
  };
  const callers = keys.flatMap((k) => Array.from({ length: 2 + Math.floor(random() * 3) }, () => call(k)));
  const active = Promise.all([...callers, daemon(4), clock(), person()]).finally(() => (activeDone = true));
  await Promise.all([active, provider()]);

  // Quiet: every call ended, every request is over at the provider and answered.
  const retriedUnsettled = (key: string) =>
    w.decisions.some((d) => d.key === key && d.verdict === "retry" && d.unsettled);
  // Unless every effect of the key is one the ledger was never told of (`unseen`: its request answered
  // before it arrived, and committed after the last lookup): nothing could have moved the row.
  const knownEffect = (key: string) => (w.effects.get(key) ?? []).some((e) => !unseen(w, w.requests[e.by - 1]!));
  for (const op of await ledger.admin.list({ tenant }))
    if (op.status === "pending" && knownEffect(op.key) && !retriedUnsettled(op.key))
      problems.push(`${kind}: ${op.keyLabel} pending (known not done) with the effect present, nothing in flight`);

  // Drain: time passes, the provider and its lookups behave, the daemon settles what is due.
  w.calm = true;
  for (let round = 0; round < 60; round++) {
    advance(w, MAX_JUMP_MS, "drain");
    const due = (await ledger.daemon.claimDue({ limit: 50, claimMs: 30_000 })).filter((r) => r.tenant === tenant);
    // Nothing due: the drain ends once every operation is at rest. One not due yet (a window to
    // wait) is due after a later jump, and a late answer's write still on its way (a given-up
    // lookup's finding, recorded through the fence) has landed by then (seed 255 on Postgres).
    if (due.length === 0) {
      const moving = (await ledger.admin.list({ tenant })).some(
        (op) => !["succeeded", "failed", "needs_review"].includes(op.status),
      );
      if (!moving) break;
    }
    for (const r of due) await settle(r.id);
  }
  const ops = await ledger.admin.list({ tenant });
  problems.push(...check(w, ops, told));
  problems.push(...(await alertedOfTwo(ledger, w, tenant)));
  problems.push(...(await overruledAlerted(ledger, w, ops, told)));
  if ([...w.told.values()].some((ids) => ids.size > 1)) {
    twoTold[dialect].push(seed);
    // `SIM_DUMP_TWO=1`: the script of each seed that told the ledger of two effects.
    if (process.env.SIM_DUMP_TWO)
      console.error(`seed ${seed} (${dialect}, ${kind}) told two:\n  ${w.log.join("\n  ")}`);
  }
  if (process.env.SIM_STATS) {
    count("seeds");
    count("held executes", w.requests.filter((r) => r.held).length);
    count("late commits (after the lease)", w.requests.filter((r) => r.late).length);
    count(
      "requests sent while another of the key could commit unseen",
      w.requests.filter((r) => w.requests.some((s) => excuses(w, s, r))).length,
    );
    count("excused second effects", [...w.effects.values()].filter((l) => l.length > 1).length);
    count("held lookups", w.log.filter((l) => / lookup sent, held/.test(l)).length);
    for (const d of w.decisions) count(`person ${d.verdict} accepted${d.unsettled ? " (unsettled)" : ""}`);
    count("person decisions refused", w.log.filter((l) => /person's .* refused/.test(l)).length);
    for (const op of ops) {
      count(`final ${op.status}`);
      const { events } = await ledger.get({ tenant, id: op.id });
      count("fenced late answers", events.filter((e) => /^fenced/.test(e.reason ?? "")).length);
      count("receipt overrules", events.filter((e) => /receipt proves the effect/.test(e.reason ?? "")).length);
      count(
        "absence voided",
        events.filter((e) => /absence proves nothing|still in flight when absence/.test(e.reason ?? "")).length,
      );
    }
  }
  if (problems.length && dumped++ < Number(process.env.SIM_DUMPS ?? 3)) {
    console.error(`seed ${seed} (${dialect}, ${kind}) script:\n  ${w.log.join("\n  ")}`);
    for (const op of ops) {
      const { events } = await ledger.get({ tenant, id: op.id });
      console.error(
        `seed ${seed}`,
        op.keyLabel,
        op.status,
        events.map((e) => `${e.from}>${e.to}@${e.attempt} [${e.actor}] ${e.reason} t=${e.at - t0}`).join("\n  "),
      );
    }
    console.error(
      `seed ${seed} callers told:\n  ${told.map((a) => `${a.key} #${a.seq}${a.unsettled ? ` (unsettled${a.settledSinceRead ? " at the read" : ""})` : ""}: ${JSON.stringify(a.out ?? { notRecorded: a.notRecorded })}`).join("\n  ")}`,
    );
  }
  return problems;
}

/** Seeds in which the ledger was told of two distinct effects of one key, per database (the oracle below is not vacuous). */
const twoTold: Record<TestDialect, number[]> = { sqlite: [], postgres: [] };

/**
 * A reason that alerts of two effects, proven or possible, wherever the ledger puts those words (the
 * daemon's `kindOf` reads them the same way, `twoEffectsTold`: two_effects, maybe_two_effects).
 */
const twoEffects = (reason: string | null) => reason !== null && twoEffectsTold(reason) !== undefined;

/**
 * A reason that tells a person the effect happened after a "failed" they may have acted on (the
 * provider's, or a person's verdict), or that there may be two: what a failure overruled is
 * alerted with (the daemon's failure_overruled, verdict_overruled, two effects).
 */
const overruleSaid = (reason: string | null) =>
  reason !== null && (isFailureOverruled(reason) || isVerdictOverruled(reason) || twoEffects(reason));

/**
 * A key the ledger was told two (or more) distinct effects of (receipts its executes answered,
 * effects its lookups read and answered) ends, once everything is drained, alerted or with a
 * person: its row is needs_review, or its alert is still due (alert_pending = 1: the simulation
 * delivers no alerts, nothing acknowledges one, so a due alert stays due), or its reason says two
 * effects (proven or possible); or a person decided on it (admin.resolve / retry clear the alert)
 * on a view that told them (the event before theirs, which their `seen` matched: needs_review or
 * two effects said) no earlier than the ledger was told of the second effect. Read from the row
 * itself, by tenant and key.
 */
async function alertedOfTwo(ledger: Ledger, w: World, tenant: string): Promise<string[]> {
  const problems: string[] = [];
  for (const [key, ids] of w.told) {
    if (ids.size < 2) continue;
    const row = await databaseOf(ledger)
      .selectFrom("idem_operations")
      .select(["id", "status", "reason", "alert_pending", "key_label"])
      .where("tenant_id", "=", tenant)
      .where("key", "=", key)
      .executeTakeFirst();
    const said = [...ids].map(([id, { how, at }]) => `${id} (${how} at t=${at - w.t0})`).join(", ");
    // When the ledger could first know of two: the second distinct effect's answer.
    const secondAt = [...ids.values()].map((x) => x.at).sort((a, b) => a - b)[1]!;
    if (!row) {
      problems.push(`${w.kind}: told of ${said} for a key with no operation`);
      continue;
    }
    const name = label({ keyLabel: row.key_label });
    // Alerted OF TWO: a due alert alone may be of one effect (a "failed" overruled, an action's
    // attention); the alert's kind is told by the status and the reason, as the daemon's `kindOf`
    // does. A reason of two said before, replaced by a later write, was alerted when said: nothing
    // but a person clears an alert here (the simulation delivers none).
    const { events } = await ledger.get({ tenant, id: row.id });
    if (row.status === "needs_review" || twoEffects(row.reason)) {
      count(`two told: alerted at the end (${row.status === "needs_review" ? "needs_review" : "its reason"})`);
      continue;
    }
    // Said of two, and no person acted since (their decision clears the alert): still due.
    if (events.some((e, i) => twoEffects(e.reason) && !events.slice(i + 1).some((x) => x.actor === "alice"))) {
      count(`two told: alerted of two before the end (alert_pending ${row.alert_pending})`);
      continue;
    }
    const person = events.some(
      (e, i) =>
        e.actor === "alice" &&
        e.at >= secondAt &&
        i > 0 &&
        (events[i - 1]!.to === "needs_review" || twoEffects(events[i - 1]!.reason)),
    );
    if (person) {
      count("two told: with a person");
      continue;
    }
    problems.push(
      `${w.kind}: the ledger was told of ${said} for ${name}, which ended ${row.status} (alert_pending ${row.alert_pending}) "${row.reason}", no person told`,
    );
  }
  return problems;
}

/**
 * A caller told "failed" of an operation that ended succeeded, no person having asked a retry (rule
 * 5 allows it when a request of the key was unsettled: a late receipt or a lookup's finding
 * overruled the failure), may have acted on the "failed" (a model sends the work again under
 * another key): a person is told. After the first "failed" in the operation's history, a write
 * said so (the provider's or a person's "failed" overruled, or two effects) and its alert is still
 * due (alert_pending = 1: nothing but a person clears one here), or the operation went to
 * needs_review, or a person decided on it since. Read from the row and its history.
 */
async function overruledAlerted(ledger: Ledger, w: World, ops: Operation[], told: Told[]): Promise<string[]> {
  const problems: string[] = [];
  const byId = new Map(ops.map((op) => [op.id, op]));
  const checked = new Set<string>();
  for (const a of told) {
    const op = a.operationId ? byId.get(a.operationId) : undefined;
    if (!op || a.out?.status !== "failed" || op.status !== "succeeded" || checked.has(op.id)) continue;
    if (w.decisions.some((d) => d.key === op.key && d.verdict === "retry")) continue;
    checked.add(op.id);
    const row = await databaseOf(ledger)
      .selectFrom("idem_operations")
      .select(["alert_pending"])
      .where("id", "=", op.id)
      .executeTakeFirstOrThrow();
    const { events } = await ledger.get({ tenant: op.tenant, id: op.id });
    const since = events.slice(events.findIndex((e) => e.to === "failed") + 1);
    if (since.some((e) => e.to === "needs_review" || e.actor === "alice")) {
      count("told failed, succeeded: with a person");
      continue;
    }
    const said = since.find((e) => overruleSaid(e.reason));
    if (said && Number(row.alert_pending) === 1) {
      count(`told failed, succeeded: alerted (${said.reason!.slice(0, 24)}...)`);
      continue;
    }
    problems.push(
      `${w.kind}: ${a.key} #${a.seq} told failed; ${op.keyLabel} ended succeeded (alert_pending ${row.alert_pending}) "${op.reason}", ${said ? "said, its alert not due" : "never said overruled"}: no person told`,
    );
  }
  return problems;
}

/**
 * The invariants, once everything has settled (after the drain), for each operation and key:
 * 1. Status is succeeded, failed or needs_review.
 * 2. Succeeded: its receipt is one of the effects at the target; with no receipt (a person's
 *    verdict) an effect is there.
 * 3. Failed: no effect at the target, except one the ledger was never told of: its request
 *    answered (a timeout) before it arrived, and no lookup read it and had its answer recorded
 *    (`unseen`: a person's "failed" on a provider that showed nothing yet, say).
 * 4. At most one effect per key, except (a) when every effect's request but the first sent was
 *    sent while another of the effects could commit unseen (`excuses`: it committed after the
 *    lookup that proved absence, or after the grant, with nothing telling the ledger since), or
 *    (b) a person's retry was accepted while, or decided on a view taken while, a request of the
 *    key was unsettled (not yet at the provider, or its answer not yet recorded): the person
 *    decided on a provider they could not see whole.
 * 5. Every caller's answer agrees with the final state: a receipt is an effect at the target and
 *    the operation's final receipt (a person's verdict without one: the operation succeeded); an
 *    unrecorded completion's receipt is an effect and the operation is succeeded or needs_review;
 *    "failed" stays failed unless a person asked a retry of it, or a request of the key was
 *    unsettled when it was told (a late receipt then overrules a failure: known, and allowed):
 *    when the database answered the call last (the row it read, the write it made), or when the
 *    answer reached the caller (a late one may arrive after that request's receipt was recorded).
 * (Before the drain, at the quiet point: no operation is pending with its effect present.)
 */
function check(w: World, ops: Operation[], told: Told[]): string[] {
  const problems: string[] = [];
  const kind = w.kind;
  const retriedUnsettled = (key: string) =>
    w.decisions.some((d) => d.key === key && d.verdict === "retry" && d.unsettled);
  const byId = new Map(ops.map((op) => [op.id, op]));
  for (const op of ops) {
    const label = op.keyLabel ? (JSON.parse(op.keyLabel) as string[])[0]! : "?";
    const hit = w.effects.get(op.key) ?? [];
    if (!["succeeded", "failed", "needs_review"].includes(op.status))
      problems.push(`${kind}: ${label} ended ${op.status}`);
    const result = op.result as { id: string } | null;
    if (op.status === "succeeded" && (result ? !hit.some((e) => e.id === result.id) : hit.length === 0))
      problems.push(
        `${kind}: ${label} succeeded with ${JSON.stringify(result)} but the target has ${JSON.stringify(hit)}`,
      );
    if (op.status === "failed" && hit.length > 0 && !hit.every((e) => unseen(w, w.requests[e.by - 1]!)))
      problems.push(`${kind}: ${label} failed but the target has ${JSON.stringify(hit.map((e) => e.id))}`);
    if (hit.length > 1) {
      const creators = hit.map((e) => w.requests[e.by - 1]!).sort((a, b) => a.n - b.n);
      const excused = creators.slice(1).every((r) => creators.some((s) => excuses(w, s, r)));
      if (!excused && !retriedUnsettled(op.key))
        problems.push(
          `${kind}: ${hit.length} effects for ${label} (by ${creators.map((r) => `R${r.n} a${r.attempt} sent ${r.sentAt - w.t0} granted ${r.grantedAt - w.t0} committed ${r.resolvedAt! - w.t0} answered ${(r.answeredAt ?? w.t0) - w.t0} recorded ${(r.recordedAt ?? w.t0) - w.t0}`).join(", ")})`,
        );
    }
  }
  for (const a of told) {
    const op = a.operationId ? byId.get(a.operationId) : undefined;
    if (!op) continue;
    const hit = w.effects.get(op.key) ?? [];
    const final = op.result as { id: string } | null;
    const out = a.out;
    if (a.notRecorded) {
      if (!hit.some((e) => e.id === a.notRecorded!.id) || !["succeeded", "needs_review"].includes(op.status))
        problems.push(`${kind}: ${a.key} #${a.seq} got an unrecorded receipt ${a.notRecorded.id}; final ${op.status}`);
    } else if (out?.status === "succeeded") {
      const r = out.receipt as { id: string } | null;
      // A caller whose own request made a second effect (excused above, or counted there) is told
      // its own receipt, not the recorded one, and a person is alerted of the two.
      const second = r !== null && !out.replayed && op.reason?.startsWith("two effects:") === true;
      if (
        r !== null &&
        (!hit.some((e) => e.id === r.id) || op.status !== "succeeded" || (final?.id !== r.id && !second))
      )
        problems.push(
          `${kind}: ${a.key} #${a.seq} told succeeded ${r.id}; final ${op.status} ${JSON.stringify(final)}, target ${JSON.stringify(hit.map((e) => e.id))}`,
        );
      if (r === null && op.status !== "succeeded")
        problems.push(`${kind}: ${a.key} #${a.seq} told succeeded (a person's verdict); final ${op.status}`);
    } else if (out?.status === "failed" && op.status !== "failed") {
      // A person's retry reopens it (the caller's answer may be told after the retry was accepted).
      const retried = w.decisions.some((d) => d.key === op.key && d.verdict === "retry");
      if (!retried && !a.unsettled) problems.push(`${kind}: ${a.key} #${a.seq} told failed; final ${op.status}`);
      if (!retried && a.settledSinceRead) count("told failed as read while unsettled, overruled before it arrived");
    }
  }
  return problems;
}

afterAll(() => {
  for (const [dialect, seeds] of Object.entries(twoTold))
    console.error(
      `${dialect}: ${seeds.length} seeds told the ledger of two effects of one key (${seeds.slice(0, 20).join(", ")}${seeds.length > 20 ? ", ..." : ""})`,
    );
  // How often the CI range reaches the two-effects oracle (2 to 6 SQLite seeds a run, Postgres's
  // timing rarely): printed, not asserted, since a run may reach none (timing, not the schedule).
});

for (const dialect of DIALECTS.filter((d) => !process.env.SIM_DIALECT || d === process.env.SIM_DIALECT)) {
  describe(`interleavings on existing rows, ${dialect}`, () => {
    const db = ledgers(dialect);
    const { only, from, seeds } = seedsOf(SEEDS, dialect);

    it(
      `${seeds} seeded schedules: never a second effect, every operation settled, every answer true`,
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
        if (failures.length) console.error(failures.join("\n"));
        if (process.env.SIM_STATS) console.error(dialect, JSON.stringify(stats, null, 1));
        expect(failures, `${failures.length} of ${seeds} seeds broke "once"`).toEqual([]);
      },
      scaled(600_000),
    );
  });
}
