/**
 * A forwarding proxy in front of the HubSpot sandbox that commits a write late: the first request
 * matching `hold` is forwarded only once its client has given up on it (its socket closed, as the
 * adapter's timeout closes it), as a request that reached HubSpot's edge and was committed after
 * the client timed out. Every other request is forwarded at once. Answers are passed on unchanged.
 * With `releaseAfter`, the held request is forwarded once its client has given up and a request
 * `releaseAfter` matches has been answered, before that answer is passed on: a write committed
 * while a lookup was reading.
 */
import http, { type IncomingMessage, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import { forward } from "@idem/testkit";

export interface HoldingProxy {
  readonly basePath: string;
  /** Resolves once every held request has been forwarded and answered. */
  drained(): Promise<void>;
  close(): Promise<void>;
}

export async function holdingProxy(
  target: string,
  hold: { method: string; path: string; releaseAfter?: (req: IncomingMessage) => boolean },
): Promise<HoldingProxy> {
  const to = new URL(target);
  let held = false;
  const late: Promise<void>[] = [];
  /** The held request, once its client gave up, waiting for a request `releaseAfter` matches. */
  let waiting: (() => Promise<void>) | undefined;
  /** Forwards the request; passes its answer on unless the client has gone; a failure answers nothing. */
  const pass = (req: IncomingMessage, body: Buffer, res: ServerResponse) =>
    forward(to, req, body).then(
      async (a) => {
        if (waiting && hold.releaseAfter?.(req)) {
          const release = waiting;
          waiting = undefined;
          await release();
        }
        if (!res.destroyed && !res.writableEnded) res.writeHead(a.status, a.headers).end(a.body);
      },
      () => {},
    );
  const server = http.createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on("data", (c: Buffer) => chunks.push(c));
    req.on("end", () => {
      const body = Buffer.concat(chunks);
      if (!held && req.method === hold.method && (req.url ?? "").startsWith(hold.path)) {
        held = true;
        late.push(
          new Promise<void>((resolve) =>
            res.once("close", () => {
              const go = () => pass(req, body, res).then(resolve);
              if (hold.releaseAfter) waiting = go;
              else void go();
            }),
          ),
        );
      } else void pass(req, body, res);
    });
  });
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", () => r()));
  return {
    basePath: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
    drained: async () => {
      await Promise.all(late);
    },
    close: () =>
      new Promise<void>((r) => {
        server.closeAllConnections();
        server.close(() => r());
      }),
  };
}
