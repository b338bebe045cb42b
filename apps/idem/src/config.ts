/**
 * The configuration file: `idem.config.ts`, `.js` or `.json` (the first found in the working
 * directory, or `--config`). It names the ledger, the actions the daemon may settle (objects in a
 * .ts/.js file, or built-in providers with credentials taken from the environment), the alert
 * sinks and the thresholds. Validated with zod; an error names the bad field.
 */
import { X509Certificate } from "node:crypto";
import { existsSync, readFileSync } from "node:fs";
import { readFile } from "node:fs/promises";
import { dirname, resolve } from "node:path";
import { pathToFileURL } from "node:url";
import { z } from "zod";
import { IdemError, requireName, type Action, type InvalidValueError } from "@idem/core";
import { readJson } from "./json-text.js";

/** The config file or the command line cannot be used (code `CONFIG`; the command exits 2). */
export class ConfigError extends IdemError {
  constructor(message: string, options?: { cause?: unknown }) {
    super("CONFIG", message, options);
  }
}

/** The name of an environment variable holding a secret; the secret never appears in the file. */
const envName = z.string().regex(/^[A-Z_][A-Z0-9_]*$/, "must be the NAME of an environment variable");
const port = z.number().int().min(0).max(65535);
/**
 * A tenant or an actor, as the ledger takes one (`requireName`): read here, so that a name it
 * would refuse fails the config, naming the field, not every call or tick that uses it.
 */
const ledgerName = z.string().superRefine((value, ctx) => {
  try {
    requireName(value, "name");
  } catch (error) {
    ctx.addIssue({ code: "custom", message: (error as InvalidValueError).reason });
  }
});
/**
 * A tool for `idem mcp`, as the config holds it: an @idem/agents `ToolDefinition` (`defineTool`,
 * `stripeTools(...).charge`), named here by the fields the config checks, so that the CLI's
 * published types need no @idem/agents (an optional peer).
 */
export interface ConfigTool {
  readonly name: string;
  readonly description: string;
  readonly action: Action<any, any, any>;
}
const isTool = (v: unknown): v is ConfigTool =>
  typeof v === "object" &&
  v !== null &&
  typeof (v as ConfigTool).name === "string" &&
  isAction((v as ConfigTool).action);
const isAction = (v: unknown): v is Action =>
  typeof v === "object" &&
  v !== null &&
  typeof (v as Action).type === "string" &&
  typeof (v as Action).execute === "function";

/**
 * What an SMTP or IMAP client of the config (the email provider's, the email alert sink's) trusts
 * of a server's certificate, which is always verified (no option turns that off): `caFile`, a PEM
 * file of the private CA that signed it (or the server's own self-signed certificate), relative to
 * the config file's directory; `servername`, the name the certificate carries when it is not
 * `host`; `minVersion`. Default: Node's public CAs.
 */
const emailTls = z.strictObject(
  {
    caFile: z.string().min(1).optional(),
    servername: z
      .string()
      .regex(/^[A-Za-z0-9.-]+$/, "must be a host name (the name the server's certificate carries)")
      .optional(),
    minVersion: z.enum(["TLSv1.2", "TLSv1.3"]).optional(),
  },
  {
    error: (issue) =>
      issue.code === "unrecognized_keys"
        ? `unknown option ${issue.keys.join(", ")}: the server's certificate is always verified; trust a private CA (or the server's self-signed certificate) with caFile`
        : undefined,
  },
);

/** What an SMTP server's entry holds (the email provider's and the email alert sink's): login names from the environment. */
const smtpFields = {
  host: z.string(),
  port,
  secure: z.boolean().optional(),
  /** Sign in only over TLS (STARTTLS when not `secure`): default true when signing in; false only for a server without TLS (loopback). */
  requireTLS: z.boolean().optional(),
  tls: emailTls.optional(),
  userEnv: envName.optional(),
  passEnv: envName.optional(),
};

/**
 * The most one exchange with a provider may take, whatever it keeps sending, in whole milliseconds
 * and at most 2^31-1 (a timer's limit), as the adapters take their `deadlineMs`: one send or one
 * IMAP session (@idem/email), one request (@idem/stripe, @idem/hubspot).
 */
const deadlineMs = z.number().int().positive().max(2_147_483_647).optional();
/**
 * A time the daemon waits with a timer, whole ms: at most 2^31-1 (about 24.8 days), the longest a
 * Node timer waits. A longer one fires after 1 ms: the daemon ticked without pause.
 */
const timerMs = z.number().int().positive().max(2_147_483_647);
/** `daemon.stopTimeoutMs` and `mcp.stopTimeoutMs` by default: within Kubernetes' default grace of 30 s. */
const STOP_TIMEOUT_MS = 20_000;
/** As `timerMs`, where 0 has a meaning of its own (each option says which: wait for ever, try once, no lag). */
const timerMsOrZero = z.number().int().nonnegative().max(2_147_483_647);

/**
 * A provider's settle window (`settleMs`: how long "not found" proves nothing), whole ms: at most
 * 2^31-1, as the daemon's timers. A longer one is no window anyone means (past 24.8 days), and the
 * wait it asks for (the next check) would overflow a timer.
 */
const settleMs = z
  .number()
  .int()
  .nonnegative()
  .max(2_147_483_647, "must be at most 2147483647 ms (about 24.8 days): a settle window longer than a timer can wait");

/** One of `userEnv` and `passEnv` without the other turned sign-in off without a word. */
const bothOrNeither = [
  (s: { userEnv?: string | undefined; passEnv?: string | undefined }) =>
    (s.userEnv === undefined) === (s.passEnv === undefined),
  { message: "give both userEnv and passEnv (signing in), or neither" },
] as const;

/**
 * An SMTP server (the email provider's and the email alert sink's): `deadlineMs` bounds one send,
 * from the connect to the last reply, whatever the server keeps writing (default: the provider's
 * 10 minutes, @idem/email's SMTP_DEADLINE_MS; an alert's 1 minute, alerts.ts).
 */
const smtpServer = z
  .object({ ...smtpFields, deadlineMs })
  .strict()
  .refine(...bothOrNeither);

/**
 * Why `url` cannot be a webhook's URL, or undefined when it can. Credentials in it are refused:
 * fetch will not make such a request, and a password is named (an environment variable), never
 * written. Never quotes the URL (it may hold a secret).
 */
export function webhookUrlProblem(url: string): string | undefined {
  let parsed: URL;
  try {
    parsed = new URL(url);
  } catch {
    return "must be a URL";
  }
  if (parsed.protocol !== "http:" && parsed.protocol !== "https:") return "must be an http or https URL";
  if (parsed.username !== "" || parsed.password !== "")
    return "must not hold a user name or password (user:password@host), which fetch refuses to send: give the receiver's token in a header (authorizationEnv: the NAME of an environment variable holding the Authorization value, such as `Bearer …` or `Basic …`), and a URL that is itself a secret in urlEnv (the NAME of an environment variable)";
  return undefined;
}

/** An IMAP account (the sender's, a journal's): its login from the environment. */
const imapServer = z
  .object({
    host: z.string(),
    port,
    secure: z.boolean().optional(),
    /** Log in only over TLS (STARTTLS when not `secure`): default true; false only for a server without TLS (loopback). */
    requireTLS: z.boolean().optional(),
    tls: emailTls.optional(),
    userEnv: envName,
    passEnv: envName,
    /** The most one session (a lookup, an APPEND) may take, whatever the server keeps writing: default 2 minutes. */
    deadlineMs,
  })
  .strict();

/** What an MCP call's deadline must be: @idem/agents refuses anything else (a timer's limit). */
const DEADLINE = "must be a whole number of ms from 1 to 2147483647 (about 24.8 days, the longest a timer waits)";

const schema = z
  .object({
    ledger: z.string().min(1).default("sqlite:./idem.db"),
    /**
     * How long an operation this command completes (the daemon settles it, a person resolves it)
     * is kept before `idem prune` may delete it, in whole milliseconds; null keeps it. It must be
     * the applications' own `retentionMs` (openLedger's). Default: the core's, 30 days.
     */
    retentionMs: z.number().int().min(0).max(Number.MAX_SAFE_INTEGER).nullable().optional(),
    /**
     * How a Postgres ledger is migrated (`idem migrate`, whose flags win, and `idem daemon
     * --migrate`), whole ms: `timeoutMs`, the longest one migration statement may go unanswered
     * (default 10 minutes; 0 waits for ever: a big table's rewrite may need more); `lockPatienceMs`,
     * how long the migration keeps trying for the tables' locks while a long transaction holds them
     * (default 60 s; another process's migration is waited for within `timeoutMs`). A SQLite ledger's migration waits for its write
     * lock as any writer does.
     */
    migrations: z
      .object({
        timeoutMs: timerMsOrZero.optional(),
        lockPatienceMs: timerMsOrZero.optional(),
      })
      .strict()
      .default({}),
    actions: z.array(z.custom<Action>(isAction, "must be an action made with defineAction")).default([]),
    /** Tools for agents (`idem mcp`): an action, the model's input, the business identity, what the model reads. */
    tools: z
      .array(z.custom<ConfigTool>(isTool, "must be a tool definition ({ name, description, action, input, key })"))
      .default([]),
    mcp: z
      .object({
        /** The tenant every call of this server acts for (or --tenant, IDEM_TENANT). */
        tenant: ledgerName.optional(),
        /** How long a second call for the same work waits for the first: below an MCP client's usual 60 s timeout. */
        waitMs: z.number().int().min(0).max(50_000).optional(),
        /**
         * The longest a tool call takes to answer, whatever the ledger or the provider does
         * meanwhile (then the model reads "not confirmed"): @idem/agents' `deadlineMs`, default
         * 45 s, below an MCP client's usual 60 s request timeout.
         */
        deadlineMs: z
          .number({ error: DEADLINE })
          .int(DEADLINE)
          .min(1, DEADLINE)
          .max(2_147_483_647, DEADLINE)
          .optional(),
        /**
         * How long a stop (SIGTERM, SIGINT, or the client gone) waits for the calls in flight and the
         * ledger's close before the server exits anyway, as `daemon.stopTimeoutMs`: what is still in
         * flight then is named and left to its lease (exit 1).
         */
        stopTimeoutMs: timerMs.default(STOP_TIMEOUT_MS),
      })
      .strict()
      .default({ stopTimeoutMs: STOP_TIMEOUT_MS }),
    providers: z
      .object({
        stripe: z
          .object({
            apiKeyEnv: envName,
            host: z.string().optional(),
            port: port.optional(),
            protocol: z.enum(["http", "https"]).optional(),
            // As the agents' actions have it: a replay with their key is the same request only
            // under their API version (another may encode or answer it otherwise). Default: the SDK's.
            // Its date is checked to be a calendar date when the actions are made (stripeOf): the
            // check is @idem/stripe's, an optional peer this schema does not load.
            apiVersion: z
              .string()
              .regex(
                /^\d{4}-\d{2}-\d{2}(\.[a-z]+)?(; ?[a-z0-9_]+=v\d+)*$/,
                "must be a Stripe API version, as 2025-03-31.basil or 2024-06-20",
              )
              .optional(),
            /** The most one request (a replay, a Search, a list) may take: default 2 min (@idem/stripe's STRIPE_DEADLINE_MS). */
            deadlineMs,
            // The connected account the agents' adapter config names, if it names one (as their API
            // key): an operation whose account was never recorded (its attempt stopped between the
            // claim and the reference holding the account) is sent by the daemon on this one.
            stripeAccount: z
              .string()
              .regex(
                /^acct_[A-Za-z0-9]{1,250}$/,
                "must be a connected account's Stripe id, acct_ followed by letters and digits",
              )
              .optional(),
            // How long Stripe Search may lag a write, in whole ms: "not found" before then proves
            // nothing. Default the adapter's 90 s; at most 2^31-1 (24 days, far past any lag).
            searchLagMs: timerMsOrZero.optional(),
          })
          .strict()
          .optional(),
        hubspot: z
          .object({
            accessTokenEnv: envName,
            basePath: z.string().url().optional(),
            objectTypes: z.array(z.string()).default(["contacts", "companies", "deals", "tickets", "notes"]),
            // As the agents' actions have them: an operation the daemon runs again is sent as theirs
            // is (a create or an upsert), its key in their property (a lookup reads by the one the
            // operation recorded, this one only for operations that recorded none).
            uniqueProperty: z
              .string()
              .regex(/^[a-z][a-z0-9_]*$/, "must be a HubSpot property's internal name (lowercase letters, digits, _)")
              .optional(),
            mode: z.enum(["upsert", "create"]).optional(),
            // As the agents' actions have it: how long a lookup waits before "not found" proves absence.
            settleMs: settleMs.optional(),
            /** The most one request (a write, a read by the key) may take: default 2 min (@idem/hubspot's HUBSPOT_DEADLINE_MS). */
            deadlineMs,
          })
          .strict()
          .optional(),
        email: z
          .object({
            smtp: smtpServer,
            imap: imapServer,
            from: z.string().email(),
            copy: z.enum(["provider-saves", "journal", "append"]),
            journalAddress: z.string().email().optional(),
            // The account the journal address delivers to, where its copies are searched.
            journalImap: imapServer.optional(),
            // As the agents' config has them: their references record the journal mailbox and the
            // Message-ID, and the daemon's lookups must search the Sent folder theirs file into.
            journalMailbox: z.string().min(1).optional(),
            sentMailbox: z.string().min(1).optional(),
            // The Message-ID's domain is the reference's first token, up to a space (email-actions.ts).
            messageIdDomain: z
              .string()
              .regex(/^[^\s<>]+$/, "must not hold a space or an angle bracket")
              .optional(),
            settleMs: settleMs.positive().optional(),
            // The agents' mailer's action type (emailActions' `type`), when not `email.send`.
            type: z.string().min(1).max(200).optional(),
          })
          .strict()
          .optional(),
      })
      .strict()
      .default({}),
    alerts: z
      .object({
        log: z.boolean().default(true),
        webhook: z
          .object({
            url: z
              .string()
              .superRefine((url, ctx) => {
                const problem = webhookUrlProblem(url);
                if (problem) ctx.addIssue({ code: "custom", message: problem });
              })
              .optional(),
            /** The NAME of an environment variable holding the URL (a Slack webhook's URL is itself a secret). */
            urlEnv: envName.optional(),
            /** The NAME of an environment variable holding the Authorization header's value (`Bearer …`). */
            authorizationEnv: envName.optional(),
            format: z.enum(["json", "slack"]).default("json"),
          })
          .strict()
          .refine((w) => (w.url === undefined) !== (w.urlEnv === undefined), {
            message: "give url or urlEnv (the NAME of an environment variable holding the URL), one of them",
          })
          .optional(),
        email: z
          .object({
            smtp: smtpServer,
            from: z.string().email(),
            to: z.array(z.string().email()).min(1),
          })
          .strict()
          .optional(),
        /** The tenant under which alert deliveries are recorded (once each). */
        tenant: ledgerName.default("idem-alerts"),
      })
      .strict()
      .default({ log: true, tenant: "idem-alerts" }),
    thresholds: z
      .object({
        /** An operation running longer than this in one attempt is reported as stuck. */
        stuckAfterMs: z.number().int().positive().default(300_000),
        /**
         * Per action type, instead of `stuckAfterMs`. A key may name an action only agents run (the
         * daemon reports any running operation stuck), so one that matches none of the config's
         * actions is not refused: the daemon warns of it at start (`unmatchedThresholds`).
         */
        // Keys are action types (the ledger's names): one it could never hold is refused, not matched by no row.
        perAction: z
          .record(z.string(), z.number().int().positive())
          .default({})
          .superRefine((thresholds, ctx) => {
            for (const key of Object.keys(thresholds)) {
              const problem = ledgerName.safeParse(key).error?.issues[0]?.message;
              if (problem) ctx.addIssue({ code: "custom", path: [key], message: `an action type ${problem}` });
            }
          }),
      })
      .strict()
      .default({ stuckAfterMs: 300_000, perAction: {} }),
    daemon: z
      .object({
        intervalMs: timerMs.default(1_000),
        batch: z.number().int().positive().default(100),
        /**
         * How long a claimed row is hidden from other daemons; also the longest a tick settles for.
         * A settlement under way ends by the claim's end: a lookup not answered by then is given up
         * (inconclusive: the operation stays unknown, checked again later), and a request has its
         * signal aborted, then is no longer awaited a second later (unknown: it may have been
         * sent; its answer, if one comes, is recorded then). Give it more than the slowest lookup
         * and request of the config's actions.
         */
        claimMs: timerMs.default(60_000),
        /**
         * Inconclusive lookups before an unknown operation goes to review; also the tries the
         * provider refused for now (a 503) before work known not done does.
         */
        maxChecks: z.number().int().positive().default(20),
        /**
         * Age after which an unknown operation goes to review (from its last execution); also a
         * pending one of an action this config lacks (from its last attempt).
         */
        maxAgeMs: z
          .number()
          .int()
          .positive()
          .default(24 * 3_600_000),
        /** Lease of the daemon's own attempts. */
        leaseMs: timerMs.default(30_000),
        /**
         * How long a stop (SIGTERM, SIGINT) waits for the work in flight before the daemon exits
         * anyway (exit 1), its operations left to their leases: within Kubernetes' default grace
         * of 30 s, though a frozen database answers only at its client's read timeout (35 s).
         */
        stopTimeoutMs: timerMs.default(STOP_TIMEOUT_MS),
        metricsPort: port.optional(),
        metricsHost: z.string().default("127.0.0.1"),
        /** Label `idem_unsettled_operations` by tenant too: one series per tenant, status and action (opt-in: tenants can be many). */
        metricsPerTenant: z.boolean().default(false),
        /** Also serve the operators' console (the `console` section) while the daemon runs. */
        console: z.boolean().default(false),
      })
      .strict()
      .default({
        intervalMs: 1_000,
        batch: 100,
        claimMs: 60_000,
        maxChecks: 20,
        maxAgeMs: 24 * 3_600_000,
        leaseMs: 30_000,
        stopTimeoutMs: STOP_TIMEOUT_MS,
        metricsHost: "127.0.0.1",
        metricsPerTenant: false,
        console: false,
      }),
    /** The operators' web console (`idem console`, or the daemon with `daemon.console`). */
    console: z
      .object({
        port: port.default(9470),
        /** Loopback by default: put it behind your reverse proxy (TLS, SSO) to reach it from elsewhere. */
        host: z.string().default("127.0.0.1"),
        /**
         * Who may sign in, each with the tenants they may see and decide ("*": every tenant). A
         * token (named by `tokenEnv`, never written here) signs in; in `proxyHeader` mode the proxy
         * names the operator and no token is needed.
         */
        operators: z
          .array(
            z
              .object({
                name: ledgerName,
                tokenEnv: envName.optional(),
                tenants: z.union([z.literal("*"), z.array(ledgerName).min(1)]),
              })
              .strict(),
          )
          // A session names its operator: two of one name would share each other's tenants.
          .refine((ops) => new Set(ops.map((o) => o.name)).size === ops.length, {
            message: "operator names must be unique",
          })
          .default([]),
        /** Trust this header (set by an authenticating reverse proxy) to name the operator. */
        proxyHeader: z.string().min(1).optional(),
        /** The addresses the proxy connects from, whose `proxyHeader` is trusted. Default: loopback only. */
        trustedProxies: z.array(z.string().min(1)).default(["127.0.0.1", "::1", "::ffff:127.0.0.1"]),
        /**
         * Host names the console answers to (the name in your proxy's URL), besides its own address
         * and localhost: a request for any other Host is refused, so a page whose name was
         * re-pointed at this address (DNS rebinding) cannot use it.
         */
        allowedHosts: z.array(z.string().min(1)).default([]),
        /** The key that signs sessions (an environment variable); default: a random one per process. */
        sessionSecretEnv: envName.optional(),
        /** No sign-in at all, every tenant, operator "local": only on a loopback address, for local use. */
        insecureNoAuth: z.boolean().default(false),
      })
      .strict()
      .default({
        port: 9470,
        host: "127.0.0.1",
        operators: [],
        trustedProxies: ["127.0.0.1", "::1", "::ffff:127.0.0.1"],
        allowedHosts: [],
        insecureNoAuth: false,
      }),
  })
  .strict();

export type IdemConfig = z.infer<typeof schema> & { readonly source: string };
type EmailTls = z.infer<typeof emailTls>;

const DEFAULT_NAMES = ["idem.config.ts", "idem.config.js", "idem.config.mjs", "idem.config.json"];

/** Loads and validates the configuration; without a file, the defaults (SQLite ledger, no actions). */
export async function loadConfig(path?: string, overrides: { ledger?: string } = {}): Promise<IdemConfig> {
  const file = path ? resolve(path) : DEFAULT_NAMES.map((n) => resolve(n)).find((p) => existsSync(p));
  let raw: unknown = {};
  if (file) {
    if (!existsSync(file)) throw new ConfigError(`config file ${file} does not exist`);
    const tsx = file.endsWith(".ts")
      ? await importOptional(
          "tsx",
          `the TypeScript config ${file}`,
          () => import("tsx/esm/api"),
          "or write the config as .js, .mjs or .json",
        )
      : undefined;
    try {
      if (file.endsWith(".json")) raw = parseJsonFile(await readFile(file, "utf8"));
      else if (tsx)
        raw = ((await tsx.tsImport(pathToFileURL(file).href, import.meta.url)) as { default?: unknown }).default;
      else raw = ((await import(pathToFileURL(file).href)) as { default?: unknown }).default;
    } catch (cause) {
      throw new ConfigError(`cannot read config ${file}: ${(cause as Error).message}`, { cause });
    }
    // A module without a default export is a mistake, not a wish for the defaults (a daemon on
    // ./idem.db, settling nothing, while it looks healthy).
    if (raw === undefined)
      throw new ConfigError(`invalid config ${file}: it has no default export (export default { ledger: … })`);
  }
  // A file's content is checked as it is: one that holds null (a template that rendered nothing)
  // is refused as the object it is not, not read as no file at all (the defaults: ./idem.db).
  return parseConfig(file ? raw : {}, file ?? "(defaults)", overrides);
}

/**
 * A JSON config file's content. Refused without the parser's message (`readJson`): a ledger URL's
 * password or a token may be in the text around the fault.
 */
function parseJsonFile(text: string): unknown {
  const read = readJson(text);
  if (read.ok) return read.value;
  throw new ConfigError(
    `not valid JSON${read.where} (the text there is not repeated: it may hold a secret); check it with a JSON linter`,
  );
}

/** Validates a configuration object (what a config file exports). */
export function parseConfig(raw: unknown, source = "(inline)", overrides: { ledger?: string } = {}): IdemConfig {
  const parsed = schema.safeParse(raw);
  if (!parsed.success) {
    const lines = parsed.error.issues.map((i) => `  ${i.path.length ? i.path.join(".") : "(root)"}: ${i.message}`);
    throw new ConfigError(`invalid config ${source}:\n${lines.join("\n")}`);
  }
  return { ...parsed.data, ...(overrides.ledger && { ledger: overrides.ledger }), source };
}

/**
 * The actions of the config: given ones plus built-in providers, secrets read from the
 * environment. Provider SDKs load only when configured, so `idem ls` starts fast.
 */
export async function actionsOf(config: IdemConfig): Promise<Action<any, any>[]> {
  // A tool's action is settled by the daemon like any other. One action per type is kept, the
  // last given: tools' first, then the providers', and those listed in `actions` last, so that
  // an action listed wins over a tool's or a provider's of its type.
  const out: Action<any, any>[] = config.tools.map((t) => t.action);
  const p = config.providers;
  const stripe = await stripeOf(config);
  if (stripe)
    out.push(stripe.actions.customersCreate, stripe.actions.paymentIntentsCreate, stripe.actions.refundsCreate);
  if (p.hubspot) {
    const { hubspotActions } = await importOptional(
      "@idem/hubspot",
      "providers.hubspot",
      () => import("@idem/hubspot"),
    );
    const h = hubspotActions({
      accessToken: secret(p.hubspot.accessTokenEnv, "providers.hubspot.accessTokenEnv"),
      ...(p.hubspot.basePath && { basePath: p.hubspot.basePath }),
      ...(p.hubspot.uniqueProperty && { uniqueProperty: p.hubspot.uniqueProperty }),
      ...(p.hubspot.mode && { mode: p.hubspot.mode }),
      ...(p.hubspot.settleMs !== undefined && { settleMs: p.hubspot.settleMs }),
      ...(p.hubspot.deadlineMs !== undefined && { deadlineMs: p.hubspot.deadlineMs }),
    });
    for (const t of p.hubspot.objectTypes) out.push(h.create(t));
  }
  if (p.email) {
    const { emailActions } = await importOptional("@idem/email", "providers.email", () => import("@idem/email"));
    const e = p.email;
    const smtpAuth =
      e.smtp.userEnv && e.smtp.passEnv
        ? {
            auth: {
              user: secret(e.smtp.userEnv, "providers.email.smtp.userEnv"),
              pass: secret(e.smtp.passEnv, "providers.email.smtp.passEnv"),
            },
          }
        : {};
    const imapOf = (i: NonNullable<typeof e.journalImap>, at: string) => ({
      host: i.host,
      port: i.port,
      secure: i.secure ?? false,
      ...(i.requireTLS !== undefined && { requireTLS: i.requireTLS }),
      ...(i.deadlineMs !== undefined && { deadlineMs: i.deadlineMs }),
      ...tlsOf(config, i.tls, `${at}.tls`),
      auth: { user: secret(i.userEnv, `${at}.userEnv`), pass: secret(i.passEnv, `${at}.passEnv`) },
    });
    const imap = imapOf(e.imap, "providers.email.imap");
    if (e.copy === "journal" && (!e.journalAddress || !e.journalImap))
      throw new ConfigError(
        "invalid config: providers.email.journalAddress and providers.email.journalImap (the account it delivers to) are required with copy: journal",
      );
    const journalOnly = (["journalAddress", "journalImap", "journalMailbox"] as const).find(
      (k) => e.copy !== "journal" && e[k] !== undefined,
    );
    if (journalOnly)
      throw new ConfigError(
        `invalid config: providers.email.${journalOnly} applies only with copy: journal (copy is ${e.copy}): remove it, or say copy: journal`,
      );
    out.push(
      emailActions({
        smtp: {
          host: e.smtp.host,
          port: e.smtp.port,
          secure: e.smtp.secure ?? false,
          ...(e.smtp.requireTLS !== undefined && { requireTLS: e.smtp.requireTLS }),
          ...(e.smtp.deadlineMs !== undefined && { deadlineMs: e.smtp.deadlineMs }),
          ...tlsOf(config, e.smtp.tls, "providers.email.smtp.tls"),
          ...smtpAuth,
        },
        imap,
        from: e.from,
        copy:
          e.copy === "journal"
            ? {
                mode: "journal",
                address: e.journalAddress!,
                imap: imapOf(e.journalImap!, "providers.email.journalImap"),
                ...(e.journalMailbox && { mailbox: e.journalMailbox }),
              }
            : { mode: e.copy },
        ...(e.sentMailbox && { sentMailbox: e.sentMailbox }),
        ...(e.messageIdDomain && { messageIdDomain: e.messageIdDomain }),
        ...(e.settleMs !== undefined && { settleMs: e.settleMs }),
        ...(e.type && { type: e.type }),
      }).send,
    );
  }
  return lastOfEachType([...out, ...config.actions]);
}

/** One action of each type, the last given of it (the ledger refuses two different actions of one type). */
export function lastOfEachType(actions: readonly Action<any, any>[]): Action<any, any>[] {
  const byType = new Map<string, Action<any, any>>();
  for (const a of actions) {
    byType.delete(a.type);
    byType.set(a.type, a);
  }
  return [...byType.values()];
}

/**
 * The `thresholds.perAction` keys that name none of `known` (the types of the config's actions,
 * `actionsOf`), each with the known type it most likely misspells, if one is near.
 *
 * Why the daemon warns and does not refuse: stuck operations are found across the ledger, of any
 * action type, so a threshold for an action that only agents run (registered in their process,
 * not in the daemon's config: a JSON config cannot even hold custom actions) is used, and such a
 * config is legitimate. What tells it from a typo is not in the config, so the warning names the
 * key, the near known type and the known ones, and the operator decides.
 */
export function unmatchedThresholds(
  config: IdemConfig,
  known: readonly string[],
): { key: string; near: string | undefined }[] {
  return Object.keys(config.thresholds.perAction)
    .filter((key) => !known.includes(key))
    .map((key) => ({ key, near: nearest(key, known) }));
}

/**
 * The one of `types` that `key` most likely misspells: the same but for case, or at most two
 * letters added, dropped or changed (`stripe.paymentIntent.create` for `stripe.paymentIntents.create`).
 */
function nearest(key: string, types: readonly string[]): string | undefined {
  let best: { type: string; distance: number } | undefined;
  for (const type of types) {
    const distance = type.toLowerCase() === key.toLowerCase() ? 0 : editDistance(key, type);
    if (distance <= 2 && (!best || distance < best.distance)) best = { type, distance };
  }
  return best?.type;
}

/** Levenshtein's distance: the fewest letters added, dropped or changed to make `a` into `b`. */
function editDistance(a: string, b: string): number {
  let previous = Array.from({ length: b.length + 1 }, (_, j) => j);
  for (let i = 1; i <= a.length; i++) {
    const row = [i];
    for (let j = 1; j <= b.length; j++)
      row[j] = Math.min(previous[j]! + 1, row[j - 1]! + 1, previous[j - 1]! + (a[i - 1] === b[j - 1] ? 0 : 1));
    previous = row;
  }
  return previous[b.length]!;
}

/** The tools of the config: given ones, and the ready ones of configured providers (Stripe's charge). */
export async function toolsOf(config: IdemConfig): Promise<ConfigTool[]> {
  const stripe = await stripeOf(config);
  return stripe ? [...config.tools, stripe.tools.charge] : [...config.tools];
}

/** The configured Stripe provider's actions and ready tools, if any (the client only holds settings). */
async function stripeOf(config: IdemConfig) {
  const p = config.providers.stripe;
  if (!p) return undefined;
  const { stripeActions, stripeApiVersionProblem, stripeTools } = await importOptional(
    "@idem/stripe",
    "providers.stripe",
    () => import("@idem/stripe"),
  );
  // Well formed (the schema's check) is not enough: 2024-02-30 would be refused by Stripe at the
  // daemon's first replay (the operation left unknown, alerted), rather than at its start.
  const versionProblem = p.apiVersion === undefined ? undefined : stripeApiVersionProblem(p.apiVersion);
  if (versionProblem)
    throw new ConfigError(`invalid config ${config.source}:\n  providers.stripe.apiVersion: ${versionProblem}`);
  const actions = stripeActions({
    apiKey: secret(p.apiKeyEnv, "providers.stripe.apiKeyEnv"),
    ...(p.host !== undefined && { host: p.host }),
    ...(p.port !== undefined && { port: p.port }),
    ...(p.protocol !== undefined && { protocol: p.protocol }),
    ...(p.apiVersion !== undefined && { apiVersion: p.apiVersion }),
    ...(p.deadlineMs !== undefined && { deadlineMs: p.deadlineMs }),
    ...(p.searchLagMs !== undefined && { searchLagMs: p.searchLagMs }),
    ...(p.stripeAccount !== undefined && { stripeAccount: p.stripeAccount }),
  });
  return { actions, tools: stripeTools(actions) };
}

/**
 * Loads a package the CLI needs only for some configs: the providers, the MCP server's packages and
 * tsx (for a .ts config) are optional peer dependencies, so a Stripe-only operator does not install
 * HubSpot's client. A missing one is a ConfigError naming the package to install and the setting
 * that needs it; a package that is there but fails to load keeps its own error.
 */
export async function importOptional<M>(
  name: string,
  neededBy: string,
  load: () => Promise<M>,
  orElse?: string,
): Promise<M> {
  try {
    return await load();
  } catch (cause) {
    const missing =
      (cause as { code?: unknown }).code === "ERR_MODULE_NOT_FOUND" &&
      String((cause as Error).message).includes(`'${name}'`);
    if (!missing) throw cause;
    throw new ConfigError(
      `${neededBy} needs the ${name} package, which is not installed: npm install ${name}${orElse ? `, ${orElse}` : ""}`,
      { cause },
    );
  }
}

/**
 * A server's `tls` trust as its client takes it (@idem/email's `TlsTrust`, nodemailer's and
 * imapflow's `tls`): the CA file's certificates, the name and the lowest version, never another
 * option (verification stays on); `{}` when the config gives none. `at` names the field in errors.
 */
export function tlsOf(
  config: IdemConfig,
  t: EmailTls | undefined,
  at: string,
): { tls?: { ca?: string; servername?: string; minVersion?: NonNullable<EmailTls["minVersion"]> } } {
  if (!t) return {};
  return {
    tls: {
      ...(t.caFile !== undefined && { ca: caFile(config.source, t.caFile, `${at}.caFile`) }),
      ...(t.servername !== undefined && { servername: t.servername }),
      ...(t.minVersion !== undefined && { minVersion: t.minVersion }),
    },
  };
}

/**
 * The PEM certificates in `file` (a CA's, for an email server's TLS), relative to the config
 * file's directory (the working directory for a config given inline); a ConfigError naming
 * `field` when it cannot be read or holds no certificate.
 */
function caFile(source: string, file: string, field: string): string {
  const path = resolve(existsSync(source) ? dirname(source) : process.cwd(), file);
  let pem: string;
  try {
    pem = readFileSync(path, "utf8");
  } catch (cause) {
    throw new ConfigError(`invalid config: ${field}: cannot read ${path}: ${(cause as Error).message}`, { cause });
  }
  const blocks = pem.match(/-----BEGIN CERTIFICATE-----[\s\S]*?-----END CERTIFICATE-----/g);
  if (!blocks)
    throw new ConfigError(`invalid config: ${field}: ${path} holds no PEM certificate (-----BEGIN CERTIFICATE-----)`);
  for (const block of blocks) {
    try {
      new X509Certificate(block);
    } catch (cause) {
      throw new ConfigError(
        `invalid config: ${field}: ${path} holds a certificate that cannot be read (${(cause as Error).message})`,
        { cause },
      );
    }
  }
  return pem;
}

export function secret(name: string, field: string): string {
  const v = process.env[name];
  if (!v) throw new ConfigError(`invalid config: ${field}: environment variable ${name} is not set`);
  return v;
}
