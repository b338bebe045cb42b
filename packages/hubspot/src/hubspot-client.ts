/**
 * The @hubspot/api-client Client, configured for the ledger.
 *
 * The client's retry and rate-limit decorators are process-wide: each Client constructed sets
 * them for every API object bound afterwards. We bind our APIs right after constructing, so a
 * Client constructed later does not change ours. Our default is no client retries: each ledger
 * execution is one HTTP request, and the ledger's budget (attempts, elapsed time) and its 429
 * handling are the only retry loop. With `clientRetries: n` (1–6, counted as attempts by the
 * client), one ledger execution may make up to n requests; that is safe for upserts (the same
 * external id) and for creates (a repeated create meets the unique value and is read back), and
 * the ledger's attempts then multiply: at most attempts × n requests per call.
 */
import { Client } from "@hubspot/api-client";

export interface HubSpotConfig {
  /** A private app token; never stored in the ledger or logged. */
  readonly accessToken: string;
  /** API base, e.g. a sandbox `http://127.0.0.1:PORT`. Default HubSpot's. */
  readonly basePath?: string;
  /** The unique-value property that carries the operation key. Default "idem_external_id". */
  readonly uniqueProperty?: string;
  /** "upsert" (batch upsert by idProperty, default) or "create" (a conflict is read back). */
  readonly mode?: "upsert" | "create";
  /** Attempts the client itself makes per request (its retry decorator). Default 0: none. */
  readonly clientRetries?: number;
  /** Property group per object type for `ensureSchema`. Default `<type singular>information`. */
  readonly groupNames?: Readonly<Record<string, string>>;
}

export function createHubSpotClient(config: HubSpotConfig) {
  const client = new Client({
    accessToken: config.accessToken,
    ...(config.basePath !== undefined && { basePath: config.basePath }),
    numberOfApiCallRetries: config.clientRetries ?? 0,
  });
  // Bind now, with the decorators this constructor just set (see above).
  return { objects: client.crm.objects, properties: client.crm.properties };
}
