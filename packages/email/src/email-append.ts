/**
 * The Sent copy in append mode, filed by us after the server accepted the message. An APPEND that
 * fails for a reason that may pass (`appendMayPass`) is tried again with a growing pause (p-retry,
 * as core retries), `APPEND_RETRY.retries` more times at most; every try after one that may have
 * filed the copy (no answer came: a connection lost, a timeout) first looks for it, so a retry
 * never files a second copy. What still fails is what the receipt's `copyNotFiled` says. Nothing here
 * sends: the message went out already, whatever happens to its copy.
 *
 * Not covered: a server that files the copy after it answered NO, or after the look that follows a
 * lost answer (Dovecot commits before its OK); a look that is refused (an account that may file
 * into Sent but not read it) ends the tries, with that refusal as the reason.
 */
import pRetry, { AbortError } from "p-retry";
import { type Mailbox, MailboxRefusedError, MailboxUnavailableError } from "./email-mailbox.js";
import type { CopyNotFiled } from "./email-receipt.js";
import type { MessageContent } from "./email-reply.js";

/**
 * Two more tries after the first, 200 ms then about 400 ms apart (spread up to twice that, so
 * senders that failed together do not retry in step), none begun 20 s after the first: the
 * operation's lease is held meanwhile, and a Sent folder still failing then is reported, not waited on.
 */
export const APPEND_RETRY = { retries: 2, minTimeout: 200, maxTimeout: 2_000, randomize: true, maxRetryTime: 20_000 };

/**
 * Codes of a NO that say the same APPEND fails again (RFC 5530; TOOBIG, RFC 7889): the message is
 * over the server's limit (TOOBIG, LIMIT), the server will not do it (CANNOT), the command was ours
 * to fix (CLIENTBUG), or the account's state is a person's (CONTACTADMIN, EXPIRED, PRIVACYREQUIRED).
 */
const FAILS_AGAIN: ReadonlySet<string> = new Set([
  "TOOBIG",
  "LIMIT",
  "CANNOT",
  "CLIENTBUG",
  "CONTACTADMIN",
  "EXPIRED",
  "PRIVACYREQUIRED",
]);

/** What imapflow keeps of a command's failure: the tagged status and code, or a socket's error. */
interface CommandFailure {
  readonly responseStatus?: unknown;
  readonly serverResponseCode?: unknown;
}

/** Whether a failed APPEND of the Sent copy may pass if tried again. */
export function appendMayPass(error: unknown): boolean {
  // Refused until a person acts: no right to file, a quota, no such mailbox, the sign-in, TLS.
  if (error instanceof MailboxRefusedError) return false;
  // Anything else that is no mailbox failure is a bug of ours: the same call fails the same way.
  if (!(error instanceof MailboxUnavailableError)) return false;
  const cause = (error.cause ?? {}) as CommandFailure;
  // BAD: the server could not take the command as written; written again, it is the same.
  if (cause.responseStatus === "BAD") return false;
  const code = typeof cause.serverResponseCode === "string" ? cause.serverResponseCode : undefined;
  if (cause.responseStatus === "NO" && code !== undefined && FAILS_AGAIN.has(code)) return false;
  // A NO that may pass (INUSE, UNAVAILABLE, SERVERBUG, none said), a lost connection, a timeout,
  // a session that did not open for now.
  return true;
}

/** Whether a failed APPEND may have filed the copy: no tagged answer came (a NO or BAD filed nothing). */
function mayHaveFiled(error: unknown): boolean {
  const cause = (error instanceof Error ? error.cause : undefined) as CommandFailure | undefined;
  return cause?.responseStatus !== "NO" && cause?.responseStatus !== "BAD";
}

/**
 * Files `raw` (the message with Message-ID `messageId`) in `sent`, tried again as the module says.
 * Undefined once it is there; else why not. Nothing is tried once `signal` is aborted (the lease
 * lost, the caller gone, a settlement's time bound), and an APPEND or a look for the copy in
 * flight then ends at once (its session closed: the copy may be there), the reason saying so, as
 * does a pause between tries (the last failure the reason).
 * The message went out: the send is answered with its receipt, the copy missing in it, not kept
 * waiting on a Sent folder past its signal (core stops awaiting an execute a second after it
 * aborts, and would record a message sent as one that may have been). `content`: what the
 * message says, kept out of the reason a server's refusal gives (a filter quotes the message it
 * refused).
 */
export async function fileCopy(
  sent: Mailbox,
  raw: Buffer,
  messageId: string,
  signal: AbortSignal,
  content: MessageContent,
): Promise<CopyNotFiled | undefined> {
  let tries = 0;
  let stopped: Error | undefined;
  // Once an APPEND may have filed the copy, every later try looks first: a look that fails in
  // between (a SEARCH answered NO) says nothing of the copy.
  let maybeFiled = false;
  let filed = false;
  try {
    await pRetry(
      async () => {
        // Aborted as the pause ended: no try, the last failure stands (p-retry throws the error given).
        if (tries > 0 && signal.aborted) throw new AbortError(stopped ?? "aborted");
        tries++;
        if (maybeFiled && (await sent.find(messageId, { signal, content }))) {
          filed = true;
          return;
        }
        try {
          await sent.append(raw, { signal, content });
          filed = true;
        } catch (error) {
          maybeFiled ||= mayHaveFiled(error);
          throw error;
        }
      },
      {
        ...APPEND_RETRY,
        // Ends the pause between tries at once when it aborts (up to 800 ms otherwise, an answer
        // the caller gave up on kept waiting); p-retry then throws the signal's reason.
        signal,
        onFailedAttempt: ({ error }) => {
          stopped = error;
        },
        shouldRetry: ({ error }) => !signal.aborted && appendMayPass(error),
      },
    );
    return undefined;
  } catch (error) {
    // p-retry also throws the signal's reason after a try that filed the copy, if it aborted
    // just then: filed is filed.
    if (filed) return undefined;
    // Its reason is not why the copy is missing: the last failure is (none before a first try).
    const given = error !== undefined && error === signal.reason ? (stopped ?? notTried(signal.reason)) : error;
    return notFiled(given, tries);
  }
}

/** Why there is no copy when the signal aborted before a first try (the message sent just then). */
function notTried(reason: unknown): Error {
  const why = reason instanceof Error ? reason.message : String(reason ?? "aborted");
  return new MailboxUnavailableError(`the APPEND was not tried: given up first (${why})`);
}

/** What a receipt keeps of a failed APPEND of the Sent copy: refused for good, or failed (it may be there). */
function notFiled(error: unknown, tries: number): CopyNotFiled {
  const said = error instanceof Error ? `${error.name}: ${error.message}` : String(error);
  const cause = (error instanceof Error ? error.cause : undefined) as CommandFailure | undefined;
  const code =
    error instanceof MailboxRefusedError ? error.responseCode : (cause?.serverResponseCode as string | undefined);
  return {
    // A tagged NO or BAD that trying again would get again (TOOBIG, LIMIT, CONTACTADMIN…) filed
    // nothing, and the next copy like it is refused too: refused, not "may or may not be there".
    refused: error instanceof MailboxRefusedError || (!appendMayPass(error) && !mayHaveFiled(error)),
    responseCode: typeof code === "string" ? code.slice(0, 64) : null,
    reason: (tries > 1 ? `after ${tries} tries: ${said}` : said).slice(0, 1_000),
  };
}
