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
 *
 * A request that gets no byte for `timeoutMs` is cut (its socket destroyed, ETIMEDOUT): the client
 * has no timeout of its own, and a heartbeat keeps the lease of a call that waits forever. Not
 * supported: cancelling a request on `op.signal` (the client's fetch takes no AbortSignal); a lost
 * lease is harmless here, since the CRM refuses a second record with the same key.
 */
import http from "node:http";
import https from "node:https";
import type { Socket } from "node:net";
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
  /** Longest wait for a byte of an answer. Default 20 s; a timeout after the request left is ambiguous. */
  readonly timeoutMs?: number;
  /**
   * Longest wait for a whole answer, from the request's start: an answer that keeps coming (a byte
   * now and then, each resetting `timeoutMs`) and never ends is cut here, as a timeout is (ambiguous
   * after the request left). Default 2 min.
   */
  readonly deadlineMs?: number;
  /**
   * How long after an attempt gave up on its write (a timeout, a lost answer) a lookup that finds
   * no record still proves nothing: HubSpot may be writing a request our client stopped waiting
   * for. Default 2 min; absence counts only after it (the operation stays unknown meanwhile).
   */
  readonly settleMs?: number;
}

/** The default of `HubSpotConfig.deadlineMs`. */
export const HUBSPOT_DEADLINE_MS = 2 * 60_000;

/** The default of `HubSpotConfig.settleMs`. */
export const HUBSPOT_SETTLE_MS = 2 * 60_000;

/**
 * The options every call passes last. @hubspot/api-client 13's generated methods apply the
 * configured middleware (its User-Agent header, our timeout agent) only when the call passes
 * middleware of its own: "append" to none keeps the configured ones. Without it, neither applies.
 */
export const HUBSPOT_CALL_OPTIONS = { middleware: [] as never[], middlewareMergeStrategy: "append" as const };

/**
 * Call options for a write that keep what its requests were answered: with `clientRetries`, the
 * client's retry decorator sends a write again after a 5xx (or a 429), and the error it finally
 * throws is the last request's alone. `earlier()`: the HTTP statuses of the requests before the
 * last (each was answered: the decorator retries on an answer only). Appended as
 * `HUBSPOT_CALL_OPTIONS` is.
 */
export function answersKept(): { readonly options: typeof HUBSPOT_CALL_OPTIONS; earlier(): number[] } {
  const answers: number[] = [];
  let requests = 0;
  const keep = {
    pre: async <C>(context: C) => {
      requests += 1;
      return context;
    },
    post: async <C extends { httpStatusCode: number }>(context: C) => {
      answers.push(context.httpStatusCode);
      return context;
    },
  };
  return {
    options: { middleware: [keep as never], middlewareMergeStrategy: "append" },
    earlier: () => answers.slice(0, Math.max(0, requests - 1)),
  };
}

export function createHubSpotClient(config: HubSpotConfig) {
  const client = new Client({
    accessToken: config.accessToken,
    ...(config.basePath !== undefined && { basePath: config.basePath }),
    numberOfApiCallRetries: config.clientRetries ?? 0,
    httpAgent: timeoutAgent(
      config.basePath ?? "https://api.hubapi.com",
      config.timeoutMs ?? 20_000,
      config.deadlineMs ?? HUBSPOT_DEADLINE_MS,
    ),
  });
  // Bind now, with the decorators this constructor just set (see above). The host names the
  // server in errors the adapter raises (never the path, which may hold an operation key).
  const host = new URL(config.basePath ?? "https://api.hubapi.com").host;
  return { objects: client.crm.objects, properties: client.crm.properties, host };
}

/** `http.Agent#addRequest`: how each ClientRequest reaches its agent (node's, not in its types). */
type AddRequest = { addRequest(req: http.ClientRequest, options: unknown): void };

/**
 * An agent whose sockets are destroyed after `ms` without a byte, in a request or idle in the
 * pool: node's own socket timeout only emits an event, which the client's fetch does not listen to.
 * Each request is also destroyed `deadlineMs` after it started unless its answer ended (its
 * `close`): bytes trickling for ever reset the socket's timeout, never this.
 */
function timeoutAgent(basePath: string, ms: number, deadlineMs: number): http.Agent {
  if (!(Number.isFinite(ms) && ms > 0)) throw new Error(`timeoutMs must be a number of ms > 0 (got ${ms})`);
  if (!(Number.isFinite(deadlineMs) && deadlineMs > 0 && deadlineMs <= 2 ** 31 - 1))
    throw new Error(`deadlineMs must be a number of ms > 0 and at most 2^31-1 (got ${deadlineMs})`);
  const Base = basePath.startsWith("http:") ? http.Agent : https.Agent;
  const addRequest = (Base.prototype as unknown as AddRequest).addRequest;
  class TimeoutAgent extends Base {
    addRequest(req: http.ClientRequest, options: unknown): void {
      const deadline = setTimeout(
        () =>
          req.destroy(
            Object.assign(new Error(`no complete answer from HubSpot within ${deadlineMs} ms (deadlineMs)`), {
              code: "ETIMEDOUT",
            }),
          ),
        deadlineMs,
      );
      req.once("close", () => clearTimeout(deadline));
      addRequest.call(this, req, options);
    }
    override createConnection(...args: Parameters<http.Agent["createConnection"]>): Socket {
      const socket = super.createConnection(...args) as Socket;
      socket.setTimeout(ms, () =>
        socket.destroy(
          Object.assign(new Error(`no answer from HubSpot within ${ms} ms (timeoutMs)`), { code: "ETIMEDOUT" }),
        ),
      );
      return socket;
    }
    // Back in the pool, node set the socket's timeout to the agent's, or shorter when the server's
    // Keep-Alive hint is: a reused socket must give its next request the whole of `ms` again.
    override reuseSocket(...args: Parameters<http.Agent["reuseSocket"]>): void {
      super.reuseSocket(...args);
      (args[0] as Socket).setTimeout(ms);
    }
  }
  return new TimeoutAgent({ keepAlive: true, timeout: ms });
}
