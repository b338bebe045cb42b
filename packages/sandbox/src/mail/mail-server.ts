/**
 * A local mail provider: an SMTP server (npm smtp-server) that stores what it accepts and files
 * copies into a real IMAP server (Dovecot), the way the three kinds of provider do:
 *  - "provider-saves": a copy of each message in the sender's Sent folder (Gmail, Office 365);
 *  - "journal": a Bcc to the journal address is delivered to that mailbox, once accepted;
 *  - "none": nothing is filed (a plain Postfix; the client must APPEND its own copy).
 * The copy is filed before the SMTP reply, as those providers do once they accepted a message.
 *
 * Faults: `hold_reply` (accept and file, then hold the reply past the client's timeout, or until
 * `releaseHeldReplies`),
 * `drop_data` (read the body, then close the connection with no reply, taking nothing: a server
 * that failed before it committed the message, which the client cannot tell from one after),
 * `drop_at` (close the connection with no reply to the command its `match.method` names: "AUTH",
 * "MAIL", "RCPT" (the addresses `match.path` matches) or "DATA", before any body; the first of
 * them without a `match`), `reject_421` (421 at MAIL FROM, before DATA), `reject_rcpt` (550, or the fault's `status`: a 450 is
 * greylisting, at RCPT TO for the addresses the fault's `match.path` matches; the others are still accepted), `refuse_data` (read the body,
 * take nothing, and answer the fault's `status`, 554 by default, with a reply that quotes the
 * message's subject and the first line of its text, as content filters do), `defer_taken` (store
 * and file the message, then answer the fault's `status`, 451 by default: a server that queued it
 * and said "try again", a before-queue filter timing out after the next hop took it), `refuse_auth` (535) and, on
 * the IMAP side, `refuse_search` (a SEARCH answered NO [UNAVAILABLE]; imap-proxy.ts).
 *
 * TLS (`tls`: a certificate and its key): SMTP offers STARTTLS, and a second SMTP port speaks
 * implicit TLS (`smtps`); Dovecot offers STARTTLS, and implicit TLS on its own port (`imaps`,
 * direct, not through the fault proxy). Without it, no TLS at all. Under TLS the proxy cannot
 * read a SEARCH, so `refuse_search` does not apply to a session that started TLS.
 */
import { EventEmitter } from "node:events";
import type { AddressInfo } from "node:net";
import { ImapFlow } from "imapflow";
import { simpleParser } from "mailparser";
import { SMTPServer, type SMTPServerDataStream, type SMTPServerSession } from "smtp-server";
import { FaultPlan } from "../faults.js";
import { imapProxy, type ImapProxy } from "./imap-proxy.js";
import { Dovecot, type MailUser, type ServerTls } from "./dovecot.js";

export type CopyMode = "provider-saves" | "journal" | "none";
export type MailFaultKind =
  | "hold_reply"
  | "drop_data"
  | "drop_at"
  | "reject_421"
  | "reject_rcpt"
  | "refuse_data"
  | "defer_taken"
  | "refuse_auth"
  | "refuse_search";

export interface ReceivedMessage {
  readonly messageId: string | undefined;
  readonly subject: string | undefined;
  readonly from: string;
  readonly to: readonly string[];
  readonly raw: Buffer;
}

export interface MailSandboxOptions {
  /** How accepted mail is filed. Default "provider-saves"; can be changed while running (`mode`). */
  readonly mode?: CopyMode;
  /** File copies this long after accepting instead of before the reply (copies that appear late). */
  readonly copyDelayMs?: number;
  /** Serve TLS with this certificate (STARTTLS, and implicit-TLS ports); default no TLS. */
  readonly tls?: ServerTls;
  /** Dovecot's ACL plugin on, rights set with `dovecot.rights(...)` (a mailbox answering NOPERM). */
  readonly acl?: boolean;
}

export const SENDER: MailUser = { user: "agent@idem.test", pass: "agent-password" };
export const JOURNAL: MailUser = { user: "journal@idem.test", pass: "journal-password" };

export class MailSandbox {
  mode: CopyMode;
  copyDelayMs: number;
  readonly faults = new FaultPlan<MailFaultKind>();
  /** Emits "accepted" (ReceivedMessage) once a message is stored and filed, before the reply. */
  readonly events = new EventEmitter();
  readonly received: ReceivedMessage[] = [];
  readonly dovecot: Dovecot;
  private readonly tls: ServerTls | undefined;
  private smtp: SMTPServer | undefined;
  /** The implicit-TLS SMTP server, with `tls`. */
  private smtps: SMTPServer | undefined;
  private proxy: ImapProxy | undefined;
  /** Replies `hold_reply` holds now: each sends its 250 when its delay ends or `releaseHeldReplies` is called. */
  private readonly held = new Set<() => void>();
  smtpPort = 0;
  imapPort = 0;

  constructor(options: MailSandboxOptions = {}) {
    this.mode = options.mode ?? "provider-saves";
    this.copyDelayMs = options.copyDelayMs ?? 0;
    this.tls = options.tls;
    this.dovecot = new Dovecot([SENDER, JOURNAL], {
      ...(this.tls && { tls: this.tls }),
      ...(options.acl && { acl: true }),
    });
  }

  /** Messages received with this Message-ID: the effect count at the target. */
  count(messageId?: string): number {
    return messageId === undefined
      ? this.received.length
      : this.received.filter((m) => m.messageId === messageId).length;
  }

  /**
   * Sends every reply `hold_reply` holds now, at once: a test that has done what it wanted done
   * while the client waited lets the answer arrive late, in its own time, instead of a delay's.
   */
  releaseHeldReplies(): number {
    const replies = [...this.held];
    for (const reply of replies) reply();
    return replies.length;
  }

  /** `smtps` and `imaps` (the implicit-TLS ports) only with `tls`. */
  async start(): Promise<{
    smtp: { host: string; port: number };
    imap: { host: string; port: number };
    smtps?: { host: string; port: number };
    imaps?: { host: string; port: number };
    sender: MailUser;
    journal: MailUser;
  }> {
    const dovecot = (await this.dovecot.start()).port;
    this.proxy = await imapProxy(dovecot, () => this.faults.take("SEARCH", "", ["refuse_search"]) !== undefined);
    this.imapPort = this.proxy.port;
    this.smtp = await this.listen(false);
    this.smtpPort = (this.smtp.server.address() as AddressInfo).port;
    const host = "127.0.0.1";
    const plain = {
      smtp: { host, port: this.smtpPort },
      imap: { host, port: this.imapPort },
      sender: SENDER,
      journal: JOURNAL,
    };
    if (!this.tls) return plain;
    this.smtps = await this.listen(true);
    const smtps = (this.smtps.server.address() as AddressInfo).port;
    return { ...plain, smtps: { host, port: smtps }, imaps: { host, port: this.dovecot.imapsPort } };
  }

  /** An SMTP server on a free loopback port: STARTTLS with `tls` (implicit TLS if `secure`), else no TLS. */
  private async listen(secure: boolean): Promise<SMTPServer> {
    const smtp = new SMTPServer({
      secure,
      ...(this.tls ? { key: this.tls.key, cert: this.tls.cert } : { disabledCommands: ["STARTTLS"] }),
      allowInsecureAuth: true,
      authMethods: ["PLAIN", "LOGIN"],
      logger: false,
      onAuth: (auth, session, cb) => {
        if (this.faults.take("AUTH", "", ["drop_at"])) return this.hangUp(session);
        if (this.faults.take("AUTH", "", ["refuse_auth"]))
          return cb(Object.assign(new Error("Authentication refused"), { responseCode: 535 }));
        const ok = [SENDER, JOURNAL].some((u) => u.user === auth.username && u.pass === auth.password);
        return ok
          ? cb(null, { user: auth.username })
          : cb(Object.assign(new Error("Invalid username or password"), { responseCode: 535 }));
      },
      onMailFrom: (_address, session, cb) => {
        if (this.faults.take("MAIL", "", ["drop_at"])) return this.hangUp(session);
        if (this.faults.take("MAIL", "", ["reject_421"]))
          return cb(Object.assign(new Error("Service not available, try again later"), { responseCode: 421 }));
        return cb();
      },
      onRcptTo: (address, session, cb) => {
        if (this.faults.take("RCPT", address.address, ["drop_at"])) return this.hangUp(session);
        const rejected = this.faults.take("RCPT", address.address, ["reject_rcpt"]);
        if (rejected)
          return cb(
            Object.assign(new Error(`Mailbox unavailable: ${address.address}`), {
              responseCode: rejected.status ?? 550,
            }),
          );
        return cb();
      },
      onData: (stream, session, cb) => {
        // smtp-server asks onData before it writes its 354: closed now, the client never gets it
        // and sends no body.
        if (this.faults.take("DATA", "", ["drop_at"])) return this.hangUp(session);
        if (this.faults.take("DATA", "", ["drop_data"])) return void this.drop(stream, session);
        const refused = this.faults.take("DATA", "", ["refuse_data"]);
        if (refused) return void this.refuse(stream, refused.status ?? 554).then(cb, cb);
        const deferred = this.faults.take("DATA", "", ["defer_taken"]);
        void this.accept(stream, session).then(
          () =>
            deferred
              ? cb(answer(deferred.status ?? 451, "Error: queue file write error, try again later"))
              : this.reply(cb),
          (e: Error) => cb(e),
        );
      },
    });
    // A client that refuses the certificate ends the handshake: smtp-server emits that as an
    // error, which would otherwise take the test process down.
    smtp.on("error", () => {});
    await new Promise<void>((resolve) => smtp.listen(0, "127.0.0.1", resolve));
    return smtp;
  }

  async close(): Promise<void> {
    // A held reply would keep its connection open until the client's own timeout: the close waits for it.
    this.releaseHeldReplies();
    for (const smtp of [this.smtp, this.smtps]) if (smtp) await new Promise<void>((r) => smtp.close(() => r()));
    this.smtp = undefined;
    this.smtps = undefined;
    await this.proxy?.close();
    this.proxy = undefined;
    await this.dovecot.stop();
  }

  /**
   * Opens an IMAP session as one of the sandbox users (for tests that look into mailboxes), in
   * clear text on loopback even with `tls` (never STARTTLS: the sandbox need not trust its own
   * certificate's CA).
   */
  imap(user: MailUser): ImapFlow {
    return new ImapFlow({
      host: "127.0.0.1",
      port: this.imapPort,
      secure: false,
      doSTARTTLS: false,
      auth: { user: user.user, pass: user.pass },
      logger: false,
    });
  }

  private async accept(stream: SMTPServerDataStream, session: SMTPServerSession): Promise<void> {
    const chunks: Buffer[] = [];
    for await (const c of stream) chunks.push(c as Buffer);
    const raw = Buffer.concat(chunks);
    const parsed = await simpleParser(raw);
    const to = session.envelope.rcptTo.map((r) => r.address);
    const from = session.envelope.mailFrom ? session.envelope.mailFrom.address : "";
    const msg: ReceivedMessage = { messageId: parsed.messageId, subject: parsed.subject, from, to, raw };
    this.received.push(msg);
    const fileCopies = async () => {
      if (this.mode === "provider-saves" && from === SENDER.user) await this.file(SENDER, "Sent", raw);
      if (this.mode === "journal" && to.includes(JOURNAL.user)) await this.file(JOURNAL, "INBOX", raw);
    };
    if (this.copyDelayMs > 0) setTimeout(() => void fileCopies().catch(() => {}), this.copyDelayMs);
    else await fileCopies();
    this.events.emit("accepted", msg);
  }

  /**
   * Reads the body and takes nothing: the refusal a content filter answers, quoting what it
   * matched (the subject, the first line of the text).
   */
  private async refuse(stream: SMTPServerDataStream, status: number): Promise<Error> {
    const chunks: Buffer[] = [];
    for await (const c of stream) chunks.push(c as Buffer);
    const parsed = await simpleParser(Buffer.concat(chunks));
    const line = (parsed.text ?? "").split(/\r?\n/)[0] ?? "";
    return answer(
      status,
      `Message refused by policy: subject "${parsed.subject ?? ""}" and text "${line}" look like spam`,
    );
  }

  /** Reads the body and closes the session's connection without a reply: nothing is taken. */
  private async drop(stream: SMTPServerDataStream, session: SMTPServerSession): Promise<void> {
    for await (const _ of stream); // the whole body reached the server
    this.hangUp(session);
  }

  /** Closes the session's connection at once, with no reply to the command in hand. */
  private hangUp(session: SMTPServerSession): void {
    // smtp-server keeps its connections (SMTPConnection: the session's id, the socket) in a Set.
    for (const smtp of [this.smtp, this.smtps]) {
      const connections = (smtp as unknown as { connections?: Set<{ id: string; _socket: { destroy(): void } }> })
        ?.connections;
      for (const c of connections ?? []) if (c.id === session.id) c._socket.destroy();
    }
  }

  private reply(cb: (err?: Error | null) => void): void {
    const hold = this.faults.take("DATA", "", ["hold_reply"]);
    // "accepted, but the client timed out": the message is stored and filed; the 250 comes too late.
    if (!hold) {
      cb();
      return;
    }
    const reply = () => {
      clearTimeout(timer);
      if (this.held.delete(reply)) cb();
    };
    this.held.add(reply);
    const timer = setTimeout(reply, hold.delayMs ?? 30_000).unref(); // a held reply must not keep the process alive
  }

  /**
   * How many messages with `messageId` the user's `mailbox` holds: the copies counted at the
   * target, by the server's own search (not through the adapter's lookup).
   */
  async copies(user: MailUser, mailbox: string, messageId: string): Promise<number> {
    return this.asUser(user, async (client) => {
      const lock = await client.getMailboxLock(mailbox);
      try {
        const uids = await client.search({ header: { "message-id": messageId } }, { uid: true });
        return Array.isArray(uids) ? uids.length : Number.NaN;
      } finally {
        lock.release();
      }
    });
  }

  /**
   * `fn` with a signed-in session of the user's, logged out after: what a person's mail client
   * or the server's rules do to a mailbox (rename it, move a copy, change rights' effects).
   */
  async asUser<T>(user: MailUser, fn: (client: ImapFlow) => Promise<T>): Promise<T> {
    const client = this.imap(user);
    await client.connect();
    try {
      return await fn(client);
    } finally {
      await client.logout();
    }
  }

  /** Files `raw` into the user's `mailbox`, as the server files its copies (tests plant others so). */
  async file(user: MailUser, mailbox: string, raw: Buffer): Promise<void> {
    await this.asUser(user, (client) => client.append(mailbox, raw, ["\\Seen"]));
  }
}

/** An smtp-server reply: `status`, its enhanced code (RFC 3463) by class, then `text`. */
function answer(status: number, text: string): Error {
  const enhanced = status >= 500 ? "5.7.1" : "4.3.0";
  return Object.assign(new Error(`${enhanced} ${text}`), { responseCode: status });
}
