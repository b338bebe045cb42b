/**
 * A forwarding proxy in front of a sandbox that holds the first request matching `hold` until the
 * test calls `release()`: a gate, not a timer. `hold: "answer"` sends the request on at once (the
 * provider commits) and keeps its answer back: an answer that arrives late, not lost.
 * `hold: "request"` keeps the request itself back: it reaches the provider, and commits, only
 * when released. Every other request is forwarded at once; answers are passed on unchanged.
 * The client must wait longer than the hold (its timeout), or the answer is lost, not late.
 */
import http, { type IncomingMessage, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";

export interface GatedProxy {
  readonly port: number;
  readonly url: string;
  /** Resolves once the held request arrived and (`hold: "answer"`) the provider answered it. */
  readonly held: Promise<void>;
  /** Lets the held request (or its answer) go on. */
  release(): void;
  close(): Promise<void>;
}

/** An answer as it came back from the target. */
export interface Forwarded {
  readonly status: number;
  readonly headers: http.IncomingHttpHeaders;
  readonly body: Buffer;
}

/** Sends a request (its method, path, headers and `body`) on to `to`; resolves with the answer. */
export function forward(to: URL, req: IncomingMessage, body: Buffer): Promise<Forwarded> {
  return new Promise((resolve, reject) => {
    const out = http.request(
      {
        host: to.hostname,
        port: to.port,
        method: req.method,
        path: req.url,
        headers: { ...req.headers, host: to.host },
      },
      (answer) => {
        const parts: Buffer[] = [];
        answer.on("data", (c: Buffer) => parts.push(c));
        answer.on("end", () =>
          resolve({ status: answer.statusCode ?? 502, headers: answer.headers, body: Buffer.concat(parts) }),
        );
      },
    );
    out.on("error", reject);
    out.end(body);
  });
}

export async function gatedProxy(
  target: string,
  match: { method: string; path: string; hold: "answer" | "request" },
): Promise<GatedProxy> {
  const to = new URL(target);
  let taken = false;
  let heldNow: () => void = () => {};
  const held = new Promise<void>((r) => (heldNow = r));
  let release: () => void = () => {};
  const gate = new Promise<void>((r) => (release = r));

  const answer = async (req: IncomingMessage, body: Buffer, res: ServerResponse, hold: boolean) => {
    if (hold && match.hold === "request") {
      heldNow();
      await gate;
    }
    const a = await forward(to, req, body);
    if (hold && match.hold === "answer") {
      heldNow();
      await gate;
    }
    if (!res.destroyed) res.writeHead(a.status, a.headers).end(a.body);
  };

  const server = http.createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on("data", (c: Buffer) => chunks.push(c));
    req.on("end", () => {
      const hold = !taken && req.method === match.method && (req.url ?? "").startsWith(match.path);
      if (hold) taken = true;
      answer(req, Buffer.concat(chunks), res, hold).catch(() => res.destroy());
    });
  });
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", () => r()));
  const port = (server.address() as AddressInfo).port;
  return {
    port,
    url: `http://127.0.0.1:${port}`,
    held,
    release: () => release(),
    close: () =>
      new Promise<void>((r) => {
        release(); // a request still held is let go, so nothing waits on the gate after the test
        server.closeAllConnections();
        server.close(() => r());
      }),
  };
}
