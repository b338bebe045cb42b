/**
 * An HTTPS server whose certificate no one trusts (self-signed, made with openssl for this run),
 * as a TLS-inspecting proxy or a private endpoint with its own certificate looks to the client:
 * the handshake fails before any byte of a request is written. `requests` counts the requests
 * that got through (none should); each is answered 500.
 */
import { execFileSync } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import https from "node:https";
import type { AddressInfo } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";

export interface UntrustedServer {
  readonly basePath: string;
  /** Requests that reached the server (past the handshake). */
  readonly requests: () => number;
  close(): Promise<void>;
}

export async function untrustedServer(): Promise<UntrustedServer> {
  const dir = mkdtempSync(join(tmpdir(), "idem-untrusted-tls-"));
  let key: Buffer;
  let cert: Buffer;
  try {
    execFileSync(
      "openssl",
      ["req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-days", "2"].concat(
        ["-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"],
        ["-keyout", join(dir, "k.pem"), "-out", join(dir, "c.pem")],
      ),
      { stdio: "pipe" },
    );
    key = readFileSync(join(dir, "k.pem"));
    cert = readFileSync(join(dir, "c.pem"));
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
  let requests = 0;
  const server = https.createServer({ key, cert }, (_req, res) => {
    requests += 1;
    res.writeHead(500).end();
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  return {
    basePath: `https://127.0.0.1:${(server.address() as AddressInfo).port}`,
    requests: () => requests,
    close: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}
