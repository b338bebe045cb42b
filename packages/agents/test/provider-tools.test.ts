/**
 * The provider packages' ready tools through `guard`: HubSpot's contact tool against the HubSpot
 * sandbox (one record per address, however the model spells it or renames the person), and the
 * email tool's identity (recipient hashed, the model's wording never part of the key).
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { openLedger, operationKey, type LedgerOptions } from "@idem/core";
import { emailTools, type EmailActions } from "@idem/email";
import { hubspotActions, hubspotTools } from "@idem/hubspot";
import { stripeTools, type StripeActions } from "@idem/stripe";
import { HubSpotSandbox } from "@idem/sandbox";
import { DIALECTS, ledgersFor } from "@idem/testkit";
import { guard } from "@idem/agents";

let sandbox: HubSpotSandbox;
let server: { basePath: string; accessToken: string };
beforeAll(async () => {
  sandbox = new HubSpotSandbox();
  server = await sandbox.start();
});
afterAll(() => sandbox.close());

for (const dialect of DIALECTS) {
  describe(`provider tools on ${dialect}`, () => {
    const db = ledgersFor(dialect, openLedger, { defaults: { poolSize: 2 } as LedgerOptions });

    it("create_contact: one HubSpot record per address; the model reads done, then already done", async () => {
      const ledger = await db.open();
      const crm = hubspotActions({ accessToken: server.accessToken, basePath: server.basePath });
      await crm.ensureSchema(["contacts"]); // the unique property the external ids live in
      const tool = guard(ledger, hubspotTools(crm).createContact, { tenant: `t-${dialect}` });
      const email = `ada-${dialect}-${Math.random().toString(36).slice(2, 7)}@example.com`;
      const call = { context: undefined, callId: "c1" };
      const before = sandbox.count("contacts");
      const first = await tool({ email, firstname: "Ada", lastname: null }, call);
      const again = await tool(
        { email: email.toUpperCase(), firstname: "Ada", lastname: null },
        { ...call, callId: "c2" },
      );
      const renamed = await tool({ email, firstname: "Augusta", lastname: null }, { ...call, callId: "c3" });
      expect(first, JSON.stringify(first)).toMatchObject({
        status: "done",
        result: { id: expect.any(String), new: true },
      });
      expect(again).toMatchObject({
        status: "already_done",
        operationId: (first as { operationId: string }).operationId,
      }); // the address's case is not another contact
      expect(renamed.status).toBe("refused");
      expect(renamed.message).toMatch(/^Refused: this work \(contact …\) was already done with different arguments/);
      expect(JSON.stringify([first, again, renamed])).not.toContain(email); // the address stays out of what the key shows
      expect(sandbox.count("contacts") - before).toBe(1);
    });
  });
}

describe("send_email's identity", () => {
  it("is the reference and the recipient (hashed), never the model's subject or text", () => {
    const def = emailTools({ send: { type: "email.send" } } as unknown as EmailActions).send;
    const a = { to: "Bob@Example.com", reference: "order-42", subject: "Your order", text: "Shipped." };
    const b = { ...a, to: "bob@example.com", subject: "Order 42 update", text: "It shipped today." };
    const key = (i: typeof a) => operationKey({ tenant: "t", action: "email.send", parts: def.key(i) });
    expect(key(a).hash).toBe(key(b).hash);
    expect(key(a).label).not.toMatch(/bob/i);
    expect(key({ ...a, reference: "order-43" }).hash).not.toBe(key(a).hash);
    expect(def.args(a)).toEqual({ to: "bob@example.com", subject: a.subject, text: a.text });
  });

  it("a reference is an id, compared without surrounding spaces; free text is refused", () => {
    const def = emailTools({ send: { type: "email.send" } } as unknown as EmailActions).send;
    const base = { to: "bob@example.com", subject: "Your order", text: "Shipped." };
    const key = (reference: string) =>
      operationKey({ tenant: "t", action: "email.send", parts: def.key(def.input.parse({ ...base, reference })) }).hash;
    expect(key(" ord-42 ")).toBe(key("ord-42"));
    expect(def.input.safeParse({ ...base, reference: "the order from Monday" }).success).toBe(false);
    expect(def.input.safeParse({ ...base, reference: "  " }).success).toBe(false);
  });
});

describe("charge_invoice's identity", () => {
  it("is the invoice id without surrounding spaces, its case kept", () => {
    const def = stripeTools({
      paymentIntentsCreate: { type: "stripe.paymentIntents.create" },
    } as unknown as StripeActions).charge;
    const key = (invoiceId: string) =>
      operationKey({
        tenant: "t",
        action: "stripe.paymentIntents.create",
        parts: def.key(def.input.parse({ invoiceId, amount: 100, currency: "eur" })),
      }).hash;
    expect(key(" in_1Ab ")).toBe(key("in_1Ab"));
    expect(key("in_1ab")).not.toBe(key("in_1Ab"));
    expect(def.input.safeParse({ invoiceId: "invoice of May", amount: 100, currency: "eur" }).success).toBe(false);
  });
});

describe("send_email's description", () => {
  it("promises one email only while the ledger keeps the operation, not for ever", () => {
    // Past the ledger's retention (30 days by default) only the check before sending stands in the
    // way, and a mailbox's retention archives or deletes the copy it looks for: the same reference
    // and recipient is emailed again (found-earlier.test.ts). Before: "Safe to call again: the same
    // reference and recipient is never emailed twice", unconditionally.
    const def = emailTools({ send: { type: "email.send" } } as unknown as EmailActions).send;
    expect(def.description).toMatch(
      /while the ledger keeps the operation \(30 days by default\), it is never emailed twice/,
    );
    expect(def.description).not.toMatch(/Safe to call again/);
  });
});

describe("charge_invoice's description", () => {
  it("promises one charge only while the ledger keeps the operation, not for ever", () => {
    // A key that comes again after its operation was pruned (retentionMs, 30 days by default) and
    // after Stripe's 24 h key window is a new operation, and Stripe charges again. Before: "Safe
    // to call again for the same invoice: it is never charged twice", unconditionally.
    const def = stripeTools({
      paymentIntentsCreate: { type: "stripe.paymentIntents.create" },
    } as unknown as StripeActions).charge;
    expect(def.description).toMatch(
      /while the ledger keeps the operation \(30 days by default\), it is never charged twice/,
    );
    expect(def.description).not.toMatch(/Safe to call again for the same invoice: it is never charged twice/);
  });
});
