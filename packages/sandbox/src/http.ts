/** The HTTP plumbing the sandbox servers share: listen on loopback, close hard, read a body. */
import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";

/** A loopback HTTP server with a handler; `port` 0 lets the OS choose. */
export async function listen(
  handler: (req: IncomingMessage, res: ServerResponse) => Promise<void>,
  port: number,
): Promise<{ server: Server; port: number }> {
  const server = createServer((req, res) => void handler(req, res));
  await new Promise<void>((resolve) => server.listen(port, "127.0.0.1", resolve));
  return { server, port: (server.address() as AddressInfo).port };
}

/** Closes the server and every connection still open (held answers included). */
export async function closeHard(server: Server | undefined): Promise<void> {
  if (!server) return;
  server.closeAllConnections();
  await new Promise((r) => server.close(r));
}

export function readBody(req: IncomingMessage): Promise<string> {
  return new Promise((resolve, reject) => {
    let data = "";
    req.setEncoding("utf8");
    req.on("data", (c) => (data += c));
    req.on("end", () => resolve(data));
    req.on("error", reject);
  });
}
