/**
 * A local HubSpot for the CRM v3 subset idem uses, spoken to through the real
 * @hubspot/api-client: objects create / get (with idProperty and `archived`) / archive (DELETE,
 * 204) / batch upsert / search, and the properties API (create, read, delete) with unique-value properties. Errors carry
 * HubSpot's JSON (`status`, `message`, `category`, `correlationId`); 429s carry `policyName`.
 * Every answer of HubSpot's carries the X-HubSpot-RateLimit headers (hubspot-rate-limits.ts). A batch upsert whose input HubSpot refuses (a validation
 * error) is answered 207 Multi-Status, `{ status, results: [], numErrors, errors }`, as HubSpot
 * answers it even for a single input (a create answers the same refusal 400).
 *
 * Faults: `rate_limit` (429 of the ten-secondly rolling limit, with HubSpot's headers: the
 * window is X-HubSpot-RateLimit-Interval-Milliseconds, 10 s; a Retry-After only when the fault
 * names `retryAfterSec`, which HubSpot does not document for 429s), `missing_scopes` (403: a
 * token without the scope the endpoint needs), `locked` (423: HubSpot's lock while many writes
 * sync, 2 s), `migrating` (477 with Retry-After: the account moves between data centres) and
 * `bad_gateway` (502) and `page` (an HTML page of the fault's `status`, 404 by default, as a
 * proxy, load balancer, gateway or firewall in front of HubSpot answers: not HubSpot's JSON)
 * before anything is written; after the write, `drop_after_commit` (the
 * connection closes with no answer), `bad_gateway_after_commit` (a gateway's 502 though HubSpot
 * wrote), `page_after_commit` (that page though HubSpot wrote: a server in front of it that
 * answers its own page in place of an answer it did not take), `delay_after_commit`,
 * `trickle_after_commit` (the answer's head, then its body a byte
 * every `intervalMs`, never ended: see trickle.ts; a 204 has no body and goes out whole) and
 * `conflict_after_commit` (a 409 CONFLICT, as the loser of two racing writes of one unique
 * value gets: the record exists, written by the other; with `status: 400` the 400 validation
 * error some report for a custom unique property instead, naming it, and with `status: 207` a
 * batch upsert's answer of that refusal, per input).
 */
import { STATUS_CODES, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import { EventEmitter } from "node:events";
import { FaultPlan } from "../faults.js";
import { closeHard, listen, readBody } from "../http.js";
import { TricklingAnswers } from "../trickle.js";
import { RateLimitHeaders } from "./hubspot-rate-limits.js";
import {
  CrmStore,
  HubSpotFailure,
  InputRefusal,
  error,
  uniqueValueRefusal,
  type CrmRecord,
} from "./hubspot-records.js";

export type HubSpotFaultKind =
  | "rate_limit"
  | "missing_scopes"
  | "locked"
  | "migrating"
  | "bad_gateway"
  | "page"
  | "drop_after_commit"
  | "bad_gateway_after_commit"
  | "page_after_commit"
  | "delay_after_commit"
  | "trickle_after_commit"
  | "conflict_after_commit";

export interface HubSpotSandboxOptions {
  readonly accessToken?: string;
  /** How long a write stays out of search results. Default 0. */
  readonly indexLagMs?: number;
}

export class HubSpotSandbox {
  readonly faults = new FaultPlan<HubSpotFaultKind>();
  /**
   * Emits "commit" ({ objectType, record }) when a write (a create, upsert or archive) has taken
   * effect, before the answer.
   */
  readonly events = new EventEmitter();
  readonly requests: { method: string; path: string; status: number | "dropped" }[] = [];
  /** Answers of `trickle_after_commit` still trickling. */
  readonly trickling = new TricklingAnswers();
  readonly crm: CrmStore;
  indexLagMs: number;
  private readonly token: string;
  private server: Server | undefined;
  private skewMs = 0;
  private readonly limits: RateLimitHeaders;

  constructor(options: HubSpotSandboxOptions = {}) {
    this.token = options.accessToken ?? "pat-sandbox-idem";
    this.indexLagMs = options.indexLagMs ?? 0;
    const now = () => Date.now() + this.skewMs;
    this.crm = new CrmStore(now, () => this.indexLagMs);
    this.limits = new RateLimitHeaders(now);
  }

  /** Moves HubSpot's clock forward (record times, search lag, rate-limit windows), as time passing would. */
  advance(ms: number): void {
    this.skewMs += ms;
  }

  /**
   * Records of an object type ever created, archived ones too: the effect count at the target (a
   * record someone deleted since is still an effect that happened). Live ones: `crm.live(type)`.
   */
  count(objectType: string): number {
    return this.crm.count(objectType);
  }

  async start(port = 0): Promise<{ basePath: string; port: number; accessToken: string }> {
    const { server, port: bound } = await listen((req, res) => this.handle(req, res), port);
    this.server = server;
    return { basePath: `http://127.0.0.1:${bound}`, port: bound, accessToken: this.token };
  }

  async close(): Promise<void> {
    this.trickling.cut();
    await closeHard(this.server);
    this.server = undefined;
  }

  private async handle(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const url = new URL(req.url ?? "/", "http://sandbox");
    const method = req.method ?? "GET";
    const path = url.pathname;
    const record = (status: number | "dropped") => this.requests.push({ method, path, status });
    let body: Record<string, unknown> = {};
    try {
      const text = await readBody(req);
      body = text ? (JSON.parse(text) as Record<string, unknown>) : {};
    } catch {
      record(400);
      return send(res, 400, error("Invalid input JSON", "INVALID_JSON"));
    }
    if (path === "/_sandbox/counts")
      return send(
        res,
        200,
        Object.fromEntries(["contacts", "companies", "deals", "tickets", "notes"].map((t) => [t, this.crm.count(t)])),
      );
    if (req.headers.authorization !== `Bearer ${this.token}`) {
      record(401);
      return send(
        res,
        401,
        error(
          "Authentication credentials not found. This API supports OAuth 2.0 authentication.",
          "INVALID_AUTHENTICATION",
          "INVALID_AUTHENTICATION",
        ),
      );
    }
    const before = this.faults.take(method, path, [
      "rate_limit",
      "missing_scopes",
      "locked",
      "migrating",
      "bad_gateway",
      "page",
    ]);
    // HubSpot's answers carry its rate-limit headers (hubspot-rate-limits.ts); a page in front of it does not.
    const limits = before?.kind === "page" ? {} : this.limits.count(before?.kind === "rate_limit");
    const reply = (status: number, body: unknown, headers: Record<string, string> = {}) =>
      send(res, status, body, { ...limits, ...headers });
    if (before?.kind === "rate_limit") {
      record(429);
      return reply(
        429,
        {
          ...error("You have reached your ten_secondly_rolling limit.", "RATE_LIMIT", "RATE_LIMITS"),
          errorType: "RATE_LIMIT",
          policyName: "TEN_SECONDLY_ROLLING",
        },
        before.retryAfterSec !== undefined ? { "retry-after": String(before.retryAfterSec) } : {},
      );
    }
    if (before?.kind === "missing_scopes") {
      record(403);
      return reply(
        403,
        error(
          "This app hasn't been granted all required scopes to make this call.",
          "MISSING_SCOPES",
          "MISSING_SCOPES",
        ),
      );
    }
    if (before?.kind === "locked") {
      record(423);
      return reply(423, error("The resource is locked; retry in 2 seconds", "LOCKED", "LOCKED"));
    }
    if (before?.kind === "migrating") {
      record(477);
      return reply(477, error("This account is being migrated", "MIGRATION_IN_PROGRESS", "MIGRATION"), {
        "retry-after": String(before.retryAfterSec ?? 60),
      });
    }
    if (before?.kind === "bad_gateway") {
      record(502);
      return reply(502, error("Bad gateway: nothing was written", "BAD_GATEWAY", "SERVICE_UNAVAILABLE"));
    }
    if (before?.kind === "page") return page(res, before.status, record);

    let status = 200;
    let out: unknown;
    let committed: { objectType: string; record: CrmRecord } | undefined;
    try {
      [status, out, committed] = this.route(method, path, url.searchParams, body);
    } catch (e) {
      if (!(e instanceof HubSpotFailure)) throw e;
      record(e.status);
      return reply(e.status, e.body);
    }
    if (committed) this.events.emit("commit", committed);
    const after = this.faults.take(method, path, [
      "drop_after_commit",
      "bad_gateway_after_commit",
      "page_after_commit",
      "delay_after_commit",
      "trickle_after_commit",
      "conflict_after_commit",
    ]);
    if (after?.kind === "bad_gateway_after_commit") {
      record(502);
      return reply(502, error("Bad gateway", "BAD_GATEWAY", "SERVICE_UNAVAILABLE"));
    }
    if (after?.kind === "page_after_commit") return page(res, after.status, record);
    if (after?.kind === "conflict_after_commit" && (after.status === 400 || after.status === 207)) {
      const refused = uniqueValueRefusal(committed?.objectType ?? "record", this.clashedProperty(body, committed));
      record(after.status);
      if (after.status === 400) return reply(400, refused);
      const { status, category, message } = refused;
      const now = new Date().toISOString();
      return reply(207, {
        status: "COMPLETE",
        results: [],
        numErrors: 1,
        errors: [{ status, category, message, context: {} }],
        startedAt: now,
        completedAt: now,
      });
    }
    if (after?.kind === "conflict_after_commit") {
      record(409);
      return reply(
        409,
        error(
          `A record with this unique value already exists. Existing ID: ${committed?.record.id}`,
          "CONFLICT",
          "CONFLICT",
        ),
      );
    }
    if (after?.kind === "drop_after_commit") {
      record("dropped");
      req.socket.destroy();
      return;
    }
    if (after?.kind === "trickle_after_commit") {
      record(status);
      return this.trickling.start(
        res,
        status,
        { ...limits, "content-type": "application/json;charset=utf-8" },
        after.intervalMs,
      );
    }
    if (after?.kind === "delay_after_commit") await new Promise((r) => setTimeout(r, after.delayMs ?? 30_000).unref());
    record(status);
    if (!res.destroyed && !req.socket.destroyed) reply(status, out);
  }

  /**
   * The unique value a racing write repeated: an upsert's idProperty, else the first custom
   * unique-value property the record has a value in (a contact's email last).
   */
  private clashedProperty(
    body: Record<string, unknown>,
    committed?: { objectType: string; record: CrmRecord },
  ): string {
    const [input] = (body.inputs ?? []) as { idProperty?: string }[];
    if (input?.idProperty) return input.idProperty;
    if (!committed) return "hs_object_id";
    const unique = this.crm
      .listProperties(committed.objectType)
      .filter((p) => p.hasUniqueValue && committed.record.properties[p.name] !== undefined)
      .map((p) => p.name);
    return unique[0] ?? "email";
  }

  private route(
    method: string,
    path: string,
    q: URLSearchParams,
    body: Record<string, unknown>,
  ): [number, unknown, { objectType: string; record: CrmRecord }?] {
    const m = /^\/crm\/v3\/(objects|properties)\/([^/]+)(?:\/([^/]+))?(?:\/([^/]+))?$/.exec(path);
    if (!m) throw new HubSpotFailure(404, error(`No route for ${method} ${path}`, "NOT_FOUND", "OBJECT_NOT_FOUND"));
    const [, api, objectType, raw, b] = m as unknown as [
      string,
      string,
      string,
      string | undefined,
      string | undefined,
    ];
    // An id given by idProperty arrives percent-encoded (a contact's email: `%40`), as HubSpot decodes it.
    let a = raw;
    try {
      a = raw === undefined ? undefined : decodeURIComponent(raw);
    } catch {
      throw new HubSpotFailure(400, error(`Malformed path ${path}`, "INVALID_INPUT"));
    }
    if (api === "properties") {
      if (method === "POST" && !a) return [201, this.crm.createProperty(objectType, body)];
      if (method === "GET" && !a) return [200, { results: this.crm.listProperties(objectType) }];
      if (method === "DELETE" && a) {
        if (!this.crm.deleteProperty(objectType, a))
          throw new HubSpotFailure(
            404,
            error(`Unable to find property ${a}`, "PROPERTY_NOT_FOUND", "OBJECT_NOT_FOUND"),
          );
        return [204, undefined];
      }
      if (method === "GET" && a) {
        const p = this.crm.getProperty(objectType, a);
        if (!p)
          throw new HubSpotFailure(
            404,
            error(`Unable to find property ${a}`, "PROPERTY_NOT_FOUND", "OBJECT_NOT_FOUND"),
          );
        return [200, p];
      }
    }
    if (api === "objects") {
      if (method === "POST" && !a) {
        const record = this.crm.create(objectType, (body.properties ?? {}) as Record<string, unknown>);
        return [201, view(record), { objectType, record }];
      }
      if (method === "POST" && a === "batch" && b === "upsert") {
        const inputs = (body.inputs ?? []) as {
          idProperty?: string;
          id: string;
          properties: Record<string, unknown>;
        }[];
        if (inputs.length !== 1)
          throw new HubSpotFailure(400, error("The sandbox upserts one input per batch", "INVALID_INPUT"));
        const input = inputs[0]!;
        const now = new Date().toISOString();
        let upserted: { record: CrmRecord; isNew: boolean };
        try {
          upserted = this.crm.upsert(objectType, input.idProperty ?? "hs_object_id", input.id, input.properties ?? {});
        } catch (e) {
          // A unique value another record holds is refused for the whole batch (409), not per
          // input: HubSpot documents 207 Multi-Status for batch inputs it refuses, but answers a
          // conflict in a batch upsert with a whole 409 ("Contacts API Batch Upsert return 409
          // instead of 207", community.hubspot.com/t5/APIs-Integrations/Contacts-API-Batch-Upsert-return-409-instead-of-207/td-p/1051941,
          // as airbytehq/airbyte#76340 splits batches to find the input). The adapter reads either
          // back (hubspot-actions.ts), and a 409 names the existing record, which it judges by.
          if (!(e instanceof InputRefusal)) throw e;
          // Per input, as HubSpot answers a batch upsert (hubspot-api-ruby#403): no result, the
          // error in `errors`.
          const { status, category, message } = e.body;
          return [
            207,
            {
              status: "COMPLETE",
              results: [],
              numErrors: 1,
              errors: [{ status, category, message, context: {} }],
              startedAt: now,
              completedAt: now,
            },
          ];
        }
        const { record, isNew } = upserted;
        return [
          200,
          { status: "COMPLETE", results: [{ ...view(record), new: isNew }], startedAt: now, completedAt: now },
          { objectType, record },
        ];
      }
      if (method === "POST" && a === "search") {
        const groups = (body.filterGroups ?? []) as {
          filters: { propertyName: string; operator: string; value?: string }[];
        }[];
        const results = groups.flatMap((g) => this.crm.search(objectType, g.filters)).map(view);
        return [200, { total: results.length, results }];
      }
      if (method === "DELETE" && a && !b) {
        const record = this.crm.archive(objectType, a);
        if (!record)
          throw new HubSpotFailure(
            404,
            error(`Object not found.  objectId are usually numeric.`, "OBJECT_NOT_FOUND", "OBJECT_NOT_FOUND"),
          );
        return [204, undefined, { objectType, record }];
      }
      if (method === "GET" && a) {
        const record = this.crm.get(objectType, a, q.get("idProperty") ?? undefined, q.get("archived") === "true");
        if (!record)
          throw new HubSpotFailure(
            404,
            error(`Object not found.  objectId are usually numeric.`, "OBJECT_NOT_FOUND", "OBJECT_NOT_FOUND"),
          );
        // Only the properties asked for (the client repeats `properties`; HubSpot takes a comma
        // separated list too), else the type's defaults: see CrmStore.readProperties.
        const asked = q
          .getAll("properties")
          .flatMap((p) => p.split(","))
          .map((p) => p.trim())
          .filter((p) => p !== "");
        return [200, { ...view(record), properties: this.crm.readProperties(objectType, record, asked) }];
      }
    }
    throw new HubSpotFailure(404, error(`No route for ${method} ${path}`, "NOT_FOUND", "OBJECT_NOT_FOUND"));
  }
}

function view(r: CrmRecord) {
  const { id, properties, createdAt, updatedAt, archived, archivedAt } = r;
  return { id, properties, createdAt, updatedAt, archived, ...(archivedAt ? { archivedAt } : {}) };
}

function send(res: ServerResponse, status: number, body: unknown, headers: Record<string, string> = {}): void {
  if (status === 204) {
    res.writeHead(204, headers);
    res.end();
    return;
  }
  res.writeHead(status, { "content-type": "application/json;charset=utf-8", ...headers });
  res.end(JSON.stringify(body));
}

/**
 * Not HubSpot's answer (its JSON error, with a category) but the page of a server in front of it
 * (a proxy's, a load balancer's, a firewall's): HTML, without HubSpot's rate-limit headers, of
 * `status` (404 unless given).
 */
function page(res: ServerResponse, status = 404, record: (status: number) => void): void {
  const phrase = STATUS_CODES[status] ?? "Error";
  record(status);
  res.writeHead(status, { "content-type": "text/html; charset=utf-8" });
  res.end(`<html><head><title>${status} ${phrase}</title></head><body><h1>${phrase}</h1></body></html>`);
}
