/**
 * The console's queue is one read of the ledger: an operation that changes status while the page
 * is read (the daemon escalating an unknown outcome to a person) is shown once, as it was. Over
 * real HTTP against the console server on SQLite and Postgres; the change is made between the
 * queue's statements by a hooked dialect (the ledger's own driver runs every statement), not by
 * timing. Before, the queue read each status with its own statement: such an operation was shown
 * twice, or not at all.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { openLedger, type Ledger } from "@idem/core";
import { databaseOf } from "@idem/core/testing";
import { DIALECTS, freshDatabase, scaled } from "@idem/testkit";
import { dialectFor, hooked } from "../../../packages/core/test/support/dialects.js";
import type { ConsoleServer } from "../src/console/server.js";
import { browserOn, parked, serveFor } from "./console-support.js";

const TOKEN = "alice-token-queue-0151";

for (const dialect of DIALECTS) {
  describe(`the console's queue on ${dialect}`, { timeout: scaled(120_000) }, () => {
    /** Where the test writes, as the daemon would: its own connection. */
    let writer: Ledger;
    /** The console's ledger: after the first statement of a queue that reads needs_review rows, `between` runs. */
    let ledger: Ledger;
    let between: (() => Promise<void>) | undefined;
    let web: ConsoleServer;
    beforeAll(async () => {
      const url = await freshDatabase(dialect);
      writer = await openLedger(url);
      ledger = await openLedger(
        hooked(await dialectFor(dialect, url), {
          query: async (q, run) => {
            const out = await run();
            const change = between;
            if (change && /^\s*select/i.test(q.sql) && q.sql.includes("'needs_review'")) {
              between = undefined;
              await change();
            }
            return out;
          },
        }),
      );
      web = await serveFor(ledger, url, [{ name: "alice", token: TOKEN, tenants: "*" }]);
    }, scaled(60_000));
    afterAll(async () => {
      await web?.close();
      await ledger?.close();
      await writer?.close();
    });

    const browser = browserOn(() => web.url);
    const session = () => browser.session(TOKEN);
    /** Sets a row's status (and checks) as another process's statement would. */
    const move = (tenant: string, id: string, status: "unknown" | "needs_review", checks: number) =>
      databaseOf(writer)
        .updateTable("idem_operations")
        .set({ status, checks } as never)
        .where("tenant_id", "=", tenant)
        .where("id", "=", id)
        .execute();

    it("an operation that changes status while the queue is read is shown once, never twice or not at all", async () => {
      const tenant = `t-queue-${dialect}`;
      // Escalated by the daemon while the page is read: an unknown outcome its checks could not settle.
      const escalated = (await writer.run(parked, { tenant, key: ["escalated"], args: {} })).operationId;
      await move(tenant, escalated, "unknown", 2);
      // And the other way (any change of status between two reads does it).
      const reopened = (await writer.run(parked, { tenant, key: ["reopened"], args: {} })).operationId;
      const cookie = await session();
      between = async () => {
        await move(tenant, escalated, "needs_review", 2);
        await move(tenant, reopened, "unknown", 3);
      };
      const page = await (await browser.get(cookie, `/?tenant=${tenant}`)).text();
      expect(between).toBeUndefined(); // the change was made while the page was read
      const shown = (id: string) => page.split(`data-operation="${id}"`).length - 1;
      expect({ escalated: shown(escalated), reopened: shown(reopened) }).toEqual({ escalated: 1, reopened: 1 });
      // Read again, each as it is now.
      const after = await (await browser.get(cookie, `/?tenant=${tenant}`)).text();
      expect(after.split(`data-operation="${escalated}"`).length - 1).toBe(1);
      expect(after).toContain("outcome unknown after 3 checks");
    });
  });
}
