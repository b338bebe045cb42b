/**
 * Compile-once for the ledger's hot queries. kysely builds and compiles every query anew, which
 * costs more than the indexed read or single-row write it describes (measured: ~20 µs of a ~30 µs
 * replay on SQLite). A hot query is built once with `slot(name)` placeholders where its values go,
 * and afterwards runs with new values in those positions. This holds because kysely sends every
 * value as a bound parameter, so the SQL text does not depend on the values; a query whose shape
 * varies (optional SET fields) is cached per shape. Hot queries address at most one row (by a
 * unique key), which the direct executors rely on.
 */
import { CompiledQuery, type Compilable, type Kysely, type QueryResult } from "kysely";

const SLOT = "\u0000idem-slot:";

/**
 * Runs a compiled hot query on the driver itself (see open.ts), skipping kysely's per-query
 * connection and plugin plumbing; returns undefined where it cannot, and kysely runs it.
 * `asArrays`: a read may answer its rows as arrays in select-list order, which both drivers make
 * faster than objects (16 columns: about a quarter of a SQLite replay). `atOnce`: the answer now,
 * synchronously, or undefined having sent nothing (no wait for a lock, no round trip): Postgres
 * never answers so, and a statement sent anyway would be a second round trip whose answer and
 * failure nobody reads. `claim`: the write of a fresh claim, which a SQLite ledger refuses rather
 * than commits once its close stopped waiting, should it still wait then (sqlite-driver.ts `close`).
 */
export type DirectExecutor = (
  sql: string,
  parameters: readonly unknown[],
  asArrays?: boolean,
  atOnce?: boolean,
  claim?: boolean,
) => QueryResult<any> | Promise<QueryResult<any>> | undefined;

export class QueryCache<DB> {
  private readonly cache = new Map<
    string,
    { sql: string; parameters: readonly unknown[]; slots: (string | undefined)[] }
  >();

  /**
   * `enabled: false` builds every time (used when a test clock inlines the time into the SQL).
   * `closed`: true once the ledger's close stopped waiting (Store.markClosed): from then on no hot
   * query is sent, and each fails at once (its caller's guard says it met the close). The direct
   * executors skip kysely, whose destroy refuses its own queries: without this, a write of a call
   * still in flight (its outcome, once its action heard the close) was committed while the close
   * drained the writes waiting for a lock, though the close named the call as not recorded.
   */
  constructor(
    private readonly db: Kysely<DB>,
    private readonly enabled: boolean,
    private readonly direct?: DirectExecutor,
    private readonly closed: () => boolean = () => false,
  ) {}

  /**
   * The query's answer if the direct executor gives it at once (a SQLite read that met no lock),
   * else undefined and nothing was run: `run` it. Only for a query that `run` has built before.
   */
  runNow<R>(shape: string, values: Record<string, unknown>, asArrays = false): QueryResult<R> | undefined {
    if (this.closed()) return undefined; // `run` refuses it
    const entry = this.enabled ? this.cache.get(shape) : undefined;
    if (!entry || !this.direct) return undefined;
    const out = this.direct(entry.sql, this.parameters(entry, values), asArrays, true);
    return out instanceof Promise ? undefined : out;
  }

  /**
   * `asArrays`: rows may come back as arrays (see DirectExecutor) or, through kysely, as objects;
   * the caller reads both with `rowObject`. `claim`: a fresh claim's write (see DirectExecutor).
   */
  run<R>(
    shape: string,
    build: (slot: (name: string) => any) => Compilable<R>,
    values: Record<string, unknown>,
    asArrays = false,
    claim = false,
  ): Promise<QueryResult<R>> {
    // Not an async function: the driver's promise is handed on as it is, not wrapped in another
    // (two more turns of the microtask queue for each statement). Whatever throws is a rejection.
    try {
      if (this.closed()) throw new Error("the ledger was closed: no statement is sent");
      if (!this.enabled) return this.db.executeQuery(build((name) => values[name]));
      let entry = this.cache.get(shape);
      if (!entry) {
        const compiled = build((name) => SLOT + name).compile();
        const slots = compiled.parameters.map((p) =>
          typeof p === "string" && p.startsWith(SLOT) ? p.slice(SLOT.length) : undefined,
        );
        entry = { sql: compiled.sql, parameters: compiled.parameters, slots };
        this.cache.set(shape, entry);
      }
      const parameters = this.parameters(entry, values);
      const out =
        (this.direct?.(entry.sql, parameters, asArrays, false, claim) as
          | QueryResult<R>
          | Promise<QueryResult<R>>
          | undefined) ?? this.db.executeQuery<R>(CompiledQuery.raw(entry.sql, parameters));
      return out instanceof Promise ? out : Promise.resolve(out);
    } catch (error) {
      return Promise.reject(error);
    }
  }

  private parameters(
    entry: { parameters: readonly unknown[]; slots: (string | undefined)[] },
    values: Record<string, unknown>,
  ) {
    return entry.parameters.map((p, i) => {
      const name = entry.slots[i];
      return name === undefined ? p : values[name];
    });
  }
}

/** A row as an object: as it came (kysely), or from an array in select-list order (`names`). */
export function rowObject<T>(names: readonly string[], row: unknown): T {
  if (!Array.isArray(row)) return row as T;
  const out: Record<string, unknown> = {};
  for (let i = 0; i < names.length; i++) out[names[i]!] = row[i];
  return out as T;
}
