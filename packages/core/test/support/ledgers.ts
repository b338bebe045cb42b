/** Opens ledgers on a test file's database and closes every one of them after each test. */
import { afterEach, beforeAll } from "vitest";
import { openLedger, type Ledger, type LedgerOptions } from "@idem/core";
import { freshDatabase, type TestDialect } from "@idem/testkit";

export function ledgers(dialect: TestDialect) {
  let url = "";
  const open: Ledger[] = [];
  beforeAll(async () => {
    url = await freshDatabase(dialect);
  });
  afterEach(async () => {
    for (const l of open.splice(0)) await l.close();
  });
  return {
    url: () => url,
    async open(options: LedgerOptions = {}): Promise<Ledger> {
      const l = await openLedger(url, { poolSize: 4, ...options });
      open.push(l);
      return l;
    },
  };
}

let n = 0;
/** A tenant no other test uses, so tests in one file never see each other's rows. */
export function uniqueTenant(): string {
  n += 1;
  return `tenant-${process.pid}-${n}-${Math.random().toString(36).slice(2, 8)}`;
}
