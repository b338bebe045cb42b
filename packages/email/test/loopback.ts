/**
 * Test helpers on loopback, for what the mail sandbox cannot be made to do or show:
 *  - `scriptedSmtp`: an SMTP server that answers as its script says (a final reply that is no
 *    verdict, a 4xx to one RCPT TO among others) and keeps what clients wrote (AUTH in clear
 *    text). It offers AUTH PLAIN and LOGIN and never STARTTLS: a server without TLS, or one
 *    behind a man in the middle that took STARTTLS out of the EHLO reply. Anything it does not
 *    know (STARTTLS among them) gets a 502.
 *  - `recordingProxy`: a pass-through to an IMAP server that keeps what clients wrote.
 */
import { connect, createServer, type AddressInfo, type Socket } from "node:net";

export interface SmtpScript {
  /** The reply to RCPT TO for an address. Default "250 ok". */
  rcpt?: (address: string) => string;
  /** The reply after the final dot. Default "250 2.0.0 queued as X". */
  final?: string;
}

export interface ScriptedSmtp {
  readonly port: number;
  /** What the next transactions are answered; reset by `reset()`. */
  script: SmtpScript;
  /** Every line the clients wrote outside message bodies, as written (AUTH lines among them). */
  readonly lines: string[];
  /** Every message body that reached the final dot, whatever the reply: the server holds it. */
  readonly bodies: string[];
  reset(): void;
  close(): Promise<void>;
}

export async function scriptedSmtp(): Promise<ScriptedSmtp> {
  const sockets = new Set<Socket>();
  const server = createServer((socket) => {
    sockets.add(socket);
    socket.on("close", () => sockets.delete(socket));
    socket.on("error", () => {});
    let pending = "";
    let body: string | undefined; // defined while in DATA
    socket.write("220 scripted.test ESMTP\r\n");
    socket.on("data", (chunk: Buffer) => {
      pending += chunk.toString("latin1");
      for (;;) {
        if (body !== undefined) {
          const end = pending.indexOf("\r\n.\r\n");
          if (end < 0) return;
          smtp.bodies.push(body + pending.slice(0, end));
          pending = pending.slice(end + 5);
          body = undefined;
          socket.write(`${smtp.script.final ?? "250 2.0.0 queued as X"}\r\n`);
          continue;
        }
        const eol = pending.indexOf("\r\n");
        if (eol < 0) return;
        const line = pending.slice(0, eol);
        pending = pending.slice(eol + 2);
        smtp.lines.push(line);
        const verb = line.split(" ")[0]!.toUpperCase();
        if (verb === "EHLO") socket.write("250-scripted.test\r\n250-AUTH PLAIN LOGIN\r\n250 8BITMIME\r\n");
        else if (verb === "HELO") socket.write("250 scripted.test\r\n");
        else if (verb === "AUTH") socket.write("235 2.7.0 accepted\r\n");
        else if (verb === "MAIL" || verb === "RSET" || verb === "NOOP") socket.write("250 ok\r\n");
        else if (verb === "RCPT")
          socket.write(`${smtp.script.rcpt?.(/<([^>]*)>/.exec(line)?.[1] ?? "") ?? "250 ok"}\r\n`);
        else if (verb === "DATA") {
          body = "";
          socket.write("354 go ahead\r\n");
        } else if (verb === "QUIT") {
          socket.end("221 bye\r\n");
          return;
        } else socket.write("502 5.5.2 command not recognized\r\n");
      }
    });
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const smtp: ScriptedSmtp = {
    port: (server.address() as AddressInfo).port,
    script: {},
    lines: [],
    bodies: [],
    reset() {
      smtp.script = {};
      smtp.lines.length = 0;
      smtp.bodies.length = 0;
    },
    close: () =>
      new Promise<void>((resolve) => {
        for (const s of sockets) s.destroy();
        server.close(() => resolve());
      }),
  };
  return smtp;
}

/** A pass-through to a server on loopback that keeps what clients wrote (a login in clear text). */
export async function recordingProxy(target: number) {
  const sockets = new Set<Socket>();
  const written: string[] = [];
  const server = createServer((client) => {
    const upstream = connect(target, "127.0.0.1");
    for (const s of [client, upstream]) {
      sockets.add(s);
      const end = () => {
        client.destroy();
        upstream.destroy();
        sockets.delete(client);
        sockets.delete(upstream);
      };
      s.on("close", end);
      s.on("error", end);
    }
    client.on("data", (chunk: Buffer) => {
      written.push(chunk.toString("latin1"));
      upstream.write(chunk);
    });
    upstream.pipe(client);
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  return {
    port: (server.address() as AddressInfo).port,
    /** Everything the clients wrote, in order. */
    written,
    close: () =>
      new Promise<void>((resolve) => {
        for (const s of sockets) s.destroy();
        server.close(() => resolve());
      }),
  };
}
