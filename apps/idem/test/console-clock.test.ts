/**
 * The console's ages are measured on the database's clock, as every age in idem is: a console
 * whose host clock runs apart from the database's (another machine, a step) showed an operation
 * created a minute ago as waiting for hours. Here the database's clock (the test clock) is 3 h
 * behind the console's host. Real HTTP against the console server, on SQLite and Postgres.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { Ledger } from "@idem/core";
import { openTestLedger } from "@idem/core/testing";
import { DIALECTS, freshDatabase, scaled } from "@idem/testkit";
import type { ConsoleServer } from "../src/console/server.js";
import { browserOn, parked, serveFor } from "./console-support.js";

const TOKEN = "alice-token-clock-0001";
const HOUR = 3_600_000;

for (const dialect of DIALECTS) {
  describe(`the console's clock on ${dialect}`, { timeout: scaled(120_000) }, () => {
    let ledger: Ledger;
    let web: ConsoleServer;
    beforeAll(async () => {
      const url = await freshDatabase(dialect);
      ledger = await openTestLedger(url, { clock: () => Date.now() - 3 * HOUR });
      web = await serveFor(ledger, url, [{ name: "alice", token: TOKEN, tenants: "*" }]);
    }, scaled(60_000));
    afterAll(async () => {
      await web?.close();
      await ledger?.close();
    });

    it("the queue's age of an operation just parked reads minutes, not the 3 h between the clocks", async () => {
      const tenant = `t-clock-${dialect}`;
      const op = await ledger.run(parked, { tenant, key: ["sms"], args: {} });
      const cookie = await browserOn(() => web.url).session(TOKEN);
      const page = await (await fetch(`${web.url}/?tenant=${tenant}`, { headers: { cookie } })).text();
      const row = new RegExp(`data-operation="${op.operationId}"[\\s\\S]*?</tr>`).exec(page)?.[0] ?? "";
      expect(row).toContain("needs_review");
      // Before: "3 h" (the console's Date.now() against the database's created_at).
      expect(row).toMatch(/<td>[0-9] min<\/td>/);
    });
  });
}
