/**
 * OpenTelemetry traces with the SDK's in-memory exporter, on SQLite and Postgres: a guarded call
 * is one `idem.run` span with the operation, action, tenant, status, attempt and whether it was
 * replayed, and the claim, the provider call and the completion are its children; a duplicate
 * has no provider call; the daemon's settlement is an `idem.settle` span.
 */
import { context, trace } from "@opentelemetry/api";
import { AsyncLocalStorageContextManager } from "@opentelemetry/context-async-hooks";
import {
  BasicTracerProvider,
  InMemorySpanExporter,
  SimpleSpanProcessor,
  type ReadableSpan,
} from "@opentelemetry/sdk-trace-base";
import { DIALECTS } from "@idem/testkit";
import { afterAll, beforeAll, beforeEach, describe, expect, it } from "vitest";
import { ledgers, uniqueTenant } from "./support/ledgers.js";
import { TestProvider } from "./support/provider.js";

const exporter = new InMemorySpanExporter();
const contextManager = new AsyncLocalStorageContextManager();
beforeAll(() => {
  context.setGlobalContextManager(contextManager.enable());
  trace.setGlobalTracerProvider(new BasicTracerProvider({ spanProcessors: [new SimpleSpanProcessor(exporter)] }));
});
afterAll(() => {
  trace.disable();
  context.disable();
});
beforeEach(() => exporter.reset());

const named = (name: string) => exporter.getFinishedSpans().filter((s) => s.name === name);
const parentOf = (s: ReadableSpan) => s.parentSpanContext?.spanId;

for (const dialect of DIALECTS) {
  describe(`traces on ${dialect}`, () => {
    const db = ledgers(dialect);

    it("a guarded call: idem.run with the operation's attributes, and its claim, provider call and completion as children", async () => {
      const ledger = await db.open();
      const p = new TestProvider();
      const tenant = uniqueTenant();
      const out = await ledger.run(p.action("mail.send", {}), { tenant, key: ["k"], args: { to: "a" } });
      const [run] = named("idem.run");
      expect(run?.attributes).toEqual({
        "idem.action": "mail.send",
        "idem.tenant": tenant,
        "idem.operation.id": out.operationId,
        "idem.status": "succeeded",
        "idem.attempt": 1,
        "idem.replayed": false,
      });
      const children = ["idem.claim", "idem.execute", "idem.complete"].map((n) => named(n));
      for (const [span] of children) expect(parentOf(span!)).toBe(run!.spanContext().spanId);
      expect(children[0]![0]!.attributes).toMatchObject({
        "idem.claim.fresh": true,
        "idem.operation.id": out.operationId,
      });
      expect(children[1]![0]!.attributes).toMatchObject({ "idem.action": "mail.send", "idem.attempt": 1 });
      // Nothing of the args or the receipt leaves in a span.
      expect(JSON.stringify(exporter.getFinishedSpans().map((s) => s.attributes))).not.toContain('"to"');

      exporter.reset();
      await ledger.run(p.action("mail.send", {}), { tenant, key: ["k"], args: { to: "a" } });
      expect(named("idem.run")[0]?.attributes).toMatchObject({ "idem.status": "succeeded", "idem.replayed": true });
      expect(named("idem.execute")).toHaveLength(0);
    });

    it("a provider call that fails is an error span; the daemon's settlement is an idem.settle span", async () => {
      const p = new TestProvider();
      const action = p.action("sms.send", { lookup: true });
      const ledger = await db.open({ actions: [action] });
      const tenant = uniqueTenant();
      p.lookupAnswer = "inconclusive";
      p.faults.push({ when: "after", cls: { kind: "ambiguous", reason: "timeout" } });
      const out = await ledger.run(action, { tenant, key: ["k"], args: { to: "a" } });
      expect(out).toMatchObject({ status: "pending_verification", state: "unknown" });
      const [failed] = named("idem.execute");
      expect(failed?.status.code).toBe(2); // SpanStatusCode.ERROR
      expect(named("idem.run")[0]?.attributes).toMatchObject({ "idem.status": "pending_verification:unknown" });

      exporter.reset();
      p.lookupAnswer = "real"; // the provider's index caught up
      const settled = await ledger.daemon.settle({ tenant, id: out.operationId, actor: "daemon" });
      expect(settled.status).toBe("succeeded");
      const [settle] = named("idem.settle");
      expect(settle?.attributes).toMatchObject({
        "idem.operation.id": out.operationId,
        "idem.from": "unknown",
        "idem.status": "succeeded",
        "idem.attempt": settled.attempt,
      });
      // Found by lookup: no provider call, and the completion is the settlement's child.
      expect(named("idem.execute")).toHaveLength(0);
      expect(parentOf(named("idem.complete")[0]!)).toBe(settle!.spanContext().spanId);
    });

    it("follows the SDK registered now: none (no spans made: the app's own span is the active one in execute), then a new one", async () => {
      const ledger = await db.open();
      const tenant = uniqueTenant();
      let seen: unknown;
      const action = new TestProvider().action("mail.send", {});
      const probe = {
        ...action,
        execute: async (a: unknown, ctx: Parameters<typeof action.execute>[1]) => {
          seen = trace.getActiveSpan();
          return action.execute(a as never, ctx);
        },
      } as typeof action;
      await ledger.run(probe, { tenant, key: ["before"], args: { to: "a" } }); // the SDK of beforeAll
      expect(named("idem.run")).toHaveLength(1);
      exporter.reset();
      trace.disable(); // no SDK
      try {
        const outer = trace.wrapSpanContext({ traceId: "1".repeat(32), spanId: "2".repeat(16), traceFlags: 1 });
        await context.with(trace.setSpan(context.active(), outer), () =>
          ledger.run(probe, { tenant, key: ["none"], args: { to: "a" } }),
        );
        // The very object: a no-op span made in between would be another one with the same ids.
        expect(seen).toBe(outer);
        expect(exporter.getFinishedSpans()).toHaveLength(0);
        const later = new InMemorySpanExporter(); // an SDK registered after the ledger opened
        trace.setGlobalTracerProvider(new BasicTracerProvider({ spanProcessors: [new SimpleSpanProcessor(later)] }));
        await ledger.run(probe, { tenant, key: ["after"], args: { to: "a" } });
        expect(
          later
            .getFinishedSpans()
            .map((s) => s.name)
            .sort(),
        ).toEqual(["idem.claim", "idem.complete", "idem.execute", "idem.run"]);
        expect(exporter.getFinishedSpans()).toHaveLength(0);
      } finally {
        trace.disable();
        trace.setGlobalTracerProvider(new BasicTracerProvider({ spanProcessors: [new SimpleSpanProcessor(exporter)] }));
      }
    });
  });
}
