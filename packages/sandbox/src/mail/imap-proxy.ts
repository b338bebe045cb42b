/**
 * The mail sandbox's IMAP port: a pass-through to its Dovecot that can answer a SEARCH with NO,
 * as a server under load or rebuilding its index does (RFC 9051's [UNAVAILABLE]); Dovecot cannot
 * be made to. Clients (imapflow) write each command whole, so a command is recognised at the
 * start of what the client sent.
 */
import { connect, createServer, type AddressInfo, type Socket } from "node:net";

export interface ImapProxy {
  readonly port: number;
  close(): Promise<void>;
}

/** `refuse()` is asked per SEARCH: true answers it NO instead of passing it on. */
export async function imapProxy(target: number, refuse: () => boolean): Promise<ImapProxy> {
  const sockets = new Set<Socket>();
  const server = createServer((client) => {
    const upstream = connect(target, "127.0.0.1");
    const end = () => {
      client.destroy();
      upstream.destroy();
      sockets.delete(client);
      sockets.delete(upstream);
    };
    for (const s of [client, upstream]) {
      sockets.add(s);
      s.on("close", end);
      s.on("error", end);
    }
    client.on("data", (chunk: Buffer) => {
      const command = /^(\S+) (?:UID )?SEARCH\b/i.exec(chunk.toString("latin1", 0, 64));
      if (command && refuse()) client.write(`${command[1]} NO [UNAVAILABLE] search temporarily unavailable\r\n`);
      else upstream.write(chunk);
    });
    upstream.pipe(client);
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  return {
    port: (server.address() as AddressInfo).port,
    close: () =>
      new Promise<void>((resolve) => {
        for (const s of sockets) s.destroy();
        server.close(() => resolve());
      }),
  };
}
