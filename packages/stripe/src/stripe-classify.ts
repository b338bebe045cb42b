/**
 * Maps stripe-node errors to the failure classes of @idem/core, one reason per branch. Tested
 * directly against errors from the real SDK (test/stripe-classify.test.ts).
 */
import Stripe from "stripe";
import { neverSent, tlsRefused, type Classification } from "@idem/core";
import { deadlineOf } from "./stripe-http-client.js";

/**
 * `resent`: stripe-node had sent the request more than once (it retries a closed connection by
 * itself); an answer that says nothing was done speaks only for the last send, so it is ambiguous.
 * So is a refusal Stripe gives before it reads the idempotency key (our credentials refused, 401
 * or 403; an API version it does not know; its TLS refused by us), which a committed earlier send
 * does not change: the alert stays, the outcome is unknown. A decline or a validation error is the
 * key's saved answer, the first send's too.
 */
export function classifyStripeError(error: unknown, resent = false): Classification {
  const cls = classifyAnswer(error);
  const refusedBeforeKey = cls.kind === "permanent" && cls.alert === true;
  if (!resent || (cls.kind !== "transient" && cls.kind !== "rate_limited" && !refusedBeforeKey)) return cls;
  return {
    kind: "ambiguous",
    reason: `stripe-node sent the request again after its connection closed, and an earlier send may have run: ${cls.reason}`,
    ...(cls.providerRequestId !== undefined && { providerRequestId: cls.providerRequestId }),
    ...(refusedBeforeKey && { alert: true }),
  };
}

/** How Stripe's 400 for a `Stripe-Version` it does not know begins ("… version: 2024-12-18"). */
const API_VERSION_REFUSED = "Invalid Stripe API version: ";

function classifyAnswer(error: unknown): Classification {
  if (!(error instanceof Stripe.errors.StripeError)) {
    return { kind: "ambiguous", reason: `not a Stripe error: ${String(error)}` };
  }
  const providerRequestId = error.requestId ?? undefined;
  const ids = providerRequestId ? { providerRequestId } : {};
  const status = error.statusCode;
  const decline = error.decline_code ? ` (${error.decline_code})` : "";
  // A confirmation Stripe refused (a decline, an authentication it required) still created the
  // payment intent, left waiting for another payment method: its id is how an operator finds it.
  // Only the id: the intent Stripe sends with the error carries the card (last4, expiry, holder).
  const madeId: unknown = (error.payment_intent as { id?: unknown } | undefined)?.id;
  const made = typeof madeId === "string" ? `; payment intent ${madeId}` : "";
  const what = `${error.type}${error.code ? ` ${error.code}` : ""}: ${error.message}${decline}${made}`;
  // The same ids and codes as fields, for an agent and an operator who must not parse the reason.
  const named = evidenceOf({ payment_intent: madeId, code: error.code, decline_code: error.decline_code });

  if (error.type === "StripeConnectionError") {
    // Refused, unresolvable, or unreachable at connect: the request never reached Stripe. An
    // unreachable host on an open connection (an ICMP error once the request was written) may
    // come after Stripe executed it.
    if (neverSent(error.detail))
      return { kind: "transient", reason: `not sent (${(error.detail as { code?: string }).code})` };
    // We refused Stripe's TLS (a TLS-inspecting proxy, a stale CA bundle): the handshake failed
    // before the request was written, and every retry meets the same certificate.
    const tls = tlsRefused(error.detail);
    if (tls)
      return {
        kind: "permanent",
        reason: `not sent: ${tls.refused === "certificate" ? "Stripe's certificate is not trusted (trust the proxy's CA with NODE_EXTRA_CA_CERTS)" : "no TLS version both Stripe and this process accept"} (${tls.code}): ${error.message}`,
        alert: true,
      };
    // Cut at our deadline (an answer that never ended): stripe-node words it as its own timeout,
    // naming `timeoutMs`; the reason names the deadline that cut it. Stripe may have executed it.
    const cut = deadlineOf(error.detail);
    if (cut) return { kind: "ambiguous", reason: `connection cut after sending: ${cut.message}` };
    // Timeout or reset after the request left: Stripe may have executed it.
    return { kind: "ambiguous", reason: `connection lost after sending: ${error.message}` };
  }
  // idempotency_key_in_use: a request with our key is still executing at Stripe (our earlier
  // attempt). That proves nothing about its outcome, so not transient: unknown, and a replay with
  // the key once Stripe finished returns what it saved. Read by its code before its status or
  // type: Stripe documents the code, not the status (a 409, stripe-node retrying it as a conflict;
  // answered as a 400 it would read as other parameters, or as a refusal: "failed" while the
  // earlier attempt may still charge). Stripe documents no other 409; any other conflict is read
  // the same way, since it too says nothing of our request.
  if (error.code === "idempotency_key_in_use" || status === 409) {
    const why =
      error.code === "idempotency_key_in_use"
        ? "an earlier request with our key is still executing"
        : "conflict with another request";
    return { kind: "ambiguous", reason: `${why}: ${what}`, ...ids };
  }
  // Same key, other parameters: a request with our key already ran at Stripe (the ledger's args
  // hash kept the arguments; an SDK or API-version change may encode them differently). Whatever
  // it did stands, so never "failed, nothing happened": unknown, looked up, not replayed (a replay
  // with the key only repeats this answer); no lookup, a person.
  if (error.type === "StripeIdempotencyError" && status === 400) {
    return {
      kind: "ambiguous",
      reason: `a request with our idempotency key already ran at Stripe with other parameters: ${error.message}`,
      replayable: false,
      ...ids,
    };
  }
  // Stripe's rate limiter: a 429, or on API versions before 2015-09-08 a 400 with the code
  // `rate_limit` (docs.stripe.com/changelog/2015-09-08), which stripe-node reads as a
  // StripeRateLimitError too. Read before the 400s below: such a 400 refused nothing for good. A
  // throttle Stripe reported only in a message, under another code, cannot be told apart from a
  // validation error and stays permanent.
  const limited = status === 429 || error.type === "StripeRateLimitError" || error.code === "rate_limit";
  // `Idempotent-Replayed: true`: Stripe answered with what it saved under our key, which it does
  // only once an execution began. A 503 or a rate limit saved so is no proof that nothing was done.
  const saved = String(error.headers?.["idempotent-replayed"] ?? "").toLowerCase() === "true";
  if (saved && (limited || (status !== undefined && status >= 500))) {
    return {
      kind: "ambiguous",
      reason: `Stripe replayed what it saved under our key after an execution began (a replay only repeats it): ${what}`,
      replayable: false,
      ...ids,
    };
  }
  // Stripe's rate limiter answers before the idempotency layer (a rate limit that is not a replay
  // saved nothing and ran nothing): wait as it says, then send the same request again.
  if (limited) {
    const seconds = Number(error.headers?.["retry-after"]);
    return {
      kind: "rate_limited",
      reason: what,
      retryAfterMs: Number.isFinite(seconds) && seconds > 0 ? seconds * 1000 : 1_000,
      ...ids,
    };
  }
  // A 500 is saved under the key: the effect is unknown and a replay would only repeat the 500.
  if (status === 500) return { kind: "ambiguous", reason: what, replayable: false, ...ids };
  // Any other 5xx that is not a replay (above): Stripe saves the answer of a request that began
  // executing, a 5xx included (docs.stripe.com/api/idempotent_requests), so a 503 may follow a
  // charge as a 502 or 504 from a gateway may, and none proves that nothing was done. A replay with
  // our key inside Stripe's window either runs the request once (nothing was saved) or returns
  // what was saved, marked as a replay (then looked up, above).
  if (status !== undefined && status > 500) return { kind: "ambiguous", reason: what, ...ids };
  // Stripe does not know the API version this process sends (its `apiVersion` setting misspelled,
  // or newer than Stripe has released). Stripe refuses it before its idempotency layer: nothing
  // ran, nothing was saved under our key, and it says nothing of an earlier attempt with the key.
  // A setup refusal, as a revoked key is: permanent, and a person must know (a replay of an
  // attempt that may have committed stays unknown). Matched on Stripe's words, the only mark the
  // wire gives it: no `code` is seen with it, and a validation error words its message otherwise.
  // It names no parameter: one that does (a webhook endpoint's `api_version`) refused the request's
  // own arguments, Stripe's final answer for them.
  if (
    status === 400 &&
    error.rawType === "invalid_request_error" &&
    !error.param &&
    error.message.startsWith(API_VERSION_REFUSED)
  ) {
    return {
      kind: "permanent",
      reason: `Stripe does not know the API version this process sends (its apiVersion setting): ${what}`,
      alert: true,
      ...ids,
      ...named,
    };
  }
  // Wrong or revoked key, or not allowed: permanent, and a person must know.
  if (status === 401 || status === 403) return { kind: "permanent", reason: what, alert: true, ...ids, ...named };
  // Declines and validation errors: Stripe's final answer for these parameters.
  if (status === 402 || status === 400 || status === 404) return { kind: "permanent", reason: what, ...ids, ...named };
  return { kind: "ambiguous", reason: `unexpected Stripe answer ${status}: ${what}`, ...ids };
}

/**
 * The ids and codes Stripe's answer or record names, as `Classification.evidence`: those given as
 * strings, in this order; nothing when none is. Never the card, its holder or a message.
 */
export function evidenceOf(fields: { payment_intent?: unknown; code?: unknown; decline_code?: unknown }): {
  evidence?: Record<string, string>;
} {
  const given = Object.entries(fields).filter((e): e is [string, string] => typeof e[1] === "string" && e[1] !== "");
  return given.length > 0 ? { evidence: Object.fromEntries(given) } : {};
}
