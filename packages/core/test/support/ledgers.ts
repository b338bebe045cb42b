/** Opens ledgers on a test file's database and closes every one of them after each test. */
import { openLedger, type Ledger, type LedgerOptions } from "@idem/core";
import { ledgersFor, type TestDialect } from "@idem/testkit";

export function ledgers(dialect: TestDialect): { url(): string; open(options?: LedgerOptions): Promise<Ledger> } {
  return ledgersFor(dialect, openLedger, { defaults: { poolSize: 4 } });
}

let n = 0;
/** A tenant no other test uses, so tests in one file never see each other's rows. */
export function uniqueTenant(): string {
  n += 1;
  return `tenant-${process.pid}-${n}-${Math.random().toString(36).slice(2, 8)}`;
}
