/**
 * Test helpers on loopback, for what the mail sandbox cannot be made to do or show:
 *  - `scriptedSmtp`: an SMTP server that answers as its script says (a final reply that is no
 *    verdict, a 4xx to one RCPT TO among others) and keeps what clients wrote (AUTH in clear
 *    text). It offers AUTH PLAIN and LOGIN and never STARTTLS: a server without TLS, or one
 *    behind a man in the middle that took STARTTLS out of the EHLO reply. Anything it does not
 *    know (STARTTLS among them) gets a 502.
 *  - `recordingProxy`: a pass-through to an IMAP server that keeps what clients wrote.
 *  - `appendFaultProxy`: one that answers an APPEND NO, or drops the connection as its OK comes,
 *    a SELECT (or EXAMINE) NO, and a SEARCH NO or never.
 *  - `listRewritingProxy`: one that rewrites the server's LIST lines (attributes a server
 *    configured otherwise would send).
 *  - `tricklingProxy`: one that withholds the tagged answer to a command and writes an untagged
 *    `* OK` line every 300 ms instead, for good (a server stuck in a search, a broken proxy).
 *  - `slowProxy`: one that passes each SELECT and EXAMINE on only after a delay, as a server far
 *    away answers (a round trip of a WAN link).
 */
import { connect, createServer, type AddressInfo, type Socket } from "node:net";

export interface SmtpScript {
  /** The reply to RCPT TO for an address. Default "250 ok". */
  rcpt?: (address: string) => string;
  /** The reply after the final dot. Default "250 2.0.0 queued as X". */
  final?: string;
  /**
   * Where the server starts to trickle: instead of its reply (to EHLO, or after the final dot) it
   * writes one more `250-` continuation line every 300 ms and never the last line (a tarpit).
   */
  trickle?: "EHLO" | "final";
}

/** How often a trickling server writes its next line: well inside any inactivity timeout. */
const TRICKLE_MS = 300;

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
    let trickling: NodeJS.Timeout | undefined;
    const trickle = () => {
      trickling = setInterval(() => socket.write("250-still thinking\r\n"), TRICKLE_MS);
    };
    socket.on("close", () => clearInterval(trickling));
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
          if (smtp.script.trickle === "final") return trickle();
          socket.write(`${smtp.script.final ?? "250 2.0.0 queued as X"}\r\n`);
          continue;
        }
        const eol = pending.indexOf("\r\n");
        if (eol < 0) return;
        const line = pending.slice(0, eol);
        pending = pending.slice(eol + 2);
        smtp.lines.push(line);
        const verb = line.split(" ")[0]!.toUpperCase();
        if (verb === "EHLO" && smtp.script.trickle === "EHLO") return trickle();
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

/**
 * A pass-through to a server on loopback: each client gets its own upstream connection, and
 * `wire` joins the two (`end` closes both). `close()` cuts every connection and stops listening.
 */
async function passThrough(target: number, wire: (client: Socket, upstream: Socket, end: () => void) => void) {
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
    wire(client, upstream, end);
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

/** A pass-through to a server on loopback that keeps what clients wrote (a login in clear text). */
export async function recordingProxy(target: number) {
  const written: string[] = [];
  const proxy = await passThrough(target, (client, upstream) => {
    client.on("data", (chunk: Buffer) => {
      written.push(chunk.toString("latin1"));
      upstream.write(chunk);
    });
    upstream.pipe(client);
  });
  /** Everything the clients wrote, in order. */
  return { ...proxy, written };
}

/** How `appendFaultProxy` fails the next APPEND: a tagged NO, or the connection closed before the OK. */
export type AppendFault = { readonly kind: "no"; readonly answer: string } | { readonly kind: "drop-after-ok" };

/**
 * What `appendFaultProxy` does with the next SEARCH (a `UID SEARCH` too): passes it on, answers it
 * with `answer` (`NO [UNAVAILABLE] …`) instead, or holds it (never passed on, never answered).
 */
export type SearchFault =
  | { readonly kind: "pass" }
  | { readonly kind: "no"; readonly answer: string }
  | { readonly kind: "hold" };

/**
 * A pass-through to an IMAP server that fails APPENDs as `faults` says, one fault per APPEND, in
 * order: `no` answers it with `answer` (`NO [INUSE] …`) and swallows its literal, so nothing
 * reaches the server; `drop-after-ok` passes it on and closes the connection as the server's OK
 * comes back, so the copy is filed and the client cannot tell. `appends` counts the APPENDs
 * clients sent. imapflow writes an APPEND's command line at the start of a chunk (with LITERAL+,
 * which Dovecot offers, its literal follows without waiting for a continuation). `searches` does
 * the same for SEARCHes, and `onHold` is told when one is held.
 */
export async function appendFaultProxy(target: number) {
  const state = {
    /** The faults for the next APPENDs, first first; an APPEND with none left passes. */
    faults: [] as AppendFault[],
    /** The faults for the next SEARCHes, first first; a SEARCH with none left passes. */
    searches: [] as SearchFault[],
    /** Told when a SEARCH is held (set by a test). */
    onHold: undefined as (() => void) | undefined,
    appends: 0,
    /**
     * How many SELECT (or EXAMINE: a lookup opens its mailbox read-only) commands after an APPEND
     * are answered NO [INUSE] (the mailbox locked for now); the look before sending passes.
     */
    refuseSelects: 0,
  };
  const proxy = await passThrough(target, (client, upstream, end) => {
    let swallow = 0; // bytes left of a literal answered NO
    let dropTag: string | undefined;
    client.on("data", (chunk: Buffer) => {
      let data = chunk;
      if (swallow > 0) {
        const n = Math.min(swallow, data.length);
        swallow -= n;
        data = data.subarray(n);
        if (data.length === 0) return;
      }
      const select = /^(\S+) (?:SELECT|EXAMINE)\b/i.exec(data.toString("latin1", 0, 64));
      if (select && state.refuseSelects > 0 && state.appends > 0) {
        state.refuseSelects--;
        client.write(`${select[1]} NO [INUSE] Mailbox is locked, try again\r\n`);
        return;
      }
      const search = /^(\S+) (?:UID )?SEARCH\b/i.exec(data.toString("latin1", 0, 64));
      const searchFault = search ? state.searches.shift() : undefined;
      if (search && searchFault?.kind === "no") return void client.write(`${search[1]} ${searchFault.answer}\r\n`);
      if (searchFault?.kind === "hold") return state.onHold?.();
      const command = /^(\S+) APPEND [^\r\n]*\{(\d+)(\+?)\}\r\n/i.exec(data.toString("latin1", 0, 1_024));
      if (command) {
        state.appends++;
        const fault = state.faults.shift();
        if (fault?.kind === "no") {
          // The literal and the CRLF that ends the command: what of them is not in this chunk comes next.
          const rest = data.length - Buffer.byteLength(command[0], "latin1");
          swallow = command[3] ? Math.max(0, Number(command[2]) + 2 - rest) : 0;
          client.write(`${command[1]} ${fault.answer}\r\n`);
          return;
        }
        if (fault?.kind === "drop-after-ok") dropTag = command[1];
      }
      upstream.write(data);
    });
    upstream.on("data", (chunk: Buffer) => {
      const text = chunk.toString("latin1");
      if (dropTag !== undefined && (text.startsWith(`${dropTag} `) || text.includes(`\r\n${dropTag} `))) return end();
      client.write(chunk);
    });
  });
  return Object.assign(state, proxy);
}

/**
 * A pass-through to an IMAP server that rewrites each untagged LIST line the server sends
 * (`* LIST (<attributes>) "/" <name>`) with `rewrite`: what a server configured otherwise would
 * list. What the server sends is passed on up to its last complete line, each line whole.
 */
export async function listRewritingProxy(target: number, rewrite: (line: string) => string) {
  return passThrough(target, (client, upstream) => {
    client.pipe(upstream);
    let pending = "";
    upstream.on("data", (chunk: Buffer) => {
      pending += chunk.toString("latin1");
      const whole = pending.lastIndexOf("\r\n") + 2;
      if (whole < 2) return;
      const lines = pending.slice(0, whole).split("\r\n");
      pending = pending.slice(whole);
      const out = lines.map((l) => (l.startsWith("* LIST ") ? rewrite(l) : l)).join("\r\n");
      client.write(Buffer.from(out, "latin1"));
    });
  });
}

/**
 * A pass-through to an IMAP server that withholds the server's tagged answer to the next commands
 * named in `hold` (verbs: `SEARCH` also holds a `UID SEARCH`), one each, in order: the command
 * reaches the server (an APPEND files its copy), but the client gets only an untagged
 * `* OK still working` every 300 ms, for good. Everything else passes, each line whole.
 */
export async function tricklingProxy(target: number) {
  const state = {
    /** The verbs whose next tagged answers are withheld, first first. */
    hold: [] as string[],
    /** How many answers were withheld. */
    held: 0,
  };
  const proxy = await passThrough(target, (client, upstream) => {
    const tags = new Set<string>();
    let trickling: NodeJS.Timeout | undefined;
    client.on("close", () => clearInterval(trickling));
    client.on("data", (chunk: Buffer) => {
      // imapflow writes each command line at the start of a chunk (an APPEND's literal after it).
      const command = /^(\S+) (?:UID )?([A-Za-z]+)/.exec(chunk.toString("latin1", 0, 128));
      if (command && command[2]!.toUpperCase() === state.hold[0]) {
        state.hold.shift();
        state.held++;
        tags.add(command[1]!);
        clearInterval(trickling);
        trickling = setInterval(() => client.write("* OK still working\r\n"), TRICKLE_MS);
      }
      upstream.write(chunk);
    });
    let pending = "";
    upstream.on("data", (chunk: Buffer) => {
      pending += chunk.toString("latin1");
      const whole = pending.lastIndexOf("\r\n") + 2;
      if (whole < 2) return;
      const lines = pending.slice(0, whole - 2).split("\r\n");
      pending = pending.slice(whole);
      const passed = lines.filter((l) => {
        const tagged = /^(\S+) (?:OK|NO|BAD)\b/i.exec(l);
        return !(tagged && tags.has(tagged[1]!));
      });
      if (passed.length > 0) client.write(Buffer.from(`${passed.join("\r\n")}\r\n`, "latin1"));
    });
  });
  return Object.assign(state, proxy);
}

/**
 * A pass-through to an IMAP server that holds each SELECT and EXAMINE `delayMs` before passing it
 * on (a server one round trip of a slow link away); everything else passes at once, in order.
 * `selects` counts the SELECTs and EXAMINEs clients sent (`onSelect` is told of each, with the
 * count), `open` the client connections still open; `idle()` resolves once none is.
 */
export async function slowProxy(target: number, delayMs: number, onSelect?: (selects: number) => void) {
  const state = { selects: 0, open: 0 };
  let waiting: (() => void)[] = [];
  const proxy = await passThrough(target, (client, upstream) => {
    state.open++;
    client.once("close", () => {
      state.open--;
      if (state.open === 0) for (const resolve of waiting.splice(0)) resolve();
    });
    upstream.pipe(client);
    let queue = Promise.resolve();
    client.on("data", (chunk: Buffer) => {
      const slow = /^\S+ (?:SELECT|EXAMINE)\b/i.test(chunk.toString("latin1", 0, 64));
      if (slow) onSelect?.(++state.selects);
      queue = queue.then(async () => {
        if (slow) await new Promise((r) => setTimeout(r, delayMs));
        upstream.write(chunk);
      });
    });
  });
  const idle = () =>
    state.open === 0
      ? Promise.resolve()
      : new Promise<void>((resolve) => {
          waiting.push(resolve);
        });
  return Object.assign(state, proxy, {
    idle,
    close: async () => {
      waiting = [];
      await proxy.close();
    },
  });
}
