/** Test helper: the client sockets a test opens, to fail one as the kernel does. */
import net, { type Socket } from "node:net";

/**
 * Keeps the sockets net.connect opens until `restore()` (nodemailer's client connects with it),
 * so a test can fail one the way the kernel does: with a socket error on an open connection.
 */
export function captureSockets() {
  const mod = net as unknown as { connect: typeof net.connect };
  const original = mod.connect;
  const list: Socket[] = [];
  mod.connect = ((...args: Parameters<typeof net.connect>) => {
    const socket = (original as (...a: unknown[]) => Socket)(...args);
    list.push(socket);
    return socket;
  }) as typeof net.connect;
  const restore = () => {
    mod.connect = original;
  };
  return { list, restore };
}
