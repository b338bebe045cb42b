/**
 * A local Stripe: HTTP with form-encoded bodies and JSON errors (`type`, `code`, `message`), for
 * customers, payment intents, their charges, refunds and any other POSTed resource, through the
 * real stripe SDK; lists paginate as Stripe's do (stripe-list.ts).
 *
 * Idempotency as Stripe documents it: the first response for a key is saved and replayed with
 * `Idempotent-Replayed: true`; the same key with other parameters is 400 `idempotency_error`; a
 * request while the first is still executing is 409 `idempotency_key_in_use`; keys are forgotten
 * once they are 24 h old (`keyRetentionMs`; the clock is injectable); 401, 429 and validation
 * failures are not saved. Stripe promises only that a key lives at least that long ("you can
 * remove keys from the system automatically after they're at least 24 hours old",
 * docs.stripe.com/api/idempotent_requests): a longer `keyRetentionMs` is a Stripe that prunes late.
 *
 * A parameter an endpoint the sandbox implements does not take (top-level, or a name inside one
 * whose shape it knows) is refused as Stripe refuses it, 400 `parameter_unknown` (stripe-params.ts),
 * a validation failure: nothing saved under the key.
 *
 * Connected accounts (docs.stripe.com/connect/authentication): a request with a `Stripe-Account`
 * header (or a `Stripe-Context` naming a connected account by its id) acts on that account, as
 * Stripe makes it: its objects are that account's own (created, retrieved, listed and searched
 * there, never seen from the platform or another account), and so are its idempotency keys (the
 * same key on two accounts is two requests). Stripe's idempotency page does not say how a key is
 * scoped across accounts: kept per account here, a request sent to the wrong account is answered
 * as a new request there, never hidden behind another account's saved answer. The answer to a
 * `Stripe-Account` names it in its own `Stripe-Account` header, as stripe-node reads it
 * (`lastResponse.stripeAccount`). Only the accounts `connectAccount` added exist; any other is
 * answered 403 `invalid_request_error` `account_invalid` ("The provided key '…' does not have
 * access to account '…' (or that account does not exist)…", Stripe's PermissionError), after the
 * API key is checked and before anything runs. Endpoints and their answers: stripe-routes.ts; keys and their saved answers: stripe-keys.ts.
 *
 * A `Stripe-Version` Stripe does not know is refused as Stripe refuses it: 400
 * `invalid_request_error`, "Invalid Stripe API version: <the header>", with no `code` (none is seen
 * in public reports), after the API key is checked and before the idempotency layer: nothing is
 * saved under the key, nothing runs. Which versions it knows: stripe-versions.ts (a calendar date
 * from 2011-06-21 to stripe-node's pinned default, named by its release from 2024-09-30.acacia
 * on). A request without the header is taken, under the account's default version. A payment
 * intent's statuses are named as the request's version names them (`requires_source` before
 * 2019-02-11: stripe-versions.ts `renderedFor`); the objects are otherwise the same under every version.
 *
 * Faults (see FaultPlan): `rate_limit` (429 + Retry-After; 400 `rate_limit` to a request whose
 * `Stripe-Version` is before 2015-09-08, as Stripe answered then), `unavailable` (503) and
 * `unauthorized` (401, as a key revoked or rolled meanwhile is answered) before anything commits;
 * `delay_before_commit` (the request executes slowly, its key in flight: held for `delayMs`, or
 * until `releaseHeldRequests`, the sandbox emitting "held" once it holds it); `error_before_effect` (the
 * endpoint began executing and failed before its effect: a 500, or the fault's `status`, saved
 * under the key with nothing done, which Stripe's "including 500 errors" allows as much as a 500
 * after the effect); `error_after_commit` (500, or the fault's `status`, saved under the key: Stripe documents
 * the 500; a 503 so saved is what a 503 that is not proven to come before execution may be), `drop_after_commit` (the
 * connection is closed with no answer), `delay_after_commit` (the answer is held past the
 * client's timeout) and `trickle_after_commit` (the answer's head, then its body a byte every
 * `intervalMs`, never ended: see trickle.ts) after the effect committed (a read: after it
 * executed), its answer saved under the key as usual.
 */
import type { IncomingMessage, Server, ServerResponse } from "node:http";
import { EventEmitter } from "node:events";
import qs from "qs";
import { FaultPlan } from "../faults.js";
import { closeHard, listen, readBody } from "../http.js";
import { TricklingAnswers } from "../trickle.js";
import { fingerprintOf, StripeKeys } from "./stripe-keys.js";
import { StripeFailure, StripeObjects, type StripeObject } from "./stripe-objects.js";
import { routeStripe } from "./stripe-routes.js";
import { isStripeVersion, renderedFor } from "./stripe-versions.js";
import { header, masked, requestId, send, sendError } from "./stripe-wire.js";

export type StripeFaultKind =
  | "rate_limit"
  | "unavailable"
  | "unauthorized"
  | "delay_before_commit"
  | "error_before_effect"
  | "error_after_commit"
  | "drop_after_commit"
  | "delay_after_commit"
  | "trickle_after_commit";

export interface StripeSandboxOptions {
  /** The secret key requests must carry. Default "sk_test_idem_sandbox". */
  readonly apiKey?: string;
  /** How far Search's index lags writes: a new object is not in it, an update not seen, for this long. Default 0. */
  readonly searchLagMs?: number;
  /**
   * How long a key and its saved answer are kept, from the key's first request. Default 24 h, the
   * least Stripe documents; Stripe may prune later, so a longer one is a faithful Stripe too.
   */
  readonly keyRetentionMs?: number;
}

export interface StripeRequestRecord {
  readonly method: string;
  readonly path: string;
  readonly idempotencyKey: string | undefined;
  /** The API version the request asked for (its `Stripe-Version` header), if any. */
  readonly stripeVersion: string | undefined;
  /**
   * The connected account the request named (its `Stripe-Account` header), if any: one that
   * `connectAccount` did not add is answered 403 `account_invalid`, as Stripe answers an account
   * the key cannot reach.
   */
  readonly stripeAccount: string | undefined;
  /** The account a `Stripe-Context` header named, if any: taken as a `Stripe-Account` is. */
  readonly stripeContext: string | undefined;
  readonly status: number | "dropped";
  readonly replayed: boolean;
}

const DAY_MS = 24 * 3_600_000;

export class StripeSandbox {
  readonly faults = new FaultPlan<StripeFaultKind>();
  /**
   * Emits "commit" ({ path, idempotencyKey, object, account }: `account` undefined on the
   * platform) when a write has taken effect, "held" ({ path, idempotencyKey }) when
   * `delay_before_commit` holds a request, its key in flight, and "late" ({ path, idempotencyKey })
   * when the answer `delay_after_commit` held goes out at last.
   */
  readonly events = new EventEmitter();
  readonly requests: StripeRequestRecord[] = [];
  /** Answers of `trickle_after_commit` still trickling. */
  readonly trickling = new TricklingAnswers();
  /** The platform account's objects (those of a connected account: `objectsOf`). */
  readonly objects: StripeObjects;
  searchLagMs: number;
  readonly keyRetentionMs: number;
  private clockOffsetMs = 0;
  private readonly keys: StripeKeys;
  /** Requests `delay_before_commit` holds now: each goes on when its delay ends or `releaseHeldRequests` is called. */
  private readonly held = new Set<() => void>();
  private readonly apiKey: string;
  /** The connected accounts the API key reaches, each with its own objects. */
  private readonly accounts = new Map<string, StripeObjects>();
  private server: Server | undefined;

  constructor(options: StripeSandboxOptions = {}) {
    this.apiKey = options.apiKey ?? "sk_test_idem_sandbox";
    this.searchLagMs = options.searchLagMs ?? 0;
    this.keyRetentionMs = options.keyRetentionMs ?? DAY_MS;
    this.objects = this.newObjects();
    this.keys = new StripeKeys(() => this.now(), this.keyRetentionMs);
  }

  /** The sandbox's clock: real time plus whatever `advance` added. */
  now(): number {
    return Date.now() + this.clockOffsetMs;
  }

  /** Moves the sandbox clock forward (key retention, search lag). */
  advance(ms: number): void {
    this.clockOffsetMs += ms;
  }

  /** Objects of a resource that exist on `account` (default: the platform): the effect count at the target. */
  count(resource: string, account?: string): number {
    return this.objectsOf(account).count(resource);
  }

  /** Adds a connected account the API key reaches (Connect), with no objects yet; an id given twice is one account. */
  connectAccount(id: string): void {
    if (!this.accounts.has(id)) this.accounts.set(id, this.newObjects());
  }

  /** The objects of a connected account `connectAccount` added, or the platform's (undefined). */
  objectsOf(account?: string): StripeObjects {
    if (account === undefined) return this.objects;
    const objects = this.accounts.get(account);
    if (!objects) throw new Error(`no connected account ${account} in this sandbox (connectAccount adds one)`);
    return objects;
  }

  private newObjects(): StripeObjects {
    return new StripeObjects(
      () => this.now(),
      () => this.searchLagMs,
    );
  }

  async start(port = 0): Promise<{ host: string; port: number; url: string; apiKey: string }> {
    const { server, port: bound } = await listen((req, res) => this.handle(req, res), port);
    this.server = server;
    return { host: "127.0.0.1", port: bound, url: `http://127.0.0.1:${bound}`, apiKey: this.apiKey };
  }

  /**
   * Lets every request `delay_before_commit` holds now go on at once, and returns how many: a test
   * that has done what it wanted done while a request executed (a second request with its key)
   * ends the hold then, rather than guessing a delay long enough on a loaded machine.
   */
  releaseHeldRequests(): number {
    const held = [...this.held];
    for (const release of held) release();
    return held.length;
  }

  async close(): Promise<void> {
    this.releaseHeldRequests();
    this.trickling.cut();
    await closeHard(this.server);
    this.server = undefined;
  }

  private async handle(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const url = new URL(req.url ?? "/", "http://sandbox");
    const method = req.method ?? "GET";
    const path = url.pathname;
    const body = await readBody(req);
    const params =
      method === "POST"
        ? (qs.parse(body, { depth: 5, arrayLimit: 100 }) as Record<string, unknown>)
        : (qs.parse(url.search.slice(1)) as Record<string, unknown>);
    const idemKey = header(req, "idempotency-key");
    const stripeVersion = header(req, "stripe-version");
    const stripeAccount = header(req, "stripe-account");
    const stripeContext = header(req, "stripe-context");
    const record = (status: number | "dropped", replayed = false) =>
      this.requests.push({
        method,
        path,
        idempotencyKey: idemKey,
        stripeVersion,
        stripeAccount,
        stripeContext,
        status,
        replayed,
      });

    if (path === "/_sandbox/counts") return send(res, 200, JSON.stringify(this.counts()));
    if (
      header(req, "authorization") !== `Bearer ${this.apiKey}` ||
      this.faults.take(method, path, ["unauthorized"]) !== undefined
    ) {
      record(401);
      return sendError(res, 401, { type: "invalid_request_error", message: "Invalid API Key provided." });
    }
    const account = stripeAccount ?? stripeContext;
    if (account !== undefined && !this.accounts.has(account)) {
      // Stripe's answer to an account the key cannot reach (none connected, or no such account).
      record(403);
      return sendError(res, 403, {
        type: "invalid_request_error",
        code: "account_invalid",
        message: `The provided key '${masked(this.apiKey)}' does not have access to account '${account}' (or that account does not exist). Application access may have been revoked.`,
      });
    }
    if (stripeVersion !== undefined && !isStripeVersion(stripeVersion)) {
      record(400);
      return sendError(res, 400, {
        type: "invalid_request_error",
        message: `Invalid Stripe API version: ${stripeVersion}`,
      });
    }
    const before = this.faults.take(method, path, ["rate_limit", "unavailable"]);
    if (before?.kind === "rate_limit") {
      // Before API version 2015-09-08 Stripe's rate limiter answered 400 with the code `rate_limit`
      // (docs.stripe.com/changelog/2015-09-08/rate-limited-requests-return-429-no-rate-limit).
      const status = (stripeVersion ?? "9") < "2015-09-08" ? 400 : 429;
      record(status);
      return sendError(
        res,
        status,
        { type: "invalid_request_error", code: "rate_limit", message: "Too many requests hit the API too quickly." },
        { "retry-after": String(before.retryAfterSec ?? 1) },
      );
    }
    if (before?.kind === "unavailable") {
      record(503);
      return sendError(res, 503, {
        type: "api_error",
        message: "The service is temporarily unavailable. Nothing was done.",
      });
    }

    const objects = this.objectsOf(account);
    // A key is the account's: the same key on another account (or the platform) is another request.
    const slot = method === "POST" && idemKey ? `${this.apiKey}:${account ?? ""}:${idemKey}` : undefined;
    const fingerprint = fingerprintOf(method, path, params);
    const saved = slot ? this.keys.held(slot) : undefined; // pruned: Stripe does so once a key is at least 24 hours old
    if (saved && saved.fingerprint !== fingerprint) {
      record(400);
      return sendError(res, 400, {
        type: "idempotency_error",
        message: `Keys for idempotent requests can only be used with the same parameters they were first used with. Try using a key other than '${idemKey}' if you meant to execute a different request.`,
      });
    }
    if (saved?.state === "in_flight") {
      record(409);
      return sendError(res, 409, {
        type: "idempotency_error",
        code: "idempotency_key_in_use",
        message: "There is currently another in-progress request using this Idempotent Key. Please try again later.",
      });
    }
    if (saved?.state === "done") {
      return this.answer(
        req,
        res,
        method,
        path,
        saved.status!,
        saved.body!,
        { "idempotent-replayed": "true", "original-request": saved.requestId! },
        record,
      );
    }

    if (slot) this.keys.begin(slot, fingerprint);
    const slow = this.faults.take(method, path, ["delay_before_commit"]);
    if (slow) await this.hold(slow.delayMs ?? 1_000, { path, idempotencyKey: idemKey });
    let status: number;
    let out: string;
    let committed: StripeObject | undefined;
    const broke = this.faults.take(method, path, ["error_before_effect"]);
    try {
      if (broke)
        throw new StripeFailure(broke.status ?? 500, { type: "api_error", message: "An unknown error occurred." });
      const result = routeStripe(objects, method, path, params);
      [status, out] = [200, JSON.stringify(renderedFor(stripeVersion, result))];
      if (method === "POST") committed = result as StripeObject;
    } catch (e) {
      if (!(e instanceof StripeFailure)) throw e;
      if (e.beforeExecution) {
        if (slot) this.keys.forget(slot); // failed validation: nothing saved under the key
        record(e.status);
        return sendError(res, e.status, e.error);
      }
      [status, out] = [e.status, JSON.stringify(renderedFor(stripeVersion, { error: e.error }))];
      if (e.error.payment_intent) committed = e.error.payment_intent as StripeObject;
    }
    // A 500 after the effect is what Stripe saved under the key: replays return it too.
    const late = this.faults.take(method, path, ["error_after_commit"]);
    if (late) {
      status = late.status ?? 500;
      const message = status === 503 ? "The service is temporarily unavailable." : "An unknown error occurred.";
      out = JSON.stringify({ error: { type: "api_error", message } });
    }
    const id = requestId();
    if (slot) this.keys.finish(slot, fingerprint, { status, body: out, requestId: id });
    if (committed) this.events.emit("commit", { path, idempotencyKey: idemKey, object: committed, account });
    return this.answer(req, res, method, path, status, out, { "request-id": id }, record);
  }

  /** Holds a request (`delay_before_commit`) for `ms` or until `releaseHeldRequests`, saying so ("held"). */
  private hold(ms: number, request: { path: string; idempotencyKey: string | undefined }): Promise<void> {
    return new Promise((resolve) => {
      const release = () => {
        clearTimeout(timer);
        if (this.held.delete(release)) resolve();
      };
      this.held.add(release);
      const timer = setTimeout(release, ms).unref(); // a held request must not keep the process alive
      this.events.emit("held", request);
    });
  }

  /** Sends a response, unless a fault drops, delays or trickles it. */
  private async answer(
    req: IncomingMessage,
    res: ServerResponse,
    method: string,
    path: string,
    status: number,
    body: string,
    headers: Record<string, string>,
    record: (s: number | "dropped", r?: boolean) => void,
  ): Promise<void> {
    const replayed = headers["idempotent-replayed"] === "true";
    const after = this.faults.take(method, path, ["drop_after_commit", "delay_after_commit", "trickle_after_commit"]);
    if (after?.kind === "drop_after_commit") {
      record("dropped", replayed);
      req.socket.destroy();
      return;
    }
    if (after?.kind === "delay_after_commit") await new Promise((r) => setTimeout(r, after.delayMs ?? 30_000).unref());
    record(status, replayed);
    // Recorded first: a test that awaits "late" finds the request in `requests`.
    if (after?.kind === "delay_after_commit")
      this.events.emit("late", { path, idempotencyKey: header(req, "idempotency-key") });
    if (res.destroyed || req.socket.destroyed) return;
    const idemKey = header(req, "idempotency-key");
    const account = header(req, "stripe-account"); // echoed, as stripe-node reads it (lastResponse.stripeAccount)
    const head = {
      "content-type": "application/json",
      ...headers,
      ...(idemKey && { "idempotency-key": idemKey }),
      ...(account && { "stripe-account": account }),
      "request-id": headers["request-id"] ?? requestId(),
    };
    if (after?.kind === "trickle_after_commit") return this.trickling.start(res, status, head, after.intervalMs);
    send(res, status, body, head);
  }

  private counts(): Record<string, number> {
    return Object.fromEntries(
      ["customers", "payment_intents", "charges", "refunds"].map((r) => [r, this.objects.count(r)]),
    );
  }
}
