/**
 * Configuration of the Stripe client, as stripe-node takes it (api key, apiVersion, and
 * host/port/protocol for a local server). stripe-node's own retries are off by default: the
 * ledger owns the retry budget, and a retry that stripe-node makes still carries our key (it
 * retries once on a closed connection even then, though the first send may have run: an answer to
 * such a retry that says nothing was done is read as unknown, see stripe-actions.ts). Every
 * request has a deadline (`deadlineMs`) as well as stripe-node's inactivity timeout
 * (stripe-http-client.ts).
 *
 * Connect's connected accounts: `stripeAccount` here is every action's account, unless a
 * request's args name their own (stripe-account.ts); the client itself is the platform's, and each
 * request names its account. `stripeContext` is refused (`InvalidValueError` naming it).
 */
import Stripe from "stripe";
import { InvalidValueError } from "@idem/core";
import { accountIn } from "./stripe-account.js";
import { stripeApiVersionProblem } from "./stripe-api-version.js";
import { DeadlineHttpClient, STRIPE_DEADLINE_MS } from "./stripe-http-client.js";

export interface StripeConfig {
  /** Secret key (sk_test_… or sk_live_…); never stored in the ledger or logged. */
  readonly apiKey: string;
  /**
   * The API version every request is sent under (`Stripe-Version`): a replay with our key is the
   * same request only under the version the first send had. Default: stripe-node's pinned one.
   * Refused when the client is made (RangeError) unless written `YYYY-MM-DD` or `YYYY-MM-DD.name`
   * with a calendar date (stripe-api-version.ts); Stripe refuses one it never released at the
   * first request.
   */
  readonly apiVersion?: string;
  readonly host?: string;
  readonly port?: number;
  readonly protocol?: "http" | "https";
  /**
   * Longest wait for a byte of an answer (stripe-node's `timeout`, a socket inactivity timeout:
   * each byte resets it). Default 20 s; a timeout after the request left is ambiguous.
   */
  readonly timeoutMs?: number;
  /**
   * Longest wait for a whole answer, from the request's start, for every request the client makes
   * (writes, and the lookups' Search, lists and retrieves): an answer that keeps coming (a byte now
   * and then, each resetting `timeoutMs`) and never ends is cut here, as a timeout is (ambiguous
   * after the request left: unknown, settled by a replay with our key or a lookup). Default 2 min;
   * a whole number of ms, at most 2^31-1.
   */
  readonly deadlineMs?: number;
  /** stripe-node's own network retries (same idempotency key). Default 0. */
  readonly maxNetworkRetries?: number;
  /**
   * How long Stripe Search may lag behind a write: "not found" before then proves nothing.
   * Default 90 s; a whole number of ms from 0 to 2^31-1 (a RangeError when the actions are made).
   * Measured on the ledger's database clock (`op.now`), like every window.
   */
  readonly searchLagMs?: number;
  /**
   * The connected account (`acct_…`) every action acts on (its `Stripe-Account` header), unless a
   * call's args name their own (`args.stripeAccount`). Default: none, the API key's own account.
   * Not an account id: an `InvalidValueError` when the actions are made. An operation keeps the
   * account it first sent to (its provider reference), whatever this says later.
   */
  readonly stripeAccount?: string | undefined;
  /** Not supported (API v2 contexts, `Stripe-Context`): refused with an `InvalidValueError` naming it. */
  readonly stripeContext?: never;
}

/**
 * stripe-node's per-request options (its `OPTIONS_KEYS`), its older name for the API version, and
 * its client's address settings: names a caller may think a call's args take. stripe-node 23 sends
 * the args as the request's parameters, these names too (Stripe: 400 parameter_unknown); an SDK
 * that read them as options would send the caller's `idempotencyKey` or `headers` in place of our
 * key. No Stripe v1 endpoint takes a top-level parameter of these names (camelCase, or the SDK's
 * own `timeout`, `headers`, `host`, `streaming` …), so refusing them refuses no real parameter.
 */
const REQUEST_OPTIONS = [
  "idempotencyKey",
  "apiKey",
  "apiVersion",
  "stripeVersion",
  "maxNetworkRetries",
  "timeout",
  "apiBase",
  "authenticator",
  "headers",
  "additionalHeaders",
  "streaming",
  "host",
  "port",
  "protocol",
] as const;

/**
 * Throws an `InvalidValueError` (path: `prefix` + the name) when a call's args hold a stripe-node
 * request option (a connected account apart: `stripeAccount` is checked, `stripeContext` refused,
 * by `accountIn`): the adapter sets the options itself, our idempotency key among them. Own
 * properties set to a value, as stripe-node reads options.
 */
export function refuseRequestOptions(args: object, prefix = "args."): void {
  accountIn(args, prefix);
  for (const option of REQUEST_OPTIONS)
    if (Object.hasOwn(args, option) && (args as Record<string, unknown>)[option] !== undefined)
      throw new InvalidValueError(
        `${prefix}${option}`,
        "a stripe-node request option, not a Stripe parameter: stripe-node would send it to Stripe as a parameter (400 parameter_unknown), and the adapter sets the request's options itself (its idempotency key is the operation's, its version and timeouts the client's config); nothing was sent",
      );
}

export function createStripeClient(config: StripeConfig): Stripe {
  const versionProblem = config.apiVersion === undefined ? undefined : stripeApiVersionProblem(config.apiVersion);
  if (versionProblem) throw new RangeError(`apiVersion: ${versionProblem}`);
  // Checked here, sent per request: the client is the platform's (stripe-actions.ts).
  accountIn(config);
  return new Stripe(config.apiKey, {
    ...(config.apiVersion !== undefined && { apiVersion: config.apiVersion as Stripe.LatestApiVersion }),
    ...(config.host !== undefined && { host: config.host }),
    ...(config.port !== undefined && { port: config.port }),
    ...(config.protocol !== undefined && { protocol: config.protocol }),
    timeout: config.timeoutMs ?? 20_000,
    httpClient: new DeadlineHttpClient(config.deadlineMs ?? STRIPE_DEADLINE_MS),
    maxNetworkRetries: config.maxNetworkRetries ?? 0,
    telemetry: false,
  });
}
