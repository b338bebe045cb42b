/**
 * The console's decision forms, over real HTTP against the console server on SQLite and Postgres
 * (found in review; each test failed first): a form token is bound to the session whose page
 * carried it, an operation's "It happened" takes the receipt found at the provider (checked as
 * `idem resolve --receipt` checks it), and a bulk form naming a selection the queue did not show
 * (no such operation, another tenant's, no view) is refused whole, nothing decided; a bulk
 * decision sent again (its answer lost, or twice at once) counts the rows it decided already as
 * such, as an operation's page does, rather than refusing them as changed.
 */
import { writeFileSync } from "node:fs";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { defineAction, openLedger, type Ledger } from "@idem/core";
import { DIALECTS, freshDatabase, kill9, scaled, startChild, tempDir } from "@idem/testkit";
import type { ConsoleServer } from "../src/console/server.js";
import { browserOn, serveFor } from "./console-support.js";
import { CLI } from "./support.js";

const TOKENS = { alice: "alice-token-forms-0151", bob: "bob-token-forms-0151" };

/** A receipt schema (Standard Schema, as zod's) that takes any receipt with an sid. */
const sidReceipt = {
  "~standard": {
    version: 1 as const,
    vendor: "test",
    validate: (v: unknown) =>
      typeof (v as { sid?: unknown } | null)?.sid === "string"
        ? { value: v as { sid: string } }
        : { issues: [{ message: "needs an sid" }] },
  },
};

/** No capability, and its send may have happened: a person decides. Its receipt has an sid. */
const parked = defineAction({
  type: "sms.parked",
  capabilities: {},
  receipt: sidReceipt,
  execute: async (): Promise<{ sid: string }> => {
    throw new Error("socket hang up after send");
  },
});

for (const dialect of DIALECTS) {
  describe(`the console's forms on ${dialect}`, { timeout: scaled(120_000) }, () => {
    let url = "";
    let ledger: Ledger;
    let web: ConsoleServer;
    const acme = `acme-${dialect}`;
    const globex = `globex-${dialect}`;
    beforeAll(async () => {
      url = await freshDatabase(dialect);
      // As the daemon's console: the ledger knows the config's actions, so a receipt can be checked.
      ledger = await openLedger(url, { actions: [parked] });
      web = await serveFor(ledger, url, [
        { name: "alice", token: TOKENS.alice, tenants: "*" },
        { name: "bob", token: TOKENS.bob, tenants: [acme] },
      ]);
    }, scaled(60_000));
    afterAll(async () => {
      await web?.close();
      await ledger?.close();
    });

    const { session, get, formTokenOf, postWith, post, noteAfter } = browserOn(() => web.url);
    /** An operation waiting for a person, how its page shows it (`seen`) and as a queue checkbox. */
    const waiting = async (tenant: string, key: string, on = ledger) => {
      const out = await on.run(parked, { tenant, key: [key], args: { to: "+15550100" } });
      const { operation: o } = await on.get({ tenant, id: out.operationId });
      expect(o.status).toBe("needs_review");
      const seen = { status: o.status, attempt: o.attempt, checks: o.checks, updatedAt: o.updatedAt };
      return { id: o.id, seen: JSON.stringify(seen), pick: JSON.stringify({ tenant, id: o.id, seen }) };
    };
    const statusOf = async (tenant: string, id: string) => (await ledger.get({ tenant, id })).operation.status;

    it("an operation's page keeps secrets out of a failure's evidence, as idem show does, the codes shown", async () => {
      // The review of 80f716e: show and ls --json redact a failure's evidence; the operation's page
      // printed it whole (a payment_token among the decline codes).
      const declined = defineAction({
        type: "pay.declined",
        capabilities: {},
        execute: async (): Promise<{ id: string }> => {
          throw new Error("declined");
        },
        classify: () => ({
          kind: "permanent",
          reason: "card declined",
          evidence: { decline_code: "insufficient_funds", payment_token: "tok_do_not_show" },
        }),
      });
      const out = await ledger.run(declined, { tenant: acme, key: ["evidence"], args: { amount: 5 } });
      expect(out.status).toBe("failed");
      const page = await (await get(await session(TOKENS.alice), `/op/${acme}/${out.operationId}`)).text();
      expect(page).toContain("insufficient_funds");
      expect(page).not.toContain("tok_do_not_show");
    });

    it("a form posted with another session's form token is refused, nothing written, even the same operator's", async () => {
      const op = await waiting(acme, "session-bound");
      const first = await session(TOKENS.alice);
      const second = await session(TOKENS.alice);
      const path = `/op/${acme}/${op.id}`;
      const fields: [string, string][] = [
        ["seen", op.seen],
        ["outcome", "retry"],
        ["reason", "not in the provider's log"],
      ];
      // Before: 303, decided; the token was the operator's, the same in every session of theirs.
      const crossed = await postWith(second, await formTokenOf(first, path), `${path}/decide`, fields);
      expect(crossed.status).toBe(403);
      expect(await crossed.text()).toMatch(/this form is out of date or not from the console/);
      expect(await statusOf(acme, op.id)).toBe("needs_review");
      // Another operator's session's token too.
      const bob = await session(TOKENS.bob);
      expect((await postWith(bob, await formTokenOf(first, path), `${path}/decide`, fields)).status).toBe(403);
      expect(await statusOf(acme, op.id)).toBe("needs_review");
      // A session's own token still decides.
      const own = await postWith(second, await formTokenOf(second, path), `${path}/decide`, fields);
      expect(await noteAfter(second, own)).toBe(
        "Marked not done: it will run again with the same key (looked up first where its last run may have done it).",
      );
      expect(await statusOf(acme, op.id)).toBe("pending");
    });

    it("an operation resolved as succeeded takes the receipt found at the provider, checked by the action's receipt schema and the ledger's maxResultBytes", async () => {
      const op = await waiting(acme, "receipt");
      const cookie = await session(TOKENS.alice);
      const path = `/op/${acme}/${op.id}`;
      // Before: the page told the person to give the receipt, and had no field for it.
      const page = await (await get(cookie, path)).text();
      expect(page).toMatch(/<textarea id="one-receipt" name="receipt"/);
      const resolve = (outcome: string, receipt: string) =>
        post(cookie, `${path}/decide`, [
          ["seen", op.seen],
          ["outcome", outcome],
          ["reason", "found in the provider's log"],
          ["receipt", receipt],
        ]);
      const refusals: [string, string, RegExp][] = [
        ["succeeded", "{nope", /Refused: receipt: is not valid JSON at line 1, column 2/],
        ["succeeded", '{"id":"SM1"}', /Refused: receipt: needs an sid/],
        [
          "succeeded",
          JSON.stringify({ sid: "SM1", body: "x".repeat(70_000) }),
          /Refused: receipt: is \d+ bytes, over this ledger(&#39;|')s limit of 65536 \(maxResultBytes\)/,
        ],
        ["failed", '{"sid":"SM1"}', /Refused: a receipt goes with “It happened: resolve as succeeded” only/],
      ];
      for (const [outcome, receipt, said] of refusals) {
        const refused = await resolve(outcome, receipt);
        expect(refused.status, receipt.slice(0, 20)).toBe(409);
        expect(await refused.text()).toMatch(said);
        const { operation, events } = await ledger.get({ tenant: acme, id: op.id });
        expect(operation).toMatchObject({ status: "needs_review", result: null, resolution: null });
        expect(events.at(-1)?.to).toBe("needs_review");
      }
      // Only a receipt the schema takes is stored, and every later caller replays it.
      expect(await noteAfter(cookie, await resolve("succeeded", ' {"sid":"SM1"} '))).toBe("Resolved as succeeded.");
      expect((await ledger.get({ tenant: acme, id: op.id })).operation).toMatchObject({
        status: "succeeded",
        result: { sid: "SM1" },
        resolution: { outcome: "succeeded", actor: "alice" },
      });
      const replay = await ledger.run(parked, { tenant: acme, key: ["receipt"], args: { to: "+15550100" } });
      expect(replay).toMatchObject({ status: "succeeded", receipt: { sid: "SM1" }, replayed: true });
    });

    it("idem console opens its ledger with the config's actions, so a receipt is checked and stored", async () => {
      const file = `${tempDir()}/idem.config.mjs`;
      writeFileSync(
        file,
        `export default {
  ledger: ${JSON.stringify(url)},
  actions: [{
    type: "sms.parked",
    capabilities: {},
    execute: async () => ({ sid: "SM0" }),
    receipt: { "~standard": { version: 1, vendor: "test", validate: (v) => (typeof v?.sid === "string" ? { value: v } : { issues: [{ message: "needs an sid" }] }) } },
  }],
  console: { port: 0, operators: [{ name: "alice", tokenEnv: "IDEM_FORMS_ALICE", tenants: "*" }] },
};
`,
      );
      const op = await waiting(globex, "receipt-cli");
      process.env.IDEM_FORMS_ALICE = TOKENS.alice; // the child's operator, as its config names it
      const child = startChild(CLI, ["--config", file, "console"]);
      try {
        const base = /"url":"([^"]+)"/.exec(await child.waitFor(/serving the console/))![1]!;
        const cookie = await session(TOKENS.alice, base);
        const resolve = (receipt: string) =>
          post(
            cookie,
            `/op/${globex}/${op.id}/decide`,
            [
              ["seen", op.seen],
              ["outcome", "succeeded"],
              ["reason", "found in the provider's log"],
              ["receipt", receipt],
            ],
            base,
          );
        const refused = await resolve('{"id":"SM2"}');
        expect(refused.status).toBe(409);
        expect(await refused.text()).toMatch(/Refused: receipt: needs an sid/);
        expect((await resolve('{"sid":"SM2"}')).status).toBe(303);
        expect((await ledger.get({ tenant: globex, id: op.id })).operation).toMatchObject({
          status: "succeeded",
          result: { sid: "SM2" },
        });
      } finally {
        await kill9(child);
      }
    });

    it("a bulk form naming a selection the queue did not show is refused whole: nothing decided, the forged ones named", async () => {
      const cookie = await session(TOKENS.bob); // acme only
      const decision: [string, string][] = [
        ["outcome", "succeeded"],
        ["reason", "found in the provider's log"],
      ];
      const other = await waiting(globex, "bulk-other-tenant");
      const forgeries: [string, string, string][] = [
        // An id that is no operation.
        [
          "no such operation",
          JSON.stringify({ tenant: acme, id: "op_forged", seen: JSON.parse(other.seen) }),
          "op_forged: not found",
        ],
        // Another tenant's operation, as bob's queue never shows it: "not found", as on its page.
        ["another tenant's", other.pick, `${other.id}: not found`],
        // An operation of bob's tenant without the view a queue row carries.
        ["sent without its view", "", "without the view the queue showed"],
        // Not a queue row's value at all.
        ["not a queue row", "op_123", "not a selection the queue made"],
      ];
      for (const [what, forged, said] of forgeries) {
        const real = await waiting(acme, `bulk-real-${what}`);
        const viewless = await waiting(acme, `bulk-viewless-${what}`);
        const pick = forged === "" ? JSON.stringify({ tenant: acme, id: viewless.id }) : forged;
        const note = await noteAfter(
          cookie,
          await post(cookie, "/bulk", [...decision, ["ops", real.pick], ["ops", pick]]),
        );
        // Before: "1 of 2 selected was decided: Resolved as succeeded. · …", the real one decided.
        expect(note, what).toMatch(/^Nothing was decided: 1 of 2 selected /);
        expect(note, what).toContain(said);
        expect(await statusOf(acme, real.id), what).toBe("needs_review");
        expect(await statusOf(acme, viewless.id), what).toBe("needs_review");
      }
      expect(await statusOf(globex, other.id)).toBe("needs_review");
    });

    it("a bulk decision sent again after its answer was lost says which rows it had decided already, and decides each once", async () => {
      const cookie = await session(TOKENS.alice);
      const failed: [string, string][] = [
        ["outcome", "failed"],
        ["reason", "not in the SMS provider's log"],
      ];
      const already = (n: number, of: number) =>
        `Already decided: ${n} of ${of} selected: your decision on ${n === 1 ? "it" : "them"} as shown (“It did not happen and must not be tried again: resolve as failed”) was recorded; sent again, it decided nothing.`;
      const failedBy = async (id: string) =>
        (await ledger.get({ tenant: acme, id })).events.filter((e) => e.to === "failed").map((e) => e.actor);

      // The whole decision sent again (a reload of the answer that never came, a double submit).
      const a = await waiting(acme, "bulk-again-a");
      const b = await waiting(acme, "bulk-again-b");
      const both = [...failed, ["ops", a.pick] as [string, string], ["ops", b.pick] as [string, string]];
      expect(await noteAfter(cookie, await post(cookie, "/bulk", both))).toBe(
        "2 of 2 selected were decided: Resolved as failed.",
      );
      // Before: "Nothing was decided: 2 of 2 selected do not take … as shown · …: it changed since
      // the queue showed it: … · Reload the queue and decide again.", the person's own decision untold.
      expect(await noteAfter(cookie, await post(cookie, "/bulk", both))).toBe(already(2, 2));
      expect(await failedBy(a.id)).toEqual(["alice"]);
      expect(await failedBy(b.id)).toEqual(["alice"]);

      // Sent twice at once (a double submit): each row is decided by one of them, and the other
      // says so, whichever checked or wrote first.
      const g = await waiting(acme, "bulk-again-g");
      const h = await waiting(acme, "bulk-again-h");
      const twice = [...failed, ["ops", g.pick] as [string, string], ["ops", h.pick] as [string, string]];
      const notes = await Promise.all([1, 2].map(async () => noteAfter(cookie, await post(cookie, "/bulk", twice))));
      const decidedBy = (note: string | undefined) =>
        note === "2 of 2 selected were decided: Resolved as failed."
          ? 2
          : note === `1 of 2 selected was decided: Resolved as failed. · ${already(1, 2)}`
            ? 1
            : note === already(2, 2)
              ? 0
              : Number.NaN;
      expect(decidedBy(notes[0]) + decidedBy(notes[1]), notes.join("\n")).toBe(2);
      expect(await failedBy(g.id)).toEqual(["alice"]);
      expect(await failedBy(h.id)).toEqual(["alice"]);

      // An earlier send that decided part of the selection (cut after its first row): the rest is decided now.
      const c = await waiting(acme, "bulk-again-c");
      const d = await waiting(acme, "bulk-again-d");
      await post(cookie, "/bulk", [...failed, ["ops", c.pick]]);
      expect(await noteAfter(cookie, await post(cookie, "/bulk", [...failed, ["ops", c.pick], ["ops", d.pick]]))).toBe(
        `1 of 2 selected was decided: Resolved as failed. · ${already(1, 2)}`,
      );
      expect(await failedBy(c.id)).toEqual(["alice"]);
      expect(await failedBy(d.id)).toEqual(["alice"]);

      // Another's decision is no decision of this person's: a row changed by bob still refuses the
      // whole, and the row decided already by this person's earlier send is said so, not "changed".
      const e = await waiting(acme, "bulk-again-e");
      const f = await waiting(acme, "bulk-again-f");
      await post(cookie, "/bulk", [...failed, ["ops", e.pick]]);
      const bob = await session(TOKENS.bob);
      expect(await noteAfter(bob, await post(bob, "/bulk", [...failed, ["ops", f.pick]]))).toBe(
        "1 of 1 selected was decided: Resolved as failed.",
      );
      const note = await noteAfter(cookie, await post(cookie, "/bulk", [...failed, ["ops", e.pick], ["ops", f.pick]]));
      expect(note).toMatch(
        new RegExp(
          `^Nothing was decided: 1 of 2 selected changed since the queue showed it · ${f.id}: it changed since the queue showed it: `,
        ),
      );
      expect(note).toContain(` · ${already(1, 2)} · Reload the queue and decide again.`);
      expect(note).not.toContain(`${e.id}:`);
      expect(await failedBy(e.id)).toEqual(["alice"]);
      expect(await failedBy(f.id)).toEqual(["bob"]);
    });
  });
}
