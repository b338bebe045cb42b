/**
 * The `idem` command. Human output by default, `--json` for scripts. Exit codes: 0 done,
 * 1 failure (the ledger's database unreachable included), 2 bad usage or configuration, 3 no such
 * operation (for this tenant), 4 the operation is not in a status that allows it (asking again
 * will not help), 5 `idem prune` stopped at its `--max` with more possibly left (run it again),
 * 6 `idem retry --now` ran the operation and it did not succeed, 7 a decision's operation changed
 * since it was shown (show it again and decide on what it is now).
 */
import { readFileSync } from "node:fs";
import { hostname } from "node:os";
import { Command, CommanderError, InvalidArgumentError, Option } from "commander";
import pRetry from "p-retry";
import type { Logger } from "pino";
import {
  ChangedSinceSeenError,
  IdemError,
  LedgerConfigError,
  InvalidTransitionError,
  NewerLedgerError,
  InvalidValueError,
  MigrationWaitError,
  OperationNotFoundError,
  STATUSES,
  UnknownActionError,
  openLedger,
  redactUrl,
  requireName,
  type Action,
  type Closed,
  type Ledger,
  type LedgerOptions,
  type OperationRef,
  type RunResult,
  type Seen,
  type Status,
} from "@idem/core";
import { ConfigError, actionsOf, lastOfEachType, loadConfig, unmatchedThresholds, type IdemConfig } from "./config.js";
import type { DaemonMetrics } from "./metrics.js";
import { exitFlushed, hearStopSignals, stopped } from "./stop-signals.js";
import { operationVersion, printOperation, printOperations, printStats } from "./output.js";
import { parseReceipt } from "./receipt.js";
import { readDuration } from "./durations.js";
import {
  closeLeftFailure,
  closeWithin,
  heldBy,
  inFlightSummary,
  named,
  sayLeftInFlight,
  sayUnawaited,
  type StopBound,
} from "./close-report.js";
// What only some commands use is imported by them as they run (`await import`): the logger
// (pino), the daemon, its metrics (prom-client), the alert sinks (nodemailer), the console (hono)
// and the MCP server. Loaded for every command, they added about 0.2 s to each start of ls, show
// or --help, which scripts and cron jobs run often.

/**
 * How long a `--once` pass's process may stay open once its command ended (its ledger closed, or
 * never opened): nothing is left to do but print its result, yet a request whose late answer the
 * close gave up on (its provider client's socket, a promise of its own), or a client the config
 * made as it loaded, holds the event loop until it lets go, and a cron job would hang that long.
 * Past it the process exits, its code the pass's own.
 */
const ONCE_EXIT_MS = 2_000;

const EXIT = { ok: 0, failure: 1, usage: 2, notFound: 3, refused: 4, more: 5, notDone: 6, changed: 7 } as const;

/** The exit code a program's command chose when it did its work but not all of it (printed already); else 0. */
const finishedWith = new WeakMap<Command, number>();

interface Globals {
  config?: string;
  ledger?: string;
  json?: boolean;
}

/**
 * Opens the config's ledger for one command. Only `idem migrate` (and `idem daemon --migrate`)
 * may create or migrate a ledger: for the others a path with no ledger (a typo) or a ledger that
 * needs migrations is refused, so an operator's command never writes a schema by accident.
 */
async function withLedger<T>(
  globals: Globals,
  /** `configured`: the config's own actions (`actionsOf`), when opened with `actions`; else none. */
  fn: (ledger: Ledger, config: IdemConfig, configured: readonly Action<any, any>[]) => Promise<T>,
  options: {
    /** Open the ledger with the config's actions (to settle stored operations), and these besides. */
    actions?: boolean | { also: (config: IdemConfig) => Promise<readonly Action<any, any>[]> };
    /**
     * With `actions`: when the config's actions cannot be built (a provider's credentials not in
     * this environment: a `ConfigError`), this hears why and the ledger opens without them, rather
     * than the command failing. For a command that performs no action (the console).
     */
    withoutActions?: (error: ConfigError) => void;
    schema?: "require" | "create" | "migrate";
    /** How a migration waits (`idem migrate`'s flags), over the config's `migrations`. */
    migrations?: IdemConfig["migrations"];
    onResult?: LedgerOptions["onResult"];
    /**
     * Wait for an unreachable database (the daemon), saying so here, until `signal` aborts;
     * `unreachable` hears of each try that failed.
     */
    waitForDatabase?: { log: Logger; signal: AbortSignal; unreachable?: (error: Error) => void };
    /** Runs with the config before the ledger is opened (the daemon serves /healthz meanwhile). */
    beforeOpen?: (config: IdemConfig) => Promise<void>;
    /** Closes the ledger once `fn` ended (the daemon's, within its stop's bound); else `ledger.close()`. */
    close?: (ledger: Ledger) => Promise<void>;
  } = {},
): Promise<T> {
  const config = await loadConfig(globals.config, globals.ledger ? { ledger: globals.ledger } : {});
  await options.beforeOpen?.(config);
  const schema = options.schema ?? "require";
  // Built once, not per try. One action per type, the last given.
  const configured = options.actions
    ? await actionsOf(config).catch((error: unknown) => {
        if (!(error instanceof ConfigError) || !options.withoutActions) throw error;
        options.withoutActions(error);
        return [];
      })
    : [];
  const actions = options.actions
    ? lastOfEachType([...configured, ...(options.actions === true ? [] : await options.actions.also(config))])
    : undefined;
  // The schema check is part of the open: a database that goes away between the two (a restart, a
  // failover) is waited for as one that went away during the open, not a failure (exit 1).
  const open = async () => {
    const ledger = await openLedger(config.ledger, {
      migrate: schema === "migrate",
      create: schema !== "require",
      leaseMs: config.daemon.leaseMs,
      ...migrationOptions({ ...config.migrations, ...options.migrations }),
      // What this command completes (settled, resolved) is kept as long as the applications keep theirs.
      ...(config.retentionMs !== undefined && { retentionMs: config.retentionMs }),
      ...(actions && { actions }),
      ...(options.onResult && { onResult: options.onResult }),
    }).catch((error: unknown) => {
      // The operator of this command upgrades it, not the library inside it.
      if (!(error instanceof NewerLedgerError)) throw inOperatorsTerms(error, options.migrations !== undefined);
      throw new ConfigError(
        `this ledger was migrated by a newer idem (${error.migrations.join(", ")}) than this idem command (@idem/cli ${version()}): upgrade @idem/cli to use it`,
        { cause: error },
      );
    });
    try {
      const pending = schema === "require" ? await ledger.admin.pendingMigrations() : [];
      if (pending.length)
        throw new ConfigError(
          `the ledger ${redactUrl(config.ledger)} needs migrations ${pending.join(", ")}: run \`idem migrate\` first`,
        );
    } catch (error) {
      await ledger.close().catch(() => {}); // the check's failure is what the caller must hear
      throw error;
    }
    return ledger;
  };
  const ledger = options.waitForDatabase ? await openWaiting(open, options.waitForDatabase) : await open();
  try {
    return await fn(ledger, config, configured);
  } finally {
    await (options.close ? options.close(ledger) : ledger.close());
  }
}

/**
 * A migration that gave up waiting, naming what this command's user sets (the config's
 * `migrations`, and `idem migrate`'s flag when `flags`) rather than `openLedger`'s option, which
 * they never see. Any other error as it is.
 */
function inOperatorsTerms(error: unknown, flags: boolean): unknown {
  if (!(error instanceof MigrationWaitError)) return error;
  const [flag, key] =
    error.waitedFor === "locks"
      ? ["--lock-patience", "migrations.lockPatienceMs"]
      : ["--timeout", "migrations.timeoutMs"];
  const setting = flags ? `${flag} of idem migrate, or ${key} in the config` : `${key} in the config`;
  return new MigrationWaitError(error.waitedFor, error.limitMs, { cause: error, setting });
}

/** The config's `migrations` (or `idem migrate`'s flags) as `openLedger` takes them. */
function migrationOptions(
  m: IdemConfig["migrations"],
): Pick<LedgerOptions, "migrationTimeoutMs" | "migrationLockPatienceMs"> {
  return {
    ...(m.timeoutMs !== undefined && { migrationTimeoutMs: m.timeoutMs }),
    ...(m.lockPatienceMs !== undefined && { migrationLockPatienceMs: m.lockPatienceMs }),
  };
}

/**
 * Opens the ledger, waiting while its database does not answer (a restart, a failover, a
 * database started after the daemon), with backoff and jitter so replicas do not knock in step.
 * It says so once; anything else (a wrong password, no such database) fails at once.
 */
async function openWaiting(
  open: () => Promise<Ledger>,
  { log, signal, unreachable: heard }: { log: Logger; signal: AbortSignal; unreachable?: (error: Error) => void },
): Promise<Ledger> {
  let said = false;
  let opened: Ledger | undefined;
  const tryOpen = async () => {
    opened = await open();
    return opened;
  };
  // A stop that comes as the open succeeds (p-retry checks the signal after it) closes what was opened.
  const ledger = await pRetry(tryOpen, {
    retries: Number.POSITIVE_INFINITY,
    minTimeout: 500,
    maxTimeout: 15_000,
    randomize: true,
    signal,
    shouldRetry: ({ error }) => unreachable(error),
    onFailedAttempt: ({ error }) => {
      if (!unreachable(error)) return;
      heard?.(error);
      if (said) return;
      said = true;
      log.error({ err: error }, "the ledger database is unreachable; waiting for it");
    },
  }).catch(async (error: unknown) => {
    await opened?.close();
    throw error;
  });
  if (said) log.info("the ledger database is reachable");
  return ledger;
}

const unreachable = (e: unknown) => e instanceof LedgerConfigError && e.unreachable;

/*
 * Flag values are parsed by commander as it reads the command line, so a bad one is a usage error
 * (exit 2, naming the flag) before any config is loaded or ledger opened.
 */
const LIMIT_MAX = 10_000;
/** A count for `--limit`: a whole number from 1 to LIMIT_MAX. */
function count(v: string): number {
  const n = /^\d+$/.test(v) ? Number(v) : NaN;
  if (!(n >= 1 && n <= LIMIT_MAX)) throw new InvalidArgumentError(`Expected a whole number from 1 to ${LIMIT_MAX}.`);
  return n;
}
/** A bound for `--max`: a whole number, 1 or more. */
function atLeastOne(v: string): number {
  const n = /^\d+$/.test(v) ? Number(v) : Number.NaN;
  if (!(n >= 1 && Number.isSafeInteger(n))) throw new InvalidArgumentError("Expected a whole number, 1 or more.");
  return n;
}
/** A duration in whole milliseconds (`readDuration`: 1M, a month or a minute, is refused). */
function duration(v: string): number {
  const read = readDuration(v);
  if ("problem" in read)
    throw new InvalidArgumentError(
      read.kind === "unreadable"
        ? "Expected a duration: milliseconds, or 90s, 10m, 2h, 30d."
        : `${read.problem.charAt(0).toUpperCase()}${read.problem.slice(1)}.`,
    );
  return read.ms;
}
/** A duration a timer can wait (`duration`), at most 2^31-1 ms (about 24.8 days). */
function timerDuration(v: string): number {
  const n = duration(v);
  if (n > 2_147_483_647)
    throw new InvalidArgumentError("Expected at most 2147483647 ms (about 24.8 days), such as 2h.");
  return n;
}
/**
 * A value that must be given, for `--ledger` and `--config`: an empty one (a script's unset
 * variable, `--ledger "$LEDGER_URL"`) read as absent, so the command acted on another ledger than
 * the script named: the config's, or `./idem.db`, which `idem migrate` created and migrated.
 */
function given(expected: string): (v: string) => string {
  return (v) => {
    if (v.trim() === "")
      throw new InvalidArgumentError(`Expected ${expected}, not an empty value (an unset variable?).`);
    return v;
  };
}
/** A TCP port for `--port`: 0 to 65535. */
function portNumber(v: string): number {
  const n = /^\d+$/.test(v) ? Number(v) : Number.NaN;
  if (!(n >= 0 && n <= 65535)) throw new InvalidArgumentError("Expected a port number from 0 to 65535.");
  return n;
}
/** Commander's error text ("error: …\n") as the rest of idem says it. */
const usageMessage = (str: string) => str.trimEnd().replace(/^error: /, "");
const actorOf = (given?: string) => given ?? `${process.env.USER ?? "operator"}@${hostname()}`;
/** `<status>.<attempt>.<checks>.<updatedAt>`, as `idem show` prints it (`operationVersion`). */
const VERSION = /^([a-z_]+)\.(\d+)\.(\d+)\.(\d+)$/;
/** A version as `idem show` prints it, for `--seen`: the operation as the person saw it. */
function seenVersion(v: string): Seen {
  const [, status, attempt, checks, updatedAt] = VERSION.exec(v) ?? [];
  const numbers = [attempt, checks, updatedAt].map(Number);
  if (!STATUSES.includes(status as Status) || !numbers.every(Number.isSafeInteger))
    throw new InvalidArgumentError(
      "Expected a version as idem show prints it: <status>.<attempt>.<checks>.<updatedAt>, such as needs_review.2.0.1767225600000.",
    );
  return { status: status as Status, attempt: numbers[0]!, checks: numbers[1]!, updatedAt: numbers[2]! };
}
const seenOption = () =>
  new Option(
    "--seen <version>",
    "the version of the operation you checked, as idem show printed it (required): refused (exit 7) if the operation changed in any way since",
  ).argParser(seenVersion);
/** `--attempt`, which `--seen` replaced: still read, only to say so (hidden from the help). */
const retiredAttemptOption = () => new Option("-a, --attempt <n>").hideHelp();
const decisionHelp = `
Decide on what you were shown: \`idem show <id> --tenant <tenant>\` prints the operation's version
(<status>.<attempt>.<checks>.<updatedAt>); give it as --seen. If the operation changed since (a late
answer that it may have been done, a check, another person's decision), nothing is decided (exit 7):
show it again and decide on what you see now.`;

/**
 * Every decision names the version of the operation it was taken on (`idem show` prints it), not
 * only its attempt: a late answer that the effect may have happened (a timeout after the request
 * was sent) or a check changes the operation without a new attempt, and a retry decided before it
 * would send the effect a second time. Without a version, the decision would apply to whatever
 * the operation is when the command runs. Checked before the ledger is opened.
 */
function requireSeen(o: { seen?: Seen; attempt?: string }, ref: OperationRef, what: string): Seen {
  const show = `\`idem show ${ref.id} --tenant ${ref.tenant}\``;
  if (o.attempt !== undefined)
    throw new InvalidValueError(
      "attempt",
      `--attempt is replaced by --seen <version>, the version ${show} prints: an attempt number cannot tell the view you checked from a later one at the same attempt (a late answer that it may have been done, a check), and a decision on that later one could do the effect twice`,
    );
  if (o.seen !== undefined) return o.seen;
  throw new InvalidValueError(
    "seen",
    `${what} needs --seen <version>, the version you checked, as ${show} prints it: without it the decision would apply to whatever the operation is now, which may be a later attempt or a late answer nobody checked (and may have been sent)`,
  );
}

/** A decision refused because the operation changed since the person was shown it (exit 7). */
class ChangedSinceShownError extends IdemError {
  override readonly name = "ChangedSinceShownError";
  constructor(ref: OperationRef, error: ChangedSinceSeenError) {
    super(
      "CHANGED_SINCE_SEEN",
      `operation ${ref.id} changed since it was shown (version ${operationVersion(error.seen)}): it is now ${error.now.status} at attempt ${error.now.attempt} (version ${operationVersion(error.now)}); nothing was decided. Show it again (idem show ${ref.id} --tenant ${ref.tenant}) and decide on what you see now`,
      { cause: error },
    );
  }
}

/**
 * Runs a person's decision bound to the operation as they were shown it (`seen`, which `decide`
 * passes to the ledger: it refuses a decision on another version, in the same transaction, as
 * `ChangedSinceSeenError`, apart from a status that does not allow it). A stale view is said with
 * the command to show it again; a version that the operation cannot have had, as mistyped.
 */
async function onTheVersionShown(ledger: Ledger, ref: OperationRef, seen: Seen, decide: () => Promise<unknown>) {
  try {
    await decide();
  } catch (error) {
    if (!(error instanceof ChangedSinceSeenError)) throw error;
    const now = error.now;
    // A version moves forward (its attempt, its time) from when the row was made: one ahead of the
    // row's, or older than the row, was most likely mistyped, and "changed since" would mislead.
    const older = seen.updatedAt < (await ledger.get(ref)).operation.createdAt;
    if (seen.updatedAt > now.updatedAt || seen.attempt > now.attempt || older)
      throw new InvalidValueError(
        "seen",
        `${operationVersion(seen)} is ${older ? `older than operation ${ref.id} itself` : `ahead of operation ${ref.id}'s version`} (it is now ${operationVersion(now)}): a mistyped version? Nothing was decided. Give the version idem show ${ref.id} --tenant ${ref.tenant} prints`,
      );
    throw new ChangedSinceShownError(ref, error);
  }
}

/**
 * `idem retry --now` recorded the retry, then running it failed: the operation is not where the
 * command left it (exit 1, not 2: the retry stands and the run may have done its effect).
 */
class RunAfterRetryError extends Error {
  override readonly name = "RETRIED_RUN_FAILED";
}

/**
 * Deletes a tenant's operations past retention a batch at a time, each batch one statement (its
 * own transaction, as `admin.prune` does it), so no lock is held for the whole backlog, until a
 * batch deletes none or `max` are deleted. It goes on to an empty batch rather than stopping at a
 * short one: on Postgres a batch deletes fewer than it found when rows changed meanwhile (they are
 * checked again), which does not mean none are left. `more`: it stopped at `max`, so some may be
 * left (or none, when exactly `max` were due: nothing cheaper tells without deleting).
 * `progress` hears the total after each batch, so a failure can say what was done before it.
 */
async function pruneExpired(
  ledger: Ledger,
  o: { tenant: string; batch: number; max?: number },
  progress: (pruned: number) => void,
): Promise<{ pruned: number; more: boolean }> {
  const max = o.max ?? Number.POSITIVE_INFINITY;
  let pruned = 0;
  while (pruned < max) {
    const n = await ledger.admin.prune({ tenant: o.tenant, limit: Math.min(o.batch, max - pruned) });
    if (n === 0) return { pruned, more: false };
    pruned += n;
    progress(pruned);
  }
  return { pruned, more: true };
}

/** This package's version, read from its manifest (one level above src/ and dist/). */
function version(): string {
  return (JSON.parse(readFileSync(new URL("../package.json", import.meta.url), "utf8")) as { version: string }).version;
}

export function program(): Command {
  const cmd = new Command("idem")
    .description("Side effects of AI agents, exactly once: the ledger's operators' tool and reconcile daemon")
    .addOption(
      new Option(
        "-c, --config <path>",
        "config file (default: idem.config.ts|js|json in the working directory)",
      ).argParser(given("a path to the config file")),
    )
    .addOption(
      new Option("--ledger <url>", "ledger URL, overriding the config (sqlite:PATH or postgres://…)").argParser(
        given("a ledger URL: sqlite:PATH or postgres://…"),
      ),
    )
    .option("--json", "machine-readable output")
    .version(version(), "-V, --version")
    .exitOverride()
    // Usage errors (set before the subcommands, which inherit it): printed once, here, like the other
    // errors: `idem: …` on stderr, or with --json one JSON line. main() maps them to exit 2.
    .configureOutput({
      outputError: (str, write) =>
        write(
          g().json === true
            ? `${JSON.stringify({ error: "USAGE", message: usageMessage(str) })}\n`
            : `idem: ${usageMessage(str)}\n`,
        ),
    });
  const g = () => cmd.opts<Globals>();
  const tenant = () =>
    new Option("-t, --tenant <tenant>", "the tenant whose operations to act on")
      .env("IDEM_TENANT")
      .makeOptionMandatory();

  cmd
    .command("ls")
    .description(
      "list operations, newest first, each with its version (what a decision names: --seen): one tenant's, or with --all-tenants an operator's queue",
    )
    .addOption(new Option("-t, --tenant <tenant>", "the tenant whose operations to list").env("IDEM_TENANT"))
    .option("--all-tenants", "every tenant's operations (with --status needs_review: what waits for a person)")
    .addOption(new Option("-s, --status <status...>", "only these statuses").choices([...STATUSES]))
    .option("-a, --action <type>", "only this action type")
    .addOption(
      new Option(
        "--older-than <duration>",
        "only operations created at least this long ago (milliseconds, or 90s, 10m, 2h, 30d; not 1M: say 1m or 30d)",
      ).argParser(duration),
    )
    .addOption(new Option("-n, --limit <n>", `at most this many, 1 to ${LIMIT_MAX}`).argParser(count).default(50))
    .option("--before <id>", "the page after this operation id (the last one of the previous page)")
    .action(
      async (
        o: {
          tenant?: string;
          allTenants?: boolean;
          status?: Status[];
          action?: string;
          olderThan?: number;
          limit: number;
          before?: string;
        },
        ls: Command,
      ) => {
        // IDEM_TENANT in the environment does not fight --all-tenants; a tenant on the command line does.
        const given = o.tenant !== undefined && ls.getOptionValueSource("tenant") === "cli";
        if (o.allTenants && given) throw new InvalidValueError("ls", "give --tenant or --all-tenants, not both");
        if (!o.allTenants && o.tenant === undefined)
          throw new InvalidValueError(
            "ls",
            "say whose operations: --tenant <tenant> (or IDEM_TENANT), or --all-tenants",
          );
        await withLedger(g(), async (ledger) => {
          const ops = await ledger.admin.list({
            ...(o.allTenants ? { allTenants: true as const } : { tenant: o.tenant! }),
            limit: o.limit,
            ...(o.status && { status: o.status }),
            ...(o.action && { action: o.action }),
            ...(o.olderThan !== undefined && { olderThanMs: o.olderThan }),
            ...(o.before !== undefined && { before: o.before }),
          });
          printOperations(ops, g().json === true, { tenants: o.allTenants === true, limit: o.limit });
        });
      },
    );

  cmd
    .command("show <id>")
    .description(
      "one operation with its args (redacted), receipt, verdict, audit events and version (what a decision names: --seen)",
    )
    .addOption(tenant())
    .action(async (id: string, o: { tenant: string }) => {
      await withLedger(g(), async (ledger) =>
        printOperation(await ledger.get({ tenant: o.tenant, id }), g().json === true),
      );
    });

  cmd
    .command("resolve <id>")
    .description("a person's verdict on a needs_review operation, on the version idem show printed (--seen)")
    .addOption(tenant())
    .option("--succeeded", "the effect happened")
    .option(
      "--failed",
      "the effect did not happen and must not be retried (refused on an operation whose effect is known to have happened: idem show says so)",
    )
    .requiredOption("-r, --reason <text>", "why (recorded in the audit trail)")
    .option(
      "-e, --evidence <text>",
      'what you checked: the provider\'s id or link, "found in Sent" (kept with your verdict)',
    )
    .option(
      "--receipt <json>",
      "with --succeeded: the receipt you found, checked by the action's receipt schema (needs the config's actions)",
    )
    .addOption(seenOption())
    .addOption(retiredAttemptOption())
    .option("--actor <name>", "who decides (default: $USER@host)")
    .addHelpText("after", decisionHelp)
    .action(
      async (
        id: string,
        o: {
          tenant: string;
          succeeded?: boolean;
          failed?: boolean;
          reason: string;
          evidence?: string;
          receipt?: string;
          seen?: Seen;
          attempt?: string;
          actor?: string;
        },
      ) => {
        if (o.succeeded === o.failed)
          throw new InvalidValueError("resolve", "say exactly one of --succeeded or --failed");
        if (o.failed && o.receipt !== undefined)
          throw new InvalidValueError("resolve", "--receipt goes with --succeeded");
        // Read as the console reads it (receipt.ts); the ledger checks it against the action's schema.
        const receipt = o.receipt === undefined ? undefined : parseReceipt(o.receipt);
        const ref = { tenant: o.tenant, id };
        const seen = requireSeen(o, ref, "resolve");
        await withLedger(
          g(),
          async (ledger) => {
            const common = {
              ...ref,
              reason: o.reason,
              actor: actorOf(o.actor),
              ...(o.evidence !== undefined && { evidence: o.evidence }),
              seen,
            };
            await onTheVersionShown(ledger, ref, seen, () =>
              ledger.admin.resolve(
                o.succeeded
                  ? { ...common, outcome: "succeeded", ...(receipt !== undefined && { receipt }) }
                  : { ...common, outcome: "failed" },
              ),
            );
            printOperation(await ledger.get(ref), g().json === true);
          },
          { actions: o.receipt !== undefined },
        );
      },
    );

  cmd
    .command("retry <id>")
    .description(
      "mark a needs_review, unknown or failed operation as not done, to be run again with the same key, on the version idem show printed (--seen); one whose last run may have done it (unknown, or needs_review after it) is looked up first where its action can be, and settles as succeeded if found (a request may land after you looked); refused on one whose effect is known to have happened (idem show says so: resolve it --succeeded)",
    )
    .addOption(tenant())
    .requiredOption("-r, --reason <text>", "why it is known not done")
    .option(
      "-e, --evidence <text>",
      "what you checked: the provider's log searched, a dashboard link (kept in the retry's audit event)",
    )
    .addOption(seenOption())
    .addOption(retiredAttemptOption())
    .option("--actor <name>", "who decides (default: $USER@host)")
    .option("--now", "settle it right away with the configured actions instead of leaving it to the daemon")
    .addHelpText("after", decisionHelp)
    .action(
      async (
        id: string,
        o: {
          tenant: string;
          reason: string;
          evidence?: string;
          seen?: Seen;
          attempt?: string;
          actor?: string;
          now?: boolean;
        },
      ) => {
        const ref = { tenant: o.tenant, id };
        const seen = requireSeen(o, ref, "retry");
        await withLedger(
          g(),
          async (ledger) => {
            await onTheVersionShown(ledger, ref, seen, () =>
              ledger.admin.retry({
                ...ref,
                reason: o.reason,
                actor: actorOf(o.actor),
                ...(o.evidence !== undefined && { evidence: o.evidence }),
                seen,
              }),
            );
            const ran = o.now ? await runRetried(ledger, ref, actorOf(o.actor), g().json === true) : undefined;
            printOperation(await ledger.get(ref), g().json === true);
            // The run answered, but not done (declined, a person must decide, the outcome unknown
            // again): a script must not read that as exit 0. What it ended as is printed above.
            if (ran !== undefined && ran !== "succeeded") finishedWith.set(cmd, EXIT.notDone);
          },
          {
            // An alert delivery is settled with its sink, as the daemon would (the log sink's line on stderr).
            actions: o.now === true && {
              also: async (config) => {
                if (o.tenant !== config.alerts.tenant) return [];
                const [{ alertActions }, { pino }] = await Promise.all([import("./alerts.js"), import("pino")]);
                return alertActions(config, pino(pino.destination(2)));
              },
            },
          },
        );
      },
    );

  cmd
    .command("prune")
    .description(
      "delete the tenant's completed operations past their retention, all of them (a batch per statement) or up to --max",
    )
    .addOption(tenant())
    .addOption(
      new Option(
        "--max <n>",
        "delete at most this many in this run: when it stops there, more may remain (exit 5, `more: true`)",
      ).argParser(atLeastOne),
    )
    .addOption(
      new Option(
        "--batch <n>",
        `how many one statement deletes, 1 to ${LIMIT_MAX} (each its own transaction: smaller holds its locks for less)`,
      )
        .argParser(count)
        .default(LIMIT_MAX),
    )
    .action(async (o: { tenant: string; batch: number; max?: number }) => {
      const say = (pruned: number, more: boolean, why: string) =>
        console.log(
          g().json ? JSON.stringify({ pruned, more }) : `pruned ${pruned} operations${more ? `; ${why}` : ""}`,
        );
      await withLedger(g(), async (ledger) => {
        let done = 0;
        const { pruned, more } = await pruneExpired(ledger, o, (n) => (done = n)).catch((error: unknown) => {
          // The batches before the failure are deleted: say how many (main() says the error, exit 1).
          if (done > 0) say(done, true, "then it failed: more may remain");
          throw error;
        });
        say(pruned, more, `stopped at --max ${o.max}: more may remain, run idem prune again`);
        if (more) finishedWith.set(cmd, EXIT.more);
      });
    });

  cmd
    .command("migrate")
    .description("apply pending ledger migrations")
    .addOption(
      new Option(
        "--timeout <duration>",
        "Postgres: the longest one migration statement may go unanswered (a wait for another process's migration included), over the config's migrations.timeoutMs (default 10m; 0 waits for ever)",
      ).argParser(timerDuration),
    )
    .addOption(
      new Option(
        "--lock-patience <duration>",
        "Postgres: how long to keep trying for the tables' locks (held by a long transaction), over migrations.lockPatienceMs (default 60s)",
      ).argParser(timerDuration),
    )
    .action(async (o: { timeout?: number; lockPatience?: number }) => {
      await withLedger(
        g(),
        async (ledger) => {
          const applied = await ledger.admin.migrate().catch((error: unknown) => {
            throw inOperatorsTerms(error, true);
          });
          console.log(
            g().json
              ? JSON.stringify({ applied })
              : applied.length
                ? `applied ${applied.join(", ")}`
                : "the ledger is up to date",
          );
        },
        {
          schema: "create",
          migrations: {
            ...(o.timeout !== undefined && { timeoutMs: o.timeout }),
            ...(o.lockPatience !== undefined && { lockPatienceMs: o.lockPatience }),
          },
        },
      );
    });

  cmd
    .command("stats")
    .description("operations not settled yet (running, unknown, pending, needs_review) by tenant, action and status")
    .addOption(
      new Option("-t, --tenant <tenant>", "only this tenant (without it or IDEM_TENANT: every tenant)").env(
        "IDEM_TENANT",
      ),
    )
    .option("--all-tenants", "every tenant, whatever IDEM_TENANT says")
    .action(async (o: { tenant?: string; allTenants?: boolean }, command: Command) => {
      // As ls: a shell scoped to a tenant (IDEM_TENANT) is not shown the others' work unless asked.
      if (o.allTenants && o.tenant !== undefined && command.getOptionValueSource("tenant") === "cli")
        throw new InvalidValueError("stats", "give --tenant or --all-tenants, not both");
      const tenant = o.allTenants ? undefined : o.tenant;
      await withLedger(g(), async (ledger) => {
        const stats = await ledger.admin.stats(tenant === undefined ? {} : { tenant });
        // --json: the object as the API returns it ({ unsettled: [...] }), so a field added later is not a new shape.
        if (g().json === true) console.log(JSON.stringify(stats));
        else printStats([...stats.unsettled], false);
      });
    });

  cmd
    .command("mcp")
    .description("serve the config's tools to an MCP client over stdio, each done once per business identity")
    .addOption(
      new Option("-t, --tenant <tenant>", "the tenant every call acts for (default: the config's mcp.tenant)").env(
        "IDEM_TENANT",
      ),
    )
    .action(async (o: { tenant?: string }, mcp: Command) => {
      let tenant: string | undefined;
      const [{ pino }, { serveMcp }] = await Promise.all([import("pino"), import("./mcp.js")]);
      // stdout is the protocol's: what the stop says goes to stderr.
      const log = pino({ base: { mcp: hostname() } }, pino.destination(2));
      let stopTimeoutMs: number | undefined;
      /** The stop (its signal, or the client gone) and its bound, once it came. */
      let bound: StopBound | undefined;
      /** How far a stop got: serving, then closing the ledger, then the command ended. */
      let stage: "serve" | "close" | "done" = "serve";
      /** What the ledger's close left unrecorded (named in the log): exit 1. */
      let left: Closed = { lateAnswers: [], inFlight: [] };
      const signals = hearStopSignals(log, {
        get stopping() {
          return stopTimeoutMs === undefined
            ? "the server is stopping"
            : `the calls in flight have until ${stopTimeoutMs} ms after the stop`;
        },
        left: "a call in flight is left to its lease, and settled by the daemon once that expires",
      });
      try {
        await withLedger(
          g(),
          async (ledger, config) => {
            const ms = config.mcp.stopTimeoutMs;
            stopTimeoutMs = ms;
            // Bounded, as the daemon's stop: a provider that does not answer held the calls in
            // flight, and the close waiting for them, a lease, then the process for as long as the
            // provider took (its socket open), past a supervisor's grace.
            const stop = () => {
              if (bound) return;
              bound = { setting: "mcp.stopTimeoutMs", ms, stoppedAt: performance.now() };
              setTimeout(() => {
                if (stage === "done") {
                  // Everything was closed, and what was left named; something still holds the
                  // process open. The command's own code (set once it ended).
                  log.warn(
                    { stopTimeoutMs: ms },
                    `the MCP server stopped, but the process was still open ${ms} ms after the stop${heldBy(left.lateAnswers, left.inFlight)}: exiting`,
                  );
                  exitFlushed(log);
                  return;
                }
                log.error(
                  { stopTimeoutMs: ms },
                  `${stage === "serve" ? "the MCP server did not stop" : "closing the ledger did not finish (a call still to be recorded, the database not answering, or a loaded machine)"} within ${ms} ms of the stop: exiting; a call still in flight is left to its lease, and settled by the replay policy once that expires`,
                );
                exitFlushed(log, EXIT.failure);
              }, ms).unref();
            };
            signals.signal.addEventListener("abort", stop, { once: true });
            try {
              await serveMcp(ledger, config, tenant!, signals.signal);
            } finally {
              signals.signal.removeEventListener("abort", stop);
              stop(); // the client went away: a stop too, with the calls it made still in flight
              stage = "close"; // withLedger closes the ledger once this returns
            }
          },
          {
            actions: true,
            beforeOpen: async (config) => {
              tenant = mcpTenant(o.tenant, mcp.getOptionValueSource("tenant"), config);
            },
            close: async (ledger) => {
              left = await closeWithin(ledger, bound);
              sayLeftInFlight(log, left.inFlight, bound);
              sayUnawaited(log, left.lateAnswers, bound);
            },
          },
        );
      } finally {
        signals.dispose();
        stage = "done";
      }
      const failure = closeLeftFailure("the MCP server", left);
      if (failure) throw failure;
    });

  cmd
    .command("console")
    .description("serve the operators' web console (the config's console section: port, operators and their tenants)")
    .addOption(
      new Option("-p, --port <port>", "listen on this port instead of console.port (0: any free port)").argParser(
        portNumber,
      ),
    )
    .action(async (o: { port?: number }) => {
      const [{ pino }, { serveConsole }] = await Promise.all([import("pino"), import("./console/server.js")]);
      const log = pino({ base: { console: hostname() } });
      let built = true;
      const signals = hearStopSignals(log, {
        stopping: "the console is closing",
        left: "a decision in flight is recorded or not, as its page then says on reload",
      });
      await withLedger(
        g(),
        async (ledger, config, configured) => {
          if (built) warnOfUnmatchedThresholds(config, configured, log);
          const web = await serveConsole(
            ledger,
            o.port === undefined ? config : { ...config, console: { ...config.console, port: o.port } },
            log,
          );
          // The one line a script (or a test) waits for: where the console listens.
          log.info({ port: web.port, url: web.url }, `serving the console on ${web.url}`);
          await stopped(signals.signal);
          await web.close();
        },
        {
          // A receipt given with a decision is checked by its action's receipt schema, which the
          // ledger must know. The console performs no action: it may run without the providers'
          // credentials, and then says what it cannot check.
          actions: true,
          withoutActions: (error) => {
            built = false;
            log.warn(
              { err: error },
              `the config's actions could not be built, so a receipt given with a decision is refused (evidence is taken) and thresholds.perAction is not checked against them: ${error.message}`,
            );
          },
        },
      ).finally(signals.dispose);
    });

  cmd
    .command("daemon")
    .description("settle unknown and abandoned operations, alert, serve /metrics and /healthz")
    .option("--name <name>", "this replica's name in logs and audit events", `${hostname()}:${process.pid}`)
    .option("--once", "run one pass and exit")
    .option(
      "--migrate",
      "create and migrate the ledger if needed before starting (otherwise a ledger that needs migrations is refused)",
    )
    .action(async (o: { name: string; once?: boolean; migrate?: boolean }) => {
      const [{ pino }, { Daemon }, { DaemonMetrics }, { alertActions, requireAlertSink }] = await Promise.all([
        import("pino"),
        import("./daemon.js"),
        import("./metrics.js"),
        import("./alerts.js"),
      ]);
      const log = pino({ base: { daemon: o.name } });
      let onResult: LedgerOptions["onResult"] = () => {};
      let stopTimeoutMs: number | undefined;
      let opened = false;
      /** The ledger's close returned (a close that threw, or a ledger never opened, did not). */
      let closed = false;
      /** How far a stop got: the daemon's work, then closing the ledger, then the process ending. */
      let stage: "work" | "close" | "done" = "work";
      /** When the stop came (performance.now()): the close has what is left of the bound. */
      let stoppedAt: number | undefined;
      /** The late answers the ledger's close did not await (named in the log): the stop exits 1. */
      let unawaited: readonly OperationRef[] = [];
      /** Those of a --once pass nobody stopped: the pass exits 1, naming them. */
      let passUnrecorded: readonly OperationRef[] | undefined;
      /** The operations whose calls had not ended when the ledger's close stopped waiting (named in the log): exit 1. */
      let leftInFlight: readonly OperationRef[] = [];
      // Heard from the start: a daemon started while its database is down (or restarting) waits
      // for it, and a stop meanwhile ends it; a stop once it runs ends it gracefully, bounded.
      const signals = hearStopSignals(log, {
        get stopping() {
          return stopTimeoutMs === undefined
            ? "the daemon is stopping"
            : `the work in flight has until ${stopTimeoutMs} ms after the stop`;
        },
        left: "the work in flight is left to its lease, and settled once that expires",
      });
      let metrics: DaemonMetrics | undefined;
      const running = withLedger(
        g(),
        async (ledger, config, configured) => {
          metrics!.attach(ledger);
          const daemon = new Daemon(ledger, config, log, metrics!, o.name);
          const stop = () => {
            stoppedAt = performance.now();
            log.info("stopping: finishing the work in flight");
            daemon.stop();
            // Bounded: a database or provider that does not answer (a frozen one: its client's read
            // timeout, 35 s by default) would hold the stop past a supervisor's grace (Kubernetes:
            // 30 s), which then kills it anyway. What is still in flight stays under its lease, and
            // is settled by the replay policy once that expires, as after a crash.
            // The bound covers the close too, and says which stage it cut off.
            const ms = config.daemon.stopTimeoutMs;
            setTimeout(() => {
              if (stage === "done") {
                // Everything was recorded and closed; something else held the process open. The
                // command's own code (set once it ended), as if it had exited by itself.
                log.warn(
                  { stopTimeoutMs: ms },
                  `the daemon stopped, but the process was still open ${ms} ms after the stop${heldBy(unawaited, leftInFlight)}: exiting`,
                );
                exitFlushed(log);
                return;
              }
              // 1 for a close cut off too: it was waiting to record the late answer of a request cut
              // off (its operation stays unknown, or goes to a person, where the answer would have
              // settled it), or the database did not answer; either way the stop was not clean.
              log.error(
                { stopTimeoutMs: ms },
                stage === "work"
                  ? `the work in flight did not end within ${ms} ms of the stop: exiting; its operations are left to their leases and settled once those expire`
                  : `the daemon's work ended, but closing the ledger did not finish within ${ms} ms of the stop (a late answer still awaited, to be recorded, or the database not answering): exiting; an operation whose late answer was not recorded stays as its cut-off left it (unknown, checked again, or with a person)`,
              );
              exitFlushed(log, EXIT.failure);
            }, ms).unref();
          };
          opened = true;
          if (signals.signal.aborted) return; // stopped as the database came back
          stopTimeoutMs = config.daemon.stopTimeoutMs;
          signals.signal.addEventListener("abort", stop, { once: true });
          try {
            warnOfUnmatchedThresholds(config, configured, log);
            if (o.once) {
              // As the daemon's loop: a pass stopped (a cron job's timeout, a container's end) lets
              // the request in flight finish and be recorded, sends no other and gives back the rest
              // of its claim. Node's default ended it mid-request, the row left running for the
              // next pass, which sends an effect nothing can look up to a person.
              const { failed, undelivered } = await daemon.tick();
              // A cron job hears of it: exit 1, the rows and deliveries named in the log above.
              const said = [
                ...(failed ? [`${failed} due operation(s) could not be settled`] : []),
                ...(undelivered
                  ? [
                      `${undelivered} alert delivery(ies) were not taken by their sink (down, not reached, refusing, or no answer: in review, for a person to check; the log says why)`,
                    ]
                  : []),
              ];
              if (said.length) throw new Error(`${said.join("; ")}; see the log`);
              return;
            }
            const web = config.daemon.console
              ? await (await import("./console/server.js")).serveConsole(ledger, config, log)
              : undefined;
            if (web) log.info({ port: web.port, url: web.url }, `serving the console on ${web.url}`);
            log.info({ ledger: redactUrl(config.ledger), config: config.source }, "daemon started");
            try {
              // It rejects for a ledger that must be reopened (daemon.ts): the process ends, as when stopped.
              await daemon.run();
            } finally {
              await web?.close();
            }
          } finally {
            signals.signal.removeEventListener("abort", stop);
            stage = "close"; // withLedger closes the ledger once this returns
          }
          log.info("daemon stopped");
        },
        {
          // Its own alert deliveries too: one a person retried is settled by the daemon's pass.
          actions: { also: async (config) => alertActions(config, log) },
          schema: o.migrate ? "migrate" : "require",
          onResult: (r, info) => onResult?.(r, info),
          // /healthz and /metrics are served from the start: while the database is awaited, /healthz says so.
          beforeOpen: async (config) => {
            requireAlertSink(config); // before anything is served or opened
            metrics = new DaemonMetrics(undefined, config.daemon.intervalMs, {
              perTenant: config.daemon.metricsPerTenant,
            });
            onResult = metrics.results.onResult; // the daemon's own calls (alert deliveries) feed its counters
            if (o.once || config.daemon.metricsPort === undefined) return;
            const port = await metrics.listen(config.daemon.metricsPort, config.daemon.metricsHost, (err) =>
              log.error({ err }, "the /metrics server failed; the daemon goes on"),
            );
            log.info({ port }, `serving /metrics and /healthz on ${config.daemon.metricsHost}:${port}`);
          },
          ...(!o.once && {
            waitForDatabase: { log, signal: signals.signal, unreachable: (e: Error) => metrics?.unavailable(e) },
          }),
          close: async (ledger) => {
            const bound =
              stoppedAt === undefined ? undefined : { setting: "daemon.stopTimeoutMs", ms: stopTimeoutMs!, stoppedAt };
            const { lateAnswers, inFlight } = await closeWithin(ledger, bound);
            closed = true;
            sayLeftInFlight(log, inFlight, bound);
            leftInFlight = inFlight;
            if (!lateAnswers.length) return;
            // A --once pass nobody stopped: its pass ended, and the close waited a lease. Said as a
            // stop (the stop's bound, "the daemon stopped"), a cron job's log told of a stop never sent.
            if (o.once && bound === undefined) {
              passUnrecorded = lateAnswers;
              log.error(
                { lateAnswers },
                `the pass ended, but the late answer of ${lateAnswers.length} request(s) it cut off was not recorded (${lateAnswers.map((r) => r.id).join(", ")}): the ledger's close waited for it a lease (daemon.leaseMs), and exits with the pass; each operation stays as its cut-off left it (unknown, checked again, or with a person) where its answer would have settled it`,
              );
              return;
            }
            unawaited = lateAnswers;
            sayUnawaited(log, lateAnswers, bound);
          },
        },
      );
      try {
        await running;
      } catch (error) {
        // A pass that failed after a stop is still a failure (a cron job hears of it).
        if (opened || !signals.signal.aborted) throw error;
        log.info("daemon stopped before its database was reachable");
      } finally {
        signals.dispose();
        await metrics?.close();
        stage = "done";
        // The pass is over and its ledger closed (or never opened): only its result is left to print.
        if (o.once)
          exitIfHeldOpen(
            log,
            { lateAnswers: passUnrecorded ?? unawaited, inFlight: leftInFlight },
            !opened ? "unopened" : closed ? "closed" : "unclosed",
          );
      }
      // The ledger closed cleanly, but not every answer was recorded: the pass, or the stop, was not clean.
      if (passUnrecorded)
        throw new Error(
          `the pass ended without recording the late answer of ${passUnrecorded.length} request(s) it cut off (${named(passUnrecorded)})${leftInFlight.length ? `; ${inFlightSummary(leftInFlight)}` : ""}; see the log`,
        );
      const failure = closeLeftFailure("the daemon", { lateAnswers: unawaited, inFlight: leftInFlight });
      if (failure) throw failure;
    });
  return cmd;
}

/**
 * Ends a `--once` pass's process if it is still open `ONCE_EXIT_MS` from now (an unref'd timer: a
 * process that ends by itself ends as before). Its code is the command's own (set by then), and 1
 * when the close left anything unrecorded (`left`: late answers not recorded, whose requests are
 * still out, and calls still in flight, whose request, lookup or lazy args are: what holds it
 * open), since the pass was not clean either way. The log is flushed first, and says how far the
 * pass got (`ledger`): its ledger closed; never opened (a config refused, the database
 * unreachable: the pass did not run); or its close failed.
 */
function exitIfHeldOpen(log: Logger, left: Closed, ledger: "closed" | "unopened" | "unclosed"): void {
  const { lateAnswers, inFlight } = left;
  // What the process outlived: a pass that failed before its ledger opened never ran.
  const since = {
    closed: `the pass ended, but its process was still open ${ONCE_EXIT_MS} ms after its ledger closed`,
    unopened: `the pass did not run: it failed before its ledger opened (the error says why), and its process was still open ${ONCE_EXIT_MS} ms after`,
    unclosed: `the pass ended, but closing its ledger failed (the error says why), and its process was still open ${ONCE_EXIT_MS} ms after`,
  }[ledger];
  // Calls left in flight were not named here before: "still open …: exiting", as if nothing was out.
  const held = [
    ...(lateAnswers.length
      ? [`the request(s) whose late answers were not recorded (${lateAnswers.map((r) => r.id).join(", ")})`]
      : []),
    ...(inFlight.length
      ? [`the call(s) still in flight, their outcomes not recorded (${inFlight.map((r) => r.id).join(", ")})`]
      : []),
  ];
  setTimeout(() => {
    log.warn(
      { onceExitMs: ONCE_EXIT_MS, ...(lateAnswers.length && { lateAnswers }), ...(inFlight.length && { inFlight }) },
      held.length
        ? `${since}, held by ${held.join(" and ")}: not waiting for ${inFlight.length ? "them" : "their answers"}, exiting`
        : `${since}: exiting`,
    );
    exitFlushed(log, held.length ? EXIT.failure : undefined);
  }, ONCE_EXIT_MS).unref();
}

/**
 * Runs an operation just retried (`idem retry --now`) and returns the status it ended in. The
 * retry is recorded whatever happens here: a failure says so, with where the operation is now (printed too), and exits 1, never 2
 * (bad usage: nothing done), since the run may have performed its effect before it failed (a
 * receipt that could not be kept).
 */
async function runRetried(
  ledger: Ledger,
  ref: OperationRef,
  actor: string,
  json: boolean,
): Promise<RunResult<unknown>["status"]> {
  try {
    return (await ledger.daemon.settle({ ...ref, actor })).status;
  } catch (error) {
    const why =
      error instanceof UnknownActionError
        ? `not run now: this config has no action of type ${error.action} (a daemon whose config has it runs it)`
        : `running it now failed: ${(error as Error).message}`;
    let now: string;
    try {
      const shown = await ledger.get(ref);
      printOperation(shown, json);
      now = `it is now ${shown.operation.status} at attempt ${shown.operation.attempt}`;
    } catch (readError) {
      now = `where it is now could not be read (${(readError as Error).message})`;
    }
    throw new RunAfterRetryError(
      `retried: the retry of ${ref.id} is recorded; ${why}; ${now}: see idem show ${ref.id} --tenant ${ref.tenant}`,
      { cause: error },
    );
  }
}

/**
 * The tenant `idem mcp` serves: --tenant, else the config's `mcp.tenant`, else IDEM_TENANT. An
 * IDEM_TENANT left in an operator's shell must not move a model's server to another tenant than
 * the config names: when both are set and differ (and no --tenant was given), it is refused.
 */
function mcpTenant(given: string | undefined, source: string | undefined, config: IdemConfig): string {
  const configured = config.mcp?.tenant;
  if (given !== undefined && source === "env" && configured !== undefined && given !== configured)
    throw new ConfigError(
      `idem mcp: IDEM_TENANT is ${JSON.stringify(given)} but the config's mcp.tenant is ${JSON.stringify(configured)}: unset IDEM_TENANT, or say --tenant to choose`,
    );
  const tenant = given ?? configured;
  if (!tenant) throw new ConfigError("idem mcp needs a tenant: --tenant, IDEM_TENANT or mcp.tenant in the config");
  // Checked here, as the config checks mcp.tenant: served, every call would answer "not set up
  // right" and every status check "check again later", for as long as the server ran.
  try {
    requireName(tenant, "tenant");
  } catch (error) {
    const from = source === "env" ? "IDEM_TENANT" : "--tenant";
    throw new ConfigError(
      `idem mcp: ${from} ${JSON.stringify(tenant)} is no tenant: ${(error as InvalidValueError).reason}`,
      { cause: error },
    );
  }
  return tenant;
}

/**
 * Says which `thresholds.perAction` keys name no action of the config, once at the start of the
 * daemon and of the console (whose queue shows what runs past them): a warning, not a refusal,
 * since such a key may name an action only agents run (see `unmatchedThresholds`). The alert
 * sinks' own `idem.alert.*` actions are left out of the known ones: the daemon never reports its
 * own deliveries as stuck, so a threshold for them does nothing.
 */
function warnOfUnmatchedThresholds(config: IdemConfig, configured: readonly Action<any, any>[], log: Logger): void {
  const known = [...new Set(configured.map((a) => a.type))].sort();
  for (const { key, near } of unmatchedThresholds(config, known))
    log.warn(
      { key, known },
      `thresholds.perAction[${JSON.stringify(key)}] names no action of this config${near ? ` (did you mean ${near}?)` : ""}: it applies only if agents run actions of that type; the config's are ${known.join(", ") || "none"}`,
    );
}

export async function main(argv: string[]): Promise<number> {
  try {
    const cmd = program();
    await cmd.parseAsync(argv);
    return finishedWith.get(cmd) ?? EXIT.ok;
  } catch (error) {
    if (error instanceof CommanderError) return error.exitCode === 0 ? EXIT.ok : EXIT.usage;
    const json = argv.includes("--json");
    const code =
      error instanceof LedgerConfigError && error.unreachable
        ? EXIT.failure // not the config's fault, as far as anyone can tell: try again later
        : error instanceof IdemError &&
            (error.code === "CONFIG" || error.code === "LEDGER_CONFIG" || error.code === "INVALID_VALUE")
          ? EXIT.usage
          : error instanceof OperationNotFoundError
            ? EXIT.notFound
            : error instanceof IdemError && error.code === "CHANGED_SINCE_SEEN"
              ? EXIT.changed // before InvalidTransitionError: the ledger's is one of those
              : error instanceof InvalidTransitionError
                ? EXIT.refused
                : EXIT.failure;
    const message = (error as Error).message;
    if (json)
      console.error(
        JSON.stringify({ error: error instanceof IdemError ? error.code : (error as Error).name, message }),
      );
    else console.error(`idem: ${message}`);
    return code;
  }
}
