/**
 * The Stripe lookups called directly with an explicit operation, against the Stripe sandbox
 * through the real SDK: which clock the windows use, and which refunds the lookup can see.
 */
import { afterAll, afterEach, beforeAll, beforeEach, describe, expect, it } from "vitest";
import type Stripe from "stripe";
import type { OperationContext } from "@idem/core";
import { StripeSandbox } from "@idem/sandbox";
import { stripeActions } from "@idem/stripe";

const HOUR = 3_600_000;
let sandbox: StripeSandbox;
let server: { port: number; apiKey: string };
beforeAll(async () => {
  sandbox = new StripeSandbox();
  server = await sandbox.start();
});
afterAll(() => sandbox.close());

const stripe = (at = server) =>
  stripeActions({
    apiKey: at.apiKey,
    host: "127.0.0.1",
    port: at.port,
    protocol: "http",
    timeoutMs: 5_000,
    searchLagMs: 60_000,
  });
let n = 0;
const newKey = () => `key-${++n}-${Math.random().toString(36).slice(2)}`;

/** An operation as the runner hands it over; `now` is the database's time, not ours. */
function op(
  key: string,
  t: { createdAt: number; firstSentAt?: number; lastAttemptAt?: number; now: number },
): OperationContext {
  return {
    ...(t.firstSentAt !== undefined && { firstSentAt: t.firstSentAt }),
    id: `op_${key}`,
    tenant: "t",
    key,
    keyLabel: null,
    attempt: 2,
    createdAt: t.createdAt,
    lastAttemptAt: t.lastAttemptAt ?? t.createdAt,
    now: t.now,
    providerReference: null,
    signal: new AbortController().signal,
  };
}

describe("Stripe reconcile windows use op.now", () => {
  it("inside the search lag by the database clock: inconclusive, however late the process clock says it is", async () => {
    const long = Date.now() - 48 * HOUR;
    const out = await stripe().customersCreate.reconcile!(
      { email: "a@example.com" },
      op(newKey(), { createdAt: long, now: long + 1_000 }),
    );
    expect(out).toMatchObject({ found: false, proof: "inconclusive" });
  });

  it("past the key window by the database clock: absent, however early the process clock says it is", async () => {
    const now = Date.now();
    const out = await stripe().paymentIntentsCreate.reconcile!(
      { amount: 2000, currency: "usd" },
      op(newKey(), { createdAt: now, now: now + 25 * HOUR }),
    );
    expect(out).toMatchObject({ found: false, proof: "absent" });
  });

  it("without a database time it proves nothing", async () => {
    const out = await stripe().customersCreate.reconcile!(
      {},
      { ...op(newKey(), { createdAt: 0, now: 0 }), now: undefined as unknown as number },
    );
    expect(out).toMatchObject({ found: false, proof: "inconclusive" });
  });
});

describe("an intent with our key that asks for another amount or currency (helper-112, helper-114)", () => {
  it("is not taken as this operation's: a person decides, told both amounts; the same charge is", async () => {
    const s = stripe();
    const key = newKey();
    await s.client.paymentIntents.create({ amount: 2000, currency: "usd", metadata: { idem_operation: key } });
    const now = Date.now() + 120_000; // past the search lag, inside the attempts' window's slack
    const ask = (args: Record<string, unknown>) =>
      s.paymentIntentsCreate.reconcile!(args as never, op(key, { createdAt: now - 60_000, now }));
    // A JSON caller's amount as a string is the same amount to stripe-node (form-encoded).
    for (const args of [
      { amount: 3000, currency: "usd" },
      { amount: "3000", currency: "usd" },
      { amount: 2000, currency: "eur" },
    ])
      expect(await ask(args), JSON.stringify(args)).toMatchObject({
        found: false,
        proof: "never",
        reason: expect.stringMatching(/for 2000 usd where this operation asks/),
      });
    for (const args of [
      { amount: 2000, currency: "USD" },
      { amount: "2000", currency: "usd" },
    ])
      expect(await ask(args), JSON.stringify(args)).toMatchObject({ found: true });
  });
});

describe("Stripe lookups that find more than one object with our key in our window (h163)", () => {
  it("the second not in Search yet (it lags): the list of our window finds it, and the lookup says twice", async () => {
    const s = stripe();
    const key = newKey();
    const was = sandbox.searchLagMs;
    sandbox.advance(-5 * 60_000);
    const first = await s.client.paymentIntents.create({
      amount: 700,
      currency: "usd",
      metadata: { idem_operation: key },
    });
    sandbox.advance(5 * 60_000);
    sandbox.searchLagMs = 3 * 60_000; // Search shows the first, made 5 min ago, not the second, made now
    try {
      const second = await s.client.paymentIntents.create({
        amount: 700,
        currency: "usd",
        metadata: { idem_operation: key },
      });
      const now = Date.now();
      const out = await s.paymentIntentsCreate.reconcile!(
        { amount: 700, currency: "usd" },
        op(key, { createdAt: now - 6 * 60_000, lastAttemptAt: now, now: now + 25 * HOUR }),
      );
      // Before: { found: true, receipt: { id: first.id } }, no twice.
      expect(out).toMatchObject({
        found: true,
        receipt: { id: first.id },
        twice: expect.stringMatching(new RegExp(`^2 payment_intent objects carry our key.*${first.id}.*${second.id}`)),
      });
    } finally {
      sandbox.searchLagMs = was;
    }
  });

  it("two refunds with our key in our window: found, and twice", async () => {
    const s = stripe();
    const key = newKey();
    const pi = await s.client.paymentIntents.create({
      amount: 5_000,
      currency: "usd",
      payment_method: "pm_card_visa",
      confirm: true,
      automatic_payment_methods: { enabled: true, allow_redirects: "never" },
    });
    const refunds = [];
    for (let i = 0; i < 2; i++)
      refunds.push(
        await s.client.refunds.create({ payment_intent: pi.id, amount: 100, metadata: { idem_operation: key } }),
      );
    const now = Date.now();
    const out = await s.refundsCreate.reconcile!(
      { payment_intent: pi.id, amount: 100 },
      op(key, { createdAt: now - 60_000, now: now + 25 * HOUR }),
    );
    expect(out).toMatchObject({ found: true, twice: expect.stringMatching(/^2 refund objects carry our key/) });
    expect((out as { twice: string }).twice).toContain(refunds[1]!.id);
  });
});

describe("an intent with our key made with another payment method than the args name (h163)", () => {
  const at = () => {
    const now = Date.now() + 120_000; // past the search lag, inside the attempts' window's slack
    return { createdAt: now - 60_000, now };
  };

  it("is not this operation's charge: a person decides; the same card, or a test card's name, is", async () => {
    const s = stripe();
    const key = newKey();
    await s.client.paymentIntents.create({
      amount: 2000,
      currency: "usd",
      payment_method: "pm_1BobsVisa",
      confirm: true,
      automatic_payment_methods: { enabled: true, allow_redirects: "never" },
      metadata: { idem_operation: key },
    });
    const ask = (payment_method: string) =>
      s.paymentIntentsCreate.reconcile!(
        { amount: 2000, currency: "usd", payment_method, confirm: true },
        op(key, at()),
      );
    expect(await ask("pm_1AlicesVisa")).toMatchObject({
      found: false,
      proof: "never",
      reason: expect.stringMatching(
        /made with the payment method pm_1BobsVisa where this operation names pm_1AlicesVisa/,
      ),
    });
    expect(await ask("pm_1BobsVisa")).toMatchObject({ found: true });
    // Stripe makes a payment method of its own for a test card's name: the intent never carries it.
    expect(await ask("pm_card_visa")).toMatchObject({ found: true });
  });

  it("declined on another card (the card on its last_payment_error): a person decides, not read as our decline", async () => {
    const s = stripe();
    const key = newKey();
    const declined = await s.client.paymentIntents
      .create({
        amount: 2000,
        currency: "usd",
        payment_method: "pm_card_chargeDeclined",
        confirm: true,
        automatic_payment_methods: { enabled: true, allow_redirects: "never" },
        metadata: { idem_operation: key },
      })
      .catch((e: { code?: string; payment_method?: { id: string } }) => e);
    expect(declined).toMatchObject({ code: "card_declined" });
    // The payment method Stripe made for the test card's name, named on the intent's last_payment_error.
    const tried = (declined as { payment_method: { id: string } }).payment_method.id;
    const out = await s.paymentIntentsCreate.reconcile!(
      { amount: 2000, currency: "usd", payment_method: "pm_1AlicesVisa", confirm: true },
      op(key, at()),
    );
    // Before: { found: false, proof: "refused" }: Alice's card read as declined, though never tried.
    expect(out).toMatchObject({
      found: false,
      proof: "never",
      reason: expect.stringContaining(
        `made with the payment method ${tried} where this operation names pm_1AlicesVisa`,
      ),
    });
  });
});

describe("an intent with our key made with another card given inline (payment_method_data)", () => {
  const at = () => {
    const now = Date.now() + 120_000; // past the search lag, inside the attempts' window's slack
    return { createdAt: now - 60_000, now };
  };
  type Data = Stripe.PaymentIntentCreateParams.PaymentMethodData;
  const bobs = {
    type: "card",
    card: { number: "4242424242424242", exp_month: 12, exp_year: 2034, cvc: "123" },
    billing_details: { name: "Bob", email: "bob@example.com" },
  } as unknown as Data;

  it("is not this operation's charge: a person decides; the same card, its values form-encoded, is", async () => {
    const s = stripe();
    const key = newKey();
    const made = await s.client.paymentIntents.create({
      amount: 2000,
      currency: "usd",
      payment_method_data: bobs,
      confirm: true,
      automatic_payment_methods: { enabled: true, allow_redirects: "never" },
      metadata: { idem_operation: key },
    });
    const ask = (payment_method_data: unknown) =>
      s.paymentIntentsCreate.reconcile!(
        { amount: 2000, currency: "usd", payment_method_data: payment_method_data as Data, confirm: true },
        op(key, at()),
      );
    const person = (what: RegExp) => ({ found: false, proof: "never", reason: expect.stringMatching(what) });
    // Before: { found: true }, Alice's card read as charged, though never tried.
    expect(
      await ask({ ...bobs, card: { number: "5555555555554444", exp_month: 12, exp_year: 2034, cvc: "1" } }),
    ).toMatchObject(person(new RegExp(`${made.payment_method as string} .*card ending 4242.*not the card`)));
    expect(await ask({ ...bobs, billing_details: { name: "Alice" } })).toMatchObject(person(/billing name/));
    expect(await ask({ ...bobs, card: { number: "4242424242424242", exp_month: 1, exp_year: 2034 } })).toMatchObject(
      person(/expiry/),
    );
    // The same card, as stripe-node sends it (strings, a two-digit year, spaces, the email's case).
    const same = {
      type: "card",
      card: { number: "4242 4242 4242 4242", exp_month: "12", exp_year: "34", cvc: "123" },
      billing_details: { name: "Bob", email: "Bob@Example.com" },
    };
    expect(await ask(same)).toMatchObject({ found: true, receipt: { id: made.id } });
    // A test token's card is known (tok_visa: a Visa ending 4242): the same card, by its last four digits.
    expect(await ask({ type: "card", card: { token: "tok_visa" } })).toMatchObject({ found: true });
  });

  it("given by token: a test token's card is compared by brand and last four digits; a token whose card cannot be known is not taken as ours", async () => {
    const s = stripe();
    const key = newKey();
    const made = await s.client.paymentIntents.create({
      amount: 2000,
      currency: "usd",
      payment_method_data: { type: "card", card: { token: "tok_mastercard" } } as unknown as Data,
      confirm: true,
      automatic_payment_methods: { enabled: true, allow_redirects: "never" },
      metadata: { idem_operation: key },
    });
    const ask = (token: string) =>
      s.paymentIntentsCreate.reconcile!(
        {
          amount: 2000,
          currency: "usd",
          payment_method_data: { type: "card", card: { token } } as unknown as Data,
          confirm: true,
        },
        op(key, at()),
      );
    // Before: { found: true } for each, the Mastercard's charge read as the Visa's.
    expect(await ask("tok_visa")).toMatchObject({
      found: false,
      proof: "never",
      reason: expect.stringMatching(
        new RegExp(`${made.payment_method as string} \\(the card ending 4444\\).*another card brand, card number`),
      ),
    });
    expect(await ask("tok_mastercard")).toMatchObject({ found: true, receipt: { id: made.id } });
    // A token made by Stripe.js names a card only Stripe knows: nothing to compare, a person decides.
    expect(await ask("tok_1N3T00LkdIwHu7ixt44h1F8k")).toMatchObject({
      found: false,
      proof: "never",
      reason: expect.stringMatching(/by the token tok_1N3T00LkdIwHu7ixt44h1F8k, whose card cannot be compared/),
    });
  });
});

describe("Stripe lookups inside the key window, with Search far behind (an incident)", () => {
  const lagging = async <T>(fn: () => Promise<T>): Promise<T> => {
    const was = sandbox.searchLagMs;
    sandbox.searchLagMs = 10 * 60_000; // Search ten minutes behind
    try {
      return await fn();
    } finally {
      sandbox.searchLagMs = was;
    }
  };

  for (const age of [1, 23.5])
    it(`a payment intent created ${age} h ago that Search does not show yet is found by the list, not declared absent`, async () => {
      const s = stripe();
      const key = newKey();
      const now = Date.now();
      // Our request created it (our marker on it); its answer was lost.
      await s.client.paymentIntents.create({ amount: 700, currency: "usd", metadata: { idem_operation: key } });
      const out = await lagging(() =>
        s.paymentIntentsCreate.reconcile!(
          { amount: 700, currency: "usd" },
          op(key, { createdAt: now - age * HOUR, lastAttemptAt: now - 2 * 60_000, now }),
        ),
      );
      // Before: "absent at Stripe, but Stripe saved an error …: retry with a new revision" (a second charge).
      expect(out).toMatchObject({ found: true, receipt: { object: "payment_intent" } });
    });

  it("absent by the list too, inside the key window: a person decides, told what was read and when the key is forgotten", async () => {
    const now = Date.now();
    const out = await lagging(() =>
      stripe().paymentIntentsCreate.reconcile!(
        { amount: 700, currency: "usd" },
        op(newKey(), { createdAt: now - 23.5 * HOUR, lastAttemptAt: now - 2 * 60_000, now }),
      ),
    );
    expect(out).toMatchObject({
      found: false,
      proof: "never",
      reason: expect.stringMatching(/nor in the list .* holds our key 30 min more/),
    });
  });

  it("the key window counts from the key's first request, not the operation's creation: created 25 h ago, first sent 1 h ago, Stripe still holds it", async () => {
    const now = Date.now();
    const out = await lagging(() =>
      stripe().paymentIntentsCreate.reconcile!(
        { amount: 700, currency: "usd" },
        op(newKey(), { createdAt: now - 25 * HOUR, firstSentAt: now - HOUR, lastAttemptAt: now - 2 * 60_000, now }),
      ),
    );
    // Before: "absent" (the key forgotten 24 h after creation), and a retry with it could only
    // replay what Stripe saved, or (with a new revision) charge again.
    expect(out).toMatchObject({
      found: false,
      proof: "never",
      reason: expect.stringMatching(/holds our key 1380 min more/),
    });
  });
});

describe("Stripe lookups with the ledger's clock off Stripe's", () => {
  // Our request made the object (our key on it) at Stripe's time; the ledger, whose clock is `offMin`
  // off Stripe's, puts our attempts elsewhere. Stripe forgot the key long ago (25 h).
  const skewed = (offMin: number) => {
    const at = Date.now() + offMin * 60_000;
    return { createdAt: at, lastAttemptAt: at, now: at + 25 * HOUR };
  };
  const madeWithOurKey = async (s: ReturnType<typeof stripe>, key: string) =>
    s.client.paymentIntents.create({ amount: 700, currency: "usd", metadata: { idem_operation: key } });
  const withSearch = async <T>(how: "down" | "behind", fn: () => Promise<T>): Promise<T> => {
    const was = sandbox.searchLagMs;
    if (how === "down") sandbox.faults.add({ kind: "unavailable", match: { path: "/search" }, times: 1_000 });
    else sandbox.searchLagMs = 10 * 60_000;
    try {
      return await fn();
    } finally {
      sandbox.faults.clear();
      sandbox.searchLagMs = was;
    }
  };
  const personDecides = {
    found: false,
    proof: "never",
    reason: expect.stringMatching(/carries our key but was created .* outside our attempts' window .*clock/),
  };

  for (const offMin of [6, -11]) {
    it(`clock ${offMin} min off: Search's hit outside our attempts' window is a person's question, not absence`, async () => {
      const s = stripe();
      const key = newKey();
      await madeWithOurKey(s, key);
      const out = await s.paymentIntentsCreate.reconcile!({ amount: 700, currency: "usd" }, op(key, skewed(offMin)));
      expect(out).toMatchObject(personDecides);
    });

    for (const how of ["down", "behind"] as const)
      it(`clock ${offMin} min off, Search ${how}: the list reads the wider band and finds it too`, async () => {
        const s = stripe();
        const key = newKey();
        await madeWithOurKey(s, key);
        const out = await withSearch(how, () =>
          s.paymentIntentsCreate.reconcile!({ amount: 700, currency: "usd" }, op(key, skewed(offMin))),
        );
        expect(out).toMatchObject(personDecides);
      });
  }

  it("an object with our key inside our attempts' window is ours, though another with it sits in the band", async () => {
    const s = stripe();
    const key = newKey();
    await madeWithOurKey(s, key); // an earlier operation with this key, 3 h before ours (by the moved clock below)
    sandbox.advance(3 * HOUR);
    try {
      const ours = await madeWithOurKey(s, key);
      const at = Date.now() + 3 * HOUR;
      const t = { createdAt: at, lastAttemptAt: at, now: at + 25 * HOUR };
      expect(await s.paymentIntentsCreate.reconcile!({ amount: 700, currency: "usd" }, op(key, t))).toMatchObject({
        found: true,
        receipt: { id: ours.id },
      });
      expect(
        await withSearch("down", () => s.paymentIntentsCreate.reconcile!({ amount: 700, currency: "usd" }, op(key, t))),
      ).toMatchObject({ found: true, receipt: { id: ours.id } });
    } finally {
      sandbox.advance(-3 * HOUR);
    }
  });

  it("an object with our key from more than a day outside the window stays an earlier operation's: absent", async () => {
    const s = stripe();
    const key = newKey();
    await madeWithOurKey(s, key);
    const at = Date.now() + 26 * HOUR;
    const out = await s.paymentIntentsCreate.reconcile!(
      { amount: 700, currency: "usd" },
      op(key, { createdAt: at, lastAttemptAt: at, now: at + 25 * HOUR }),
    );
    expect(out).toMatchObject({ found: false, proof: "absent" });
  });

  it("a refund with our key, the clock 6 min off: a person decides, not refunded again", async () => {
    const s = stripe();
    const key = newKey();
    const pi = await s.client.paymentIntents.create({
      amount: 5_000,
      currency: "usd",
      payment_method: "pm_card_visa",
      confirm: true,
      automatic_payment_methods: { enabled: true, allow_redirects: "never" },
    });
    await s.client.refunds.create({ payment_intent: pi.id, amount: 100, metadata: { idem_operation: key } });
    const out = await s.refundsCreate.reconcile!({ payment_intent: pi.id, amount: 100 }, op(key, skewed(6)));
    expect(out).toMatchObject(personDecides);
  });
});

describe("Stripe lookups past Search's first page", () => {
  it("ours behind ten earlier operations' objects with the same key (Search's first page): found by the list, not declared absent", async () => {
    const s = stripe();
    const key = newKey();
    // Ten operations with this key, pruned from the ledger since, made intents three days ago.
    sandbox.advance(-72 * HOUR);
    try {
      for (let i = 0; i < 10; i++)
        await s.client.paymentIntents.create({ amount: 700, currency: "usd", metadata: { idem_operation: key } });
    } finally {
      sandbox.advance(72 * HOUR);
    }
    const ours = await s.client.paymentIntents.create({
      amount: 700,
      currency: "usd",
      metadata: { idem_operation: key },
    });
    const firstPage = await s.client.paymentIntents.search({ query: `metadata['idem_operation']:'${key}'`, limit: 10 });
    expect(firstPage.has_more).toBe(true);
    expect(firstPage.data.map((p) => p.id)).not.toContain(ours.id);
    const now = Date.now();
    const out = await s.paymentIntentsCreate.reconcile!(
      { amount: 700, currency: "usd" },
      op(key, { createdAt: now, lastAttemptAt: now, now: now + 25 * HOUR }),
    );
    expect(out).toMatchObject({ found: true, receipt: { id: ours.id } });
  });
});

describe("Stripe lookups through a list of 2,000 objects (the most one lookup reads)", () => {
  // A sandbox of its own: these objects would crowd every other lookup's window.
  let crowd: StripeSandbox;
  let at: { port: number; apiKey: string };
  beforeEach(async () => {
    crowd = new StripeSandbox();
    at = await crowd.start();
  });
  afterEach(() => crowd.close());

  /** `total` customers made now, ours (with our key) at `oursAt` in the list's order (newest first, 1-based), if any. */
  const crowded = (total: number, key: string, oursAt?: number) => {
    for (let i = total; i >= 1; i--)
      crowd.objects.create("customers", i === oursAt ? { metadata: { idem_operation: key } } : {});
  };
  const tooMany = {
    found: false,
    proof: "never",
    reason: expect.stringMatching(/more than 2000 objects were created around our attempts/),
  };
  const absent = { found: false, proof: "absent" };

  it.each([
    ["2,000 in the list, ours read first", 2_000, 1, "found"],
    ["2,001 in the list, ours the 2,000th read", 2_001, 2_000, "found"],
    ["exactly 2,000 in the list, none ours: the list ended", 2_000, undefined, absent],
    ["2,001 in the list, none ours", 2_001, undefined, tooMany],
    ["2,001 in the list, ours the 2,001st (past the bound)", 2_001, 2_001, tooMany],
  ] as const)("Search down, %s", async (_, total, oursAt, expected) => {
    const key = newKey();
    crowded(total, key, oursAt);
    crowd.faults.add({ kind: "unavailable", match: { path: "/search" }, times: 1_000 });
    const now = Date.now();
    const out = await stripe(at).customersCreate.reconcile!(
      {},
      op(key, { createdAt: now, lastAttemptAt: now, now: now + 25 * HOUR }),
    );
    const ours = crowd.objects.all("customers").find((c) => c.metadata.idem_operation === key);
    // Before: "more than 2000 objects were created around our attempts", ours found or the list ended.
    expect(out).toMatchObject(expected === "found" ? { found: true, receipt: { id: ours!.id } } : expected);
    // The window's list: never more than the bound's 20 pages and the one that shows a 2,001st;
    // then, ours not in it, one page of each (empty) day either side.
    const listed = crowd.requests.filter((r) => r.method === "GET" && r.path === "/v1/customers");
    expect(listed.length).toBeLessThanOrEqual(21 + 2);
  });
});

describe("Stripe refund lookup through the refunds of a payment intent with 2,000 (the most one lookup reads)", () => {
  let crowd: StripeSandbox;
  let at: { port: number; apiKey: string };
  beforeEach(async () => {
    crowd = new StripeSandbox();
    at = await crowd.start();
  });
  afterEach(() => crowd.close());

  /** A payment intent with `total` refunds made now, ours at `oursAt` in the list's order (newest first, 1-based), if any. */
  const refunded = async (total: number, key: string, oursAt?: number) => {
    const pi = await stripe(at).client.paymentIntents.create({
      amount: 1_000_000,
      currency: "usd",
      payment_method: "pm_card_visa",
      confirm: true,
      automatic_payment_methods: { enabled: true, allow_redirects: "never" },
    });
    for (let i = total; i >= 1; i--)
      crowd.objects.create("refunds", {
        payment_intent: pi.id,
        amount: 1,
        ...(i === oursAt && { metadata: { idem_operation: key } }),
      });
    return pi.id;
  };
  const tooMany = {
    found: false,
    proof: "never",
    reason: expect.stringMatching(/more than 2000 refunds .* none with our key among the newest 2000 read/),
  };

  it.each([
    ["2,001 refunds, ours the 2,000th read", 2_001, 2_000, "found"],
    ["exactly 2,000 refunds, none ours: the list ended", 2_000, undefined, { found: false, proof: "absent" }],
    ["2,001 refunds, none ours", 2_001, undefined, tooMany],
    ["2,001 refunds, ours the 2,001st (past the bound)", 2_001, 2_001, tooMany],
  ] as const)("%s", async (_, total, oursAt, expected) => {
    const key = newKey();
    const pi = await refunded(total, key, oursAt);
    const now = Date.now();
    const out = await stripe(at).refundsCreate.reconcile!(
      { payment_intent: pi, amount: 1 },
      op(key, { createdAt: now - 25 * HOUR, lastAttemptAt: now, now }),
    );
    const ours = crowd.objects.all("refunds").find((r) => r.metadata.idem_operation === key);
    // Before: every page was read: 2,001 none ours "absent" (refunded again), 2,001st found.
    expect(out).toMatchObject(expected === "found" ? { found: true, receipt: { id: ours!.id } } : expected);
    const listed = crowd.requests.filter((r) => r.method === "GET" && r.path === "/v1/refunds");
    expect(listed.length).toBeLessThanOrEqual(21);
  });
});

describe("Stripe refund lookup", () => {
  // Stripe forgot the key (first sent 25 h ago); the last attempt ran now, when these refunds are made:
  // only an object made while our requests could have run is ours.
  const past = () => ({ createdAt: Date.now() - 25 * HOUR, lastAttemptAt: Date.now(), now: Date.now() });
  let pi: Stripe.PaymentIntent;
  beforeAll(async () => {
    pi = await stripe().client.paymentIntents.create({
      amount: 50_000,
      currency: "usd",
      payment_method: "pm_card_visa",
      confirm: true,
      automatic_payment_methods: { enabled: true, allow_redirects: "never" },
    });
  });

  it("reads every page: the refund past the first 100 of its payment intent is found", async () => {
    const s = stripe();
    const key = newKey();
    const ours = await s.client.refunds.create({ payment_intent: pi.id, amount: 1, metadata: { idem_operation: key } });
    for (let i = 0; i < 110; i++) await s.client.refunds.create({ payment_intent: pi.id, amount: 1 }); // newer, listed first
    const out = await s.refundsCreate.reconcile!({ payment_intent: pi.id, amount: 1 }, op(key, past()));
    expect(out).toMatchObject({ found: true, receipt: { id: ours.id, object: "refund" } });
    expect(await s.refundsCreate.reconcile!({ payment_intent: pi.id, amount: 1 }, op(newKey(), past()))).toMatchObject({
      found: false,
      proof: "absent",
    });
  });

  it("not found: the reason names the list it read to its end (the refunds of that payment intent or charge), as a charge's names the objects created around our attempts", async () => {
    const s = stripe();
    const charge = pi.latest_charge as string;
    // Before: "not in any page of the list", and "absent at Stripe (in no page of the list)" while
    // Stripe held the key: which list was read, an operator could not tell.
    expect(await s.refundsCreate.reconcile!({ payment_intent: pi.id, amount: 1 }, op(newKey(), past()))).toMatchObject({
      found: false,
      proof: "absent",
      reason: `not in any page of the refunds of the payment intent ${pi.id} (read to its end)`,
    });
    const now = Date.now();
    expect(
      await s.refundsCreate.reconcile!(
        { charge, amount: 1 },
        op(newKey(), { createdAt: now - HOUR, lastAttemptAt: now, now }),
      ),
    ).toMatchObject({
      found: false,
      proof: "never",
      reason: expect.stringMatching(
        new RegExp(
          `^absent at Stripe \\(in no page of the refunds of the charge ${charge}, read to its end\\), but Stripe holds our key`,
        ),
      ),
    });
  });

  it("finds a refund made by charge", async () => {
    const s = stripe();
    const key = newKey();
    const charge = pi.latest_charge as string;
    const ours = await s.client.refunds.create({ charge, amount: 5, metadata: { idem_operation: key } });
    const out = await s.refundsCreate.reconcile!({ charge, amount: 5 }, op(key, past()));
    expect(out).toMatchObject({ found: true, receipt: { id: ours.id } });
  });

  it("with neither charge nor payment_intent, absence can never be proven", async () => {
    const sent = sandbox.requests.length;
    const out = await stripe().refundsCreate.reconcile!({ amount: 5 }, op(newKey(), past()));
    expect(out).toMatchObject({
      found: false,
      proof: "never",
      reason: expect.stringMatching(/neither a charge nor a payment_intent/),
    });
    expect(sandbox.requests.length).toBe(sent);
  });
});
