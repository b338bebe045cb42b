/**
 * The IMAP side, through imapflow: find a message by Message-ID in the Sent folder (found by
 * SPECIAL-USE \Sent, by name as a fallback, or as configured) or in a journal mailbox, and
 * APPEND a copy. One short session per call: these run once per send, not per message read.
 */
import { ImapFlow } from "imapflow";
import type { ImapConfig } from "./email-config.js";

/** The mailbox could not be reached or read: nothing is known, nothing was sent because of it. */
export class MailboxUnavailableError extends Error {
  constructor(message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = "MailboxUnavailableError";
  }
}

export interface FoundMessage {
  readonly mailbox: string;
  readonly uid: number;
}

export class Mailbox {
  /** `path`: a mailbox path, or "\\Sent" to find the Sent folder. */
  constructor(
    private readonly imap: ImapConfig,
    private readonly path: string,
  ) {}

  async find(messageId: string): Promise<FoundMessage | undefined> {
    return this.session(async (client, mailbox) => {
      const lock = await client.getMailboxLock(mailbox);
      try {
        const uids = await client.search({ header: { "message-id": messageId } }, { uid: true });
        // imapflow answers a search the server refused (NO, BAD: overloaded, index rebuilding)
        // with false: that is not "no such message", and taken as one it would send again.
        if (!Array.isArray(uids))
          throw new MailboxUnavailableError(`IMAP ${mailbox}: the server refused the search for ${messageId}`);
        const uid = uids[0];
        return uid === undefined ? undefined : { mailbox, uid };
      } finally {
        lock.release();
      }
    });
  }

  async append(raw: Buffer): Promise<void> {
    await this.session(async (client, mailbox) => {
      await client.append(mailbox, raw, ["\\Seen"]);
    });
  }

  private async session<T>(fn: (client: ImapFlow, mailbox: string) => Promise<T>): Promise<T> {
    const client = new ImapFlow({
      host: this.imap.host,
      port: this.imap.port,
      secure: this.imap.secure ?? false,
      auth: { user: this.imap.auth.user, pass: this.imap.auth.pass },
      logger: false,
      connectionTimeout: 10_000,
      greetingTimeout: 10_000,
      socketTimeout: 30_000,
    });
    client.on("error", () => {}); // reported through the failing call below
    try {
      await client.connect();
    } catch (cause) {
      throw new MailboxUnavailableError(
        `IMAP ${this.imap.host}:${this.imap.port} unreachable: ${(cause as Error).message}`,
        { cause },
      );
    }
    try {
      return await fn(client, await this.resolve(client));
    } catch (cause) {
      if (cause instanceof MailboxUnavailableError) throw cause;
      throw new MailboxUnavailableError(`IMAP ${this.path}: ${(cause as Error).message}`, { cause });
    } finally {
      await client.logout().catch(() => client.close());
    }
  }

  private async resolve(client: ImapFlow): Promise<string> {
    if (this.path !== "\\Sent") return this.path;
    const boxes = await client.list();
    const sent = boxes.find((b) => b.specialUse === "\\Sent") ?? boxes.find((b) => b.name.toLowerCase() === "sent");
    if (!sent)
      throw new MailboxUnavailableError("no Sent folder (no SPECIAL-USE \\Sent, none named Sent): set sentMailbox");
    return sent.path;
  }
}
