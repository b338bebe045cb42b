/**
 * What a person needs of a failed HubSpot request, and nothing more: the status, HubSpot's
 * category and message, its correlationId (the request id its support asks for) and the host.
 * Never the token, the request's path or query (a read's path holds the operation key), or the
 * client's dump of the whole answer (its body and headers), which the error's `cause` keeps.
 */

/** The fields of @hubspot/api-client's ApiException (or a fetch error) read here. */
export interface HubSpotError {
  code?: number | string;
  body?: { message?: string; category?: string; policyName?: string; correlationId?: string };
  headers?: Record<string, string>;
  message?: string;
}

export interface HubSpotRequestEvidence {
  /** The HTTP status, when an answer came. */
  readonly status: number | undefined;
  /** HubSpot's correlationId for the request, when it answered one. */
  readonly requestId: string | undefined;
  /** The API host the request went to, when known. */
  readonly host: string | undefined;
  /** What the answer said: status, category and HubSpot's message; or the network error's code. */
  readonly said: string;
}

export function evidenceOf(error: unknown, host?: string): HubSpotRequestEvidence {
  const e = (error ?? {}) as HubSpotError;
  const status = typeof e.code === "number" ? e.code : undefined;
  // A body that is not HubSpot's JSON (a proxy's or gateway's page, handed over as text) is not
  // quoted: it is no evidence of HubSpot's, and may be anything.
  const said = !status
    ? `${e.code ?? "error"}: ${hostsOnly(e.message ?? String(error))}`
    : typeof e.body !== "object" || e.body === null
      ? `${status} (an answer without HubSpot's JSON error body)`
      : `${status} ${e.body.category ?? ""}: ${e.body.message ?? ""}`.trim();
  return { status, requestId: e.body?.correlationId, host, said };
}

/**
 * HubSpot's own answer that no record matched a read: a 404 whose JSON says category
 * OBJECT_NOT_FOUND ("Object not found.  objectId are usually numeric."). A 404 from anything in
 * front of HubSpot (`answeredInFront`) says nothing of the record: taken as absence, it "proved"
 * an operation's written record absent, and the write was sent again.
 */
export function notFoundByHubSpot(error: unknown): boolean {
  return (error as { code?: unknown } | null)?.code === 404 && errorBodyOf(error)?.category === "OBJECT_NOT_FOUND";
}

/**
 * HubSpot's own answer that it has no definition of a property: a 404 with its JSON error (a
 * `category`; the sandbox answers OBJECT_NOT_FOUND, but we found no quote of HubSpot's, so any
 * category of its JSON counts). Not a 404 in front of HubSpot (`answeredInFront`).
 */
export function propertyNotFoundByHubSpot(error: unknown): boolean {
  return (error as { code?: unknown } | null)?.code === 404 && typeof errorBodyOf(error)?.category === "string";
}

/**
 * HubSpot's own 400 (its JSON error) to a read by a unique property: it refuses a read by one that
 * is not unique-value, or no longer exists, so the property's kept verdict may be stale. A 400
 * page in front of HubSpot (`answeredInFront`) says nothing of the property: dropped on it, the
 * verdict was read again, and behind a firewall refusing the properties API that read failed, so
 * no lookup settled and no create passed its check.
 */
export function readByPropertyRefused(error: unknown): boolean {
  return (error as { code?: unknown } | null)?.code === 400 && !answeredInFront(error);
}

/**
 * An HTTP answer without HubSpot's JSON error (a page of a proxy, load balancer, gateway or
 * firewall in front of HubSpot, which the client hands over as text, or JSON with no `category`):
 * its status is that server's, not HubSpot's word, and HubSpot's answer was not received.
 */
export function answeredInFront(error: unknown): boolean {
  return (
    typeof (error as { code?: unknown } | null)?.code === "number" && typeof errorBodyOf(error)?.category !== "string"
  );
}

function errorBodyOf(error: unknown): { category?: unknown } | undefined {
  const body = (error as { body?: unknown } | null)?.body;
  return typeof body === "object" && body !== null ? body : undefined;
}

/** The evidence as one line: "<said> (HubSpot request id …, host …)". */
export function describeEvidence(ev: HubSpotRequestEvidence): string {
  const refs = [ev.requestId && `HubSpot request id ${ev.requestId}`, ev.host && `host ${ev.host}`].filter(Boolean);
  return refs.length ? `${ev.said} (${refs.join(", ")})` : ev.said;
}

/**
 * A network error's message with each URL cut to its host: node-fetch says "request to <url>
 * failed, reason: …", and the URL's path and query hold the operation key (a read by it), record
 * ids, a token where one goes in the query. An operator needs only which server refused.
 */
export function hostsOnly(message: string): string {
  return message.replace(/\b[a-z][a-z0-9+.-]*:\/\/[^\s"'<>]+/gi, (url) => {
    try {
      return new URL(url).host;
    } catch {
      return "(a URL)";
    }
  });
}
