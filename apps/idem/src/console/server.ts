/** Serves the console on its own port (`idem console`, or beside the daemon with `daemon.console`). */
import type { AddressInfo } from "node:net";
import { serve } from "@hono/node-server";
import type { Ledger } from "@idem/core";
import type { Logger } from "pino";
import type { IdemConfig } from "../config.js";
import { consoleApp } from "./app.js";
import { Access } from "./auth.js";

export interface ConsoleServer {
  readonly port: number;
  readonly url: string;
  close(): Promise<void>;
}

export async function serveConsole(ledger: Ledger, config: IdemConfig, log: Logger): Promise<ConsoleServer> {
  const settings = config.console;
  const app = consoleApp(ledger, config, new Access(settings), log);
  const server = await new Promise<ReturnType<typeof serve>>((resolve, reject) => {
    const s = serve({ fetch: app.fetch, port: settings.port, hostname: settings.host }, () => resolve(s));
    s.once("error", reject);
  });
  const port = (server.address() as AddressInfo).port;
  const host = settings.host.includes(":") ? `[${settings.host}]` : settings.host;
  return {
    port,
    url: `http://${host}:${port}`,
    close: () =>
      new Promise<void>((resolve) => {
        // Live pages hold their event streams open: end them rather than wait for the browsers.
        (server as unknown as { closeAllConnections?: () => void }).closeAllConnections?.();
        server.close(() => resolve());
      }),
  };
}
