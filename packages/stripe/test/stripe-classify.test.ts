/** classifyStripeError against the SDK's own error classes, one case per reason. */
import { describe, expect, it } from "vitest";
import { createServer, type AddressInfo, type Socket } from "node:net";
import { setTimeout as sleep } from "node:timers/promises";
import Stripe from "stripe";
import { openLedger } from "@idem/core";
import { scaled, untrustedServer } from "@idem/testkit";
import { classifyStripeError, StripeDeadlineError, stripeActions } from "@idem/stripe";

const E = Stripe.errors;
const raw = (statusCode: number, extra: Record<string, unknown> = {}) => ({
  statusCode,
  requestId: "req_123",
  message: "m",
  headers: {},
  ...extra,
});

describe("classifyStripeError", () => {
  it.each([
    [
      "a card decline",
      new E.StripeCardError(raw(402, { code: "card_declined", decline_code: "insufficient_funds" })),
      { kind: "permanent", providerRequestId: "req_123" },
    ],
    [
      "a validation error",
      new E.StripeInvalidRequestError(raw(400, { code: "parameter_missing" })),
      { kind: "permanent" },
    ],
    ["a missing resource", new E.StripeInvalidRequestError(raw(404)), { kind: "permanent" }],
    ["a bad API key", new E.StripeAuthenticationError(raw(401)), { kind: "permanent", alert: true }],
    // refused before Stripe's idempotency layer, for this process's setup (its apiVersion): a person must know
    [
      "an API version Stripe does not know",
      E.StripeError.generate(
        raw(400, { type: "invalid_request_error", message: "Invalid Stripe API version: 2024-13-45" }),
      ),
      { kind: "permanent", alert: true, providerRequestId: "req_123" },
    ],
    ["a permission denial", new E.StripePermissionError(raw(403)), { kind: "permanent", alert: true }],
    // a request with our key already ran: its effect stands, never "failed"; looked up, not replayed.
    // Built as stripe-node builds an answer's error (StripeError.generate is its generateV1Error):
    // a StripeIdempotencyError only for a 400 or 404 of type idempotency_error.
    [
      "the key reused with other parameters",
      E.StripeError.generate(raw(400, { type: "idempotency_error" })),
      { kind: "ambiguous", replayable: false },
    ],
    // proves nothing about the earlier request with our key: unknown, replayed later (never "nothing
    // happened"). A 409 is a StripeAPIError to stripe-node, whatever its type.
    [
      "our key still in flight at Stripe",
      E.StripeError.generate(raw(409, { type: "idempotency_error", code: "idempotency_key_in_use" })),
      { kind: "ambiguous" },
    ],
    ["another 409 conflict", new E.StripeAPIError(raw(409, { code: "some_conflict" })), { kind: "ambiguous" }],
    [
      "a rate limit with Retry-After",
      new E.StripeRateLimitError(raw(429, { headers: { "retry-after": "3" } })),
      { kind: "rate_limited", retryAfterMs: 3000 },
    ],
    ["a rate limit without it", new E.StripeRateLimitError(raw(429)), { kind: "rate_limited", retryAfterMs: 1000 }],
    // API versions before 2015-09-08 answered a rate limit so: not a refusal of the request
    [
      "a rate limit answered as a 400 rate_limit (stripe-node's reading of it)",
      E.StripeError.generate(raw(400, { type: "invalid_request_error", code: "rate_limit" })),
      { kind: "rate_limited", retryAfterMs: 1000, providerRequestId: "req_123" },
    ],
    [
      "a 400 rate_limit Stripe replays from our key",
      new E.StripeRateLimitError(raw(400, { code: "rate_limit", headers: { "idempotent-replayed": "true" } })),
      { kind: "ambiguous", replayable: false },
    ],
    // Stripe saves what a request that began executing answered, a 5xx too: a 503 may follow a charge
    ["a 503 that is not a replay", new E.StripeAPIError(raw(503)), { kind: "ambiguous" }],
    ["a 500 saved under the key", new E.StripeAPIError(raw(500)), { kind: "ambiguous", replayable: false }],
    // Stripe's replay of what it saved under the key: an execution began, whatever the status says
    [
      "a 503 Stripe replays from our key",
      new E.StripeAPIError(raw(503, { headers: { "idempotent-replayed": "true" } })),
      { kind: "ambiguous", replayable: false },
    ],
    [
      "a 429 Stripe replays from our key",
      new E.StripeRateLimitError(raw(429, { headers: { "idempotent-replayed": "true" } })),
      { kind: "ambiguous", replayable: false },
    ],
    // a gateway's answer: the request may still run and save its own answer, which a replay returns
    ["a 502 from a gateway", new E.StripeAPIError(raw(502)), { kind: "ambiguous" }],
    ["a 504 from a gateway", new E.StripeAPIError(raw(504)), { kind: "ambiguous" }],
    [
      "a refused connection",
      new E.StripeConnectionError({ message: "m", detail: { code: "ECONNREFUSED" } }),
      { kind: "transient" },
    ],
    [
      "a host unreachable at connect: never sent",
      new E.StripeConnectionError({
        message: "m",
        detail: Object.assign(new Error("m"), { code: "EHOSTUNREACH", syscall: "connect" }),
      }),
      { kind: "transient" },
    ],
    [
      "a host unreachable on an open connection: may have run",
      new E.StripeConnectionError({
        message: "m",
        detail: Object.assign(new Error("m"), { code: "EHOSTUNREACH", syscall: "read" }),
      }),
      { kind: "ambiguous" },
    ],
    [
      "a timeout after sending",
      new E.StripeConnectionError({
        message: "Request aborted due to timeout being reached (5000ms)",
        detail: { code: "ETIMEDOUT" },
      }),
      { kind: "ambiguous" },
    ],
    [
      "a reset after sending",
      new E.StripeConnectionError({ message: "m", detail: { code: "ECONNRESET" } }),
      { kind: "ambiguous" },
    ],
    ["something that is not a Stripe error", new TypeError("boom"), { kind: "ambiguous" }],
  ])("%s", (_what, error, expected) => {
    expect(classifyStripeError(error)).toMatchObject(expected);
  });

  it("reads idempotency_key_in_use as our key still executing whatever the status and type say, never as other parameters or a refusal", () => {
    // Stripe documents the code (a request with the key is executing), not its status: answered as
    // a 400, stripe-node makes it a StripeIdempotencyError (type idempotency_error) or a
    // StripeInvalidRequestError. Read as "other parameters" it was looked up as if done; read as a
    // validation error it was "failed" while the earlier attempt could still charge.
    for (const type of ["idempotency_error", "invalid_request_error"])
      for (const statusCode of [400, 409]) {
        const error = E.StripeError.generate(raw(statusCode, { type, code: "idempotency_key_in_use" }));
        const cls = classifyStripeError(error);
        expect(cls, `${statusCode} ${type}`).toMatchObject({ kind: "ambiguous", providerRequestId: "req_123" });
        expect(cls.kind === "ambiguous" && cls.replayable, `${statusCode} ${type}`).not.toBe(false);
        expect(cls.reason, `${statusCode} ${type}`).toMatch(/still executing/);
      }
  });

  it("leaves a 409 replayable: a later replay with the key returns what Stripe saved", () => {
    const error = E.StripeError.generate(raw(409, { type: "idempotency_error", code: "idempotency_key_in_use" }));
    expect(error).toBeInstanceOf(E.StripeAPIError); // as stripe-node makes a 409, never a StripeIdempotencyError
    const cls = classifyStripeError(error);
    expect(cls).toMatchObject({ kind: "ambiguous", providerRequestId: "req_123" });
    expect(cls.kind === "ambiguous" && cls.replayable).not.toBe(false);
    expect(cls.reason).toMatch(/still executing/);
  });

  it("leaves a 503 and a gateway's 502 and 504 replayable: the request may still run and save its answer under our key", () => {
    for (const status of [502, 503, 504]) {
      const cls = classifyStripeError(new E.StripeAPIError(raw(status)));
      expect(cls.kind === "ambiguous" && cls.replayable).not.toBe(false);
    }
  });

  it("reads a 400 that names an api_version parameter, or only mentions a version, as the request's own refusal: no alert", () => {
    for (const error of [
      // the request's own argument (a webhook endpoint's api_version): Stripe's answer for it
      new E.StripeInvalidRequestError(
        raw(400, {
          type: "invalid_request_error",
          param: "api_version",
          message: "Invalid Stripe API version: 2024-13-45",
        }),
      ),
      new E.StripeInvalidRequestError(
        raw(400, { type: "invalid_request_error", message: "This API version does not support the parameter." }),
      ),
    ]) {
      const cls = classifyStripeError(error);
      expect(cls.kind).toBe("permanent");
      expect(cls.kind === "permanent" && cls.alert).toBeFalsy();
    }
  });

  it("says a refused API version is this process's setting, with Stripe's words", () => {
    const cls = classifyStripeError(
      new E.StripeInvalidRequestError(
        raw(400, { type: "invalid_request_error", message: "Invalid Stripe API version: 2024-13-45" }),
      ),
    );
    // Before: permanent without an alert, "StripeInvalidRequestError: Invalid Stripe API version: 2024-13-45".
    expect(cls).toEqual({
      kind: "permanent",
      alert: true,
      providerRequestId: "req_123",
      reason:
        "Stripe does not know the API version this process sends (its apiVersion setting): StripeInvalidRequestError: Invalid Stripe API version: 2024-13-45",
    });
  });

  it("keeps the decline code in the reason", () => {
    const cls = classifyStripeError(
      new E.StripeCardError(raw(402, { code: "card_declined", decline_code: "insufficient_funds" })),
    );
    expect(cls.reason).toMatch(/card_declined.*insufficient_funds/);
  });

  it("names the payment intent a decline created (the evidence an operator looks for), and none of its card", () => {
    const intent = {
      id: "pi_declined",
      object: "payment_intent",
      status: "requires_payment_method",
      last_payment_error: {
        code: "card_declined",
        payment_method: {
          id: "pm_1",
          billing_details: { name: "Ada Lovelace" },
          card: { last4: "0002", exp_year: 2031 },
        },
      },
    };
    const cls = classifyStripeError(
      new E.StripeCardError(
        raw(402, { code: "card_declined", decline_code: "generic_decline", payment_intent: intent }),
      ),
    );
    // Before: "StripeCardError card_declined: m (generic_decline)", the request id only.
    expect(cls).toMatchObject({ kind: "permanent", providerRequestId: "req_123" });
    expect(cls.reason).toMatch(/card_declined.*generic_decline.*payment intent pi_declined/);
    expect(cls.reason).not.toMatch(/0002|2031|Ada|pm_1/);
  });

  it("gives a decline's payment intent and codes as evidence fields, and nothing of its card", () => {
    const intent = {
      id: "pi_declined",
      object: "payment_intent",
      last_payment_error: { code: "card_declined", payment_method: { id: "pm_1", card: { last4: "0002" } } },
    };
    const cls = classifyStripeError(
      new E.StripeCardError(
        raw(402, { code: "card_declined", decline_code: "insufficient_funds", payment_intent: intent }),
      ),
    );
    // Before: only in the reason's text.
    expect(cls).toMatchObject({ kind: "permanent" });
    expect(cls.kind === "permanent" && cls.evidence).toEqual({
      payment_intent: "pi_declined",
      code: "card_declined",
      decline_code: "insufficient_funds",
    });
    // A validation error names its code; one with none has no evidence.
    const invalid = classifyStripeError(new E.StripeInvalidRequestError(raw(400, { code: "parameter_missing" })));
    expect(invalid.kind === "permanent" && invalid.evidence).toEqual({ code: "parameter_missing" });
    const bare = classifyStripeError(new E.StripeInvalidRequestError(raw(404)));
    expect(bare.kind === "permanent" && bare.evidence).toBeUndefined();
  });

  it("reads an answer that says nothing was done as unknown when stripe-node had sent the request more than once", () => {
    const limited = new E.StripeRateLimitError(raw(429));
    const declined = new E.StripeCardError(raw(402, { code: "card_declined" }));
    expect(classifyStripeError(limited)).toMatchObject({ kind: "rate_limited" });
    expect(classifyStripeError(limited, true)).toMatchObject({ kind: "ambiguous", providerRequestId: "req_123" });
    const refused = new E.StripeConnectionError({ message: "m", detail: { code: "ECONNREFUSED" } });
    expect(classifyStripeError(refused)).toMatchObject({ kind: "transient" });
    expect(classifyStripeError(refused, true)).toMatchObject({ kind: "ambiguous" });
    // Stripe's answer for the key (saved under it): the same whichever send it answered.
    expect(classifyStripeError(declined, true)).toMatchObject({ kind: "permanent" });
    // Refused before Stripe reads the key (our credentials, our API version): the last send's alone, still alerted.
    for (const denied of [
      new E.StripeAuthenticationError(raw(401)),
      new E.StripePermissionError(raw(403)),
      new E.StripeInvalidRequestError(
        raw(400, { type: "invalid_request_error", message: "Invalid Stripe API version: 2024-13-45" }),
      ),
    ]) {
      expect(classifyStripeError(denied)).toMatchObject({ kind: "permanent", alert: true });
      expect(classifyStripeError(denied, true)).toMatchObject({ kind: "ambiguous", alert: true });
    }
  });
});

describe("a Stripe endpoint whose certificate this process does not trust (a TLS-inspecting proxy)", () => {
  it("fails the call as not sent, alerted: the handshake failed before the request, and a retry meets the same certificate", async () => {
    // Before: "connection lost after sending", ambiguous: unknown, looked up (and refused alike) until a person.
    const server = await untrustedServer();
    const ledger = await openLedger("sqlite::memory:");
    try {
      const { port } = new URL(server.basePath);
      const stripe = stripeActions({ apiKey: "sk_test_x", host: "127.0.0.1", port: Number(port), protocol: "https" });
      const out = await ledger.run(stripe.customersCreate, { tenant: "t", key: ["tls"], args: { email: "a@b.c" } });
      expect(out).toMatchObject({
        status: "failed",
        error: {
          kind: "permanent",
          alert: true,
          reason: expect.stringMatching(/^not sent: Stripe's certificate is not trusted .*DEPTH_ZERO_SELF_SIGNED_CERT/),
        },
      });
      expect(server.requests()).toBe(0);
    } finally {
      await ledger.close();
      await server.close();
    }
  });
});

describe("a request cut at its deadline (deadlineMs)", () => {
  it("before the answer's head (a head trickled a byte at a time): ambiguous, the reason naming the deadline, the socket closed", async () => {
    // Each byte of the head resets stripe-node's inactivity timeout; the deadline cuts the
    // request, which had left: never "not sent".
    const sockets = new Set<Socket>();
    const server = createServer((socket) => {
      sockets.add(socket);
      socket.on("error", () => {});
      socket.once("data", () => {
        socket.write("HTTP/1.1 200 OK\r\nx-slow: ");
        const t = setInterval(() => socket.write("a"), 50);
        socket.on("close", () => {
          clearInterval(t);
          sockets.delete(socket);
        });
      });
    });
    await new Promise<void>((r) => server.listen(0, "127.0.0.1", () => r()));
    try {
      const { port } = server.address() as AddressInfo;
      const { client } = stripeActions({
        apiKey: "sk_test_x",
        host: "127.0.0.1",
        port,
        protocol: "http",
        timeoutMs: 1_000,
        deadlineMs: 300,
      });
      // Bounded here: a request never cut fails in seconds, not at the test's timeout.
      const error = await Promise.race([
        client.customers.create({ email: "a@b.c" }).then(
          () => undefined,
          (e: unknown) => e,
        ),
        sleep(scaled(5_000)).then(() => "still waiting"),
      ]);
      expect(error).toBeInstanceOf(E.StripeConnectionError);
      expect((error as Stripe.errors.StripeConnectionError).detail).toBeInstanceOf(StripeDeadlineError);
      expect(classifyStripeError(error)).toEqual({
        kind: "ambiguous",
        reason: "connection cut after sending: no complete answer from Stripe within 300 ms (deadlineMs)",
      });
      for (const until = Date.now() + scaled(1_000); sockets.size > 0 && Date.now() < until; ) await sleep(20);
      expect(sockets.size).toBe(0);
    } finally {
      for (const s of sockets) s.destroy();
      await new Promise<void>((r) => server.close(() => r()));
    }
  });

  it("refuses a deadline that is not a whole number of ms from 1 to 2^31-1 when the actions are made", () => {
    for (const deadlineMs of [0, -1, 1.5, Number.NaN, 2 ** 31])
      expect(() => stripeActions({ apiKey: "sk_test_x", deadlineMs })).toThrow(/deadlineMs must be/);
  });
});
