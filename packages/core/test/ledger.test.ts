import { describe, expect, it } from "vitest";
import { setTimeout as sleep } from "node:timers/promises";
import {
  ArgsMismatchError,
  defineAction,
  describeResult,
  InvalidValueError,
  LedgerConfigError,
  operationKey,
} from "@idem/core";
import { DIALECTS, scaled } from "@idem/testkit";
import { openTestLedger } from "@idem/core/testing";
import { dialectFor, hooked } from "./support/dialects.js";
import { ledgers, uniqueTenant } from "./support/ledgers.js";
import { TestProvider } from "./support/provider.js";

const DEDUPE = { dedupe: { retentionMs: 24 * 3_600_000 } };
const LOOKUP = { lookup: true };
const NEITHER = {};

for (const dialect of DIALECTS) {
  describe(`run on ${dialect}`, () => {
    const db = ledgers(dialect);

    it("executes once and replays the first receipt to a duplicate", async () => {
      const ledger = await db.open();
      const p = new TestProvider();
      const send = p.action("mail.send", NEITHER);
      const tenant = uniqueTenant();
      const input = { tenant, key: ["weekly-report", "c1", "2026-W48"], args: { to: "a@example.com" } };
      const first = await ledger.run(send, input);
      const second = await ledger.run(send, input);
      expect(first).toMatchObject({ status: "succeeded", replayed: false, receipt: { id: "obj_1" } });
      expect(second).toMatchObject({
        status: "succeeded",
        replayed: true,
        receipt: { id: "obj_1" },
        operationId: first.operationId,
      });
      expect(p.effects).toHaveLength(1);
      expect(describeResult(second)).toMatch(/^already done earlier/);
    });

    it("fails closed on the same key with other args, executing nothing", async () => {
      const ledger = await db.open();
      const p = new TestProvider();
      const send = p.action("mail.send", NEITHER);
      const tenant = uniqueTenant();
      const first = await ledger.run(send, { tenant, key: ["k"], args: { to: "a@example.com" } });
      const err = await ledger
        .run(send, { tenant, key: ["k"], args: { to: "b@example.com" } })
        .catch((e: unknown) => e);
      expect(err).toBeInstanceOf(ArgsMismatchError);
      const mismatch = err as ArgsMismatchError;
      expect(mismatch.operationId).toBe(first.operationId);
      expect(mismatch.storedArgsHash).toMatch(/^[0-9a-f]{64}$/);
      expect(mismatch.givenArgsHash).not.toBe(mismatch.storedArgsHash);
      expect(p.calls).toBe(1);
    });

    // The daemon settles an operation with the action registered under its type: a second one of
    // the type was kept in the first's place, silently (two mailers: one's operations looked up
    // in the other's mailbox, read as absent, sent again; helper-115).
    it("refuses two different actions of one type, and takes the same one given twice", async () => {
      const p = new TestProvider();
      const send = p.action("mail.send", NEITHER);
      const other = new TestProvider().action("mail.send", NEITHER);
      const err = await db.open({ actions: [send, other] }).catch((e: unknown) => e);
      expect(err).toBeInstanceOf(LedgerConfigError);
      expect((err as Error).message).toMatch(/^actions: two different actions have the type "mail\.send"/);
      const ledger = await db.open({ actions: [send, send] });
      expect(await ledger.run(send, { tenant: uniqueTenant(), key: ["k"], args: { to: "a" } })).toMatchObject({
        status: "succeeded",
      });
    });

    // `repeatable` decides recovery alone (policy.ts: run again, whatever the age): declared with
    // `dedupe` or `lookup`, the key window or the lookup the definition promises was never used,
    // silently. Refused where an action is defined, and where a hand-made one is registered.
    it("refuses an action that declares repeatable with dedupe or lookup, naming it and the fields; registers nothing", async () => {
      const execute = async () => ({ id: "line" });
      const reconcile = async () => ({ found: false as const, proof: "absent" as const, reason: "none" });
      const alone = defineAction({ type: "log.line", capabilities: { repeatable: true, lookup: false }, execute });
      for (const [capabilities, fields] of [
        [{ repeatable: true, lookup: true }, "lookup"],
        [{ repeatable: true, ...DEDUPE }, "dedupe"],
        [{ repeatable: true, lookup: true, ...DEDUPE }, "dedupe and lookup"],
      ] as const) {
        const said = new RegExp(`^action log\\.line: capabilities\\.repeatable cannot be declared with ${fields}`);
        expect(() => defineAction({ type: "log.line", capabilities, execute, reconcile }), fields).toThrow(said);
        expect(() => defineAction({ type: "log.line", capabilities, execute, reconcile })).toThrow(LedgerConfigError);
        const handMade = { ...alone, capabilities };
        const err = await db.open({ actions: [handMade] }).catch((e: unknown) => e);
        expect(err, fields).toBeInstanceOf(LedgerConfigError);
        expect((err as Error).message).toMatch(said);
      }
      // Alone (lookup: false is no lookup), it is defined and registered, and runs.
      const ledger = await db.open({ actions: [alone] });
      expect(await ledger.run(alone, { tenant: uniqueTenant(), key: ["k"], args: {} })).toMatchObject({
        status: "succeeded",
      });
    });

    // Each becomes a stored value (retention_ms) or a limit a call checks: NaN disabled a size limit,
    // and a NaN retention reached the database as a value it refuses, on every call, read as an outage.
    for (const [option, value] of [
      ["maxArgsBytes", Number.NaN],
      ["maxArgsBytes", 0],
      ["maxResultBytes", 2e9],
      ["maxResultBytes", 1.5],
      ["waitMs", -1],
      ["waitMs", Number.NaN],
      ["retentionMs", Number.NaN],
      ["retentionMs", -5],
      ["retentionMs", Number.POSITIVE_INFINITY],
    ] as const)
      it(`refuses ${option}: ${value} at open, naming it`, async () => {
        const err = await db.open({ [option]: value }).catch((e: unknown) => e);
        expect(err).toBeInstanceOf(LedgerConfigError);
        expect((err as Error).message).toMatch(new RegExp(`^${option} must be a whole number`));
      });

    it("refuses a call's waitMs that is no whole number of ms a timer takes, writing nothing", async () => {
      const ledger = await db.open();
      const p = new TestProvider();
      const send = p.action("mail.send", NEITHER);
      const tenant = uniqueTenant();
      for (const waitMs of [Number.NaN, -1, 1.5, 2 ** 31])
        await expect(ledger.run(send, { tenant, key: ["k"], args: { to: "a" }, waitMs })).rejects.toThrow(
          InvalidValueError,
        );
      expect({ calls: p.calls, rows: await ledger.admin.list({ tenant }) }).toEqual({ calls: 0, rows: [] });
    });

    it("refuses a key from operationKey built for another action or tenant, running and writing nothing", async () => {
      const ledger = await db.open();
      const p = new TestProvider();
      const send = p.action("mail.send", NEITHER);
      const charge = p.action("charge", NEITHER);
      const [tenant, other] = [uniqueTenant(), uniqueTenant()];
      const sendKey = operationKey({ tenant, action: "mail.send", parts: ["k"] });
      const first = await ledger.run(send, { tenant, key: sendKey, args: { to: "a@example.com" } });
      expect(first).toMatchObject({ status: "succeeded", replayed: false });
      // Its hash names the email's operation: run with it, the charge would be answered the
      // email's receipt (or, another tenant's, run under a key derived for someone else).
      for (const [action, t] of [
        [charge, tenant],
        [send, other],
      ] as const) {
        const err = await ledger
          .run(action, { tenant: t, key: sendKey, args: { to: "a@example.com" } })
          .catch((e) => e);
        expect(err).toBeInstanceOf(InvalidValueError);
        expect((err as Error).message).toContain(`built for tenant "${tenant}" and action "mail.send"`);
      }
      expect(p.calls).toBe(1);
      expect(await ledger.admin.list({ tenant: other })).toHaveLength(0);
      // A key built for this action and tenant is the key run would derive from the parts itself.
      const again = await ledger.run(send, { tenant, key: ["k"], args: { to: "a@example.com" } });
      expect(again).toMatchObject({ replayed: true, operationId: first.operationId });
    });

    it("refuses a hand-made key whose operation is of another action: it is not answered that action's receipt", async () => {
      const ledger = await db.open();
      const p = new TestProvider();
      const send = p.action("mail.send", NEITHER);
      const charge = p.action("charge", NEITHER);
      const tenant = uniqueTenant();
      const made = operationKey({ tenant, action: "mail.send", parts: ["k"] });
      const byHand = { hash: made.hash, label: made.label }; // a key without its tenant and action
      const first = await ledger.run(send, { tenant, key: byHand, args: { to: "a@example.com" } });
      expect(first).toMatchObject({ status: "succeeded", replayed: false });
      // Before: the charge was answered "succeeded, replayed", with the email's receipt.
      const err = await ledger.run(charge, { tenant, key: byHand, args: { to: "a@example.com" } }).catch((e) => e);
      expect(err).toBeInstanceOf(InvalidValueError);
      expect((err as Error).message).toContain(`names operation ${first.operationId}, of action "mail.send"`);
      expect(p.calls).toBe(1);
      // Its own retry is answered as before.
      expect(await ledger.run(send, { tenant, key: byHand, args: { to: "a@example.com" } })).toMatchObject({
        replayed: true,
        operationId: first.operationId,
      });
    });

    it("stores a permanent failure and replays it without calling the provider again", async () => {
      const ledger = await db.open();
      const p = new TestProvider();
      p.faults.push({
        when: "before",
        cls: { kind: "permanent", reason: "card declined", providerRequestId: "req_1" },
      });
      const charge = p.action("charge", DEDUPE);
      const input = { tenant: uniqueTenant(), key: ["order-1"], args: { to: "x" } };
      const first = await ledger.run(charge, input);
      const again = await ledger.run(charge, input);
      expect(first).toMatchObject({
        status: "failed",
        replayed: false,
        error: { kind: "permanent", reason: "card declined", providerRequestId: "req_1" },
      });
      expect(again).toMatchObject({ status: "failed", replayed: true });
      expect(p.calls).toBe(1);
      expect(p.effects).toHaveLength(0);
    });

    it("retries a transient failure with the same key within the budget", async () => {
      const ledger = await db.open({ budget: { baseDelayMs: 5 } });
      const p = new TestProvider();
      p.faults.push({ when: "before", cls: { kind: "transient", reason: "503 before execution" } });
      const charge = p.action("charge", DEDUPE);
      const tenant = uniqueTenant();
      const out = await ledger.run(charge, { tenant, key: ["o2"], args: { to: "x" } });
      expect(out).toMatchObject({ status: "succeeded", attempt: 2 });
      expect(p.calls).toBe(2);
      expect(p.effects).toHaveLength(1);
      const { events } = await ledger.get({ tenant, id: out.operationId });
      expect(events.map((e) => `${e.from}>${e.to}`)).toEqual([
        "null>running",
        "running>pending",
        "pending>running",
        "running>succeeded",
      ]);
    });

    // A reference made of config (a sender's domain, where copies are kept) that changes between
    // attempts: its last digit counts the configs deployed. Before, the first reference was kept
    // even after an attempt known not to have sent: a config corrected since (a journal on a
    // wrong port) could never apply to the operation.
    for (const [what, fault, made] of [
      [
        "an attempt that may have sent keeps its reference for good: the retry executes with it",
        { when: "after", cls: { kind: "ambiguous", reason: "timeout after sending" } },
        ["1", "1"],
      ],
      [
        "an attempt known not to have sent leaves no reference behind: the next one records its own",
        { when: "before", cls: { kind: "transient", reason: "503 before execution" } },
        ["1", "2"],
      ],
    ] as const) {
      it(what, async () => {
        const ledger = await db.open({ budget: { baseDelayMs: 5 } });
        const p = new TestProvider();
        p.faults.push(fault);
        const inner = p.action("charge", DEDUPE);
        const given: (string | null)[] = [];
        let configs = 0;
        const charge = defineAction({
          type: inner.type,
          capabilities: DEDUPE,
          classify: inner.classify,
          providerReference: (_args, op) => `ch-${op.key.slice(0, 8)}-${++configs}`,
          execute: (args: { to: string }, op) => {
            given.push(op.providerReference);
            return inner.execute(args, op);
          },
        });
        const tenant = uniqueTenant();
        const out = await ledger.run(charge, { tenant, key: ["ref"], args: { to: "x" } });
        expect(out).toMatchObject({ status: "succeeded", attempt: 2 });
        const { operation, events } = await ledger.get({ tenant, id: out.operationId });
        expect(given.map((r) => r?.match(/^ch-[0-9a-f]{8}-(\d)$/)?.[1])).toEqual(made);
        expect(operation.providerReference).toBe(given[1]);
        // The audit trail keeps the reference each transition was made under.
        expect(events.some((e) => e.providerReference === given[0])).toBe(true);
      });
    }

    it("stops at the attempts budget and leaves the work pending, not failed", async () => {
      const ledger = await db.open({ budget: { attempts: 2, baseDelayMs: 5 } });
      const p = new TestProvider();
      for (let i = 0; i < 3; i++)
        p.faults.push({ when: "before", cls: { kind: "transient", reason: "connection refused" } });
      const out = await ledger.run(p.action("charge", DEDUPE), {
        tenant: uniqueTenant(),
        key: ["o3"],
        args: { to: "x" },
      });
      expect(out).toMatchObject({ status: "pending_verification", state: "pending" });
      expect(p.calls).toBe(2);
    });

    it("tells a caller whose work is known not done, its args not stored, to call again: no one else can", async () => {
      const ledger = await db.open({ budget: { attempts: 1 } });
      const p = new TestProvider();
      p.faults.push({ when: "before", cls: { kind: "transient", reason: "connection refused" } });
      const input = { tenant: uniqueTenant(), key: ["o3b"], args: { to: "x" }, storeArgs: false };
      const out = await ledger.run(p.action("charge", DEDUPE), input);
      expect(out).toMatchObject({ status: "pending_verification", state: "pending" });
      // Before: "...a later call with the args retries...; do not retry it yourself".
      const said = describeResult(out);
      expect(said).toMatch(/known not done/);
      expect(said).not.toMatch(/do not retry it yourself/);
      expect(said).toMatch(/the same call again does it, once/);
      expect(await ledger.run(p.action("charge", DEDUPE), input)).toMatchObject({ status: "succeeded" });
      expect(p.effects).toHaveLength(1);
    });

    it("waits as long as a rate limit says before retrying", async () => {
      const ledger = await db.open();
      const p = new TestProvider();
      p.faults.push({ when: "before", cls: { kind: "rate_limited", reason: "429", retryAfterMs: 300 } });
      const started = Date.now();
      const out = await ledger.run(p.action("charge", DEDUPE), {
        tenant: uniqueTenant(),
        key: ["o4"],
        args: { to: "x" },
      });
      expect(out.status).toBe("succeeded");
      expect(Date.now() - started).toBeGreaterThanOrEqual(300);
    });

    it("replays an ambiguous outcome with the same key when the provider dedupes", async () => {
      const ledger = await db.open();
      const p = new TestProvider();
      p.faults.push({ when: "after", cls: { kind: "ambiguous", reason: "socket closed after send" } });
      const out = await ledger.run(p.action("charge", DEDUPE), {
        tenant: uniqueTenant(),
        key: ["o5"],
        args: { to: "x" },
      });
      expect(out).toMatchObject({ status: "succeeded", receipt: { id: "obj_1", replayed: true } });
      expect(p.effects).toHaveLength(1);
    });

    it("reconciles an ambiguous outcome by lookup: found means succeeded with the found receipt", async () => {
      const ledger = await db.open();
      const p = new TestProvider();
      p.faults.push({ when: "after", cls: { kind: "ambiguous", reason: "timeout after DATA" } });
      const out = await ledger.run(p.action("mail", LOOKUP), {
        tenant: uniqueTenant(),
        key: ["m1"],
        args: { to: "x" },
      });
      expect(out).toMatchObject({ status: "succeeded", receipt: { id: "obj_1" } });
      expect(p.calls).toBe(1);
      expect(p.effects).toHaveLength(1);
    });

    it("a lookup that finds the effect more than once settles it with the receipt, alerted as two effects, never in silence", async () => {
      const ledger = await db.open();
      const tenant = uniqueTenant();
      let sends = 0;
      const found = (twice?: unknown) =>
        defineAction<{ to: string }, { id: string }>({
          type: `found.twice.${String(twice)}`,
          capabilities: { lookup: true },
          execute: async () => {
            sends += 1;
            throw new Error("timeout after DATA");
          },
          classify: () => ({ kind: "ambiguous", reason: "timeout after DATA" }),
          reconcile: async () =>
            ({ found: true, receipt: { id: "obj_1" }, ...(twice !== undefined && { twice }) }) as never,
        });
      const cases = [
        { twice: "obj_1 and obj_2 both carry the key", says: "obj_1 and obj_2 both carry the key", alerted: true },
        // An action's bug (no words): still alerted, with what it gave.
        { twice: 42, says: "said as 42", alerted: true },
        { twice: undefined, says: undefined, alerted: false },
      ];
      for (const c of cases) {
        const out = await ledger.run(found(c.twice), { tenant, key: [String(c.twice)], args: { to: "x" } });
        expect(out).toMatchObject({ status: "succeeded", receipt: { id: "obj_1" }, replayed: false });
        const { operation } = await ledger.get({ tenant, id: out.operationId });
        const alerted = (await ledger.daemon.alertsDue({ limit: 100 })).some((a) => a.id === out.operationId);
        expect({ reason: operation.reason, alerted }, String(c.twice)).toEqual({
          reason: c.says
            ? `two effects: the lookup found the effect more than once (${c.says}); a person must check the provider`
            : "reconciled: the effect was found",
          alerted: c.alerted,
        });
      }
      expect(sends).toBe(3); // one send each, none again after the finding
    });

    it("a receipt whose ids name several effects is alerted as two effects, however it came (an execute's, a lookup's that did not say twice)", async () => {
      const ledger = await db.open();
      const tenant = uniqueTenant();
      // An execute that finds what earlier sends left (email's check before sending) answers with
      // a receipt of all of them; a lookup may read them all without saying `twice`.
      const naming = (ids: string[], via: "execute" | "lookup") =>
        defineAction<{ to: string }, { ids: string[] }>({
          type: `names.${via}.${ids.length}`,
          capabilities: { lookup: true },
          execute: async () => {
            if (via === "execute") return { ids };
            throw new Error("timeout after DATA");
          },
          classify: () => ({ kind: "ambiguous", reason: "timeout after DATA" }),
          reconcile: async () => ({ found: true, receipt: { ids } }),
          effectId: (r) => (r.ids.length === 1 ? r.ids[0] : r.ids),
        });
      for (const via of ["execute", "lookup"] as const)
        for (const ids of [["obj_1"], ["obj_1", "obj_2"], ["obj_1", "obj_1"]]) {
          const out = await ledger.run(naming(ids, via), { tenant, key: [via, ...ids], args: { to: "x" } });
          expect(out).toMatchObject({ status: "succeeded", receipt: { ids }, replayed: false });
          const { operation } = await ledger.get({ tenant, id: out.operationId });
          const alerted = (await ledger.daemon.alertsDue({ limit: 100 })).some((a) => a.id === out.operationId);
          const several = new Set(ids).size > 1;
          expect({ reason: operation.reason, alerted }, `${via} ${ids}`).toEqual({
            reason: several
              ? "two effects: the receipt names 2 effects (obj_1, obj_2); a person must check the provider"
              : via === "execute"
                ? "the effect happened"
                : "reconciled: the effect was found",
            alerted: several,
          });
        }
    });

    it("runs again with the same key when the lookup proves absence", async () => {
      const ledger = await db.open();
      const p = new TestProvider();
      p.faults.push({ when: "before", cls: { kind: "ambiguous", reason: "timeout, nothing committed in fact" } });
      const out = await ledger.run(p.action("mail", LOOKUP), {
        tenant: uniqueTenant(),
        key: ["m2"],
        args: { to: "x" },
      });
      expect(out).toMatchObject({ status: "succeeded", receipt: { id: "obj_1" } });
      expect(p.calls).toBe(2);
      expect(p.effects).toHaveLength(1);
    });

    it("keeps an inconclusive lookup unknown and says so, without a second send", async () => {
      const ledger = await db.open();
      const p = new TestProvider();
      p.lookupAnswer = "inconclusive";
      p.faults.push({ when: "after", cls: { kind: "ambiguous", reason: "timeout" } });
      const tenant = uniqueTenant();
      const out = await ledger.run(p.action("mail", LOOKUP), { tenant, key: ["m3"], args: { to: "x" } });
      expect(out).toMatchObject({ status: "pending_verification", state: "unknown" });
      expect(describeResult(out)).toMatch(/pending verification/);
      const { operation } = await ledger.get({ tenant, id: out.operationId });
      expect(operation).toMatchObject({ status: "unknown", checks: 1 });
      expect(operation.nextCheckAt).toBeGreaterThan(operation.updatedAt);
      expect(p.effects).toHaveLength(1);
    });

    it("parks an ambiguous outcome in needs_review when nothing can prove it", async () => {
      const ledger = await db.open();
      const p = new TestProvider();
      p.faults.push({ when: "after", cls: { kind: "ambiguous", reason: "timeout" } });
      const out = await ledger.run(p.action("sms", NEITHER), {
        tenant: uniqueTenant(),
        key: ["s1"],
        args: { to: "x" },
      });
      expect(out).toMatchObject({ status: "pending_verification", state: "needs_review" });
      expect(p.calls).toBe(1);
    });

    it("parks it too when the lookup can never prove absence", async () => {
      const ledger = await db.open();
      const p = new TestProvider();
      p.lookupAnswer = "never";
      p.faults.push({ when: "before", cls: { kind: "ambiguous", reason: "timeout" } });
      const out = await ledger.run(p.action("mail", LOOKUP), {
        tenant: uniqueTenant(),
        key: ["m4"],
        args: { to: "x" },
      });
      expect(out).toMatchObject({ status: "pending_verification", state: "needs_review" });
      expect(p.calls).toBe(1);
    });

    it("fails an unknown outcome the lookup finds refused at the provider, and replays that failure", async () => {
      const ledger = await db.open();
      const p = new TestProvider();
      p.lookupAnswer = "refused";
      p.faults.push({ when: "before", cls: { kind: "ambiguous", reason: "timeout" } });
      const input = { tenant: uniqueTenant(), key: ["declined"], args: { to: "x" } };
      const out = await ledger.run(p.action("card", LOOKUP), input);
      expect(out).toMatchObject({
        status: "failed",
        replayed: false,
        error: { kind: "permanent", reason: "the provider's record shows it declined" },
      });
      const again = await ledger.run(p.action("card", LOOKUP), input);
      expect(again).toMatchObject({ status: "failed", replayed: true });
      expect(p.calls).toBe(1); // never sent again
      const { events } = await ledger.get({ tenant: input.tenant, id: out.operationId });
      expect(events.map((e) => e.to)).toEqual(["running", "unknown", "running", "failed"]);
      expect(events.at(-1)!.reason).toBe("reconciled: the provider's record shows it declined");
    });

    it("answers a live lease as in progress, or waits a bounded time for its receipt", async () => {
      const ledger = await db.open();
      const p = new TestProvider();
      let release!: () => void;
      p.gate = new Promise((r) => (release = r));
      const send = p.action("mail", NEITHER);
      const input = { tenant: uniqueTenant(), key: ["busy"], args: { to: "x" } };
      const winner = ledger.run(send, input);
      await p.called(1);
      const busy = await ledger.run(send, input);
      expect(busy).toMatchObject({ status: "pending_verification", state: "running" });
      expect(busy.status === "pending_verification" && busy.reason).toMatch(/in progress/);
      const waiting = ledger.run(send, { ...input, waitMs: 5_000 });
      setTimeout(release, 100);
      expect(await waiting).toMatchObject({ status: "succeeded", replayed: true, receipt: { id: "obj_1" } });
      expect(await winner).toMatchObject({ status: "succeeded", replayed: false });
      expect(p.effects).toHaveLength(1);
    });

    it("keeps the lease alive with heartbeats while a long action runs", async () => {
      const ledger = await db.open({ leaseMs: 500 });
      const p = new TestProvider();
      let release!: () => void;
      p.gate = new Promise((r) => (release = r));
      const send = p.action("mail", DEDUPE);
      const input = { tenant: uniqueTenant(), key: ["long"], args: { to: "x" } };
      const winner = ledger.run(send, input);
      await p.called(1);
      await sleep(2_000); // four leases long
      const other = await ledger.run(send, input);
      expect(other).toMatchObject({ status: "pending_verification", state: "running" });
      release();
      expect(await winner).toMatchObject({ status: "succeeded", attempt: 1 });
      expect(p.calls).toBe(1);
    });

    it("fences a worker whose lease was taken over: its completion is refused and recorded", async () => {
      const stale = await db.open();
      const later = await db.open({ clock: () => Date.now() + 3_600_000 }); // sees the lease expired
      const p = new TestProvider();
      let release!: () => void;
      p.gate = new Promise((r) => (release = r));
      const charge = p.action("charge", DEDUPE);
      const tenant = uniqueTenant();
      const input = { tenant, key: ["fence"], args: { to: "x" } };
      const first = stale.run(charge, input);
      await p.called(1); // attempt 1 is inside execute, before its effect
      p.gate = undefined;
      const second = await later.run(charge, input);
      expect(second).toMatchObject({ status: "succeeded", attempt: 2 });
      release();
      const firstOut = await first;
      // Its own request made the effect (attempt 2's was deduped onto it): "done", not "already
      // done earlier", though attempt 2 recorded it first.
      expect(firstOut).toMatchObject({
        status: "succeeded",
        replayed: false,
        attempt: 1,
        receipt: second.status === "succeeded" ? second.receipt : null,
      });
      const { operation, events } = await stale.get({ tenant, id: second.operationId });
      expect(operation).toMatchObject({ status: "succeeded", attempt: 2 });
      expect(
        events.some((e) => e.attempt === 1 && /fenced: attempt 1 tried to write succeeded/.test(e.reason ?? "")),
      ).toBe(true);
      expect(p.effects).toHaveLength(1); // the provider deduped attempt 2 onto attempt 1's object
    });

    it("a fenced worker's receipt settles the row even when its audit event cannot be written", async () => {
      const failing = { on: false };
      const failingDialect = hooked(await dialectFor(dialect, db.url()), {
        query(q, run) {
          // The fence's audit event (an UPDATE of the history alone) meets a full disk.
          if (failing.on && /^update "idem_operations" set "history"/.test(q.sql))
            throw new Error("disk full (injected)");
          return run();
        },
      });
      const stale = await openTestLedger(failingDialect);
      const p = new TestProvider();
      const charge = p.action("charge", LOOKUP);
      const later = await db.open({ clock: () => Date.now() + 3_600_000, actions: [charge] }); // sees the lease expired
      let release!: () => void;
      p.gate = new Promise((r) => (release = r));
      const tenant = uniqueTenant();
      const first = stale.run(charge, { tenant, key: ["fence-event"], args: { to: "x" } });
      await p.called(1); // attempt 1 is inside execute
      p.gate = undefined;
      // Its lease runs out; a daemon's lookup finds nothing yet: attempt 2 leaves it unknown.
      p.lookupAnswer = "inconclusive";
      const [op] = await later.admin.list({ tenant });
      expect(await later.daemon.settle({ tenant, id: op!.id })).toMatchObject({ state: "unknown", attempt: 2 });
      failing.on = true;
      release();
      // Attempt 1's effect happened and its receipt proves it: the row is settled with it, and
      // its caller is told its own attempt (the one whose request made the effect).
      expect(await first).toMatchObject({ status: "succeeded", replayed: false, attempt: 1 });
      expect((await later.get({ tenant, id: op!.id })).operation.status).toBe("succeeded");
      await stale.close();
    });

    it("an action whose providerReference throws fails before sending, with the reason; the caller gets a result, not the exception", async () => {
      const ledger = await db.open();
      let sent = 0;
      const broken = defineAction({
        type: "broken.reference",
        capabilities: DEDUPE,
        providerReference: () => {
          throw new TypeError("Cannot read properties of undefined (reading 'id')");
        },
        execute: async () => {
          sent += 1;
          return { ok: true };
        },
      });
      const out = await ledger.run(broken, { tenant: uniqueTenant(), key: ["ref"], args: {} });
      expect(out).toMatchObject({ status: "failed", error: { kind: "permanent", alert: true } });
      expect(out.status === "failed" && out.error.reason).toMatch(/providerReference threw: .*reading 'id'/);
      expect(sent).toBe(0);
    });

    it("a caller that gives up while its claim is in flight sends nothing: the row is left pending, and run rejects with its reason", async () => {
      const caller = new AbortController();
      const failingDialect = hooked(await dialectFor(dialect, db.url()), {
        query(q, run) {
          // The claim (on Postgres, inside the statement that also reads the key).
          if (/^(with "ins" as \()?insert into "idem_operations"/.test(q.sql))
            caller.abort(new Error("the agent gave up"));
          return run();
        },
      });
      const ledger = await openTestLedger(failingDialect);
      const p = new TestProvider();
      const tenant = uniqueTenant();
      const out = ledger.run(p.action("mail", DEDUPE), {
        tenant,
        key: ["gave-up"],
        args: { to: "x" },
        signal: caller.signal,
      });
      await expect(out).rejects.toThrow(/the agent gave up/);
      expect(p.effects).toHaveLength(0);
      expect(p.calls).toBe(0);
      const [op] = await ledger.admin.list({ tenant });
      expect(op).toMatchObject({ status: "pending" });
      await ledger.close();
    });

    it("a heartbeat still in flight when the call ends does not abort its signal afterwards", async () => {
      let beating!: () => void;
      const beat = new Promise<void>((r) => (beating = r));
      const slowBeat = hooked(await dialectFor(dialect, db.url()), {
        async query(q, run) {
          // A heartbeat (the lease alone) that answers late, after the action has returned.
          if (/^update "idem_operations" set "lease_expires_at"/.test(q.sql)) {
            beating();
            await sleep(scaled(400));
          }
          return run();
        },
      });
      const leaseMs = scaled(300);
      const ledger = await openTestLedger(slowBeat, { leaseMs });
      let signal: AbortSignal | undefined;
      const act = defineAction({
        type: "beat",
        capabilities: DEDUPE,
        execute: async (_a: { n: number }, op) => {
          signal = op.signal;
          await beat; // returns while a heartbeat is in flight
          return { ok: true };
        },
      });
      expect(await ledger.run(act, { tenant: uniqueTenant(), key: ["beat"], args: { n: 1 } })).toMatchObject({
        status: "succeeded",
      });
      await sleep(scaled(400) + leaseMs * 2); // the late answer, then longer than a lease
      expect(signal?.aborted).toBe(false);
      await ledger.close();
    });

    it("args an action's validate refuses reject the call as InvalidValueError with its reason; nothing is written", async () => {
      const ledger = await db.open();
      const mail = defineAction({
        type: "mail.validated",
        capabilities: DEDUPE,
        validate: (args: { subject: string }) => {
          if (!args.subject.trim()) throw new Error("email.send needs a subject");
        },
        execute: async () => ({ ok: true }),
      });
      const tenant = uniqueTenant();
      const out = ledger.run(mail, { tenant, key: ["v"], args: { subject: " " } });
      await expect(out).rejects.toBeInstanceOf(InvalidValueError);
      await expect(out).rejects.toThrow(/args: email.send needs a subject/);
      expect(await ledger.admin.list({ tenant })).toEqual([]);
    });

    it("a replay refused for auth (a token rotated) after an attempt that may have committed stays unknown, with an alert", async () => {
      const p = new TestProvider();
      const charge = p.action("charge", DEDUPE);
      const ledger = await db.open({ budget: { attempts: 1 }, actions: [charge] });
      const tenant = uniqueTenant();
      p.faults.push({ when: "after", cls: { kind: "ambiguous", reason: "timeout after sending" } });
      const first = await ledger.run(charge, { tenant, key: ["rotated"], args: { to: "x" } });
      expect(first).toMatchObject({ state: "unknown" });
      // The daemon's replay (same key) meets a revoked token: that is no answer about the first attempt.
      p.faults.push({ when: "before", cls: { kind: "permanent", reason: "401 invalid token", alert: true } });
      const again = await ledger.daemon.settle({ tenant, id: first.operationId });
      expect(again).toMatchObject({ status: "pending_verification", state: "unknown", attempt: 2 });
      expect(p.calls).toBe(2);
      expect(p.effects).toHaveLength(1);
      // Every ledger's alerts (other tests' too): this one among them.
      const alerts = await ledger.daemon.alertsDue({ limit: 100_000 });
      expect(alerts.filter((a) => a.tenant === tenant)).toMatchObject([{ status: "unknown" }]);
    });

    it("a lookup refused for good (its error classified with an alert: a credential revoked) leaves the outcome unknown, with an alert; a lookup that merely failed, none", async () => {
      const revoked = Object.assign(new Error("401 token revoked"), { status: 401 });
      const failing = new Map<string, Error>();
      const mail = defineAction({
        type: "mail.lookup-refused",
        capabilities: LOOKUP,
        execute: async (): Promise<{ ok: boolean }> => {
          throw new Error("timeout after DATA");
        },
        classify: (e) =>
          (e as { status?: number }).status === 401
            ? { kind: "permanent", reason: "401 token revoked", alert: true }
            : { kind: "ambiguous", reason: (e as Error).message },
        reconcile: async (_args, op) => {
          throw failing.get(op.id) ?? new Error("no failure set");
        },
      });
      const ledger = await db.open({ budget: { attempts: 1 }, actions: [mail] });
      const tenant = uniqueTenant();
      const refused = await ledger.run(mail, { tenant, key: ["refused"], args: { to: "x" } });
      const down = await ledger.run(mail, { tenant, key: ["down"], args: { to: "x" } });
      expect([refused, down]).toMatchObject([{ state: "unknown" }, { state: "unknown" }]);
      failing.set(refused.operationId, revoked);
      failing.set(down.operationId, Object.assign(new Error("connect ECONNREFUSED"), { code: "ECONNREFUSED" }));
      for (const op of [refused, down])
        expect(await ledger.daemon.settle({ tenant, id: op.operationId })).toMatchObject({
          status: "pending_verification",
          state: "unknown",
        });
      // Every ledger's alerts (other tests' too): the refused lookup's among them, not the other's.
      const alerts = (await ledger.daemon.alertsDue({ limit: 100_000 })).filter((a) => a.tenant === tenant);
      expect(alerts).toMatchObject([{ id: refused.operationId, status: "unknown" }]);
    });

    it("a caller that gives up during a lookup: run rejects with its reason, and the row keeps its count of checks", async () => {
      let looking!: () => void;
      const lookupStarted = new Promise<void>((r) => (looking = r));
      const mail = defineAction({
        type: "mail.lookup-abort",
        capabilities: LOOKUP,
        execute: async (): Promise<{ ok: boolean }> => {
          throw new Error("timeout after DATA");
        },
        reconcile: async () => {
          looking();
          return new Promise<never>(() => {}); // a search that never answers
        },
      });
      const tenant = uniqueTenant();
      const input = { tenant, key: ["abort-lookup"], args: {} };
      const ledger = await db.open({ budget: { attempts: 1 } });
      const first = await ledger.run(mail, input);
      expect(first).toMatchObject({ state: "unknown" });
      const checksBefore = (await ledger.get({ tenant, id: first.operationId })).operation.checks;
      // A caller whose clock sees the check due looks it up, then gives up.
      const later = await db.open({ clock: () => Date.now() + 3_600_000 });
      const caller = new AbortController();
      const second = later.run(mail, { ...input, signal: caller.signal });
      await lookupStarted;
      caller.abort(new Error("the agent gave up"));
      await expect(second).rejects.toThrow(/the agent gave up/);
      const { operation } = await ledger.get({ tenant, id: first.operationId });
      expect(operation).toMatchObject({ status: "unknown", checks: checksBefore });
      // The search is still out: closed without waiting a lease (30 s) for an answer that never comes.
      const closed = await later.close({ waitMs: 0 });
      expect(closed.lateAnswers).toEqual([{ tenant, id: first.operationId }]);
    });

    it("aborts the action's signal when its lease is lost, or when the caller aborts", async () => {
      const tenant = uniqueTenant();
      const seen: unknown[] = [];
      let entered!: () => void;
      // Waits for its signal, as an action passing it to fetch would, and reports why it stopped.
      const waiting = defineAction({
        type: "slow",
        capabilities: DEDUPE,
        execute: async (_args: { n: number }, op) => {
          entered();
          await new Promise((resolve) => op.signal.addEventListener("abort", resolve, { once: true }));
          seen.push(op.signal.reason);
          throw op.signal.reason;
        },
      });
      const quick = defineAction({ type: "slow", capabilities: DEDUPE, execute: async () => ({ ok: true }) });

      // Lease lost: another worker, whose clock says the lease expired, takes the operation over;
      // the first worker's next heartbeat finds attempt 2 and aborts attempt 1's signal.
      // Scaled: on a loaded machine a 150 ms lease may end by its own deadline before the heartbeat sees the takeover.
      const stale = await db.open({ leaseMs: scaled(150) });
      const later = await db.open({ clock: () => Date.now() + 3_600_000 });
      let inside = new Promise<void>((r) => (entered = r));
      const first = stale.run(waiting, { tenant, key: ["lost"], args: { n: 1 } });
      await inside;
      const second = await later.run(quick, { tenant, key: ["lost"], args: { n: 1 } });
      expect(second).toMatchObject({ status: "succeeded", attempt: 2 });
      expect(await first).toMatchObject({ status: "succeeded", replayed: true, attempt: 2 });
      expect(String(seen[0])).toMatch(/lease of attempt 1 lost/);

      // The caller gives up: its abort reaches the action, and run rejects with its reason.
      const caller = new AbortController();
      inside = new Promise<void>((r) => (entered = r));
      const third = stale.run(waiting, { tenant, key: ["aborted"], args: { n: 2 }, signal: caller.signal });
      await inside;
      caller.abort(new Error("the agent gave up"));
      await expect(third).rejects.toThrow(/the agent gave up/);
      expect(String(seen[1])).toMatch(/the agent gave up/);
    });

    it("generates lazy args once and sends exactly the stored content on every attempt", async () => {
      const ledger = await db.open({ budget: { baseDelayMs: 5 } });
      const p = new TestProvider();
      p.faults.push({ when: "before", cls: { kind: "transient", reason: "421 try later" } });
      let generated = 0;
      const summary = () => ({ to: `summary #${++generated}` });
      const input = { tenant: uniqueTenant(), key: ["summary", "w48"], args: summary };
      const out = await ledger.run(p.action("mail", DEDUPE), input);
      const again = await ledger.run(p.action("mail", DEDUPE), input);
      expect(out).toMatchObject({ status: "succeeded" });
      expect(again).toMatchObject({ status: "succeeded", replayed: true });
      expect(generated).toBe(1);
      expect(p.effects.map((e) => e.args)).toEqual([{ to: "summary #1" }]);
    });

    it("validates lazily generated args once, as a caller's own args are, through a retry", async () => {
      const ledger = await db.open({ budget: { baseDelayMs: 5 } });
      let validated = 0;
      let sends = 0;
      const mail = defineAction({
        type: "mail.lazy-validated",
        capabilities: DEDUPE,
        validate: (args: { to: string }) => {
          validated++;
          if (!args.to) throw new Error("mail needs a recipient");
        },
        execute: async (args: { to: string }) => {
          if (++sends === 1) throw new Error("421 try later");
          return { sentTo: args.to };
        },
        classify: (error) => ({ kind: "transient", reason: String(error) }),
      });
      const out = await ledger.run(mail, { tenant: uniqueTenant(), key: ["lazy-v"], args: () => ({ to: "a@x" }) });
      expect(out).toMatchObject({ status: "succeeded", receipt: { sentTo: "a@x" } });
      expect(sends).toBe(2);
      expect(validated).toBe(1);
    });

    it("records an audit event with the actor for every transition", async () => {
      const ledger = await db.open();
      const p = new TestProvider();
      const tenant = uniqueTenant();
      const out = await ledger.run(p.action("mail", NEITHER), {
        tenant,
        key: ["audit"],
        args: { to: "x" },
        actor: "agent-7/run-3",
      });
      const { events } = await ledger.get({ tenant, id: out.operationId });
      expect(events.map((e) => [e.from, e.to, e.actor])).toEqual([
        [null, "running", "agent-7/run-3"],
        ["running", "succeeded", "agent-7/run-3"],
      ]);
      expect(events[1]!.at).toBeGreaterThanOrEqual(events[0]!.at);
    });

    it("a permanent auth failure is stored with its alert flag for the daemon", async () => {
      const ledger = await db.open();
      const p = new TestProvider();
      p.faults.push({ when: "before", cls: { kind: "permanent", reason: "401 invalid api key", alert: true } });
      const out = await ledger.run(p.action("charge", DEDUPE), {
        tenant: uniqueTenant(),
        key: ["auth"],
        args: { to: "x" },
      });
      expect(out).toMatchObject({ status: "failed", error: { alert: true } });
    });

    it("treats an action without classify as ambiguous, never as a clean failure", async () => {
      const ledger = await db.open();
      let calls = 0;
      const raw = defineAction({
        type: "raw",
        capabilities: {},
        execute: async () => {
          calls++;
          throw new Error("ECONNRESET");
        },
      });
      const out = await ledger.run(raw, { tenant: uniqueTenant(), key: ["x"], args: {} });
      expect(out).toMatchObject({ status: "pending_verification", state: "needs_review" });
      expect(calls).toBe(1);
    });
  });
}
