/**
 * What the commands that read a config and act on its ledger share: opening the ledger for one
 * command (waiting for its database, refusing a schema it must not write), decisions taken on the
 * version of an operation a person was shown, `idem retry --now`'s run, `idem prune`'s batches,
 * `idem mcp`'s tenant. cli.ts loads this module as such a command runs (`await import`), so that
 * building the command line, all `--help` and `--version` do, loads no ledger (@idem/core, kysely)
 * and no config reader (zod).
 */
import pRetry from "p-retry";
import type { Logger } from "pino";
import {
  ChangedSinceSeenError,
  IdemError,
  InvalidValueError,
  LedgerConfigError,
  MigrationWaitError,
  NewerLedgerError,
  UnknownActionError,
  openLedger,
  redactUrl,
  requireName,
  type Action,
  type Ledger,
  type LedgerOptions,
  type OperationRef,
  type RunResult,
  type Seen,
} from "@idem/core";
import { ConfigError, actionsOf, lastOfEachType, loadConfig, unmatchedThresholds, type IdemConfig } from "./config.js";
import { operationVersion, printOperation } from "./output.js";
import { packageVersion } from "./package-version.js";

/** The options of `idem` itself (before the command), which every command reads. */
export interface Globals {
  config?: string;
  ledger?: string;
  json?: boolean;
}

/**
 * Opens the config's ledger for one command. Only `idem migrate` (and `idem daemon --migrate`)
 * may create or migrate a ledger: for the others a path with no ledger (a typo) or a ledger that
 * needs migrations is refused, so an operator's command never writes a schema by accident.
 */
export async function withLedger<T>(
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
        `this ledger was migrated by a newer idem (${error.migrations.join(", ")}) than this idem command (@idem/cli ${packageVersion()}): upgrade @idem/cli to use it`,
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
export function inOperatorsTerms(error: unknown, flags: boolean): unknown {
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

/**
 * Every decision names the version of the operation it was taken on (`idem show` prints it), not
 * only its attempt: a late answer that the effect may have happened (a timeout after the request
 * was sent) or a check changes the operation without a new attempt, and a retry decided before it
 * would send the effect a second time. Without a version, the decision would apply to whatever
 * the operation is when the command runs. Checked before the ledger is opened.
 */
export function requireSeen(o: { seen?: Seen; attempt?: string }, ref: OperationRef, what: string): Seen {
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
export async function onTheVersionShown(ledger: Ledger, ref: OperationRef, seen: Seen, decide: () => Promise<unknown>) {
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
export class RunAfterRetryError extends Error {
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
export async function pruneExpired(
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

/**
 * Runs an operation just retried (`idem retry --now`) and returns the status it ended in. The
 * retry is recorded whatever happens here: a failure says so, with where the operation is now (printed too), and exits 1, never 2
 * (bad usage: nothing done), since the run may have performed its effect before it failed (a
 * receipt that could not be kept).
 */
export async function runRetried(
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
export function mcpTenant(given: string | undefined, source: string | undefined, config: IdemConfig): string {
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
export function warnOfUnmatchedThresholds(
  config: IdemConfig,
  configured: readonly Action<any, any>[],
  log: Logger,
): void {
  const known = [...new Set(configured.map((a) => a.type))].sort();
  for (const { key, near } of unmatchedThresholds(config, known))
    log.warn(
      { key, known },
      `thresholds.perAction[${JSON.stringify(key)}] names no action of this config${near ? ` (did you mean ${near}?)` : ""}: it applies only if agents run actions of that type; the config's are ${known.join(", ") || "none"}`,
    );
}
