/**
 * What a caller can learn after the call: `status` (the answer `run` would give, without running)
 * and `wait` (until the operation settles, or the caller's time is up); and args checked by the
 * action's input schema before anything is claimed, with `undefined` fields left out of the hash.
 */
import { describe, expect, it } from "vitest";
import { z } from "zod";
import { InvalidValueError, defineAction, type Ledger } from "@idem/core";
import { DIALECTS } from "@idem/testkit";
import { ledgers, uniqueTenant } from "./support/ledgers.js";
import { TestProvider } from "./support/provider.js";

const count = async (ledger: Ledger, tenant: string) => (await ledger.admin.list({ tenant })).length;

for (const dialect of DIALECTS) {
  describe(`status and wait on ${dialect}`, () => {
    const db = ledgers(dialect);

    it("status answers as a later run would; wait resolves when the worker settles the operation", async () => {
      const p = new TestProvider();
      const mail = p.action("mail", {});
      const ledger = await db.open({ actions: [mail] });
      const tenant = uniqueTenant();
      let release!: () => void;
      p.gate = new Promise<void>((r) => (release = r));
      const call = ledger.run(mail, { tenant, key: ["w"], args: { to: "a" } });
      await p.called(1);
      const [op] = await ledger.admin.list({ tenant });
      const running = await ledger.status({ tenant, id: op!.id });
      expect(running).toMatchObject({ status: "pending_verification", state: "running", operationId: op!.id });
      expect((running as { reason: string }).reason).toMatch(/performing it now/);

      const waited = ledger.wait({ tenant, id: op!.id, timeoutMs: 30_000 });
      release();
      const [direct, later] = await Promise.all([call, waited]);
      expect(direct).toMatchObject({ status: "succeeded", replayed: false });
      expect(later).toMatchObject({
        status: "succeeded",
        replayed: true,
        operationId: op!.id,
        receipt: { id: p.effects[0]!.id },
      });
      expect(p.effects).toHaveLength(1);
    });

    it("wait gives the current state when the time is up or the signal aborts; another tenant's id is not found", async () => {
      const p = new TestProvider();
      const mail = p.action("mail", {});
      const ledger = await db.open({ actions: [mail] });
      const tenant = uniqueTenant();
      let release!: () => void;
      p.gate = new Promise<void>((r) => (release = r)); // the operation stays running until the end
      void ledger.run(mail, { tenant, key: ["stuck"], args: { to: "a" } }).catch(() => {});
      try {
        await p.called(1);
        const [op] = await ledger.admin.list({ tenant });
        const t0 = performance.now();
        expect(await ledger.wait({ tenant, id: op!.id, timeoutMs: 300 })).toMatchObject({
          status: "pending_verification",
          state: "running",
        });
        expect(performance.now() - t0).toBeGreaterThanOrEqual(280);
        const ac = new AbortController();
        const aborted = ledger.wait({ tenant, id: op!.id, timeoutMs: 60_000, signal: ac.signal });
        ac.abort();
        expect(await aborted).toMatchObject({ status: "pending_verification" });
        await expect(ledger.status({ tenant: uniqueTenant(), id: op!.id })).rejects.toThrow(/no operation/i);
      } finally {
        release(); // the ledger's close waits for the call in flight (up to a lease)
      }
    });
  });

  describe(`input schemas on ${dialect}`, () => {
    const db = ledgers(dialect);
    const charges: unknown[] = [];
    const charge = defineAction({
      type: "test.charge",
      capabilities: {},
      input: z.object({
        invoice: z.string().min(1),
        amount: z.number().int().positive(),
        currency: z.string().default("eur"),
        memo: z.string().optional(),
      }),
      async execute(args) {
        charges.push(args);
        return { ok: true };
      },
    });

    it("refuses bad input before anything is claimed, naming the field", async () => {
      const ledger = await db.open();
      const tenant = uniqueTenant();
      const e = await ledger
        .run(charge, { tenant, key: ["inv-1"], args: { invoice: "inv-1", amount: -5 } })
        .catch((x: unknown) => x);
      expect(e).toBeInstanceOf(InvalidValueError);
      expect((e as InvalidValueError).path).toBe("args.amount");
      expect(await count(ledger, tenant)).toBe(0);
      expect(charges).toHaveLength(0);
    });

    it("hashes and executes the schema's output: defaults applied, an unset optional field the same as an absent one", async () => {
      const ledger = await db.open();
      const tenant = uniqueTenant();
      const first = await ledger.run(charge, {
        tenant,
        key: ["inv-2"],
        args: { invoice: "inv-2", amount: 100, memo: undefined },
      });
      const again = await ledger.run(charge, {
        tenant,
        key: ["inv-2"],
        args: { invoice: "inv-2", amount: 100, currency: "eur" },
      });
      expect(first).toMatchObject({ status: "succeeded", replayed: false });
      expect(again).toMatchObject({ status: "succeeded", replayed: true });
      expect(charges.at(-1)).toEqual({ invoice: "inv-2", amount: 100, currency: "eur" });
      const other = await ledger
        .run(charge, { tenant, key: ["inv-2"], args: { invoice: "inv-2", amount: 200 } })
        .catch((x: unknown) => x);
      expect((other as Error).name).toBe("ArgsMismatchError");
    });
  });
}
