/** How the Stripe sandbox reads headers and writes answers: JSON bodies, errors as `{ error }` with a Request-Id. */
import type { IncomingMessage, ServerResponse } from "node:http";
import { randomBytes } from "node:crypto";

/** A request id as Stripe's look. */
export const requestId = () => `req_${randomBytes(7).toString("hex")}`;

export function header(req: IncomingMessage, name: string): string | undefined {
  const v = req.headers[name];
  return Array.isArray(v) ? v[0] : v;
}

export function send(res: ServerResponse, status: number, body: string, headers: Record<string, string> = {}): void {
  res.writeHead(status, { "content-type": "application/json", ...headers });
  res.end(body);
}

export function sendError(
  res: ServerResponse,
  status: number,
  error: object,
  headers: Record<string, string> = {},
): void {
  send(res, status, JSON.stringify({ error }), { "request-id": requestId(), ...headers });
}

/** An API key as Stripe's messages show it: its prefix, then stars but for the last four characters. */
export function masked(key: string): string {
  const prefix = /^[a-z]+_(?:test_|live_)?/.exec(key)?.[0] ?? "";
  const rest = key.slice(prefix.length);
  return `${prefix}${"*".repeat(Math.max(rest.length - 4, 0))}${rest.slice(-4)}`;
}
