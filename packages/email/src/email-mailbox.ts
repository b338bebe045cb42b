/**
 * The IMAP side, through imapflow: find a message by Message-ID in the Sent folder (found by
 * SPECIAL-USE \Sent, by name as a fallback, or as configured; when the server flags several
 * mailboxes \Sent, each of them is searched) or in a journal mailbox, and
 * APPEND a copy. A lookup whose "not found" would send again searches every mailbox the account
 * lists (`everywhere`; each opened read-only, each with a deadline of its own): the copy may have
 * been moved since. A lookup can also ask, in the same session, whether another name (a Sent folder
 * recorded as `\Sent` and configured as "Sent", say) is the mailbox searched: the server's LIST
 * says, never the spelling. One short session per call: these run once per send, not per message
 * read. Without implicit TLS, a session signs in only after STARTTLS unless the config says
 * `requireTLS: false`: with a server that does not offer it, the session fails before any login.
 * The server's certificate is verified against the config's `tls` trust (email-tls.ts). A session
 * that cannot open says why: refused by us or by the server for good (MailboxRefusedError: the
 * certificate, TLS, the sign-in), or unavailable (MailboxUnavailableError: anything that may pass);
 * so does a mailbox the server will not let the account read (NOPERM: MailboxRefusedError too), one
 * it says does not exist (the configured name misspelt), an account whose LIST names no Sent folder
 * (set `sentMailbox`), and an APPEND it refuses (no right to file into the mailbox, a quota). A SEARCH the server refuses stays unavailable (it may pass), with the
 * server's code and text: imapflow answers it `false` and hands the error only to its logger.
 * Only a mailbox that can be opened counts: a LIST entry marked \NonExistent or \Noselect (a name
 * that only holds other mailboxes, or one the server's config names special-use with nothing
 * behind it) is never taken for the Sent folder, and a configured name the server lists only so
 * is no mailbox (NONEXISTENT). A session ends by its deadline (`deadlineMs`: connect, commands and
 * logout), not only by imapflow's inactivity timeouts, which any untagged line resets: past it the
 * connection is closed and the session is unavailable (no tagged answer came: an APPEND may have
 * filed its copy). Retrying a failed APPEND is email-append.ts's.
 * What a server says in an error (a NO's text, a sign-in refusal's, a line imapflow could not
 * parse) is kept as an SMTP reply is (`scrubReply`): the message's content (`content`, when the
 * caller gives it) cut out, its recipients hashed, bounded; errors reach the ledger as reasons,
 * and a filter refusing an APPEND quotes the message it refused.
 */
import { ImapFlow } from "imapflow";
import { IMAP_DEADLINE_MS, type ImapConfig } from "./email-config.js";
import { MAX_COPIES, SEND_NAME } from "./email-receipt.js";
import { scrubReply, type MessageContent } from "./email-reply.js";
import { tlsOptions, tlsRefusal } from "./email-tls.js";

/** The mailbox could not be reached or read: nothing is known, nothing was sent because of it. */
export class MailboxUnavailableError extends Error {
  constructor(message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = "MailboxUnavailableError";
  }
}

/**
 * The mailbox cannot be reached until a person changes something: we refused the server's TLS (its
 * certificate not trusted, or no TLS version in common; or a required STARTTLS not offered), the
 * server refused the sign-in, or it refused the account the mailbox (NOPERM: its rights do not
 * allow reading it; NONEXISTENT: it has no mailbox of the name configured, or listed as Sent).
 * Every later session meets the same refusal, so every check before sending and every lookup fails
 * until then; nothing is known of the mailbox. Also what an APPEND of a Sent copy is refused with
 * (NOPERM: no right to file into it; OVERQUOTA; TRYCREATE: no such mailbox).
 */
export class MailboxRefusedError extends MailboxUnavailableError {
  constructor(
    message: string,
    /**
     * What was refused: `tls` (by us: the certificate, the version; or STARTTLS by the server),
     * `sign-in` or `mailbox` (the account's access to the mailbox searched; by the server).
     */
    readonly refused: "tls" | "sign-in" | "mailbox",
    /**
     * The server's response code (RFC 5530: `AUTHENTICATIONFAILED` to a sign-in, `NOPERM`,
     * `NONEXISTENT` (also when the server gave none and its LIST has no such mailbox), `OVERQUOTA`;
     * RFC 3501's `TRYCREATE` to an APPEND), or Node's TLS error code.
     */
    readonly responseCode?: string,
    options?: { cause?: unknown },
  ) {
    super(message, options);
    this.name = "MailboxRefusedError";
  }
}

/**
 * RFC 5530's codes for a sign-in refused for now, not for good: the server's authentication is
 * down (UNAVAILABLE), a limit of connections (LIMIT), a lock (INUSE), its own bug (SERVERBUG).
 */
const SIGN_IN_NOT_NOW: ReadonlySet<string> = new Set(["UNAVAILABLE", "LIMIT", "INUSE", "SERVERBUG"]);

/**
 * Why a session could not open, for `where` (the server): refused until a person acts, or
 * unavailable. Reads imapflow's marks: `tlsFailed` (a STARTTLS that was required and not made),
 * `authenticationFailed` with the server's `serverResponseCode` (a tagged NO or BAD to the login).
 */
function openFailure(cause: unknown, where: string, user: string, content: MessageContent): MailboxUnavailableError {
  const e = (cause ?? {}) as {
    message?: string;
    code?: string;
    tlsFailed?: boolean;
    authenticationFailed?: boolean;
    serverResponseCode?: string;
    responseText?: string;
  };
  // What the server (or imapflow, quoting it) said: kept as an SMTP reply is.
  const text = (said: unknown) => scrubReply(String(said), content);
  const tls = tlsRefusal(cause);
  if (tls) return new MailboxRefusedError(`${where}, no login sent: ${tls}`, "tls", e.code, { cause });
  // Required STARTTLS the server does not offer (or a man in the middle took out of its
  // capabilities), or data injected before the handshake: no login was sent. Not a handshake cut
  // off (a socket error's code): that may pass.
  if (e.tlsFailed && (e.code === undefined || e.code === "STARTTLS_INJECTION"))
    return new MailboxRefusedError(
      `${where} would not start TLS (requireTLS), no login sent: ${text(e.message ?? "no reason given")}`,
      "tls",
      e.code,
      { cause },
    );
  if (e.tlsFailed)
    return new MailboxUnavailableError(`${where} would not start TLS (requireTLS), no login sent: ${text(e.message)}`, {
      cause,
    });
  const code = e.serverResponseCode;
  if (e.authenticationFailed && !(code !== undefined && SIGN_IN_NOT_NOW.has(code)))
    return new MailboxRefusedError(
      `${where} refused the sign-in of ${user} (${code ?? "no code"}: ${text(e.responseText ?? e.message ?? "no text")}): fix the credentials`,
      "sign-in",
      code,
      { cause },
    );
  const why = e.authenticationFailed ? `refused the sign-in for now (${code})` : "unreachable";
  return new MailboxUnavailableError(`${where} ${why}: ${text(e.message ?? String(cause))}`, { cause });
}

export interface FoundMessage {
  readonly mailbox: string;
  readonly uid: number;
  /**
   * The sends the copies found are, each as its `X-Idem-Attempt` names it (`<operation id>/<attempt>`),
   * sorted, each once; empty when that is not known of every copy (see `sendsOf`). Several: the
   * message went out more than once.
   */
  readonly sends: readonly string[];
  /** How many copies the search found. */
  readonly copies: number;
  /**
   * How many of them were not read (more than MAX_COPIES in one mailbox: only the first are):
   * what they name is not known, so it may be another send. Copies in several mailboxes, each
   * read, are not: every one of them names its send.
   */
  readonly unread: number;
}

/** A search for a Message-ID, and what another name of a mailbox means on that server. */
export interface Lookup {
  readonly found: FoundMessage | undefined;
  /** The mailbox searched. */
  readonly searched: string;
  /**
   * The other name asked about (`alias`): `same` when the server resolves it to the mailbox
   * searched; else `path` is the mailbox it names (undefined: none), or `error` why it could not
   * be told (the LIST failed). Absent when no other name was asked about.
   */
  readonly alias?: { readonly same: boolean; readonly path: string | undefined; readonly error?: Error };
  /**
   * Asked to look `everywhere` and not found where the copy is filed: how many of the account's
   * other mailboxes were searched too (every one it lists that can be opened), besides `searched`
   * and `alsoSent`.
   */
  readonly elsewhere?: { readonly searched: number };
  /**
   * The other mailboxes the server flags \Sent, searched besides `searched` (RFC 6154 §2 lets a
   * server give the special use to several); empty when none, or the mailbox was configured.
   */
  readonly alsoSent: readonly string[];
}

/** The part of imapflow's LIST answer (ListResponse) that naming a mailbox needs. */
export interface ListedMailbox {
  readonly path: string;
  readonly name: string;
  readonly specialUse?: string | undefined;
  readonly flags: ReadonlySet<string>;
}

/** The name of the Sent folder, whatever the server calls it: the config's default. */
const SENT = "\\Sent";

/**
 * The path of the mailbox a name means on a server, from its LIST: `\Sent` is the Sent folder
 * (SPECIAL-USE \Sent, else one named Sent); any other name is a path, as the server spells it
 * (mailbox names are case-sensitive but INBOX, RFC 3501), under the personal namespace's `prefix`
 * when it does not start with it (as imapflow opens it). Only a mailbox that can be opened counts
 * (`selectable`): undefined when the server has no such mailbox.
 */
export function mailboxPath(name: string, boxes: readonly ListedMailbox[], prefix = ""): string | undefined {
  const real = boxes.filter(selectable);
  if (name === SENT)
    // imapflow gives the \Sent special use to one listed name only, a \NonExistent one among
    // them (it sorts before the real one by name): the attribute is what the server said.
    return (
      real.find((b) => b.specialUse === SENT) ??
      real.find((b) => has(b, SENT)) ??
      real.find((b) => b.name.toLowerCase() === "sent")
    )?.path;
  const path = listedPath(name, prefix);
  return real.find((b) => b.path === path)?.path;
}

/** How the server's LIST spells the path `name` means (INBOX in capitals, under `prefix`). */
function listedPath(name: string, prefix: string): string {
  return name.toUpperCase() === "INBOX" ? "INBOX" : prefix && !name.startsWith(prefix) ? prefix + name : name;
}

/**
 * Whether a listed name is a mailbox that can be opened. Not one marked `\NonExistent` (RFC 5258:
 * listed because it has children, is subscribed or is named special-use in the server's config,
 * RFC 6154) nor `\Noselect` (RFC 3501: it only holds other mailboxes): a SELECT or an APPEND of
 * either fails, and neither holds a copy.
 */
function selectable(box: ListedMailbox): boolean {
  return !has(box, "\\NonExistent") && !has(box, "\\Noselect");
}

/** A LIST attribute, case-insensitive as RFC 3501 has them. */
function has(box: ListedMailbox, attribute: string): boolean {
  const wanted = attribute.toLowerCase();
  for (const flag of box.flags) if (flag.toLowerCase() === wanted) return true;
  return false;
}

/** What imapflow keeps of a command the server answered NO or BAD (its ImapFlowError, as logged). */
interface CommandRefusal {
  readonly responseStatus?: unknown;
  readonly serverResponseCode?: unknown;
  readonly responseText?: unknown;
  /** Set by imapflow on a SELECT answered NO when its LIST has no such mailbox either. */
  readonly mailboxMissing?: unknown;
}

/**
 * What the server said, for a reason: scrubbed (`scrubReply`), since a server may quote what it
 * was given (a filter refusing an APPEND quotes the message's subject, a refusal names an address).
 */
function said(refusal: CommandRefusal, content: MessageContent): string {
  return typeof refusal.responseText === "string" && refusal.responseText
    ? scrubReply(refusal.responseText, content)
    : "no text";
}

/** An error's message, for a reason: imapflow's can quote what the server sent (a line it could not parse). */
function messageOf(cause: unknown, content: MessageContent): string {
  return scrubReply(cause instanceof Error ? cause.message : String(cause), content);
}

/** No message known: a server's text is still bounded and kept on one line. */
const NO_CONTENT: MessageContent = { recipients: [], fields: [] };

/** What a session does, as its error says when its signal ends it: what was cut off, and what that leaves known. */
interface SessionTask {
  readonly what: string;
  readonly left: string;
}
const LOOKING: SessionTask = { what: "the lookup", left: "nothing proven" };
// An APPEND cut off may have been filed (Dovecot commits before its OK) or not.
const APPENDING: SessionTask = { what: "the APPEND", left: "the copy may or may not be there" };

/** RFC 5530's codes, and RFC 3501's TRYCREATE, with which an APPEND is refused until a person acts. */
const APPEND_REFUSED: ReadonlySet<string> = new Set(["NOPERM", "OVERQUOTA", "TRYCREATE", "NONEXISTENT"]);

export class Mailbox {
  /**
   * `path`: a mailbox path, or "\\Sent" to find the Sent folder. `setting`: the config key that
   * names it (`sentMailbox`, `copy.mailbox`), for a person told to check it.
   */
  constructor(
    private readonly imap: ImapConfig,
    private readonly path: string,
    private readonly setting = "the mailbox setting",
  ) {}

  /**
   * `signal`: aborting it ends the search at once (the session closed), as unavailable. `content`:
   * what the message says, cut out of what the server says in an error (module doc).
   */
  async find(
    messageId: string,
    options: { signal?: AbortSignal | undefined; content?: MessageContent | undefined } = {},
  ): Promise<FoundMessage | undefined> {
    return (await this.lookup(messageId, undefined, options)).found;
  }

  /**
   * Searches for `messageId` and, in the same session, asks the server whether `alias` (another
   * name: `\Sent`, or a path) is the mailbox searched. One LIST answers both. A LIST that fails
   * leaves the alias unresolved (`error`), not the search: a copy found still counts; without an
   * alias, a Sent folder that cannot be listed makes the lookup fail, as before.
   *
   * `everywhere`, for a lookup whose "not found" would send again: the copy not found where it
   * is filed is looked for in every other mailbox of the account the LIST gives. The copy may
   * have been moved since the send: its Sent folder renamed ("Sent 2025", the server making a new,
   * empty Sent), a rule that files sent mail into an archive, an archiver that drains a journal.
   * Searching only the mailbox of today's name would prove it absent and send it again.
   *
   * `signal`: the caller's bound (a settlement's `timeoutMs`, a lease lost). Each mailbox has a
   * deadline of its own, so a scan of many has none as a whole but this: once it aborts, the
   * session is closed and the lookup fails as unavailable, whatever it had searched (a part of
   * the account searched proves nothing absent).
   *
   * `content`: what the message says, cut out of what the server says in an error (module doc).
   */
  async lookup(
    messageId: string,
    alias?: string,
    options: {
      everywhere?: boolean | undefined;
      signal?: AbortSignal | undefined;
      content?: MessageContent | undefined;
    } = {},
  ): Promise<Lookup> {
    const everywhere = options.everywhere ?? false;
    const content = options.content ?? NO_CONTENT;
    return this.session(options.signal, content, LOOKING, async (client, refused, renew) => {
      let boxes: readonly ListedMailbox[] = [];
      let listError: Error | undefined;
      if (this.path === SENT || alias !== undefined || everywhere) {
        try {
          boxes = await client.list();
        } catch (cause) {
          if (this.path === SENT) throw cause;
          listError = new MailboxUnavailableError(`IMAP LIST failed: ${messageOf(cause, content)}`, { cause });
        }
      }
      const prefix = client.namespace?.prefix ?? "";
      const mailbox = this.opened(boxes);
      let found = await this.search(client, mailbox, messageId, refused, content);
      // The server may give \Sent to several mailboxes (RFC 6154 §2; Dovecot's stock config marks
      // "Sent" and "Sent Messages"), and imapflow hands its special use to one of them, by name: the
      // provider may file into another. The copy is looked for in each of the others, so "not
      // found" covers every mailbox the server calls Sent, and copies of two sends, one in each,
      // read as two (`merged`): stopped at the first, the second send went unsaid. One that cannot
      // be read once a copy is found leaves the copy found standing: only "not found" needs them all.
      const sent = this.otherSent(boxes, mailbox);
      for (const other of sent) {
        const more = await this.search(client, other, messageId, refused, content).catch((cause: unknown) => {
          if (found) return undefined;
          throw cause;
        });
        found = merged(found, more);
      }
      // Not found where it is filed, and the other mailboxes cannot be listed: not found proves nothing.
      if (everywhere && !found && listError) throw listError;
      const elsewhere =
        everywhere && !found
          ? await this.searchRest(client, boxes, [mailbox, ...sent], messageId, refused, renew, content)
          : undefined;
      if (elsewhere?.found) found = elsewhere.found;
      const rest = { alsoSent: sent, ...(elsewhere && { elsewhere: { searched: elsewhere.searched } }) };
      if (alias === undefined) return { found, searched: mailbox, ...rest };
      if (listError)
        return { found, searched: mailbox, alias: { same: false, path: undefined, error: listError }, ...rest };
      const path = mailboxPath(alias, boxes, prefix);
      const searched = this.path === SENT ? mailbox : mailboxPath(mailbox, boxes, prefix);
      return { found, searched: mailbox, alias: { same: path !== undefined && path === searched, path }, ...rest };
    });
  }

  /**
   * The copy looked for in each mailbox of the LIST (`boxes`) that can be opened, besides those
   * `done`, until one holds it. A mailbox not searched is not one the copy is proven absent from,
   * so any failure fails the lookup. One the account may not read (NOPERM: an IMAP ACL) is
   * refused until a person acts: a mailbox the account may list but not read it may still file
   * into (RFC 4314's insert right: its clients' COPY and MOVE, its rules), so the copy may have
   * been moved there. One renamed or deleted between the LIST and its SELECT is unavailable, not
   * refused: the next lookup lists it as it is now. Each mailbox gets the session's deadline anew
   * (`renew`): the deadline is for a server that stops answering, and an account of a thousand
   * mailboxes on a server a round trip of 50 ms away takes longer than the whole of it.
   */
  private async searchRest(
    client: ImapFlow,
    boxes: readonly ListedMailbox[],
    done: readonly string[],
    messageId: string,
    refused: () => CommandRefusal | undefined,
    renew: () => void,
    content: MessageContent,
  ): Promise<{ found: FoundMessage | undefined; searched: number }> {
    let searched = 0;
    for (const box of boxes) {
      if (!selectable(box) || done.includes(box.path)) continue;
      renew();
      try {
        const found = await this.search(client, box.path, messageId, refused, content);
        searched++;
        if (found) return { found, searched };
      } catch (cause) {
        if (!(cause instanceof MailboxRefusedError)) throw cause;
        const where = `IMAP ${this.imap.host}:${this.imap.port}`;
        if (cause.responseCode === "NOPERM")
          throw new MailboxRefusedError(
            `${where}: ${this.imap.auth.user} may not read ${box.path} (NOPERM), so a copy moved there cannot be looked for, and not found elsewhere proves nothing: give the account the right to read it (IMAP ACL: read)`,
            "mailbox",
            "NOPERM",
            { cause },
          );
        throw new MailboxUnavailableError(
          `${where}: ${box.path}, listed a moment before, could not be opened (renamed or deleted since?): ${cause.message}`,
          { cause },
        );
      }
    }
    return { found: undefined, searched };
  }

  /**
   * Files `raw` into the mailbox. Refused by the server until a person acts (no right to file
   * into it, a quota, no such mailbox): MailboxRefusedError `mailbox` with its code; otherwise
   * MailboxUnavailableError (a connection lost, a NO without a code: the copy may or may not be there).
   * `content`: what the message says (`raw`'s subject, text, recipients), cut out of what the
   * server says in an error: a filter that refuses the copy quotes it. `signal`: aborting it
   * ends the APPEND at once (the session closed), as unavailable: the copy may have been filed.
   */
  async append(
    raw: Buffer,
    options: { signal?: AbortSignal | undefined; content?: MessageContent | undefined } = {},
  ): Promise<void> {
    const content = options.content ?? NO_CONTENT;
    await this.session(options.signal, content, APPENDING, async (client) => {
      const mailbox = this.opened(this.path === SENT ? await client.list() : []);
      try {
        await client.append(mailbox, raw, ["\\Seen"]);
      } catch (cause) {
        const e = cause as CommandRefusal;
        const code = typeof e.serverResponseCode === "string" ? e.serverResponseCode : undefined;
        if (e.responseStatus === "NO" && !(code !== undefined && APPEND_REFUSED.has(code)))
          throw new MailboxUnavailableError(
            `IMAP ${this.imap.host}:${this.imap.port}: the APPEND to ${mailbox} was answered NO (${code ?? "no code"}: ${said(e, content)})`,
            { cause },
          );
        if (e.responseStatus !== "NO") throw cause;
        const fix =
          code === "OVERQUOTA"
            ? "make room in the account, or raise its quota"
            : code === "NOPERM"
              ? "give the account the right to file into it (IMAP ACL: insert)"
              : `check ${this.setting}, or create the mailbox`;
        const what =
          code === "NOPERM" ? "may not file into" : code === "OVERQUOTA" ? "is over quota for" : "has no mailbox";
        throw new MailboxRefusedError(
          `IMAP ${this.imap.host}:${this.imap.port}: ${this.imap.auth.user} ${what} ${mailbox} (${code}: ${said(e, content)}): ${fix}`,
          "mailbox",
          code,
          { cause },
        );
      }
    });
  }

  /**
   * With the Sent folder found by the server's LIST (no `sentMailbox`), the other mailboxes that
   * can be opened and that the server flags \Sent too, besides `opened`; none otherwise.
   */
  private otherSent(boxes: readonly ListedMailbox[], opened: string): string[] {
    if (this.path !== SENT) return [];
    return boxes
      .filter((b) => selectable(b) && b.path !== opened && (b.specialUse === SENT || has(b, SENT)))
      .map((b) => b.path);
  }

  /** The mailbox to open: the configured path, or the Sent folder the server lists (`boxes`). */
  private opened(boxes: readonly ListedMailbox[]): string {
    if (this.path !== SENT) return this.path;
    const sent = mailboxPath(SENT, boxes);
    if (sent === undefined) {
      const phantom = boxes.find((b) => b.specialUse === SENT || has(b, SENT));
      const listed = phantom
        ? `; ${phantom.path} is listed as \\Sent but cannot be opened (${[...phantom.flags].join(" ")})`
        : "";
      // The account's configuration, not a passing failure: every later session lists the same.
      throw new MailboxRefusedError(
        `IMAP ${this.imap.host}:${this.imap.port}: ${this.imap.auth.user} has no Sent folder (no SPECIAL-USE \\Sent, none named Sent${listed}): set sentMailbox`,
        "mailbox",
        "NONEXISTENT",
      );
    }
    return sent;
  }

  /**
   * One session: `fn` gets the client, `refused()`, the last command the server answered NO or
   * BAD in it, as imapflow logs it (a SEARCH it answers `false` keeps its code nowhere else), and
   * `renew()`, which starts the deadline again from now (for each step of a long search). The
   * session ends when `signal` aborts as at its deadline (closed; unavailable, saying so), but
   * that no `renew()` starts it again; its error then says `task`. Errors say what the server said
   * without `content` (module doc).
   */
  private async session<T>(
    signal: AbortSignal | undefined,
    content: MessageContent,
    task: SessionTask,
    fn: (client: ImapFlow, refused: () => CommandRefusal | undefined, renew: () => void) => Promise<T>,
  ): Promise<T> {
    const where = `IMAP ${this.imap.host}:${this.imap.port}`;
    const givenUp = (cause: unknown) =>
      new MailboxUnavailableError(
        `${where}: ${task.what} was given up before it could answer (${describe(signal?.reason)}): closed, ${task.left}`,
        { cause },
      );
    if (signal?.aborted) throw givenUp(signal.reason);
    const secure = this.imap.secure ?? false;
    let refusal: CommandRefusal | undefined;
    const quiet = () => {};
    // imapflow's logger sees every line; only a failed command's error (`{ err }` at warn) is kept,
    // and nothing is written anywhere.
    const logger = {
      trace: quiet,
      debug: quiet,
      info: quiet,
      error: quiet,
      fatal: quiet,
      warn: (entry: unknown) => {
        const err = (entry as { err?: CommandRefusal } | undefined)?.err;
        if (err && (err.responseStatus === "NO" || err.responseStatus === "BAD")) refusal = err;
      },
    };
    const client = new ImapFlow({
      host: this.imap.host,
      port: this.imap.port,
      secure,
      // Required STARTTLS unless said otherwise: left to imapflow, a server (or a man in the
      // middle) that does not offer it gets the login in clear text. imapflow refuses it with
      // implicit TLS, which needs none.
      ...(!secure && (this.imap.requireTLS ?? true) && { doSTARTTLS: true }),
      // The trust the config gives (its CA, name, version), for STARTTLS and implicit TLS alike;
      // only those three keys (tlsOptions), so verification stays on.
      tls: tlsOptions(this.imap.tls),
      auth: { user: this.imap.auth.user, pass: this.imap.auth.pass },
      logger,
      connectionTimeout: 10_000,
      greetingTimeout: 10_000,
      socketTimeout: 30_000,
    });
    client.on("error", () => {}); // reported through the failing call below
    // Closing the client rejects the command in flight (imapflow's NoConnection), so whatever the
    // session awaits ends; the error it then throws is replaced by the deadline's. A result `fn`
    // already returned stands: only the logout was cut off.
    const deadlineMs = this.imap.deadlineMs ?? IMAP_DEADLINE_MS;
    let expired = false;
    const arm = () =>
      setTimeout(() => {
        expired = true;
        client.close();
      }, deadlineMs);
    let deadline = arm();
    const renew = () => {
      if (expired || aborted) return;
      clearTimeout(deadline);
      deadline = arm();
    };
    let aborted = false;
    const onAbort = () => {
      aborted = true;
      client.close();
    };
    signal?.addEventListener("abort", onAbort, { once: true });
    const late = (cause: unknown) =>
      new MailboxUnavailableError(
        `IMAP ${this.imap.host}:${this.imap.port}: no complete answer within ${deadlineMs} ms (imap.deadlineMs): closed`,
        { cause },
      );
    try {
      try {
        await client.connect();
      } catch (cause) {
        if (aborted) throw givenUp(cause);
        if (expired) throw late(cause);
        throw openFailure(cause, `IMAP ${this.imap.host}:${this.imap.port}`, this.imap.auth.user, content);
      }
      try {
        const result = await fn(client, () => refusal, renew);
        // An answer made of a session cut short (a search loop that reads a closed client as
        // done) is no answer: only one the whole session gave counts.
        if (aborted) throw givenUp(signal?.reason);
        return result;
      } catch (cause) {
        if (aborted) throw givenUp(cause);
        if (expired) throw late(cause);
        if (cause instanceof MailboxUnavailableError) throw cause;
        throw new MailboxUnavailableError(`IMAP ${this.path}: ${messageOf(cause, content)}`, { cause });
      } finally {
        await client.logout().catch(() => client.close());
      }
    } finally {
      clearTimeout(deadline);
      signal?.removeEventListener("abort", onAbort);
    }
  }

  /**
   * Whether the server's LIST has `mailbox` only as a name that cannot be opened (\Noselect,
   * \NonExistent). False when the LIST fails: the SELECT's own failure is reported then.
   */
  private async onlyFolders(client: ImapFlow, mailbox: string): Promise<boolean> {
    const boxes: readonly ListedMailbox[] | undefined = await client.list().catch(() => undefined);
    if (!boxes) return false;
    const prefix = client.namespace?.prefix ?? "";
    const path = listedPath(mailbox, prefix);
    return boxes.some((b) => b.path === path) && mailboxPath(mailbox, boxes, prefix) === undefined;
  }

  /**
   * The message with `messageId` in `mailbox`, if any. A SELECT the server answers NO [NOPERM]
   * (RFC 5530: the account's rights, an IMAP ACL, do not let it read the mailbox; a journal account
   * allowed to receive but not read, say) is a configuration a person must fix, not an outage; so
   * is one it answers NO [NONEXISTENT], or NO while its LIST has no such mailbox (imapflow's
   * `mailboxMissing`; Dovecot gives no code to a SELECT): the name configured, or the Sent folder
   * the server listed, is not one the server has. A SEARCH it refuses (NO, BAD: overloaded, index
   * rebuilding) may pass: unavailable, with what it said.
   */
  private async search(
    client: ImapFlow,
    mailbox: string,
    messageId: string,
    refused: () => CommandRefusal | undefined,
    content: MessageContent,
  ): Promise<FoundMessage | undefined> {
    const where = `IMAP ${this.imap.host}:${this.imap.port}`;
    const user = this.imap.auth.user;
    // Read-only (EXAMINE): a SELECT would take \Recent off the new mail of the mailboxes it opens.
    const lock = await client.getMailboxLock(mailbox, { readOnly: true }).catch(async (cause: unknown) => {
      const e = cause as CommandRefusal;
      // Dovecot answers a SELECT of a name that only holds other mailboxes with a bare NO, and
      // imapflow's own check lists it (\Noselect), so it is not `mailboxMissing`: the full LIST says.
      const folders =
        e.responseStatus === "NO" &&
        e.serverResponseCode === undefined &&
        e.mailboxMissing !== true &&
        (await this.onlyFolders(client, mailbox));
      if (e.serverResponseCode === "NOPERM")
        throw new MailboxRefusedError(
          `${where}: ${user} may not read ${mailbox} (NOPERM: ${said(e, content)}): give the account the right to read it, or configure a mailbox it may read`,
          "mailbox",
          "NOPERM",
          { cause },
        );
      if (
        e.responseStatus === "NO" &&
        (e.serverResponseCode === "NONEXISTENT" || e.mailboxMissing === true || folders)
      ) {
        // Named by the config, or by the server's own LIST as its Sent folder: either way the
        // server has none of that name now, and every later session will say the same.
        const named =
          this.path === SENT
            ? `the Sent folder its LIST names (${mailbox}); set ${this.setting} to the Sent folder's path`
            : `check ${this.setting} (mailbox names are case-sensitive, as the server's LIST spells them), or create the mailbox`;
        const only = folders ? "; the server lists the name as one that holds only other mailboxes" : "";
        throw new MailboxRefusedError(
          `${where}: ${user} has no mailbox ${mailbox} (NONEXISTENT: ${said(e, content)}${only}): ${named}`,
          "mailbox",
          "NONEXISTENT",
          { cause },
        );
      }
      throw cause;
    });
    try {
      const uids = await client.search({ header: { "message-id": messageId } }, { uid: true });
      // imapflow answers a search the server refused (NO, BAD: overloaded, index rebuilding)
      // with false: that is not "no such message", and taken as one it would send again.
      if (!Array.isArray(uids)) {
        const e = refused();
        const how = e
          ? ` (${typeof e.serverResponseCode === "string" ? e.serverResponseCode : `${String(e.responseStatus)}, no code`}: ${said(e, content)})`
          : "";
        throw new MailboxUnavailableError(`${where} ${mailbox}: the server refused the search for ${messageId}${how}`);
      }
      const uid = uids[0];
      if (uid === undefined) return undefined;
      const sends = await sendsOf(client, uids);
      return { mailbox, uid, sends, copies: uids.length, unread: Math.max(0, uids.length - MAX_COPIES) };
    } finally {
      lock.release();
    }
  }
}

/**
 * Copies found in two mailboxes as one finding: the first's place, every copy counted, and the
 * sends both name. Sends unknown of either part (`[]`, see `sendsOf`) leave them unknown, unless
 * the parts already name two or more: it went out more than once, whatever the rest are.
 */
function merged(a: FoundMessage | undefined, b: FoundMessage | undefined): FoundMessage | undefined {
  if (!a || !b) return a ?? b;
  const sends = [...new Set([...a.sends, ...b.sends])].sort();
  const known = a.sends.length > 0 && b.sends.length > 0;
  // Each part's copies beyond MAX_COPIES are the ones not read; their sum alone is no such count
  // (two mailboxes of 11 copies each, every one read, naming one send, are one send).
  return {
    ...a,
    copies: a.copies + b.copies,
    unread: a.unread + b.unread,
    sends: known || sends.length >= 2 ? sends : [],
  };
}

/** The `X-Idem-Attempt` lines of a header block: `<operation id>/<attempt>`, as email-actions.ts writes it. */
const ATTEMPT_LINES = /^x-idem-attempt:[ \t]*(.*?)[ \t]*$/gim;

/**
 * The sends the copies `uids` are (FoundMessage.sends), or none (unknown) unless every copy is read
 * and names exactly one: a copy sent by an earlier version, one that vanished between the SEARCH
 * and the FETCH, or one with two such lines could be another send, and a send left out would make
 * two read as one. Only a detail of a copy found: a FETCH that fails leaves them unknown, never
 * the copy not found. Of more than MAX_COPIES copies the first MAX_COPIES are read: the sends
 * they name when several (it went out more than once, whatever the rest say), else none.
 */
async function sendsOf(client: ImapFlow, uids: readonly number[]): Promise<string[]> {
  const read = uids.slice(0, MAX_COPIES);
  try {
    const copies = await client.fetchAll([...read], { headers: ["x-idem-attempt"] }, { uid: true });
    if (copies.length !== read.length) return [];
    const sends = new Set<string>();
    for (const copy of copies) {
      const named = new Set(
        [...(copy.headers?.toString("latin1") ?? "").matchAll(ATTEMPT_LINES)].map((m) => m[1] ?? ""),
      );
      const [only] = named;
      if (named.size !== 1 || only === undefined || !SEND_NAME.test(only)) return [];
      sends.add(only);
    }
    return read.length < uids.length && sends.size < 2 ? [] : [...sends].sort();
  } catch {
    return [];
  }
}

/** An abort's reason, for a message. */
function describe(reason: unknown): string {
  if (reason instanceof Error) return reason.message;
  return reason === undefined ? "aborted" : String(reason);
}
