/**
 * The parts of a close with calls in flight that tests provoke for real: another process holding
 * the ledger's writes, and a call that keeps the close from being quiet until it stops waiting.
 */
import { defineAction } from "@idem/core";
import Database from "better-sqlite3";
import { lockTable, type TestDialect } from "@idem/testkit";

/** Another process's hold on the ledger's writes: SQLite's write lock, or Postgres's lock on the operations table. */
export async function holdWriteLock(dialect: TestDialect, url: string): Promise<{ release(): Promise<void> }> {
  if (dialect === "postgres") return lockTable(url, "idem_operations");
  const other = new Database(url.slice("sqlite:".length), { timeout: 0 });
  other.exec("BEGIN IMMEDIATE");
  return {
    release: async () => {
      other.exec("ROLLBACK");
      other.close();
    },
  };
}

/**
 * An action that runs until the close stops waiting for the calls in flight (its signal aborts
 * then: Store.markClosed), then ends ambiguous; `started` and `closeStoppedWaiting` tell when.
 */
export function heldUntilClose() {
  let running!: () => void;
  const started = new Promise<void>((r) => (running = r));
  let stopped!: () => void;
  const closeStoppedWaiting = new Promise<void>((r) => (stopped = r));
  const held = defineAction({
    type: "held",
    capabilities: {},
    execute: async (_a: { to: string }, op) => {
      running();
      await new Promise((r) => op.signal.addEventListener("abort", r, { once: true }));
      stopped();
      throw new Error("This operation was aborted");
    },
    classify: () => ({ kind: "ambiguous", reason: "aborted, its request may have gone out" }),
  });
  return { held, started, closeStoppedWaiting };
}
