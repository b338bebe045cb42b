/**
 * A TCP proxy in front of Postgres, for tests that watch or break the wire: each client gets its
 * own connection upstream and `wire` joins the two (by default, both ways as they come); either
 * side closing closes both. `down()` refuses new connections and cuts the open ones; `up()` takes
 * new ones again, as a database back from an outage does.
 */
import { connect, createServer, type Socket } from "node:net";

export interface PgProxy {
  /** The target's URL with the proxy's host and port. */
  readonly url: string;
  down(): void;
  up(): void;
  close(): Promise<void>;
}

export async function pgProxy(
  target: URL,
  wire: (client: Socket, upstream: Socket) => void = (client, upstream) => {
    client.pipe(upstream);
    upstream.pipe(client);
  },
): Promise<PgProxy> {
  const sockets = new Set<Socket>();
  let refusing = false;
  const server = createServer((client) => {
    if (refusing) return void client.destroy();
    const upstream = connect(Number(target.port), target.hostname);
    for (const s of [client, upstream]) {
      sockets.add(s);
      s.on("error", () => {});
      s.on("close", () => {
        client.destroy();
        upstream.destroy();
        sockets.delete(s);
      });
    }
    wire(client, upstream);
  });
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  const url = new URL(target);
  url.host = `127.0.0.1:${(server.address() as { port: number }).port}`;
  return {
    url: url.toString(),
    down() {
      refusing = true;
      for (const s of sockets) s.destroy();
    },
    up() {
      refusing = false;
    },
    async close() {
      for (const s of sockets) s.destroy();
      await new Promise((r) => server.close(r));
    },
  };
}
