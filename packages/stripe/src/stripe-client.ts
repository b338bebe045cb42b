/**
 * Configuration of the Stripe client, as stripe-node takes it (api key, apiVersion, and
 * host/port/protocol for a local server). stripe-node's own retries are off by default: the
 * ledger owns the retry budget, and a retry that stripe-node makes still carries our key (it
 * retries once on a closed connection even then, though the first send may have run: an answer to
 * such a retry that says nothing was done is read as unknown, see stripe-actions.ts).
 */
import Stripe from "stripe";

export interface StripeConfig {
  /** Secret key (sk_test_… or sk_live_…); never stored in the ledger or logged. */
  readonly apiKey: string;
  readonly apiVersion?: string;
  readonly host?: string;
  readonly port?: number;
  readonly protocol?: "http" | "https";
  /** Per-request timeout. Default 20 s; a timeout after the request left is ambiguous. */
  readonly timeoutMs?: number;
  /** stripe-node's own network retries (same idempotency key). Default 0. */
  readonly maxNetworkRetries?: number;
  /**
   * How long Stripe Search may lag behind a write: "not found" before then proves nothing.
   * Default 90 s. Measured on the ledger's database clock (`op.now`), like every window.
   */
  readonly searchLagMs?: number;
}

export function createStripeClient(config: StripeConfig): Stripe {
  return new Stripe(config.apiKey, {
    ...(config.apiVersion !== undefined && { apiVersion: config.apiVersion as Stripe.LatestApiVersion }),
    ...(config.host !== undefined && { host: config.host }),
    ...(config.port !== undefined && { port: config.port }),
    ...(config.protocol !== undefined && { protocol: config.protocol }),
    timeout: config.timeoutMs ?? 20_000,
    maxNetworkRetries: config.maxNetworkRetries ?? 0,
    telemetry: false,
  });
}
