/**
 * The operators' and the daemon's reads over many operations (list by status, stats, prune,
 * stuck, activity) read the rows they answer with through an index, never the whole ledger:
 * each call's statements, as the ledger sent them, are EXPLAINed on a ledger of 12,000
 * operations (Postgres after ANALYZE, as autovacuum would; SQLite without statistics, as the
 * ledger runs it), and their answers are checked on the same rows.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { CompiledQuery, sql, type Kysely } from "kysely";
import { InvalidValueError, type Ledger, type Status } from "@idem/core";
import { databaseOf, openTestLedger } from "@idem/core/testing";
import { DIALECTS, type TestDialect } from "@idem/testkit";
import { dialectFor, hooked } from "./support/dialects.js";
import { ledgers, uniqueTenant } from "./support/ledgers.js";

const CROWD = 12_000;
const HOUR = 3_600_000;

/** Operations of the subject tenants, inserted with SQL so each status is exactly where a test wants it. */
interface Seed {
  id: string;
  tenant: string;
  status: "running" | "succeeded" | "failed" | "unknown" | "needs_review" | "pending";
  action?: string;
  /** Relative to now: negative has expired. */
  expiresIn?: number;
}

const COLUMNS = `id, tenant_id, key, action, args_hash, status, attempt, lease_owner, lease_expires_at, result_json, reason, next_check_at, checks, created_at, updated_at, completed_at, expires_at`;

/**
 * The crowd: `CROWD` settled operations of 10 tenants, the subject among them (a tenth: half of
 * them past retention, one in five failed), and one other tenant's all past retention.
 */
async function fillCrowd(db: Kysely<any>, dialect: TestDialect, subject: string, crowd: string): Promise<void> {
  const now = Date.now();
  const row = (i: string) =>
    `'op_00crowd' || lpad_(${i}), CASE WHEN ${i} % 10 = 0 THEN '${subject}' ELSE '${crowd}-' || (${i} % 10) END, 'crowd' || ${i}, 'bench.noop', 'h',
     CASE WHEN ${i} % 50 = 10 THEN 'failed' ELSE 'succeeded' END, 1, null, null, '{}', 'done', null, 0,
     ${now - 2 * HOUR}, ${now - 2 * HOUR}, ${now - 2 * HOUR},
     CASE WHEN ${i} % 10 = 3 OR ${i} % 20 = 0 THEN ${now - HOUR} ELSE ${now + 24 * HOUR} END`;
  const pad = (i: string) => (dialect === "postgres" ? `lpad(${i}::text, 8, '0')` : `substr('00000000' || ${i}, -8)`);
  const select = (i: string) => row(i).replace(`lpad_(${i})`, pad(i));
  if (dialect === "postgres") {
    await sql
      .raw(`INSERT INTO idem_operations (${COLUMNS}) SELECT ${select("g")} FROM generate_series(1, ${CROWD}) g`)
      .execute(db);
  } else {
    await sql
      .raw(
        `WITH RECURSIVE g(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM g WHERE x < ${CROWD})
         INSERT INTO idem_operations (${COLUMNS}) SELECT ${select("x")} FROM g`,
      )
      .execute(db);
  }
}

async function insert(db: Kysely<any>, rows: readonly Seed[]): Promise<void> {
  const now = Date.now();
  for (const r of rows) {
    const running = r.status === "running";
    const settled = r.status === "succeeded" || r.status === "failed";
    await sql
      .raw(
        `INSERT INTO idem_operations (${COLUMNS}) VALUES ('${r.id}', '${r.tenant}', 'k-${r.id}', '${r.action ?? "mail.send"}', 'h',
          '${r.status}', 1, ${running ? "'w'" : "null"}, ${running ? now + HOUR : "null"}, ${settled ? "'{}'" : "null"}, 'seeded',
          ${r.status === "unknown" || r.status === "pending" ? now + HOUR : "null"}, 0, ${now - HOUR}, ${now - HOUR},
          ${settled ? now - HOUR : "null"}, ${r.expiresIn === undefined ? "null" : now + r.expiresIn})`,
      )
      .execute(db);
  }
}

/** Index names a plan reads idem_operations through; throws on a read of the table that uses none. */
async function indexesOf(db: Kysely<any>, dialect: TestDialect, q: CompiledQuery): Promise<string[]> {
  const used: string[] = [];
  if (dialect === "sqlite") {
    const { rows } = await db.executeQuery<{ detail: string }>(
      CompiledQuery.raw(`EXPLAIN QUERY PLAN ${q.sql}`, [...q.parameters]),
    );
    for (const { detail } of rows) {
      if (!/\bidem_operations\b/.test(detail)) continue;
      // A SEARCH reads a range of an index; a SCAN reads all of one, allowed only for a partial index.
      const m = /^(SEARCH|SCAN) idem_operations USING (?:COVERING |INTEGER PRIMARY KEY )?(?:INDEX )?(\w+)/.exec(detail);
      if (!m || (m[1] === "SCAN" && !PARTIAL.has(m[2]!))) throw new Error(`reads the whole table: ${detail}\n${q.sql}`);
      used.push(m[2]!);
    }
    return used;
  }
  const { rows } = await db.executeQuery<{ "QUERY PLAN": unknown }>(
    CompiledQuery.raw(`EXPLAIN (FORMAT JSON) ${q.sql}`, [...q.parameters]),
  );
  const plan = (rows[0]!["QUERY PLAN"] as { Plan: PgNode }[])[0]!.Plan;
  const walk = (n: PgNode) => {
    if (n["Relation Name"] === "idem_operations" && /Seq Scan/.test(n["Node Type"]))
      throw new Error(`reads the whole table: ${JSON.stringify(plan, null, 1)}\n${q.sql}`);
    if (n["Index Name"]) {
      if (n["Node Type"] !== "Bitmap Index Scan" && !n["Index Cond"] && !PARTIAL.has(n["Index Name"]))
        throw new Error(`reads all of ${n["Index Name"]}: ${JSON.stringify(plan, null, 1)}\n${q.sql}`);
      used.push(n["Index Name"]);
    }
    for (const c of n.Plans ?? []) walk(c);
  };
  walk(plan);
  return used;
}

interface PgNode {
  "Node Type": string;
  "Relation Name"?: string;
  "Index Name"?: string;
  "Index Cond"?: string;
  Plans?: PgNode[];
}

/** Indexes over the unsettled rows only, small whatever the ledger's size: reading one whole is fine. */
const PARTIAL = new Set(["idem_operations_running", "idem_operations_due", "idem_operations_status"]);

for (const dialect of DIALECTS) {
  describe(`operators' queries over many operations, on ${dialect}`, () => {
    const db = ledgers(dialect);
    let ledger: Ledger;
    let sent: CompiledQuery[] | undefined;
    const subject = uniqueTenant();
    const other = uniqueTenant();
    const crowd = uniqueTenant();
    const seeds: Seed[] = [
      { id: "op_01", tenant: subject, status: "needs_review" },
      { id: "op_02", tenant: subject, status: "running" },
      { id: "op_03", tenant: subject, status: "unknown" },
      { id: "op_04", tenant: subject, status: "needs_review", action: "stripe.charge" },
      { id: "op_05", tenant: subject, status: "pending" },
      { id: "op_06", tenant: subject, status: "running" },
      { id: "op_07", tenant: subject, status: "failed", expiresIn: -HOUR },
      { id: "op_08", tenant: subject, status: "succeeded", expiresIn: -HOUR },
      { id: "op_09", tenant: subject, status: "succeeded", expiresIn: HOUR },
      { id: "op_10", tenant: subject, status: "unknown" },
      { id: "op_11", tenant: subject, status: "needs_review" },
      { id: "op_12", tenant: other, status: "needs_review" },
      { id: "op_13", tenant: other, status: "succeeded", expiresIn: -HOUR },
    ];

    beforeAll(async () => {
      await (await db.open()).close(); // migrated
      ledger = await openTestLedger(
        hooked(await dialectFor(dialect, db.url()), {
          query: (q, run) => {
            sent?.push(q);
            return run();
          },
        }),
      );
      const raw = databaseOf(ledger);
      await fillCrowd(raw, dialect, subject, crowd);
      await insert(raw, seeds);
      if (dialect === "postgres") await sql`ANALYZE idem_operations`.execute(raw);
    });
    afterAll(async () => {
      await ledger?.close();
    });

    /** The statements `call` sent, and the indexes each one's plan reads idem_operations through. */
    async function plans<T>(call: () => Promise<T>): Promise<{ out: T; indexes: string[][] }> {
      sent = [];
      const out = await call();
      const statements = sent.filter((q) => /idem_operations\b/.test(q.sql) && !/idem_migration/.test(q.sql));
      sent = undefined;
      expect(statements.length).toBeGreaterThan(0);
      const indexes: string[][] = [];
      for (const q of statements) indexes.push(await indexesOf(databaseOf(ledger), dialect, q));
      return { out, indexes };
    }
    const ids = (ops: readonly { id: string }[]) => ops.map((o) => o.id);

    it("lists a tenant's operations by status, newest first, through the status index, page by page", async () => {
      const first = await plans(() => ledger.admin.list({ tenant: subject, status: "needs_review", limit: 2 }));
      expect(ids(first.out)).toEqual(["op_11", "op_04"]);
      expect(first.indexes).toEqual([["idem_operations_status"]]);
      const next = await plans(() =>
        ledger.admin.list({ tenant: subject, status: "needs_review", limit: 2, before: "op_04" }),
      );
      expect(ids(next.out)).toEqual(["op_01"]);
      expect(next.indexes).toEqual([["idem_operations_status"]]);

      const several = await plans(() =>
        ledger.admin.list({ tenant: subject, status: ["unknown", "pending", "needs_review"] }),
      );
      expect(ids(several.out)).toEqual(["op_11", "op_10", "op_05", "op_04", "op_03", "op_01"]);
      expect(several.indexes).toEqual([
        ["idem_operations_status"],
        ["idem_operations_status"],
        ["idem_operations_status"],
      ]);
      const mixed = await plans(() =>
        ledger.admin.list({ tenant: subject, status: ["running", "needs_review"], limit: 4 }),
      );
      expect(ids(mixed.out)).toEqual(["op_11", "op_06", "op_04", "op_02"]);
      expect(mixed.indexes).toEqual([["idem_operations_running"], ["idem_operations_status"]]);

      const failed = await plans(() => ledger.admin.list({ tenant: subject, status: "failed" }));
      expect(failed.out[0]!.id).toBe("op_07");
      expect(failed.out.length).toBe(100); // and the crowd's failures of this tenant
      expect(failed.out.every((o) => o.status === "failed" && o.tenant === subject)).toBe(true);
      expect(failed.indexes).toEqual([["idem_operations_status"]]);

      const running = await plans(() => ledger.admin.list({ tenant: subject, status: "running" }));
      expect(ids(running.out)).toEqual(["op_06", "op_02"]);
      expect(running.indexes).toEqual([["idem_operations_running"]]);

      // No status asked for: nothing, not every status.
      expect(await ledger.admin.list({ tenant: subject, status: [] })).toEqual([]);
      // A misspelt status is refused, not answered with nothing.
      const misspelt = await ledger.admin
        .list({ tenant: subject, status: ["failed", "needs-review" as Status] })
        .catch((e: unknown) => e);
      expect(misspelt).toBeInstanceOf(InvalidValueError);
      expect((misspelt as InvalidValueError).message).toMatch(
        /"needs-review" is not a status: one of running, .*needs_review/,
      );
      const none = await ledger.admin
        .list({ tenant: subject, status: null as unknown as Status })
        .catch((e: unknown) => e);
      expect(none).toBeInstanceOf(InvalidValueError);
    });

    it("lists the needs_review operations of several tenants or of all of them (an operator's queue)", async () => {
      const mine = await plans(() => ledger.admin.list({ tenant: [subject, other], status: "needs_review" }));
      expect(ids(mine.out)).toEqual(["op_12", "op_11", "op_04", "op_01"]);
      expect(mine.indexes).toEqual([["idem_operations_status"]]);
      const all = await plans(() => ledger.admin.list({ allTenants: true, status: "needs_review", limit: 3 }));
      expect(ids(all.out)).toEqual(["op_12", "op_11", "op_04"]);
      expect(all.indexes).toEqual([["idem_operations_status"]]);
      const page = await plans(() =>
        ledger.admin.list({ allTenants: true, status: "needs_review", limit: 3, before: "op_04" }),
      );
      expect(ids(page.out)).toEqual(["op_01"]);
    });

    it("counts the unsettled operations exactly, by tenant, action and status, from their indexes", async () => {
      const one = await plans(() => ledger.admin.stats({ tenant: subject }));
      const rows = (s: Awaited<ReturnType<Ledger["admin"]["stats"]>>, tenant: string) =>
        s.unsettled
          .filter((r) => r.tenant === tenant)
          .map((r) => `${r.action} ${r.status} ${r.count}`)
          .sort();
      expect(rows(one.out, subject)).toEqual([
        "mail.send needs_review 2",
        "mail.send pending 1",
        "mail.send running 2",
        "mail.send unknown 2",
        "stripe.charge needs_review 1",
      ]);
      expect(one.out.unsettled.every((r) => r.tenant === subject)).toBe(true);
      for (const used of one.indexes) {
        expect(used.length).toBeGreaterThan(0);
        for (const i of used) expect(PARTIAL).toContain(i);
      }
      const all = await plans(() => ledger.admin.stats());
      expect(rows(all.out, subject)).toEqual(rows(one.out, subject));
      expect(rows(all.out, other)).toEqual(["mail.send needs_review 1"]);
      for (const used of all.indexes) for (const i of used) expect(PARTIAL).toContain(i);
    });

    it("finds running operations past a threshold through the running index", async () => {
      const stuck = await plans(() => ledger.daemon.stuck({ olderThanMs: 60_000 }));
      expect(ids(stuck.out).filter((id) => !id.startsWith("op_00"))).toEqual(
        expect.arrayContaining(["op_02", "op_06"]),
      );
      expect(stuck.indexes).toEqual([["idem_operations_running"]]);
      // Of some tenants (an operator's): still their running rows only, not every row of theirs.
      const theirs = await plans(() => ledger.daemon.stuck({ olderThanMs: 60_000, tenants: [subject, other] }));
      expect(ids(theirs.out)).toEqual(["op_02", "op_06"]);
      expect(theirs.indexes).toEqual([["idem_operations_running"]]);
      // Counted with no limit, a tenant's actions left out (the daemon's own deliveries): the same index.
      const counted = await plans(() =>
        ledger.daemon.countStuck({
          olderThanMs: 60_000,
          tenants: [subject, other],
          except: { tenant: other, actions: ["mail.send"] },
        }),
      );
      expect(counted.out).toBe(theirs.out.filter((o) => o.tenant !== other || o.action !== "mail.send").length);
      expect(counted.indexes).toEqual([["idem_operations_running"]]);
    });

    it("reads several lists and stuck runs in one statement (one snapshot), each through its own index", async () => {
      const read = await plans(() =>
        ledger.admin.readAtOnce({
          lists: [
            { tenant: [subject, other], status: "needs_review", limit: 2 },
            { allTenants: true, status: "unknown", limit: 500 },
            { tenant: subject, status: ["pending", "needs_review"] },
            { tenant: [], status: "needs_review" },
          ],
          stuck: [
            { olderThanMs: 60_000, tenants: [subject] },
            { olderThanMs: 60_000, tenants: [] },
          ],
        }),
      );
      expect(read.out.lists.map(ids)).toEqual([
        ["op_12", "op_11"],
        ["op_10", "op_03"],
        ["op_11", "op_05", "op_04", "op_01"],
        [],
      ]);
      expect(read.out.stuck.map(ids)).toEqual([["op_02", "op_06"], []]);
      expect(read.out.stuck[0]!.every((o) => o.runningForMs >= 60_000)).toBe(true);
      // One statement, each arm on its index: the status index for the lists, the running index for stuck runs.
      expect(read.indexes).toHaveLength(1);
      expect([...read.indexes[0]!].sort()).toEqual([
        "idem_operations_running",
        "idem_operations_status",
        "idem_operations_status",
        "idem_operations_status",
        "idem_operations_status",
      ]);
      // Refused as list and stuck refuse them.
      await expect(
        ledger.admin.readAtOnce({ lists: [{ tenant: subject, status: "nope" as Status }] }),
      ).rejects.toBeInstanceOf(InvalidValueError);
      await expect(ledger.admin.readAtOnce({ stuck: [{ olderThanMs: -1 }] })).rejects.toBeInstanceOf(InvalidValueError);
      expect(await ledger.admin.readAtOnce({})).toEqual({ lists: [], stuck: [] });
    });

    it("the daemon's stuck read refuses a limit that is not a whole number from 1, as the operators' reads do", async () => {
      for (const limit of [0, -1, 1.5, Number.NaN, Number.POSITIVE_INFINITY]) {
        await expect(ledger.daemon.stuck({ olderThanMs: 0, limit })).rejects.toThrow(InvalidValueError);
        await expect(ledger.daemon.stuck({ olderThanMs: 0, limit })).rejects.toThrow(/limit/);
      }
      expect(await ledger.daemon.stuck({ olderThanMs: 0, limit: 1, tenants: [subject] })).toHaveLength(1);
    });

    it("the daemon's claim reads the expired leases and the due rows through their partial indexes", async () => {
      // Migration 0011 added a term to the due index's predicate: SQLite uses a partial index only
      // when the query holds each of its terms, so a claim written otherwise reads the whole table.
      const claimed = await plans(() => ledger.daemon.claimDue({ limit: 1_000, claimMs: 1 }));
      // Postgres reads each twice: the candidates, then the rows the update takes.
      expect(claimed.indexes.map((used) => [...new Set(used.filter((i) => PARTIAL.has(i)))])).toEqual([
        ["idem_operations_running"],
        ["idem_operations_due"],
      ]);
    });

    it("charts one tenant's recent operations from its rows only", async () => {
      const recent = await plans(() => ledger.admin.activity({ tenant: subject, sinceMs: 3 * HOUR }));
      const total = recent.out.reduce((n, a) => n + a.count, 0);
      expect(total).toBe(CROWD / 10 + seeds.filter((s) => s.tenant === subject).length);
      for (const used of recent.indexes) expect(used.length).toBeGreaterThan(0);
    });

    // Last: it deletes.
    it("prunes only this tenant's completed operations past retention, through its expiry index", async () => {
      const pruned = await plans(() => ledger.admin.prune({ tenant: subject, limit: 50 }));
      expect(pruned.out).toBe(50);
      for (const used of pruned.indexes) expect(used).toContain("idem_operations_tenant_expiry");
      let rest = 0;
      for (
        let n = await ledger.admin.prune({ tenant: subject });
        n > 0;
        n = await ledger.admin.prune({ tenant: subject })
      )
        rest += n;
      expect(pruned.out + rest).toBe(CROWD / 20 + 2); // its crowd rows past retention, op_07 and op_08
      const left = await ledger.admin.list({ tenant: subject, limit: 1_000 });
      expect(ids(left).filter((id) => !id.startsWith("op_00crowd"))).toEqual([
        "op_11",
        "op_10",
        "op_09",
        "op_06",
        "op_05",
        "op_04",
        "op_03",
        "op_02",
        "op_01",
      ]);
      expect(ids(await ledger.admin.list({ tenant: other }))).toEqual(["op_13", "op_12"]);
      expect(await ledger.admin.prune({ tenant: `${crowd}-3`, limit: 10_000 })).toBe(CROWD / 10);
    });
  });
}
