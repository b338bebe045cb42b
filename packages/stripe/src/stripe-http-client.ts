/**
 * stripe-node's Node HTTP client with a deadline: a request, and its answer, must end within
 * `deadlineMs` of its start. stripe-node's own client guards a request with `req.setTimeout`
 * (`timeoutMs`) only, a socket inactivity timeout: an answer whose body comes a byte now and then
 * and never ends (Stripe, or a proxy in front of it, committed the charge and sent the head) resets
 * it with every byte, and `execute` never returns while the heartbeat renews its lease.
 *
 * Built on the extension point stripe-node documents (its `httpClient` option: a client that
 * extends `Stripe.HttpClient`, a response that extends `Stripe.HttpClientResponse`), and read as
 * its own client reads: the same agents (keep-alive), the same inactivity timeout, the same
 * response-body errors (`HttpClient.makeResponseBodyError`), so stripe-node reports a cut request
 * as a `StripeConnectionError` (ETIMEDOUT), ambiguous once the request may have left. What it
 * does not do: cancel on `op.signal` (stripe-node passes no signal to its client).
 */
import http from "node:http";
import https from "node:https";
import Stripe from "stripe";

/** The default of `StripeConfig.deadlineMs`. */
export const STRIPE_DEADLINE_MS = 2 * 60_000;

/**
 * The error a request is cut with at its deadline (code ETIMEDOUT, as stripe-node's own timeout):
 * its `detail`, or the `exception` of the response-body error that is its `detail`.
 */
export class StripeDeadlineError extends Error {
  readonly code = "ETIMEDOUT";
  constructor(readonly deadlineMs: number) {
    super(`no complete answer from Stripe within ${deadlineMs} ms (deadlineMs)`);
    this.name = "StripeDeadlineError";
  }
}

/** The deadline error a `StripeConnectionError`'s `detail` carries, if it was cut at its deadline. */
export function deadlineOf(detail: unknown): StripeDeadlineError | undefined {
  if (detail instanceof StripeDeadlineError) return detail;
  const inner: unknown = (detail as { exception?: unknown } | null | undefined)?.exception;
  return inner instanceof StripeDeadlineError ? inner : undefined;
}

/**
 * `error`, or, when it is stripe-node's error for a request cut at its deadline, the same error
 * (a StripeConnectionError with its detail and request id) worded as what happened. stripe-node
 * words every request that ends with ETIMEDOUT as its own inactivity timeout ("Request aborted due
 * to timeout being reached (20000ms)", naming `timeoutMs`), a cut at the deadline too: a lookup's
 * failure, stored as its message ("lookup failed: …"), then told an operator of a timeout that
 * never ran out and nothing of the deadline to raise. Classified as before (its type and detail
 * are kept); an execution's reason names the deadline already (classifyStripeError).
 */
export function deadlineWorded(error: unknown): unknown {
  if (!(error instanceof Stripe.errors.StripeConnectionError)) return error;
  const cut = deadlineOf(error.detail);
  if (!cut) return error;
  const worded = new Stripe.errors.StripeConnectionError({
    message: `the request was cut at its deadline: ${cut.message}`,
    ...(error.detail !== undefined && { detail: error.detail }),
    ...(error.requestId !== undefined && { requestId: error.requestId }),
  });
  // stripe-node's errors are all named "Error": the type says which this is, where it is read.
  worded.name = "StripeConnectionError";
  return worded;
}

// As stripe-node's NodeHttpClient: one keep-alive agent per protocol for the process.
const httpAgent = new http.Agent({ keepAlive: true });
const httpsAgent = new https.Agent({ keepAlive: true });

export class DeadlineHttpClient extends Stripe.HttpClient {
  constructor(private readonly deadlineMs: number) {
    super();
    if (!(Number.isInteger(deadlineMs) && deadlineMs > 0 && deadlineMs <= 2 ** 31 - 1))
      throw new RangeError(`deadlineMs must be a whole number of ms > 0 and at most 2^31-1 (got ${deadlineMs})`);
  }

  override getClientName(): string {
    return "node";
  }

  override makeRequest(
    host: string,
    port: string,
    path: string,
    method: string,
    headers: Record<string, string | number | string[]>,
    requestData: string,
    protocol: string,
    timeout: number,
  ): Promise<DeadlineHttpClientResponse> {
    const insecure = protocol === "http";
    return new Promise((resolve, reject) => {
      const req = (insecure ? http : https).request({
        host,
        port,
        path,
        method,
        agent: insecure ? httpAgent : httpsAgent,
        headers,
        ciphers: "DEFAULT:!aNULL:!eNULL:!LOW:!EXPORT:!SSLv2:!MD5", // stripe-node's
      });
      let timedOut = false;
      req.setTimeout(timeout, () => {
        timedOut = true;
        req.destroy(Stripe.HttpClient.makeTimeoutError());
      });
      // From the request's start to its answer's end, whatever trickles in between. Cut after the
      // head, the answer is destroyed with it, so stripe-node's body reader rejects with it.
      let answer: http.IncomingMessage | undefined;
      const deadline = setTimeout(() => {
        const cut = new StripeDeadlineError(this.deadlineMs);
        if (answer) answer.destroy(cut);
        else req.destroy(cut);
      }, this.deadlineMs);
      deadline.unref(); // the socket holds the process while the request runs; the timer never does
      const done = () => clearTimeout(deadline);
      req.once("close", done);
      req.on("response", (res) => {
        answer = res;
        res.once("close", done);
        resolve(new DeadlineHttpClientResponse(res, () => timedOut));
      });
      req.on("error", (error) => {
        done();
        reject(error);
      });
      req.write(requestData);
      req.end();
    });
  }
}

/** An answer read as stripe-node's NodeHttpClientResponse reads it. */
export class DeadlineHttpClientResponse extends Stripe.HttpClientResponse {
  constructor(
    private readonly res: http.IncomingMessage,
    private readonly timedOut: () => boolean,
  ) {
    super(res.statusCode ?? 0, res.headers as Record<string, string>);
  }

  override getRawResponse(): http.IncomingMessage {
    return this.res;
  }

  override toStream(streamCompleteCallback: () => void): http.IncomingMessage {
    this.res.once("end", () => streamCompleteCallback());
    return this.res;
  }

  override toJSON(): Promise<unknown> {
    return new Promise((resolve, reject) => {
      let body = "";
      const failed = (error: unknown) =>
        reject(Stripe.HttpClient.makeResponseBodyError(this.timedOut() ? Stripe.HttpClient.makeTimeoutError() : error));
      this.res.setEncoding("utf8");
      this.res.on("data", (chunk: string) => {
        body += chunk;
      });
      // Without an error listener, an answer cut after its head never settles (stripe-node#2814).
      this.res.once("error", failed);
      this.res.once("close", () => {
        if (!this.res.complete) failed(null);
      });
      this.res.once("end", () => {
        try {
          resolve(this._parseResponseBody(body));
        } catch (e) {
          reject(e);
        }
      });
    });
  }
}
