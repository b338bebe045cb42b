/**
 * The idem command's reads and a person's receipt, on SQLite and Postgres: what `stats` shows a
 * shell scoped to one tenant, what `show` and `ls` print of a receipt, and a receipt too large to
 * keep refused before anything is written.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { defineAction, openLedger, type Ledger } from "@idem/core";
import { DIALECTS, freshDatabase, scaled, tempDir } from "@idem/testkit";
import { operationVersion } from "../src/output.js";
import { idem } from "./support.js";

const parked = defineAction({
  type: "sms.send",
  capabilities: {},
  execute: async () => {
    throw new Error("timeout after send");
  },
});

for (const dialect of DIALECTS) {
  describe(`idem reads and receipts on ${dialect}`, { timeout: scaled(180_000) }, () => {
    let url = "";
    let ledger: Ledger;
    beforeAll(async () => {
      url = await freshDatabase(dialect);
      ledger = await openLedger(url);
    });
    afterAll(() => ledger.close());

    it("stats in a shell scoped to a tenant (IDEM_TENANT) counts only that tenant's, as ls lists only its; every tenant with --all-tenants", async () => {
      await ledger.run(parked, { tenant: "acme", key: ["sms", 1], args: { to: "+100" } });
      await ledger.run(parked, { tenant: "globex", key: ["sms", 2], args: { to: "+200" } });
      const tenantsOf = (stdout: string) =>
        (JSON.parse(stdout) as { unsettled: { tenant: string }[] }).unsettled.map((r) => r.tenant).sort();
      // Before: globex's counts (its action types, how many wait for a person) too.
      const scoped = await idem(["--ledger", url, "--json", "stats"], { IDEM_TENANT: "acme" });
      expect(scoped.code, scoped.stderr).toBe(0);
      expect(tenantsOf(scoped.stdout)).toEqual(["acme"]);
      const all = await idem(["--ledger", url, "--json", "stats", "--all-tenants"], { IDEM_TENANT: "acme" });
      expect(all.code, all.stderr).toBe(0);
      expect(tenantsOf(all.stdout)).toEqual(["acme", "globex"]);
      const both = await idem(["--ledger", url, "stats", "--all-tenants", "--tenant", "acme"]);
      expect(both.code).toBe(2);
      expect(both.stderr).toMatch(/--tenant or --all-tenants, not both/);
    });

    it("show and ls print a receipt redacted as args are: a secret the action's receipt holds is kept out", async () => {
      const intent = defineAction({
        type: "pay.intent",
        capabilities: {},
        execute: async () => ({ id: "pi_1", status: "requires_action", client_secret: "pi_1_secret_DO_NOT_SHOW" }),
      });
      const { operationId: id } = await ledger.run(intent, { tenant: "paid", key: ["pi"], args: { amount: 500 } });
      const human = await idem(["--ledger", url, "show", id, "--tenant", "paid"]);
      expect(human.code, human.stderr).toBe(0);
      expect(human.stdout).toMatch(
        /^receipt\s+\{"client_secret":"\[redacted\]","id":"pi_1","status":"requires_action"\}$/m,
      );
      const json = await idem(["--ledger", url, "--json", "show", id, "--tenant", "paid"]);
      expect(JSON.parse(json.stdout).operation.result).toEqual({
        id: "pi_1",
        status: "requires_action",
        client_secret: "[redacted]",
      });
      const listed = await idem(["--ledger", url, "--json", "ls", "--tenant", "paid"]);
      expect(listed.code, listed.stderr).toBe(0);
      for (const out of [human, json, listed]) expect(out.stdout).not.toContain("DO_NOT_SHOW");
      // Callers still replay the receipt whole.
      expect((await ledger.get({ tenant: "paid", id })).operation.result).toMatchObject({
        client_secret: "pi_1_secret_DO_NOT_SHOW",
      });
    });

    it("resolve refuses a receipt larger than the ledger keeps (maxResultBytes) with exit 2, and writes nothing", async () => {
      const { operationId: id } = await ledger.run(parked, { tenant: "big", key: ["sms"], args: { to: "+300" } });
      const file = join(tempDir(), "idem.config.mjs");
      // The action's receipt schema takes any receipt with an sid (a Standard Schema, as zod's).
      writeFileSync(
        file,
        `export default {
  ledger: ${JSON.stringify(url)},
  actions: [{
    type: "sms.send",
    capabilities: {},
    execute: async () => ({ sid: "SM1" }),
    receipt: { "~standard": { version: 1, vendor: "test", validate: (v) => (typeof v?.sid === "string" ? { value: v } : { issues: [{ message: "needs an sid" }] }) } },
  }],
};
`,
      );
      const seen = operationVersion((await ledger.get({ tenant: "big", id })).operation);
      const resolve = (receipt: unknown) =>
        idem([
          "--config",
          file,
          "resolve",
          id,
          "--tenant",
          "big",
          "--succeeded",
          "--seen",
          seen,
          "--reason",
          "found at the provider",
          "--receipt",
          JSON.stringify(receipt),
        ]);
      // Before: stored (exit 0), 100 KB that every later caller replays, past the 64 KiB the runner keeps.
      const big = await resolve({ sid: "SM1", body: "x".repeat(100_000) });
      expect(big.code, big.stderr).toBe(2);
      expect(big.stderr).toMatch(/^idem: receipt: is \d+ bytes, over this ledger's limit of 65536 \(maxResultBytes\)/);
      const refused = await resolve({ id: "SM1" });
      expect(refused.code).toBe(2);
      expect(refused.stderr).toMatch(/receipt: needs an sid/);
      const { operation, events } = await ledger.get({ tenant: "big", id });
      expect(operation).toMatchObject({ status: "needs_review", result: null, resolution: null });
      expect(operationVersion(operation)).toBe(seen);
      expect(events.at(-1)?.to).toBe("needs_review");
      const ok = await resolve({ sid: "SM1" });
      expect(ok.code, ok.stderr).toBe(0);
      expect((await ledger.get({ tenant: "big", id })).operation).toMatchObject({
        status: "succeeded",
        result: { sid: "SM1" },
      });
    });
  });
}
