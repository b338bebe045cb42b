/** Opens ledgers on a test file's database and closes every one of them after each test. */
import type { Ledger } from "@idem/core";
import { openTestLedger, type TestLedgerOptions } from "@idem/core/testing";
import { ledgersFor, type TestDialect } from "@idem/testkit";

/** `open` takes `openLedger`'s options plus the test-only `clock`. */
export function ledgers(dialect: TestDialect): { url(): string; open(options?: TestLedgerOptions): Promise<Ledger> } {
  return ledgersFor<Ledger, TestLedgerOptions>(dialect, openTestLedger, { defaults: { poolSize: 4 } });
}

let n = 0;
/** A tenant no other test uses, so tests in one file never see each other's rows. */
export function uniqueTenant(): string {
  n += 1;
  return `tenant-${process.pid}-${n}-${Math.random().toString(36).slice(2, 8)}`;
}
