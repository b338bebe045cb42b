/**
 * `run` answers a retry of a settled operation at once, with no promise made on the way but the
 * one it returns (issue 16). What that must not change: a caller's bad input is still a rejected
 * promise, never a throw out of `run`; args a schema parses (at once or later) are replayed alike;
 * the keys a ledger remembers having seen, kept by key alone, never answer one tenant from
 * another's row; the hashes it remembers (of key identities and args) never let other args, another
 * action or another tenant through; and each replay is a receipt of its own, read from the row.
 */
import { describe, expect, it } from "vitest";
import { z } from "zod";
import {
  ArgsMismatchError,
  defineAction,
  GuardrailError,
  InvalidValueError,
  LedgerConfigError,
  operationKey,
  PayloadTooLargeError,
} from "@idem/core";
import { DIALECTS } from "@idem/testkit";
import { ledgers, uniqueTenant } from "./support/ledgers.js";
import { TestProvider } from "./support/provider.js";

/** An action counting its effects, its args checked by `input`. */
function checked(type: string, input: z.ZodType<{ to: string }>) {
  const effects: unknown[] = [];
  const action = defineAction({
    type,
    capabilities: {},
    input,
    validate: (a) => {
      if (a.to === "refused@example.com") throw new Error("this address is refused");
    },
    execute: async (a) => {
      effects.push(a);
      return { n: effects.length };
    },
  });
  return { action, effects };
}

const lowercased = z.object({ to: z.string().email().toLowerCase() });
const lowercasedLater = z.object({
  to: z
    .string()
    .email()
    .toLowerCase()
    .refine(async () => true),
});

for (const dialect of DIALECTS) {
  describe(`run's answer at once on ${dialect}`, () => {
    const db = ledgers(dialect);

    it("answers a caller's bad input as a rejected promise, never a throw, on a fresh key and on a settled one", async () => {
      const ledger = await db.open({ allowedActions: { "*": ["mail", "mail.later"] }, maxArgsBytes: 200 });
      const tenant = uniqueTenant();
      const now = checked("mail", lowercased);
      const later = checked("mail.later", lowercasedLater);
      const other = new TestProvider().action("charge", {});
      // Settled first: a retry of these would be answered at once.
      for (const { action } of [now, later]) {
        expect(await ledger.run(action, { tenant, key: ["done"], args: { to: "a@example.com" } })).toMatchObject({
          status: "succeeded",
        });
      }
      const cases: [string, () => Promise<unknown>, new (...a: any[]) => Error][] = [];
      for (const { action } of [now, later]) {
        for (const key of ["fresh", "done"]) {
          const t = `${action.type}, ${key}`;
          cases.push(
            [
              `${t}: no tenant`,
              () => ledger.run(action, { tenant: "", key: [key], args: { to: "a@example.com" } }),
              InvalidValueError,
            ],
            [
              `${t}: schema`,
              () => ledger.run(action, { tenant, key: [key], args: { to: "not an address" } }),
              InvalidValueError,
            ],
            [
              `${t}: validate`,
              () => ledger.run(action, { tenant, key: [key], args: { to: "refused@example.com" } }),
              InvalidValueError,
            ],
            [
              `${t}: size`,
              () => ledger.run(action, { tenant, key: [key], args: { to: `${"a".repeat(300)}@example.com` } }),
              PayloadTooLargeError,
            ],
            [
              `${t}: key`,
              () => ledger.run(action, { tenant, key: [], args: { to: "a@example.com" } }),
              InvalidValueError,
            ],
          );
        }
      }
      cases.push([
        "not allowed",
        () => ledger.run(other, { tenant, key: ["done"], args: { to: "x" } }),
        GuardrailError,
      ]);
      for (const [name, call, type] of cases) {
        let answer: Promise<unknown> | undefined;
        expect(() => {
          answer = call();
        }, name).not.toThrow();
        await expect(answer, name).rejects.toBeInstanceOf(type);
      }
      await ledger.close();
      let closed: Promise<unknown> | undefined;
      expect(() => {
        closed = ledger.run(now.action, { tenant, key: ["done"], args: { to: "a@example.com" } });
      }).not.toThrow();
      await expect(closed).rejects.toBeInstanceOf(LedgerConfigError);
      expect(now.effects).toHaveLength(1);
      expect(later.effects).toHaveLength(1);
    });

    it("replays args a schema parsed, whether it answered at once or later", async () => {
      const ledger = await db.open();
      const tenant = uniqueTenant();
      for (const { action, effects } of [checked("mail", lowercased), checked("mail.later", lowercasedLater)]) {
        const first = await ledger.run(action, { tenant, key: ["k"], args: { to: "A@Example.com" } });
        expect(first, action.type).toMatchObject({ status: "succeeded", replayed: false, receipt: { n: 1 } });
        // The same args once parsed: the stored hash is of the schema's output.
        for (const to of ["a@example.com", "A@EXAMPLE.COM"]) {
          expect(await ledger.run(action, { tenant, key: ["k"], args: { to } }), action.type).toMatchObject({
            status: "succeeded",
            replayed: true,
            receipt: { n: 1 },
            operationId: first.operationId,
          });
        }
        expect(effects, action.type).toHaveLength(1);
      }
    });

    it("a hand-made key run in two tenants is two operations, each retry answered from its own", async () => {
      const ledger = await db.open();
      const p = new TestProvider();
      const send = p.action("mail.send", {});
      const [a, b] = [uniqueTenant(), uniqueTenant()];
      const key = { hash: "f".repeat(64), label: "made by hand" }; // no tenant in it: usable in both
      const inA = await ledger.run(send, { tenant: a, key, args: { to: "a@example.com" } });
      // Seen in tenant a: in tenant b this key is read first, finds nothing there, and is claimed.
      const inB = await ledger.run(send, { tenant: b, key, args: { to: "b@example.com" } });
      expect(inA).toMatchObject({ status: "succeeded", replayed: false });
      expect(inB).toMatchObject({ status: "succeeded", replayed: false });
      expect(inB.operationId).not.toBe(inA.operationId);
      for (const [tenant, first, to] of [
        [b, inB, "b@example.com"],
        [a, inA, "a@example.com"],
        [b, inB, "b@example.com"],
      ] as const) {
        expect(await ledger.run(send, { tenant, key, args: { to } })).toMatchObject({
          status: "succeeded",
          replayed: true,
          operationId: first.operationId,
          receipt: (first as { receipt: unknown }).receipt,
        });
      }
      expect(p.effects).toHaveLength(2);
    });

    it("remembered hashes answer each action, tenant and args of the same key parts with their own operation, and other args fail closed", async () => {
      const ledger = await db.open();
      const p = new TestProvider();
      const [mail, sms] = [p.action("mail.send", {}), p.action("sms.send", {})];
      const [a, b] = [uniqueTenant(), uniqueTenant()];
      const first = new Map<string, string>();
      // The same parts and args under two actions and two tenants: four operations.
      for (let round = 0; round < 3; round++) {
        for (const [action, tenant] of [
          [mail, a],
          [sms, a],
          [mail, b],
          [sms, b],
        ] as const) {
          const out = await ledger.run(action, { tenant, key: ["same", 1], args: { to: "x@example.com" } });
          const name = `${action.type} in ${tenant === a ? "a" : "b"}`;
          expect(out, name).toMatchObject({ status: "succeeded", replayed: round > 0 });
          if (round === 0) first.set(name, out.operationId);
          else expect(out.operationId, name).toBe(first.get(name));
        }
      }
      expect(p.effects).toHaveLength(4);
      expect(new Set(first.values()).size).toBe(4);
      // The hash the ledger remembered is operationKey's.
      const made = operationKey({ tenant: b, action: sms.type, parts: ["same", 1] });
      expect(await ledger.run(sms, { tenant: b, key: made, args: { to: "x@example.com" } })).toMatchObject({
        replayed: true,
        operationId: first.get("sms.send in b"),
      });
      // Replayed (its args' hash looked up) more than once: other args under the key still fail closed,
      // with and without the args stored and the label kept, and the stored args still replay.
      for (const options of [{}, { storeArgs: false }, { keepKeyLabel: false }]) {
        await expect(
          ledger.run(mail, { tenant: a, key: ["same", 1], args: { to: "y@example.com" }, ...options }),
        ).rejects.toBeInstanceOf(ArgsMismatchError);
        expect(
          await ledger.run(mail, { tenant: a, key: ["same", 1], args: { to: "x@example.com" }, ...options }),
        ).toMatchObject({ status: "succeeded", replayed: true, operationId: first.get("mail.send in a") });
      }
      expect(p.effects).toHaveLength(4);
    });

    it("a replayed receipt is the caller's own: changing it changes no later replay", async () => {
      const ledger = await db.open();
      const tenant = uniqueTenant();
      const action = defineAction({
        type: "invoice.create",
        capabilities: {},
        execute: async () => ({ id: "inv_1", lines: [{ amount: 100 }] }),
      });
      const input = { tenant, key: ["inv"], args: {} };
      const fresh = await ledger.run(action, input);
      const replays = [await ledger.run(action, input), await ledger.run(action, input)];
      for (const out of [fresh, ...replays]) {
        if (out.status !== "succeeded" || !out.receipt) throw new Error(`not a receipt: ${JSON.stringify(out)}`);
        out.receipt.id = "changed";
        out.receipt.lines[0]!.amount = -1;
        (out as { operationId: string }).operationId = "changed";
      }
      expect(replays[0]).not.toBe(replays[1]);
      expect(await ledger.run(action, input)).toEqual({
        status: "succeeded",
        receipt: { id: "inv_1", lines: [{ amount: 100 }] },
        replayed: true,
        operationId: expect.stringMatching(/^op_/),
        attempt: 1,
      });
    });
  });
}
