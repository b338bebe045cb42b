/**
 * Alerts, delivered once: each delivery to each sink is itself an operation in the ledger (tenant
 * `alerts.tenant`, key: sink, operation, kind, attempt, transition time), so restarts and replicas
 * of the daemon never send the same alert twice. Sinks: a JSON log line, a webhook (generic JSON
 * or Slack-compatible `{ text }`), email through nodemailer. An alert carries identifiers and the
 * reason, never the operation's args or receipt.
 *
 * A webhook or email whose delivery is ambiguous (timeout after sending) is not retried blindly:
 * like any effect that cannot be proven, it goes to needs_review, and the log line says so. A
 * webhook request that fetch will not make or send (a header value it refuses, a port it blocks),
 * or a delivery whose server's certificate we refused at the handshake (the email sink trusts
 * `alerts.email.smtp.tls`, read as the email provider's is; the webhook, Node's CAs), was not
 * sent: the alert stays due and the log says why (once while the sink keeps failing: it backs off,
 * sink-backoff.ts), never quoting the URL or a header. A delivery
 * a person then retries (`idem retry`) is settled by the daemon's pass like any due
 * operation, with the alert as it was stored: the daemon's ledger is opened with `alertActions`.
 */
import type { Transporter } from "nodemailer";
import type { Logger } from "pino";
import {
  defineAction,
  LedgerUnavailableError,
  neverSent,
  operationKey,
  tlsRefused,
  type Action,
  type Classification,
  type Ledger,
  type Operation,
  type RunResult,
} from "@idem/core";
import { ConfigError, secret, tlsOf, webhookUrlProblem, type IdemConfig } from "./config.js";
import type { SinksThisTick } from "./sink-backoff.js";

/**
 * What an alert says: `needs_review` (a person decides), `auth_failure` (failed on a refused
 * credential or a policy), `check_refused` (the outcome is unknown, and a credential or a
 * certificate was refused while checking it: it may have happened), `two_effects` (a second
 * request of it took effect too: the ledger saw two different receipts, two attempts' receipts
 * that could not be stored, or one such receipt that names two effects), `maybe_two_effects` (it took effect, proven by an earlier attempt's
 * late answer after a later attempt ran it again from a proof that it was not done: that run may
 * have taken effect too), `verdict_overruled` (a person resolved it as failed, and a late receipt
 * then proved it took effect: they may have acted on "failed"), `failure_overruled` (it failed,
 * not by a person's word, and "failed" was replayed to any caller since, but an earlier attempt's
 * late receipt then proved it took effect: a caller may have sent the same work again under
 * another key), `incomplete` (it took effect, once, but not in full: its action's
 * `attention`, such as a sent mail whose Sent copy was not filed), `retry_not_run` (a person
 * retried it, and the lookup made first found the earlier attempt's effect: it took effect once,
 * and the retry did not run), `stuck` (running past its threshold).
 */
export type AlertKind =
  | "needs_review"
  | "auth_failure"
  | "check_refused"
  | "two_effects"
  | "maybe_two_effects"
  | "verdict_overruled"
  | "failure_overruled"
  | "incomplete"
  | "retry_not_run"
  | "stuck";

export interface Alert {
  readonly kind: AlertKind;
  readonly operationId: string;
  readonly tenant: string;
  readonly action: string;
  readonly status: string;
  readonly attempt: number;
  readonly reason: string | null;
  readonly since: string;
}

/**
 * The alert of `kind` about `op`, at its attempt and since its last change; `at`: another attempt
 * and time it is about (a `check_refused` alert names the attempt whose outcome is unknown, and
 * when it became so, not the last of its checks).
 */
export function alertOf(kind: AlertKind, op: Operation, at?: { attempt: number; since: number }): Alert {
  return {
    kind,
    operationId: op.id,
    tenant: op.tenant,
    action: op.action,
    status: op.status,
    attempt: at?.attempt ?? op.attempt,
    reason: op.reason,
    since: new Date(at?.since ?? op.updatedAt).toISOString(),
  };
}

const SAID: Record<AlertKind, string> = {
  stuck: "is stuck in running",
  needs_review: "needs a person's review",
  auth_failure: "failed on authentication or policy",
  // Not a failure: the effect may have happened (the check was refused, not the effect).
  check_refused:
    "is left with its outcome unknown; a credential or the server's certificate was refused while checking it (it may have happened: fix the credential or the trust, or check the provider and decide)",
  two_effects: "took effect twice (check the provider, and undo the extra effect)",
  // One effect proven, a second one possible: the person looks before undoing anything.
  maybe_two_effects:
    "may have taken effect twice: it was run again after a proof that it was not done, and an earlier attempt's effect was proven since (check the provider for a second effect, and undo it if there is one)",
  // One effect the ledger saw, but the person who said "failed" may have made another by hand.
  verdict_overruled:
    'a person\'s verdict "failed" was contradicted: it took effect after all (check whether anything was done on that verdict, such as the work redone by hand)',
  // One effect the ledger saw; a caller told "failed" (a model) may have made another elsewhere.
  failure_overruled:
    'failed, and was replayed as "failed" to any caller since, but took effect after all: an earlier attempt\'s request landed after a later one was refused (check whether a caller acted on "failed", such as the same work sent again under another key, and undo a second effect if there is one)',
  // Not a second effect: nothing to undo, a part to see to.
  incomplete: "took effect, but not in full (nothing to undo; see to the part that is missing)",
  // Not a second effect either: the person who retried it must hear that their retry did not run.
  retry_not_run:
    "was done when a person retried it: the earlier attempt took effect after all, once, and the retry did not run (nothing to undo)",
};

export function alertText(a: Alert): string {
  return `idem: ${a.action} operation ${a.operationId} (tenant ${a.tenant}) ${SAID[a.kind]}: ${a.reason ?? "no reason recorded"}. See: idem show ${a.operationId} --tenant ${a.tenant}`;
}

/**
 * A webhook request that never left this process: fetch could not make it (a URL or a header it
 * refuses) or will not send it (a port it blocks). Its message names no URL or header value.
 */
class WebhookNotSentError extends Error {
  override readonly name = "WebhookNotSentError";
}

/** Webhook answers that refuse every alert, not this one: 401, 403 (Slack's invalid_token), 404 (no_service), 410, 503. */
const NOT_TAKING: ReadonlySet<number> = new Set([401, 403, 404, 410, 503]);

/**
 * Webhook answers of a receiver (or the gateway in front of it) that failed on this request: 500
 * (an error page), 502 (the gateway could not reach it), 504 (the gateway gave up waiting), and
 * the two 4xx that say the request was not processed yet: 408 (it waited too long for the
 * request), 425 (too early, try again). They
 * may come after the receiver took the alert, but the request carries an `idempotency-key` header
 * (a receiver that reads it drops the second), and a duplicate alert costs a person a second look
 * where a lost one costs the incident it was about: tried again after the sink's backoff
 * (sink-backoff.ts: the next tick, then longer while it keeps failing), never "may have
 * been sent" (which would put the delivery in review and acknowledge the alert unsent). Not within
 * the tick: a delivery is one request a tick (`deliver`), so a receiver that takes alerts and
 * answers 500 gets one copy a tick, not one per retry.
 */
const FAILED_THIS_TIME: ReadonlySet<number> = new Set([408, 425, 500, 502, 504]);

/** undici's connect timeout: the connection was never made, so no byte of the request left. */
const CONNECT_TIMEOUT = "UND_ERR_CONNECT_TIMEOUT";

/**
 * The most one webhook request may take, from its start to the answer's status. Longer than
 * undici's connect timeout (10 s, which fetch gives no way to change): a receiver never connected
 * to (its host dropping the attempt) fails as that, "not reached", nothing sent. A deadline of
 * 10 s, as before, cut the connect first, and the delivery went to review as "may have been
 * sent", its alert acknowledged, though no byte had left this process.
 */
const WEBHOOK_DEADLINE_MS = 20_000;

/**
 * HTTP failures of the webhook sink, whose URL is `url` (never kept in a reason: a Slack
 * webhook's URL is itself a secret).
 */
function classifyDelivery(url: string) {
  return (error: unknown): Classification => {
    // Nothing was sent, and nothing will be until a person fixes the config: the alert stays due,
    // and the log says why (as for a refused SMTP sign-in). Never "may have been sent".
    if (error instanceof WebhookNotSentError)
      return { kind: "transient", reason: `webhook request not sent: ${error.message}` };
    const status = (error as { status?: number }).status;
    // The receiver is not taking alerts at all: a wrong or rotated authorization, a webhook revoked
    // or removed, or briefly unavailable. Nothing was delivered, and the alert stays due until a
    // person fixes it or the receiver is back (as for a refused SMTP sign-in), never acknowledged.
    if (status !== undefined && NOT_TAKING.has(status))
      return {
        kind: "transient",
        reason: `receiver answered ${status}, nothing delivered${status === 503 ? "" : " (check alerts.webhook: its URL and authorization)"}`,
      };
    // A redirect (the URL moved, an upgrade to https, a sign-in page): the receiver did not take
    // it, and it is not sent elsewhere (the Location may be another host). Its Location is not
    // quoted (it may hold a token, as the URL does).
    if (status !== undefined && status >= 300 && status < 400)
      return {
        kind: "transient",
        reason: `receiver answered ${status} (a redirect), nothing delivered: redirects are not followed; set alerts.webhook to the URL that takes alerts`,
      };
    if (status !== undefined && FAILED_THIS_TIME.has(status))
      return {
        kind: "transient",
        reason: `receiver answered ${status}; tried again after a backoff (a duplicate is cheaper than a lost alert)`,
      };
    // Another 4xx refuses this alert itself (its payload): final.
    if (status !== undefined && status >= 400 && status < 500 && status !== 429)
      return { kind: "permanent", reason: `receiver answered ${status}` };
    if (status === 429) return { kind: "rate_limited", reason: "receiver rate limited", retryAfterMs: 5_000 };
    const socket = (error as { cause?: { code?: string } }).cause ?? error;
    // Its certificate refused by us at the handshake, before the request: nothing sent, and each
    // tick meets it until a person fixes it (as for a refused authorization), never "may have been sent".
    const tls = tlsRefused(socket);
    if (tls)
      return {
        kind: "transient",
        reason:
          tls.refused === "certificate"
            ? `the receiver's certificate is not trusted (${tls.code}): nothing sent; the webhook trusts Node's CAs (a private CA: NODE_EXTRA_CA_CERTS)`
            : `no TLS version both the receiver and this process accept (${tls.code}): nothing sent`,
      };
    // Not connected (refused, unresolved, unreachable at connect, or a connect that timed out): nothing sent.
    if (neverSent(socket) || (socket as { code?: unknown }).code === CONNECT_TIMEOUT)
      return {
        kind: "transient",
        reason: `receiver not reached (${(socket as { code?: string }).code}): nothing sent`,
      };
    // The rest (a timeout, a connection closed after the body) may have been delivered.
    const message = [url, new URL(url).href].reduce(
      (text, secretUrl) => text.replaceAll(secretUrl, "<the webhook URL>"),
      String((error as Error | undefined)?.message ?? error),
    );
    return { kind: "ambiguous", reason: `delivery unknown: ${message}` };
  };
}

/**
 * The webhook's request, made before anything is sent: one fetch cannot make (a URL or header it
 * refuses) is a `WebhookNotSentError`. Their messages quote the URL or the header's value: not kept.
 */
function webhookRequest(url: string, init: RequestInit): Request {
  try {
    return new Request(url, init);
  } catch (cause) {
    throw new WebhookNotSentError(
      "fetch could not make the request (it refuses the URL or a header value, such as one holding a line break): nothing sent; fix alerts.webhook",
      { cause },
    );
  }
}

/**
 * A signal aborted after `ms`, its reason naming the deadline (told apart from the operation's own
 * signal); `clear` when the delivery ended.
 */
function deadline(ms: number): { signal: AbortSignal; clear: () => void } {
  const controller = new AbortController();
  const reason = Object.assign(
    new Error(`no complete answer from the SMTP server within ${ms} ms (alerts.email.smtp.deadlineMs): closed`),
    { name: DEADLINE },
  );
  const timer = setTimeout(() => controller.abort(reason), ms);
  return { signal: controller.signal, clear: () => clearTimeout(timer) };
}

/** fetch's refusal of a port it blocks (6000, 6667…), which it gives before connecting. */
const isBlockedPort = (error: unknown) =>
  error instanceof TypeError && (error.cause as { message?: unknown } | undefined)?.message === "bad port";

/**
 * Refuses a config whose alerts go nowhere (`log: false`, no webhook, no email): a daemon would
 * acknowledge every alert with no sink to send it to. For the daemon (and its console).
 */
export function requireAlertSink(config: IdemConfig): void {
  const a = config.alerts;
  if (!a.log && !a.webhook && !a.email)
    throw new ConfigError(
      `invalid config ${config.source}: alerts: no sink (log is false, and no webhook or email): the daemon would acknowledge every alert without sending it anywhere; set alerts.log to true, or give alerts.webhook or alerts.email`,
    );
}

/** How long a sink that refuses every alert (a refused sign-in, account or policy) is left before it is asked again. */
const REFUSING_EVERY_ALERT_MS = 10 * 60_000;

/**
 * The default `alerts.email.smtp.deadlineMs`: the most one delivery may take, from the connect to
 * the last reply, whatever the server keeps writing (nodemailer's inactivity timeout is reset by
 * every line, so a server writing continuation lines forever held the daemon's tick forever). An
 * alert is small: a server that has not answered it in a minute is not going to.
 */
const ALERT_EMAIL_DEADLINE_MS = 60_000;
/** The name of the abort reason a delivery cut off at its deadline carries. */
const DEADLINE = "DeliveryDeadline";

/**
 * The SMTP stages before the message: the server's greeting and EHLO, MAIL FROM and RCPT TO.
 * What is refused there is the server, the account or the envelope (`alerts.email.from` and
 * `to`), the same for every alert; at DATA, this message.
 */
const BEFORE_THE_MESSAGE: ReadonlySet<string> = new Set(["CONN", "EHLO", "HELO", "LHLO", "MAIL FROM", "RCPT TO"]);

/** The email sink's client (nodemailer, loaded as the daemon starts, else at an alert) could not be loaded: nothing was sent. */
class MailerUnloadedError extends Error {
  override readonly name = "MailerUnloadedError";
}

/** nodemailer as this process loads it: one load shared by every email sink and `loadEmailClient`. */
let mailer: Promise<typeof import("nodemailer")> | undefined;

/**
 * nodemailer, loaded once for the process. A load that failed is tried again at the next call: a
 * package missing then installed loads then; one that threw as it loaded stays failed (Node keeps
 * a module that failed to load) until the process is restarted.
 */
function loadMailer(): Promise<typeof import("nodemailer")> {
  mailer ??= import("nodemailer").catch((error: unknown) => {
    mailer = undefined;
    throw new MailerUnloadedError(`nodemailer could not be loaded: ${(error as Error).message}`, { cause: error });
  });
  return mailer;
}

/**
 * The reason `loadEmailClient` last said on each log: each reason is said once there. Once per
 * log rather than once per failed load, because one start loads it more than once: `idem
 * daemon` begins before its ledger opens, and its `Daemon` again as it is built; a missing package
 * is found missing in milliseconds, so the second is a load of its own, failing the same way, and
 * "once per load" said the same line twice for one start. A library that builds its `Daemon` again
 * (after a ledger it had to reopen) would repeat it too, while nothing changed. What an operator
 * needs is one line, loud, at the start: each alert that then fails still says "nothing sent" (the
 * sink's backoff says it once while it keeps failing). A different reason (installed meanwhile,
 * but now it throws as it loads) is news, said too. Per log, not per process: a second daemon of
 * the process with a log of its own (another destination) hears it there, not at its first alert.
 */
const saidUnloaded = new WeakMap<Logger, string>();

/**
 * With an email sink, starts loading its client (nodemailer) now, without waiting for it, so that
 * a missing or broken install is heard as the daemon starts, at error, rather than at its first
 * email alert (then each alert failed "nothing sent", tried again at every tick, and nobody was
 * told until one was due). Called by `idem daemon` before its ledger opens (heard while the
 * database is awaited) and by the `Daemon` constructor (heard by a library that builds one); the
 * line is said once a log (`saidUnloaded`). Each alert still loads it again when it failed
 * (`loadMailer`): an install fixed meanwhile is used. With no email sink, nothing is loaded.
 */
export function loadEmailClient(config: IdemConfig, log: Logger): void {
  if (!config.alerts.email) return;
  loadMailer().catch((error: unknown) => {
    const reason = (error as Error).message;
    if (saidUnloaded.get(log) === reason) return;
    saidUnloaded.set(log, reason);
    log.error(
      { err: error },
      `email alerts cannot be sent: ${reason}; each is kept due and tried again as the daemon goes on (a package that threw as it loaded is not loaded again until the daemon is restarted)`,
    );
  });
}

/**
 * SMTP failures of the email sink, as nodemailer gives them (`code`, the `command` answered,
 * `responseCode` and the server's `response`; @idem/email, an optional peer, is not imported
 * here). A server not reached, or answering 4xx, took nothing: tried again next tick. A refusal of
 * every alert (the sign-in, the account, a policy, the envelope) is a configuration a person
 * fixes: the alert stays due, held back for minutes (failed sign-ins in a loop get an account
 * locked out), and the log says why, rather than counting it delivered. A refusal of this
 * message alone (its size, its content, at DATA) is final for this alert. Only a lost answer is
 * ambiguous.
 */
function classifyEmailDelivery(error: unknown): Classification {
  if (error instanceof MailerUnloadedError) return { kind: "transient", reason: `nothing sent: ${error.message}` };
  const e = (error ?? {}) as {
    code?: string;
    command?: string;
    response?: string;
    responseCode?: number;
    timeoutType?: string;
    cause?: { name?: string; message?: string };
  };
  // Cut off at the deadline (the connect and the greeting have timeouts of their own, shorter):
  // the server was talking, and may have taken the alert without its last reply reaching us.
  if (e.code === "EABORT" && e.cause?.name === DEADLINE)
    return { kind: "ambiguous", reason: `no answer from the SMTP server: ${e.cause.message}` };
  const what = `${e.code ?? "error"}: ${String((error as Error | undefined)?.message ?? error)}`;
  const refusesEveryAlert = (why: string): Classification => ({
    kind: "rate_limited",
    reason: `${why}; the SMTP server refuses every alert, nothing sent (tried again in ${REFUSING_EVERY_ALERT_MS / 60_000} minutes): ${what}`,
    retryAfterMs: REFUSING_EVERY_ALERT_MS,
  });
  if (e.code === "EAUTH" || e.code === "ENOAUTH")
    return refusesEveryAlert("SMTP sign-in refused (fix the credentials)");
  // Refused by us at the handshake, before the message: every alert meets the same certificate.
  const tls = tlsRefused(error);
  if (tls)
    return refusesEveryAlert(
      tls.refused === "certificate"
        ? "the SMTP server's certificate is not trusted (check alerts.email.smtp.tls: caFile, servername)"
        : "no TLS version both the SMTP server and alerts.email.smtp.tls.minVersion accept",
    );
  const code = e.responseCode;
  if (typeof code === "number" && code >= 400 && code < 500)
    return { kind: "transient", reason: `SMTP server answered ${code}, nothing accepted: ${what}` };
  if (typeof code === "number" && code >= 500) {
    // 552: over the size the server takes (this message), or the mailbox's quota.
    if (code === 552) return { kind: "permanent", reason: `SMTP server refused the alert's size: ${what}` };
    // At DATA: this message (its content, a filter): final for this alert; the next may pass.
    if (e.command === "DATA") return { kind: "permanent", reason: `SMTP server refused the alert: ${what}` };
    // 530: a sign-in is required (the config has none, or the server wants TLS first).
    if (code === 530) return refusesEveryAlert("SMTP server requires a sign-in (check alerts.email.smtp)");
    // X.7.X: security or policy (relay denied, a sender the account may not use, this client refused).
    if (/^\d{3}[ -]5\.7\.\d{1,3}\b/.test(e.response ?? ""))
      return refusesEveryAlert("SMTP server refused on security or policy (check alerts.email: the account, from, to)");
    // Before the message: the server, the account or the envelope, which every alert shares.
    if (e.command !== undefined && BEFORE_THE_MESSAGE.has(e.command))
      return refusesEveryAlert(`SMTP server refused at ${e.command} (check alerts.email: the server, from, to)`);
    return { kind: "permanent", reason: `SMTP server refused the alert: ${what}` };
  }
  // Addresses refused before any was sent (nodemailer's own check): the config's, every alert's.
  if (e.code === "EENVELOPE") return refusesEveryAlert("addresses refused (check alerts.email.from and to)");
  if (neverSent(error)) return { kind: "transient", reason: `SMTP server not reached, nothing sent: ${what}` };
  if (e.timeoutType === "CONNECT_TIMEOUT" || e.timeoutType === "GREETING_TIMEOUT")
    return { kind: "transient", reason: `no greeting from the SMTP server, nothing sent: ${what}` };
  return { kind: "ambiguous", reason: `no answer from the SMTP server: ${what}` };
}

/**
 * The recipients nodemailer says the server refused (RCPT TO) while it took the message for the
 * others, with the server's reply to each; undefined when it refused none.
 */
function refusedRecipients(info: {
  rejected?: unknown;
  rejectedErrors?: unknown;
}): { addresses: string[]; said: string } | undefined {
  const addresses = Array.isArray(info.rejected) ? info.rejected.map(String) : [];
  if (addresses.length === 0) return undefined;
  const replies = Array.isArray(info.rejectedErrors)
    ? info.rejectedErrors.map((e) => String((e as { response?: unknown }).response ?? "").slice(0, 200))
    : [];
  const said = addresses.map((a, i) => (replies[i] ? `${a} (${replies[i]})` : a)).join(", ");
  return { addresses, said };
}

/** The sinks, as the config names them; a delivery to one is an operation of type `idem.alert.<name>`. */
const SINK_NAMES = ["log", "webhook", "email"] as const;
export type SinkName = (typeof SINK_NAMES)[number];
const typeOf = (sink: SinkName) => `idem.alert.${sink}`;
/** Every sink's action type: the daemon's own, run in the alerts tenant alone. */
export const ALERT_TYPES: readonly string[] = SINK_NAMES.map(typeOf);

/** The sink an operation of this action type delivers to; undefined for an action of another kind. */
export function sinkOf(actionType: string): SinkName | undefined {
  return SINK_NAMES.find((sink) => typeOf(sink) === actionType);
}

/**
 * Whether an operation is one of the daemon's own alert deliveries: in the alerts tenant AND of a
 * sink's action type. The tenant alone is not enough: a config may name an application's tenant
 * as `alerts.tenant` (a typo, or on purpose), whose operations must still be alerted.
 */
export function isAlertDelivery(config: IdemConfig, op: { readonly tenant: string; readonly action: string }): boolean {
  return op.tenant === config.alerts.tenant && sinkOf(op.action) !== undefined;
}

/** What a sink answers for an alert it took. */
export interface Delivered {
  readonly delivered: true;
  readonly detail: string;
}

export interface AlertSink {
  readonly name: SinkName;
  readonly action: Action<Alert, Delivered>;
}

/**
 * The actions the daemon's ledger is opened with (`openLedger`'s `actions`, besides the config's)
 * so that its pass settles alert deliveries like any due operation: one a person retried is
 * pending, and no due alert will run it again. One action per configured sink. A delivery to a
 * sink this config does not have (left out of this replica's config, or removed since) is left
 * to a daemon that has it (`unconfiguredSinks`): failing it here would tell the replica with the
 * sink that the alert was answered for good, and it would never be sent.
 */
export function alertActions(config: IdemConfig, log: Logger): Action<Alert, Delivered>[] {
  return alertSinks(config, log).map((s) => s.action);
}

/** The action types of the sinks the config does not have: their deliveries are not this daemon's to settle. */
export function unconfiguredSinks(sinks: readonly AlertSink[]): { names: SinkName[]; types: string[] } {
  const names = SINK_NAMES.filter((name) => !sinks.some((s) => s.name === name));
  return { names, types: names.map(typeOf) };
}

/** The webhook's URL: written in the config, or read from the environment variable it names (then checked here). */
function webhookUrl(webhook: NonNullable<IdemConfig["alerts"]["webhook"]>): string {
  if (webhook.url !== undefined) return webhook.url;
  const url = secret(webhook.urlEnv!, "alerts.webhook.urlEnv");
  const problem = webhookUrlProblem(url);
  if (problem)
    throw new ConfigError(
      `invalid config: alerts.webhook.urlEnv: the URL in environment variable ${webhook.urlEnv} ${problem}`,
    );
  return url;
}

export function alertSinks(config: IdemConfig, log: Logger): AlertSink[] {
  const sinks: AlertSink[] = [];
  const a = config.alerts;
  if (a.log) {
    sinks.push({
      name: "log",
      action: defineAction({
        type: typeOf("log"),
        // A line written twice harms no one and cannot be looked up: a delivery whose daemon died
        // writing it is written again, not handed to a person (who, logging alone, is told by a line).
        capabilities: { repeatable: true },
        execute: async (alert) => {
          log.warn({ alert }, alertText(alert));
          return { delivered: true as const, detail: "logged" };
        },
      }),
    });
  }
  if (a.webhook) {
    const { format } = a.webhook;
    const url = webhookUrl(a.webhook);
    const authorization =
      a.webhook.authorizationEnv === undefined
        ? {}
        : { authorization: secret(a.webhook.authorizationEnv, "alerts.webhook.authorizationEnv") };
    sinks.push({
      name: "webhook",
      action: defineAction({
        type: typeOf("webhook"),
        capabilities: {},
        execute: async (alert, op) => {
          const body = format === "slack" ? { text: alertText(alert) } : { ...alert, text: alertText(alert) };
          const request = webhookRequest(url, {
            method: "POST",
            headers: { "content-type": "application/json", "idempotency-key": op.key, ...authorization },
            body: JSON.stringify(body),
            // Followed, a 301/302/303 became a GET without the alert, which a page answered 200:
            // counted delivered, never posted; a 307/308 posted it wherever the Location said.
            redirect: "manual",
            signal: AbortSignal.any([op.signal, AbortSignal.timeout(WEBHOOK_DEADLINE_MS)]),
          });
          const res = await fetch(request).catch((error: unknown) => {
            if (!isBlockedPort(error)) throw error;
            throw new WebhookNotSentError(
              `fetch refuses to connect to port ${new URL(url).port} (a port it blocks for every request): nothing sent; give the receiver another port`,
              { cause: error },
            );
          });
          if (!res.ok) throw Object.assign(new Error(`webhook answered ${res.status}`), { status: res.status });
          return { delivered: true as const, detail: `HTTP ${res.status}` };
        },
        classify: classifyDelivery(url),
      }),
    });
  }
  if (a.email) {
    const e = a.email;
    const deadlineMs = e.smtp.deadlineMs ?? ALERT_EMAIL_DEADLINE_MS;
    const auth =
      e.smtp.userEnv && e.smtp.passEnv
        ? {
            auth: {
              user: secret(e.smtp.userEnv, "alerts.email.smtp.userEnv"),
              pass: secret(e.smtp.passEnv, "alerts.email.smtp.passEnv"),
            },
          }
        : {};
    // Read now, so a setting refused (a credential's variable unset, an unreadable caFile) stops
    // the start as before; the transport is made at the first alert sent, with nodemailer as
    // `loadEmailClient` began loading it as the daemon was built (or loaded then): a daemon with
    // no email sink never loads it.
    const smtp = {
      host: e.smtp.host,
      port: e.smtp.port,
      secure: e.smtp.secure ?? false,
      // A password goes only over TLS (STARTTLS when not secure), as @idem/email's default.
      requireTLS: e.smtp.requireTLS ?? ("auth" in auth && !(e.smtp.secure ?? false)),
      // The config's trust (caFile, servername, minVersion) read as the email provider's is.
      ...tlsOf(config, e.smtp.tls, "alerts.email.smtp.tls"),
      ...auth,
      socketTimeout: 30_000,
      // Within the deadline, so a server that never greets is "not reached" (nothing sent), not cut off.
      connectionTimeout: Math.min(30_000, Math.floor(deadlineMs / 3)),
      greetingTimeout: Math.min(30_000, Math.floor(deadlineMs / 3)),
    };
    let transport: Promise<Transporter> | undefined;
    const transportOf = () =>
      (transport ??= loadMailer().then(
        (m) => m.default.createTransport(smtp),
        (error: unknown) => {
          transport = undefined; // tried again with the next alert
          throw error;
        },
      ));
    const domain = e.from.split("@")[1]!;
    sinks.push({
      name: "email",
      action: defineAction({
        type: typeOf("email"),
        capabilities: {},
        execute: async (alert, op) => {
          const mailer = await transportOf();
          const cutOff = deadline(deadlineMs);
          try {
            const info = await mailer.sendMail({
              from: e.from,
              to: e.to,
              subject: `[idem] ${alert.kind}: ${alert.action} ${alert.operationId}`,
              text: alertText(alert),
              messageId: `<alert.${op.key.slice(0, 40)}@${domain}>`,
              signal: AbortSignal.any([op.signal, cutOff.signal]),
            });
            const detail = String(info.response ?? "");
            // Refused for some of `to` and taken for the rest: delivered (sent again, it would
            // reach the others twice), but an address that gets no alerts is said each time, not
            // passed over (the server's last reply, all the receipt kept, was the others' 250).
            const refused = refusedRecipients(info);
            if (refused === undefined) return { delivered: true as const, detail };
            log.warn(
              { sink: "email", operationId: alert.operationId, refused: refused.addresses },
              `alert emailed, but the SMTP server refused it for ${refused.said}: they get no alerts; check alerts.email.to`,
            );
            return { delivered: true as const, detail: `${detail}; refused for ${refused.said}` };
          } finally {
            cutOff.clear();
          }
        },
        classify: classifyEmailDelivery,
      }),
    });
  }
  return sinks;
}

/**
 * One execution per delivery of a tick, whatever it answers: a receiver that answered 500 may
 * have taken the alert, and a retry within the call would send it again, up to the ledger's budget
 * (three copies a tick). The next tick tries again, as it does for a sink that is down; the daemon
 * settles a pending delivery with it too.
 */
export const DELIVERY_BUDGET = { attempts: 1 } as const;

/** What `deliver` did with one alert. */
export interface Delivery {
  /** No sink needs another try: delivered, refused for good, or in a person's hands. */
  readonly done: boolean;
  /**
   * The keys of its deliveries no sink took this tick: down (not tried), not reached, refusing it
   * (a first refusal, not one replayed), failing, or not answering (the delivery in review: it may
   * have been sent, and no sink said so). `idem daemon --once` exits 1 when any did. Keys, not a
   * count: the tick's settling may have met the same delivery (a pending one falls due), and a
   * delivery is counted once a tick.
   */
  readonly missed: readonly string[];
}

/**
 * Delivers one alert to every sink, once each (a replay answers an alert already delivered).
 * `done` when no sink needs another try: delivered, refused for good, or in a person's hands (a
 * delivery that may have been sent is in needs_review, and stays there until someone settles it).
 * `reported`: deliveries already said to be in review, so each is logged once, not on every tick.
 * `down`: the sinks not tried in this tick: held back by their backoff, or that did not take a
 * delivery in it (unreachable, rate limiting, failing, timing out): a dead receiver tried for
 * every alert held the daemon's settling back for as long. A sink that did not take one backs off
 * (sink-backoff.ts), said once, not a line a tick. A delivery is one request a tick
 * (`DELIVERY_BUDGET`). `stop`: the daemon is stopping; nothing more is sent.
 */
export async function deliver(
  ledger: Ledger,
  config: IdemConfig,
  sinks: readonly AlertSink[],
  alert: Alert,
  discriminator: string | number,
  log: Logger,
  onSent: (kind: AlertKind, sink: string) => void,
  reported: Set<string>,
  down: SinksThisTick,
  stop?: AbortSignal,
): Promise<Delivery> {
  let done = true;
  const missed: string[] = [];
  for (const sink of sinks) {
    const key = operationKey({
      tenant: config.alerts.tenant,
      action: sink.action.type,
      parts: ["alert", sink.name, alert.operationId, alert.kind, alert.attempt, discriminator],
    });
    if (down.has(sink.name)) {
      done = false; // tried again once its backoff ends
      missed.push(key.hash);
      continue;
    }
    let out: RunResult<Delivered>;
    try {
      out = await ledger.run(sink.action, {
        tenant: config.alerts.tenant,
        key,
        // A check_refused alert's key stands for every check of the unknown attempt, whose reason
        // may differ from check to check: the alert as first made is the one delivered (given
        // args of another reason would be refused as a different payload under the same key).
        args: alert.kind === "check_refused" ? () => alert : alert,
        actor: "idem-daemon",
        budget: DELIVERY_BUDGET,
        ...(stop && { stop }),
      });
    } catch (error) {
      // The database is gone: the tick ends. Anything else (a bug: this key held other args) must
      // not stop the daemon's settling behind it: said loudly, and tried again next tick.
      if (error instanceof LedgerUnavailableError) throw error;
      done = false;
      missed.push(key.hash);
      log.error(
        { err: error, sink: sink.name, operationId: alert.operationId },
        `alert delivery to ${sink.name} failed`,
      );
      continue;
    }
    if (out.status === "succeeded" && !out.replayed) {
      onSent(alert.kind, sink.name);
      down.took(sink.name);
    }
    if (out.status !== "succeeded") {
      const inReview = out.status === "pending_verification" && out.state === "needs_review";
      // failed: the receiver refused for good; in review: a person decides; otherwise try again later
      if (out.status === "pending_verification" && !inReview) done = false;
      // another replica is delivering this very alert right now: nothing is wrong
      if (out.status === "pending_verification" && out.state === "running") continue;
      if (inReview) {
        if (reported.has(out.operationId)) continue; // an earlier tick's: the sink was not tried now
        reported.add(out.operationId);
      }
      // Not taken, refused now (a refusal replayed was counted by the tick that heard it), or in
      // review: it may have been sent, but no sink said it took it, so a run once exits 1.
      if (!(out.status === "failed" && out.replayed)) missed.push(key.hash);
      const said = {
        fields: { sink: sink.name, operationId: alert.operationId, delivery: out },
        msg: `alert delivery to ${sink.name} did not succeed (${out.status}); see idem show ${out.operationId} --tenant ${config.alerts.tenant}`,
      };
      // Not taken (unreachable, rate limiting, failing): the sink backs off, said once. No answer
      // (in review): not tried again this tick. A refusal (failed) was a quick, final answer for
      // this alert alone.
      if (out.status === "pending_verification" && !inReview) {
        await down.failed(sink.name, said);
        continue;
      }
      if (inReview) down.add(sink.name);
      log.error(said.fields, said.msg);
    }
  }
  return { done, missed };
}
