/**
 * `existedBefore` ("there before the operation began, nothing written") on an attempt after one
 * HubSpot refused before writing anything (423 Locked here; a 429, a 477, a refused connection
 * alike): nothing of the operation could have made a record (`op.mayHaveCommitted` false), so the
 * record found was made before it began (an operation with the key pruned since). Before: keyed on
 * `op.attempt === 1`, the second attempt lost it, and the model read "done", as if this call had
 * written its names, when the record was left as a person had it.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { setTimeout as sleep } from "node:timers/promises";
import { openLedger, type LedgerOptions } from "@idem/core";
import type { HubSpotSandbox } from "@idem/sandbox";
import { DIALECTS, ledgersFor } from "@idem/testkit";
import { hubspotTools, type HubSpotConfig } from "@idem/hubspot";
import { actionsOn, type SandboxServer, startSandbox, tenants } from "./support/sandbox.js";

let sandbox: HubSpotSandbox;
let server: SandboxServer;
beforeAll(async () => {
  ({ sandbox, server } = await startSandbox(["contacts"]));
});
afterAll(() => sandbox.close());

const crm = (extra: Partial<HubSpotConfig> = {}) => actionsOn(server, extra);
const tenant = tenants("rb");

for (const dialect of DIALECTS) {
  describe(`existedBefore after a first attempt refused before any write, on ${dialect}`, () => {
    const db = ledgersFor(dialect, openLedger, { defaults: { poolSize: 2 } as LedgerOptions });
    const ledger = (o: LedgerOptions = {}) => db.open({ ...o });

    for (const mode of ["upsert", "create"] as const) {
      it(`${mode}: the first request refused 423, the record there before the operation: existedBefore, the names not written`, async () => {
        const l = await ledger({ retentionMs: 1, budget: { attempts: 3, baseDelayMs: 10 } });
        const t = tenant();
        const tool = hubspotTools(crm({ mode })).createContact;
        const input = { email: `pruned-${t}@example.test`, firstname: "Ada" };
        // An earlier operation with the key made the contact; a person renamed it; the operation was pruned.
        const first = await l.run(tool.action, { tenant: t, key: tool.key(input), args: tool.args(input) });
        const id = first.status === "succeeded" ? first.receipt!.id : "";
        sandbox.crm.get("contacts", id)!.properties.firstname = "Adaline";
        await sleep(20);
        expect(await l.admin.prune({ tenant: t })).toBe(1);
        // The key comes again; HubSpot's first answer is 423 Locked (nothing written, wait 2 s).
        sandbox.faults.add({
          kind: "locked",
          match:
            mode === "upsert"
              ? { method: "GET", path: "/crm/v3/objects/contacts/" }
              : { method: "POST", path: "/crm/v3/objects/contacts" },
        });
        const again = await l
          .run(tool.action, { tenant: t, key: tool.key(input), args: tool.args(input) })
          .finally(() => sandbox.faults.clear());
        expect(again).toMatchObject({ status: "succeeded", attempt: 2, receipt: { id, new: false } });
        expect(sandbox.crm.get("contacts", id)!.properties.firstname).toBe("Adaline"); // nothing written
        const receipt = again.status === "succeeded" ? again.receipt! : undefined;
        // What the model is told: the contact was there and the names given were not written.
        expect(tool.summarize(receipt!)).toMatchObject({ id, new: false });
        expect(receipt).toMatchObject({ existedBefore: true });
      });
    }
  });
}
