/**
 * Names and text the ledger stores as they are (tenants, actors, operation ids, reasons) must mean
 * the same on both databases. Postgres stores an unpaired surrogate as U+FFFD and cannot store NUL
 * at all; SQLite keeps both. So they are refused before anything is read or written, with the same
 * typed error on both: a tenant cut inside an emoji must never read another tenant's operations.
 */
import { describe, expect, it } from "vitest";
import { InvalidValueError, type Ledger } from "@idem/core";
import { databaseOf } from "@idem/core/testing";
import { DIALECTS } from "@idem/testkit";
import { ledgers, uniqueTenant } from "./support/ledgers.js";
import { TestProvider } from "./support/provider.js";

const HIGH = "\ud83d"; // the first half of 😀 (U+1F600)
const LOW_ONLY = "\ude00"; // its second half alone

/** The error a call threw, or a failure when it did not throw. */
async function thrown(p: Promise<unknown>): Promise<unknown> {
  try {
    await p;
  } catch (e) {
    return e;
  }
  throw new Error("expected the call to be refused");
}

async function refusedAs(p: Promise<unknown>, path: string): Promise<void> {
  const e = await thrown(p);
  expect(e, String(e)).toBeInstanceOf(InvalidValueError);
  expect((e as InvalidValueError).path).toBe(path);
}

for (const dialect of DIALECTS) {
  describe(`names on ${dialect}`, () => {
    const db = ledgers(dialect);

    async function setup(): Promise<{
      ledger: Ledger;
      provider: TestProvider;
      mail: ReturnType<TestProvider["action"]>;
      count: () => Promise<number>;
    }> {
      const provider = new TestProvider();
      const mail = provider.action("mail", {});
      const ledger = await db.open({ actions: [mail] });
      const count = async () =>
        Number(
          (
            await databaseOf(ledger)
              .selectFrom("idem_operations")
              .select((eb) => eb.fn.countAll().as("n"))
              .executeTakeFirstOrThrow()
          ).n,
        );
      return { ledger, provider, mail, count };
    }

    it("refuses tenants that are not well-formed Unicode, on every tenant-scoped call, and writes nothing", async () => {
      const { ledger, provider, mail, count } = await setup();
      const base = uniqueTenant();
      // A well-formed tenant with an emoji has operations; the cut names must not reach them.
      const whole = `${base}-😀`;
      const done = await ledger.run(mail, { tenant: whole, key: ["k"], args: { to: "a" } });
      expect(done.status).toBe("succeeded");
      const id = (done as { operationId: string }).operationId;
      const before = await count();

      for (const tenant of [`${base}-${HIGH}`, `${base}-${LOW_ONLY}`, `${base}-${HIGH}x`, `${base}-\u0000`]) {
        await refusedAs(ledger.run(mail, { tenant, key: ["k"], args: { to: "a" } }), "tenant");
        await refusedAs(ledger.get({ tenant, id }), "tenant");
        await refusedAs(ledger.admin.list({ tenant }), "tenant");
        await refusedAs(
          ledger.admin.resolve({ tenant, id, outcome: "succeeded", reason: "r", actor: "ops" }),
          "tenant",
        );
        await refusedAs(ledger.admin.retry({ tenant, id, reason: "r", actor: "ops" }), "tenant");
        await refusedAs(ledger.admin.prune({ tenant }), "tenant");
        await refusedAs(ledger.daemon.settle({ tenant, id }), "tenant");
        await refusedAs(ledger.admin.stats({ tenant }), "tenant");
      }
      expect(await count()).toBe(before);
      expect(provider.effects).toHaveLength(1);
      // The well-formed tenant still reads its own operation, emoji and all.
      expect((await ledger.get({ tenant: whole, id })).operation.tenant).toBe(whole);
    });

    it("keeps two tenants apart whose names differ only after a surrogate pair (stored as they are)", async () => {
      const { ledger, mail } = await setup();
      const base = uniqueTenant();
      const a = await ledger.run(mail, { tenant: `${base}-😀`, key: ["k"], args: { to: "a" } });
      const b = await ledger.run(mail, { tenant: `${base}-😁`, key: ["k"], args: { to: "a" } });
      expect(a.status === "succeeded" && !a.replayed).toBe(true);
      expect(b.status === "succeeded" && !b.replayed).toBe(true);
      expect(await ledger.admin.list({ tenant: `${base}-😀` })).toHaveLength(1);
      expect(await ledger.admin.list({ tenant: `${base}-😁` })).toHaveLength(1);
    });

    it("refuses NUL and unpaired surrogates in actors, reasons, evidence, operation ids, keys and args, with the path", async () => {
      const { ledger, provider, mail, count } = await setup();
      const tenant = uniqueTenant();
      const before = await count();
      await refusedAs(ledger.run(mail, { tenant, key: ["k"], args: { to: "a" }, actor: "agent\u0000" }), "actor");
      await refusedAs(ledger.run(mail, { tenant, key: ["k"], args: { to: "a" }, actor: `agent${HIGH}` }), "actor");
      await refusedAs(ledger.run(mail, { tenant, key: [`cut${HIGH}`], args: { to: "a" } }), "key[0]");
      await refusedAs(ledger.run(mail, { tenant, key: ["k"], args: { to: `a${LOW_ONLY}` } }), "args.to");
      await refusedAs(
        ledger.run(mail, { tenant, key: ["k"], args: { to: "a", [`f${HIGH}`]: 1 } as { to: string } }),
        `args.f${HIGH}`,
      );
      expect(await count()).toBe(before);
      expect(provider.effects).toHaveLength(0);

      // NUL inside key parts and args is JSON-escaped, so it is stored the same on both databases.
      const ok = await ledger.run(mail, { tenant, key: ["k\u0000"], args: { to: "a\u0000b" } });
      expect(ok.status).toBe("succeeded");
      const id = (ok as { operationId: string }).operationId;

      await refusedAs(ledger.get({ tenant, id: `${id}\u0000` }), "operation id");
      await refusedAs(ledger.get({ tenant, id: `${id}${HIGH}` }), "operation id");
      await refusedAs(
        ledger.admin.resolve({ tenant, id, outcome: "succeeded", reason: "r", actor: "ops\u0000" }),
        "actor",
      );
      await refusedAs(ledger.admin.retry({ tenant, id, reason: "found\u0000nothing", actor: "ops" }), "reason");
      await refusedAs(ledger.admin.retry({ tenant, id, reason: `cut ${HIGH}`, actor: "ops" }), "reason");
      await refusedAs(
        ledger.admin.resolve({ tenant, id, outcome: "succeeded", reason: "seen", actor: "ops", evidence: "ch_\u0000" }),
        "evidence",
      );
      await refusedAs(ledger.daemon.settle({ tenant, id, actor: "daemon\u0000" }), "actor");
      // Nothing was half-written: the operation is as the run left it, with its two events.
      const { operation, events } = await ledger.get({ tenant, id });
      expect(operation.status).toBe("succeeded");
      expect(events.map((e) => e.to)).toEqual(["running", "succeeded"]);
    });

    it("refuses an owner name that cannot be stored, before connecting", async () => {
      await refusedAs(db.open({ owner: "worker\u0000" }), "owner");
    });
  });
}
