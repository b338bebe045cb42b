/**
 * `guard` without a framework: what the model reads in the cases the framework tests do not
 * reach: a summary that fails after the effect, a key that cannot be made, input its schema
 * refuses, a ledger that is gone, a receipt not stored or not yet recorded, a person's verdict.
 * Effects are counted in the action.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { tool as langchainTool } from "@langchain/core/tools";
import { z } from "zod";
import { defineAction, openLedger, sensitive, type LedgerOptions } from "@idem/core";
import { DIALECTS, ledgersFor, scaled, startPgServer, type PgServer } from "@idem/testkit";
import { openTestLedger } from "@idem/core/testing";
import { guard, statusTool, type Outcome } from "@idem/agents";
// The core's test dialect with hooks around each statement (to act right after a read).
import { dialectFor, hooked } from "../../core/test/support/dialects.js";

const sent: string[] = [];
const note = {
  name: "send_note",
  description: "Send a note, once per note id.",
  action: defineAction<{ text: string }, { id: string }>({
    type: "test.note",
    capabilities: {},
    async execute(args) {
      sent.push(args.text);
      return { id: `n${sent.length}` };
    },
  }),
  input: z.object({ noteId: z.string().min(1), text: z.string() }),
  args: (i: { text: string }) => ({ text: i.text }),
  key: (i: { noteId: string }) => ["note", i.noteId],
};
const call = { context: { tenantId: "acme" }, callId: "call_1" };

for (const dialect of DIALECTS) {
  describe(`guard on ${dialect}`, () => {
    const db = ledgersFor(dialect, openLedger, { defaults: { poolSize: 2 } as LedgerOptions });

    it("called directly with an action whose schema normalises the input: the key is made of the checked input, once per identity", async () => {
      // Before: the key was made of the raw input, so " Bob@x.com " and "bob@x.com" were two
      // identities with the same args: two welcome emails.
      const ledger = await db.open();
      const welcomed: string[] = [];
      const welcome = defineAction<{ to: string }, { ok: true }, { to: string }>({
        type: "test.welcome",
        capabilities: {},
        input: z.object({ to: z.string().trim().toLowerCase().email() }),
        execute: async (a) => {
          welcomed.push(a.to);
          return { ok: true };
        },
      });
      const tool = guard(ledger, welcome, { tenant: `w-${dialect}`, key: (i) => ["welcome", i.to] });
      const first = await tool({ to: "Bob@x.com" }, call);
      const again = await tool({ to: " bob@x.com " }, call);
      expect([first.status, again.status]).toEqual(["done", "already_done"]);
      expect(welcomed).toEqual(["bob@x.com"]);
      // A definition that reuses the action's own (transforming) schema as the tool's: applied once too.
      const reminded: string[] = [];
      const remind = defineAction<{ at: string }, { ok: true }, { at: string }>({
        type: "test.remind",
        capabilities: {},
        input: z.object({ at: z.string().transform((d) => `${d}T09:00:00Z`) }),
        execute: async (a) => {
          reminded.push(a.at);
          return { ok: true };
        },
      });
      const reused = guard(
        ledger,
        { name: "remind", description: "Remind.", action: remind, input: remind.input!, key: (i) => ["r", i.at] },
        { tenant: `w-${dialect}` },
      );
      expect(await reused({ at: "2026-12-24" }, call)).toMatchObject({ status: "done" });
      expect(reminded).toEqual(["2026-12-24T09:00:00Z"]);
    });

    it("a definition without its own input that maps the action's checked input to args: the action's schema is applied once", async () => {
      // The model fills in the action's schema, guard applies it, and `args` maps its output to the
      // action's args. Before: the ledger applied the schema again to those args, so 12.50 euros
      // went out as 125,000 cents (and the field `args` added was dropped by the schema).
      const ledger = await db.open();
      const charged: unknown[] = [];
      const charge = defineAction<{ invoice: string; euros: number; via?: string }, { ok: true }>({
        type: "test.charge-mapped",
        capabilities: {},
        input: z.object({ invoice: z.string(), euros: z.number().transform((e) => Math.round(e * 100)) }),
        execute: async (a) => {
          charged.push(a);
          return { ok: true };
        },
      });
      const tool = guard(
        ledger,
        {
          name: "charge",
          description: "Charge an invoice in euros.",
          action: charge,
          args: (i: { invoice: string; euros: number }) => ({ ...i, via: "agent" }),
          key: (i: { invoice: string }) => ["charge", i.invoice],
        },
        { tenant: `mapped-${dialect}` },
      );
      expect(await tool({ invoice: "inv-m", euros: 12.5 }, call)).toMatchObject({ status: "done" });
      expect(charged).toEqual([{ invoice: "inv-m", euros: 1250, via: "agent" }]);
    });

    it("inputParsed, from a framework that applied the schema itself (LangChain's tool): not applied again, not checked, the key made of the input given", async () => {
      // An application's own LangChain tool around guard: LangChain applies the zod schema and
      // hands the tool its output. Pins `ToolCall.inputParsed` as documented (untested before, so
      // no failing run first): applied again, the cents would be refused as euros.
      const ledger = await db.open();
      const tenant = `parsed-${dialect}`;
      const executed: unknown[] = [];
      const pay = defineAction<{ invoice: string; cents: number }, { ok: true }>({
        type: "test.pay-parsed",
        capabilities: {},
        execute: async (a) => {
          executed.push(a);
          return { ok: true };
        },
      });
      const input = z.object({
        invoice: z.string().regex(/^\S+$/, "must be an invoice id, without spaces"),
        euros: z.string().transform((e) => Math.round(Number(e) * 100)),
      });
      const guarded = guard(
        ledger,
        {
          name: "pay",
          description: "Pay an invoice.",
          action: pay,
          input,
          args: (i: z.output<typeof input>) => ({ invoice: i.invoice, cents: i.euros }),
          key: (i: z.output<typeof input>) => ["pay", i.invoice, i.euros],
        },
        { tenant },
      );
      const outcomes: Outcome[] = [];
      const lc = langchainTool(
        async (parsed: z.output<typeof input>, config) => {
          const o = await guarded(parsed, { context: {}, callId: config.toolCall?.id, inputParsed: true });
          outcomes.push(o);
          return o.message;
        },
        { name: "pay", description: "Pay an invoice.", schema: input },
      );
      for (const id of ["call_1", "call_2"])
        await lc.invoke({ name: "pay", args: { invoice: "inv-1", euros: "12.50" }, id, type: "tool_call" });
      expect(outcomes.map((o) => o.status)).toEqual(["done", "already_done"]);
      expect(executed).toEqual([{ invoice: "inv-1", cents: 1250 }]);
      const [op] = await ledger.admin.list({ tenant });
      expect(op!.keyLabel).toBe('["pay","inv-1",1250]');
      // Nothing checks it: input the schema refuses runs as given, keyed as given.
      const unchecked = await guarded({ invoice: "inv of May", euros: 700 }, { ...call, inputParsed: true });
      expect(unchecked.status).toBe("done");
      expect(executed).toEqual([
        { invoice: "inv-1", cents: 1250 },
        { invoice: "inv of May", cents: 700 },
      ]);
      // Without it, the same output is the model's input to check: refused, nothing run.
      const checked = await guarded({ invoice: "inv-2", euros: 700 }, call);
      expect(checked.status).toBe("refused");
      expect(executed).toHaveLength(2);
    });

    it("a replay reads 'by this same tool call' only when the audit trail says the call with this id did the work", async () => {
      // Before: every replay read "Already done earlier; not repeated", so a call run again (a
      // LangGraph resume) read as if another had done its work. A call with another id, one
      // without an id, and an actor the application named (not a call id) still read that.
      const ledger = await db.open();
      const tenant = `same-call-${dialect}`;
      const tool = guard(ledger, note, { tenant });
      const named = guard(ledger, note, { tenant, actor: "billing-agent" });
      const input = { noteId: `n-${dialect}`, text: "hello" };
      const first = await tool(input, { context: {}, callId: "call_A" });
      expect(first.status).toBe("done");
      const op = `operation ${"operationId" in first ? first.operationId : ""}`;
      const plain = `Already done earlier; not repeated (${op}).`;
      const messages = [
        (await tool(input, { context: {}, callId: "call_A" })).message,
        (await tool(input, { context: {}, callId: "call_B" })).message,
        (await tool(input, { context: {} })).message,
        (await named(input, { context: {}, callId: "call_A" })).message,
      ];
      expect(messages).toEqual([
        `Already done earlier by this same tool call (call_A), before it was run again; not repeated (${op}).`,
        plain,
        plain,
        plain,
      ]);
      expect(await ledger.admin.list({ tenant })).toHaveLength(1);
    });

    it("a summary that throws after the effect: the model still reads done, without the summary", async () => {
      const ledger = await db.open();
      const tool = guard(ledger, note, {
        tenant: (c) => (c.context as { tenantId: string }).tenantId,
        summarize: () => {
          throw new Error("bad summary");
        },
      });
      const before = sent.length;
      const out = await tool({ noteId: `s-${dialect}`, text: "hi" }, call);
      expect(out).toMatchObject({ status: "done" });
      expect(out).not.toHaveProperty("result");
      expect(sent.length - before).toBe(1);
      // An application's rewording that throws: the outcome as it is, not an exception.
      const reworded = guard(ledger, note, {
        tenant: "acme",
        describe: () => {
          throw new Error("bad rewording");
        },
      });
      expect(await reworded({ noteId: `s-${dialect}`, text: "hi" }, call)).toMatchObject({ status: "already_done" });
      // An async one (it reads a database, a translation): its words are taken, and one that
      // rejects leaves the outcome as it is.
      const later = { ...call, callId: "call_2" }; // another call (the first one's reads "by this same tool call")
      const translated = guard(ledger, note, {
        tenant: "acme",
        describe: async (o) => ({ ...o, message: `${o.message} (translated)` }),
      });
      expect(await translated({ noteId: `s-${dialect}`, text: "hi" }, later)).toMatchObject({
        status: "already_done",
        message: expect.stringMatching(/^Already done earlier; not repeated \(operation op_\w+\)\. \(translated\)$/),
      });
      const unread = guard(ledger, note, {
        tenant: "acme",
        describe: async () => {
          throw new Error("translation service down");
        },
      });
      expect(await unread({ noteId: `s-${dialect}`, text: "hi" }, later)).toMatchObject({
        status: "already_done",
        message: expect.stringMatching(/^Already done earlier; not repeated \(operation op_\w+\)\.$/),
      });
      expect(sent.length - before).toBe(1);
    });

    it("a rewording that changes what happened (the status, the operation, the state) is not taken: the model reads the outcome as it was", async () => {
      const ledger = await db.open();
      const lost = {
        ...note,
        action: defineAction<{ text: string }, { id: string }>({
          type: "test.describe-lost",
          capabilities: {},
          async execute() {
            throw Object.assign(new Error("socket hang up"), { code: "ECONNRESET" });
          },
        }),
      };
      const rewordings: [string, (o: Outcome) => Outcome][] = [
        ["status", () => ({ status: "done", message: "Done.", operationId: "op_1" }) as Outcome],
        ["operation", (o) => ({ ...o, operationId: "op_other" }) as Outcome],
        ["state", (o) => ({ ...o, state: "pending" }) as Outcome],
      ];
      for (const [what, describe] of rewordings) {
        const out = await guard(ledger, lost, { tenant: "acme", describe })(
          { noteId: `d-${what}-${dialect}`, text: "x" },
          call,
        );
        // Before: "done" (or another operation, another state): a lost answer read as done.
        expect(out, what).toMatchObject({ status: "pending_verification", state: "needs_review" });
        expect(out.message, what).toMatch(/^Pending verification/);
        expect((out as { operationId: string }).operationId, what).toMatch(/^op_/);
        expect((out as { operationId: string }).operationId, what).not.toBe("op_other");
      }
      // Its own words for the same outcome are taken.
      const worded = await guard(ledger, lost, {
        tenant: "acme",
        describe: (o) => ({ ...o, message: `${o.message} (ask the payments team)` }),
      })({ noteId: `d-words-${dialect}`, text: "x" }, call);
      expect(worded.message).toMatch(/\(ask the payments team\)$/);
    });

    it("input the schema refuses, a key that cannot be made, a closed ledger, a call given up: refused or not confirmed, nothing sent", async () => {
      const ledger = await db.open();
      const before = sent.length;
      const tool = guard(ledger, note, { tenant: "acme" });
      // Before: "Refused: invalid input: noteId: …." and no word of what was done.
      expect(await tool({ noteId: "", text: "x" }, call)).toMatchObject({
        status: "refused",
        message: expect.stringMatching(/^Refused: invalid input: noteId: .+\. Nothing was done; fix the input/),
      });
      const badKey = guard(ledger, note, { tenant: "acme", key: () => [new Date()] });
      // The tool's key, not the input: not set up right, and what an earlier call did is not read (before-ledger.test.ts).
      expect(await badKey({ noteId: "d", text: "x" }, call)).toMatchObject({
        status: "unconfirmed",
        message: expect.stringMatching(/^Not confirmed: the tool is not set up right \(key\[0\]: /),
      });
      await ledger.close();
      const closed = await tool({ noteId: "c", text: "x" }, call);
      // Not read, the ledger cannot say whether an earlier call did this work (existing-rows.test.ts).
      expect(closed.status).toBe("unconfirmed");
      expect(closed.message).toMatch(/^Not confirmed: the tool is not available right now/);
      expect(closed.message).not.toMatch(/may or may not|closed/); // the developer's error text stays out
      // Given up before the ledger had it: this call sent nothing, but it did not read whether an
      // earlier call did the work either (existing-rows.test.ts).
      const stopped = new AbortController();
      stopped.abort();
      const early = await guard(await db.open(), note, { tenant: "acme" })(
        { noteId: "e", text: "x" },
        { ...call, signal: stopped.signal },
      );
      expect(early.status).toBe("unconfirmed");
      expect(early.message).toMatch(/^Not confirmed: the call was stopped before .+; this call sent nothing\./);
      expect(sent.length).toBe(before);
    });

    it("a key part the tool's own key function gives that no key can be made of: not set up right, the tool's fault, not the model's input", async () => {
      // Before: "Refused: invalid input: key[1]: … fix the input before calling again.": the model
      // was told to change input it had sent right, for a part the developer's code made.
      const ledger = await db.open();
      const before = sent.length;
      const badParts: Record<string, () => unknown[]> = {
        date: () => ["note", new Date(0)],
        nan: () => ["note", Number.NaN],
        none: () => [],
        missing: () => ["note", undefined],
        sensitive: () => ["note", sensitive(new Date(0))], // refused inside the key function
      };
      for (const [name, parts] of Object.entries(badParts)) {
        const out = await guard(ledger, note, { tenant: "acme", key: parts })({ noteId: `k-${name}`, text: "x" }, call);
        // Not "not performed": an earlier call may have done this work (before-ledger.test.ts).
        expect(out, name).toMatchObject({
          status: "unconfirmed",
          message: expect.stringMatching(
            /^Not confirmed: the tool is not set up right \(key(\[\d\])?: .+\), so whether this work was already done \(by an earlier call\) could not be read; this call did nothing\. Tell the user the tool is not set up right, not whether the work was done; do not change the input for it\. /,
          ),
        });
      }
      // What the model sent that no key can hold (a string cut inside a character) is its to fix, named as it sent it.
      const cut = await guard(ledger, note, { tenant: "acme" })({ noteId: "k-\ud83d", text: "x" }, call);
      expect(cut).toMatchObject({
        status: "refused",
        message: expect.stringMatching(/^Refused: invalid input: noteId: is not well-formed Unicode/),
      });
      expect(sent.length).toBe(before);
    });

    it("a receipt too large to keep: pending verification with the operation, not 'refused, the input is too large'", async () => {
      const ledger = await db.open({ maxResultBytes: 100 });
      let performed = 0;
      const bloated = {
        ...note,
        action: defineAction<{ text: string }, { id: string; blob: string }>({
          type: "test.bloated",
          capabilities: {},
          async execute() {
            performed += 1;
            return { id: "n1", blob: "y".repeat(500) };
          },
        }),
      };
      const out = await guard(ledger, bloated, { tenant: "acme" })({ noteId: `big-${dialect}`, text: "x" }, call);
      expect(out).toMatchObject({
        status: "pending_verification",
        state: "needs_review",
        operationId: expect.any(String),
      });
      expect(out.message).toMatch(/it was performed, but its result could not be recorded; a person will record it/);
      // Every later read says so too (the ledger marks it performed: a person records it, nothing
      // is left to decide). Before: a second call and the status tool read "a person will decide
      // whether it happened".
      const id = (out as { operationId: string }).operationId;
      expect(await ledger.status({ tenant: "acme", id })).toMatchObject({ state: "needs_review", performed: true });
      const again = await guard(ledger, bloated, { tenant: "acme" })({ noteId: `big-${dialect}`, text: "x" }, call);
      const checked = await statusTool(ledger, { tenant: "acme" })({ operationId: id }, call);
      for (const read of [again, checked]) {
        expect(read, JSON.stringify(read)).toMatchObject({ status: "pending_verification", operationId: id });
        expect(read.message).toMatch(/it was performed, but its result could not be recorded; a person will record it/);
        expect(read.message).not.toMatch(/whether it happened/);
      }
      expect(performed).toBe(1);
    });

    it("the status tool under a tenant the ledger refuses (the application's setup) says so, never 'check again later'", async () => {
      const ledger = await db.open();
      const out = await guard(ledger, note, { tenant: "acme" })({ noteId: `setup-${dialect}`, text: "x" }, call);
      const id = (out as { operationId: string }).operationId;
      // A tenant read from the run context, with the newline a secret file ends with.
      const checked = await statusTool(ledger, { tenant: () => "acme\n" })({ operationId: id }, call);
      // Before: "unconfirmed ... Check again later with this tool", which can never succeed.
      expect(checked, JSON.stringify(checked)).toMatchObject({ status: "unconfirmed" });
      expect(checked.message).toMatch(/the status tool is not set up right \(tenant: /);
      expect(checked.message).toMatch(/Tell the user/);
      expect(checked.message).not.toMatch(/check again later/i);
      expect(checked.message).toMatch(/do not repeat the original action/);
    });

    it("other arguments for work performed whose receipt could not be kept: not 'a person will decide whether it happened'", async () => {
      const ledger = await db.open({ maxResultBytes: 100 });
      let performed = 0;
      const bloated = {
        ...note,
        action: defineAction<{ text: string }, { id: string; blob: string }>({
          type: "test.bloated.args",
          capabilities: {},
          async execute() {
            performed += 1;
            return { id: "n1", blob: "y".repeat(500) };
          },
        }),
      };
      const tool = guard(ledger, bloated, { tenant: "acme" });
      expect(await tool({ noteId: `big-args-${dialect}`, text: "x" }, call)).toMatchObject({
        status: "pending_verification",
      });
      const other = await tool({ noteId: `big-args-${dialect}`, text: "y" }, call);
      // Before: "was already attempted with different arguments, and a person will decide whether it happened".
      expect(other, JSON.stringify(other)).toMatchObject({ status: "refused", operationId: expect.any(String) });
      expect(other.message).toMatch(
        /was already performed with different arguments \(its result could not be recorded; a person will record it\)/,
      );
      expect(other.message).not.toMatch(/whether it happened/);
      expect(performed).toBe(1);
    });

    it("done, its recording delayed: the status tool reads it being performed or recorded, not another attempt", async () => {
      // The completion's write fails, so the row stays running under this call's lease until
      // reconciliation. Before: the status tool read "another attempt of it is in progress", a
      // second effect under way to a model told "Done … Do not repeat it".
      const tenant = `cnr-${dialect}`;
      const l = await openTestLedger(
        hooked(await dialectFor(dialect, db.url()), {
          async query(q, run) {
            const completion = q.sql.startsWith('update "idem_operations"') && q.parameters.includes("succeeded");
            if (completion && q.parameters.includes(tenant)) throw new Error("connection reset (test)");
            return run();
          },
        }),
        { leaseMs: 300 },
      );
      try {
        const before = sent.length;
        const done = await guard(l, note, { tenant })({ noteId: "cnr", text: "hi" }, call);
        expect(done.message).toMatch(/^Done \(operation op_\w+\); recording it is delayed\. Do not repeat it\.$/);
        const checked = await statusTool(l, { tenant })(
          { operationId: (done as { operationId: string }).operationId },
          call,
        );
        expect(checked, JSON.stringify(checked)).toMatchObject({ status: "pending_verification", state: "running" });
        // Its 300 ms lease may have ended by the database's clock when the status is read: then no
        // worker holds it (stalled), and the tool says so; either way one attempt, never another.
        expect(checked.message).toMatch(
          /: (it is being performed, or its outcome is being recorded|the worker that ran it stopped before recording its outcome, so its outcome will be checked with the provider; it is done once at most)\. Do not retry it/,
        );
        expect(checked.message).not.toMatch(/another attempt/);
        expect(sent.length - before).toBe(1);
      } finally {
        await l.close();
      }
    });

    it("a person's verdict: 'failed' reads that a person decided, without their note; 'succeeded' without a receipt, as they confirmed", async () => {
      // The reason an operator types into `idem resolve` or the console is for the audit trail and
      // may name the customer. Before: the model read "Failed because resolved by a person: <note>",
      // and the status tool read a receipt-less "succeeded" as a plain "Done".
      const ledger = await db.open();
      const tenant = `person-${dialect}`;
      const lost = {
        ...note,
        // No dedupe and no lookup: a lost answer goes to a person.
        action: defineAction<{ text: string }, { id: string }>({
          type: "test.lost",
          capabilities: {},
          async execute() {
            throw Object.assign(new Error("socket hang up"), { code: "ECONNRESET" });
          },
        }),
      };
      const tool = guard(ledger, lost, { tenant });
      const status = statusTool(ledger, { tenant });
      const parked = async (noteId: string) => {
        const out = await tool({ noteId, text: "x" }, call);
        expect(out).toMatchObject({ status: "pending_verification", state: "needs_review" });
        return (out as { operationId: string }).operationId;
      };
      const personal = "called Jane Doe (jane.doe@customer.example, +1 555 0100): card 4000 0000 0000 0002 was blocked";
      const failedId = await parked("p-failed");
      await ledger.admin.resolve({ tenant, id: failedId, outcome: "failed", actor: "ops@corp", reason: personal });
      const again = await tool({ noteId: "p-failed", text: "x" }, call);
      const checked = await status({ operationId: failedId }, call);
      for (const read of [again, checked]) {
        expect(read, JSON.stringify(read)).toMatchObject({
          status: "failed",
          reason: "a person checked it and decided it did not happen",
        });
        expect(read.message).toMatch(/^Failed because a person checked it and decided it did not happen \(operation/);
        expect(JSON.stringify(read)).not.toMatch(/jane|4000 0000|555 0100/i);
      }
      // The note is still the operator's, in the ledger.
      expect((await ledger.get({ tenant, id: failedId })).operation.resolution).toMatchObject({ reason: personal });

      const foundId = await parked("p-found");
      await ledger.admin.resolve({
        tenant,
        id: foundId,
        outcome: "succeeded",
        actor: "ops@corp",
        reason: "in the CRM",
      });
      expect(await status({ operationId: foundId }, call)).toMatchObject({
        status: "done",
        message: `Done, as a person confirmed (operation ${foundId}).`,
      });
    });

    it("a failure's evidence (the provider's ids and codes) is shown to the model as fields and in its message, on the call, its replay and the status tool", async () => {
      const ledger = await db.open();
      const tenant = `evidence-${dialect}`;
      const evidence = { payment_intent: "pi_3Declined", code: "card_declined", decline_code: "insufficient_funds" };
      const charge = {
        ...note,
        action: defineAction<{ text: string }, { id: string }>({
          type: "test.charge-evidence",
          capabilities: {},
          async execute() {
            throw new Error("402");
          },
          classify: () => ({ kind: "permanent", reason: "your card has insufficient funds", evidence }),
        }),
      };
      const tool = guard(ledger, charge, { tenant });
      const status = statusTool(ledger, { tenant });
      const first = await tool({ noteId: "e1", text: "x" }, call);
      const again = await tool({ noteId: "e1", text: "x" }, call);
      const checked = await status({ operationId: (first as { operationId: string }).operationId }, call);
      // Before: the ids were not shown at all (the reason a Stripe action gives names them in prose).
      for (const read of [first, again, checked]) {
        expect(read, JSON.stringify(read)).toMatchObject({ status: "failed", evidence });
        expect(read.message).toMatch(
          /^Failed because your card has insufficient funds \(payment_intent: pi_3Declined; code: card_declined; decline_code: insufficient_funds\) \(operation op_/,
        );
      }
      // A failure without evidence reads as before: no empty brackets, no field.
      const plain = await guard(
        ledger,
        {
          ...note,
          action: defineAction<{ text: string }, { id: string }>({
            type: "test.charge-plain",
            capabilities: {},
            async execute() {
              throw new Error("400");
            },
            classify: () => ({ kind: "permanent", reason: "amount too small" }),
          }),
        },
        { tenant },
      )({ noteId: "e2", text: "x" }, call);
      expect(plain.message).toMatch(/^Failed because amount too small \(operation op_/);
      expect(plain).not.toHaveProperty("evidence");
    });

    it("other arguments for work that failed, or is still being checked: not called 'already done'", async () => {
      const ledger = await db.open({ budget: { attempts: 1 } });
      let answer: "declined" | "timeout" = "declined";
      const charge = {
        ...note,
        action: defineAction<{ text: string }, { id: string }>({
          type: "test.charge",
          capabilities: {},
          async execute() {
            throw new Error(answer);
          },
          classify: (e) =>
            (e as Error).message === "declined"
              ? { kind: "permanent", reason: "card declined" }
              : { kind: "ambiguous", reason: "timeout after sending" },
        }),
      };
      const tool = guard(ledger, charge, { tenant: "acme" });
      expect(await tool({ noteId: `f-${dialect}`, text: "a" }, call)).toMatchObject({ status: "failed" });
      const refused = await tool({ noteId: `f-${dialect}`, text: "b" }, call);
      expect(refused).toMatchObject({ status: "refused" });
      expect(refused.message).toMatch(/was already tried with different arguments, and failed/);
      expect(refused.message).not.toMatch(/already done|different identity/);
      answer = "timeout"; // nothing can check it: a person decides
      expect(await tool({ noteId: `u-${dialect}`, text: "a" }, call)).toMatchObject({ status: "pending_verification" });
      const checking = await tool({ noteId: `u-${dialect}`, text: "b" }, call);
      expect(checking.message).toMatch(
        /already attempted with different arguments, and a person will decide whether it happened/,
      );
    });

    it("a call stopped after its attempt may have reached the provider: not 'failed before doing anything'", async () => {
      const ledger = await db.open({ budget: { attempts: 3, baseDelayMs: 60_000 } });
      const stop = new AbortController();
      let attempts = 0;
      const flaky = {
        ...note,
        action: defineAction<{ text: string }, { id: string }>({
          type: "test.flaky",
          capabilities: { dedupe: { retentionMs: 3_600_000 } },
          async execute() {
            attempts += 1;
            // The answer is lost after sending; the framework gives up while the retry waits.
            queueMicrotask(() => stop.abort(new DOMException("The operation was aborted.", "AbortError")));
            throw new Error("socket hang up");
          },
        }),
      };
      const out = await guard(ledger, flaky, { tenant: "acme" })(
        { noteId: `a-${dialect}`, text: "x" },
        { ...call, signal: stop.signal },
      );
      expect(attempts).toBe(1);
      expect(out.status).toBe("unconfirmed");
      expect(out.message).toMatch(
        /^Not confirmed: the call stopped before its outcome was known \(AbortError\); it may or may not have happened/,
      );
    });

    it("the status tool: a summary that throws still reads done; a ledger it cannot read says it could not check", async () => {
      const ledger = await db.open();
      const tool = guard(ledger, note, { tenant: "acme" });
      const done = await tool({ noteId: `st-${dialect}`, text: "hi" }, call);
      const id = (done as { operationId: string }).operationId;
      const status = statusTool(ledger, {
        tenant: "acme",
        summarize: () => {
          throw new Error("bad summary");
        },
      });
      expect(await status({ operationId: id }, call)).toMatchObject({ status: "done", operationId: id });
      // A tenant the application set up wrong is not "no such operation" (the model would doubt a real id).
      const misconfigured = await statusTool(ledger, { tenant: "" })({ operationId: id }, call);
      expect(misconfigured).toMatchObject({
        status: "unconfirmed",
        message: expect.stringMatching(/^Could not check/),
      });
      await ledger.close();
      const closed = await status({ operationId: id }, call);
      expect(closed.status).toBe("unconfirmed");
      expect(closed.message).toMatch(
        /^Could not check operation "op_\w+" now \(\w+\): it may or may not have happened/,
      );
      expect(closed.message).not.toMatch(/failed before doing anything/);
    });

    it("the status tool's wait ends when the call's stop aborts, also when it has a signal", async () => {
      // Before: the wait listened to `signal` only when both were given, so a connection closing
      // (`stop`) left it polling for up to 50 s.
      const ledger = await db.open();
      const tenant = `wait-stop-${dialect}`;
      const lost = {
        ...note,
        action: defineAction<{ text: string }, { id: string }>({
          type: "test.lost-wait",
          capabilities: {},
          async execute() {
            throw Object.assign(new Error("socket hang up"), { code: "ECONNRESET" });
          },
        }),
      };
      const parked = await guard(ledger, lost, { tenant })({ noteId: "w1", text: "x" }, call);
      expect(parked).toMatchObject({ status: "pending_verification", state: "needs_review" });
      const stop = new AbortController();
      const signal = new AbortController();
      setTimeout(() => stop.abort(), 200);
      const started = performance.now();
      const checked = await statusTool(ledger, { tenant })(
        { operationId: (parked as { operationId: string }).operationId, waitMs: 20_000 },
        { ...call, signal: signal.signal, stop: stop.signal },
      );
      expect(checked).toMatchObject({ status: "pending_verification", state: "needs_review" });
      expect(performance.now() - started).toBeLessThan(10_000); // not the 20 s asked for
    });

    it("refuses to build a tool without a business identity", async () => {
      const ledger = await db.open();
      expect(() => guard(ledger, note.action, { tenant: "acme" })).toThrow(/give a key/);
    });
  });
}

describe("guard when the ledger's database goes down during the effect (a private Postgres)", () => {
  let server: PgServer;
  let url = "";
  beforeAll(async () => {
    server = await startPgServer();
    url = await server.database();
  }, scaled(180_000));
  afterAll(() => server?.close(), scaled(120_000));

  it(
    "the effect went out, then the database stopped: unconfirmed with the operation id, not 'not performed'",
    async () => {
      const options = { connectTimeoutMs: 1_000, statementTimeoutMs: 1_000, poolSize: 2 } as LedgerOptions;
      const ledger = await openLedger(url, options);
      let effects = 0;
      const post = {
        ...note,
        action: defineAction<{ text: string }, { id: string }>({
          type: "test.post",
          capabilities: {},
          async execute() {
            effects += 1;
            await server.stop("immediate"); // the answer is lost with the database
            throw new Error("socket hang up");
          },
        }),
      };
      try {
        const out = await guard(ledger, post, { tenant: "acme" })({ noteId: "down", text: "x" }, call);
        // Before: "not_performed" (over MCP, isError: nothing was done), so a person redid it by hand.
        expect(effects).toBe(1);
        expect(out).toMatchObject({ status: "unconfirmed", operationId: expect.stringMatching(/^op_/) });
        expect(out.message).toMatch(/may or may not have happened/);
      } finally {
        await server.start();
        await ledger.close();
      }
      // The operation it names is the one the ledger holds, unsettled (the daemon settles it).
      const after = await openLedger(url, options);
      try {
        const [op] = await after.admin.list({ tenant: "acme" });
        expect(op).toMatchObject({ status: "running" });
      } finally {
        await after.close();
      }
    },
    scaled(120_000),
  );

  it(
    "a duplicate waiting on another worker's attempt when the database stops: unconfirmed with the operation id",
    async () => {
      const options = { connectTimeoutMs: 1_000, statementTimeoutMs: 1_000, poolSize: 2 } as LedgerOptions;
      const worker = await openLedger(url, options);
      let release!: () => void;
      const released = new Promise<void>((r) => (release = r));
      let started!: () => void;
      const executing = new Promise<void>((r) => (started = r));
      const slow = {
        ...note,
        action: defineAction<{ text: string }, { id: string }>({
          type: "test.post-slow",
          capabilities: {},
          async execute() {
            started();
            await released; // the first worker's request is out: its answer has not come
            return { id: "p1" };
          },
        }),
      };
      const first = guard(worker, slow, { tenant: "acme-dup" })({ noteId: "dup", text: "x" }, call);
      await executing;
      // The duplicate reads the key (the operation, under the worker's lease), then the database
      // stops as it reads it again: while its connection is checked out, so that connection's end
      // is reported on its client, not the pool (unheard there, an uncaught exception).
      let reads = 0;
      const duplicate = await openTestLedger(
        hooked(await dialectFor("postgres", url), {
          async query(q, run) {
            if (q.parameters.includes("acme-dup") && ++reads === 2) await server.stop("immediate");
            return run();
          },
        }),
        options,
      );
      try {
        const out = await guard(duplicate, slow, { tenant: "acme-dup" })({ noteId: "dup", text: "x" }, call);
        expect(reads).toBeGreaterThanOrEqual(2);
        // Before: its next read named no operation, and it read "not_performed" (MCP: isError).
        expect(out).toMatchObject({ status: "unconfirmed", operationId: expect.stringMatching(/^op_/) });
      } finally {
        release();
        await first.catch(() => undefined);
        await server.start();
        await Promise.all([worker.close(), duplicate.close()]);
      }
    },
    scaled(120_000),
  );
});
