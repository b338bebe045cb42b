/**
 * The `idem` command. Human output by default, `--json` for scripts. Exit codes: 0 done,
 * 1 failure (the ledger's database unreachable included), 2 bad usage or configuration, 3 no such
 * operation (for this tenant), 4 the operation is not in a status that allows it (asking again
 * will not help), 5 `idem prune` stopped at its `--max` with more possibly left (run it again),
 * 6 `idem retry --now` ran the operation and it did not succeed, 7 a decision's operation changed
 * since it was shown (show it again and decide on what it is now).
 */
import { hostname } from "node:os";
import { Command, CommanderError, InvalidArgumentError, Option } from "commander";
import type { Logger } from "pino";
import type { STATUSES as LEDGER_STATUSES, Closed, LedgerOptions, OperationRef, Seen, Status } from "@idem/core";
import type { Globals } from "./ledger-commands.js";
import type { DaemonMetrics } from "./metrics.js";
import { exitFlushed, hearStopSignals, stopped } from "./stop-signals.js";
import { StopTimer } from "./stop-bound.js";
import { readDuration } from "./durations.js";
import { packageVersion } from "./package-version.js";
import {
  closeLeftFailure,
  closeWithin,
  heldBy,
  inFlightSummary,
  named,
  sayLeftInFlight,
  sayUnawaited,
} from "./close-report.js";
// What only some commands use is imported by them as they run (`await import`): the ledger
// (@idem/core, kysely) and the config reader (zod), with what opens one for a command
// (ledger-commands.ts) and prints what it holds (output.ts); the logger (pino), the daemon, its
// metrics (prom-client), the alert sinks, the console (hono) and the MCP server. Loaded for every
// command, the logger and the rest added about 0.2 s to each start of ls, show or --help, and the
// ledger and the config reader about 0.35 s of CPU to each --help and --version.

/** ledger-commands.ts, loaded by a command as it runs. */
const ledgerCommands = () => import("./ledger-commands.js");
/** The ledger's public entry, loaded by a command as it runs. */
const core = () => import("@idem/core");

/** Opens the config's ledger for one command: ledger-commands.ts's `withLedger`, loaded as the command runs. */
const withLedger: typeof import("./ledger-commands.js").withLedger = async (...args) =>
  (await ledgerCommands()).withLedger(...args);

/**
 * The statuses `--status` offers and `--seen` reads: the ledger's (`STATUSES` of @idem/core),
 * written here so that building the command line loads no ledger; `satisfies` keeps them the
 * ledger's, every one and in its order.
 */
const STATUSES = [
  "running",
  "succeeded",
  "failed",
  "unknown",
  "needs_review",
  "pending",
] as const satisfies typeof LEDGER_STATUSES;

/**
 * How long a `--once` pass's process may stay open once its command ended (its ledger closed, or
 * never opened): nothing is left to do but print its result, yet a request whose late answer the
 * close gave up on (its provider client's socket, a promise of its own), or a client the config
 * made as it loaded, holds the event loop until it lets go, and a cron job would hang that long.
 * Past it the process exits, its code the pass's own.
 */
const ONCE_EXIT_MS = 2_000;

const EXIT = { ok: 0, failure: 1, usage: 2, notFound: 3, refused: 4, more: 5, notDone: 6, changed: 7 } as const;

/**
 * What becomes of a call `idem mcp` left in flight (running under its lease), completing "left to
 * its lease, and …": idem mcp runs no replay policy of its own, so it is settled only by a daemon
 * on the ledger, or by a later call with the same key, which takes the expired lease over.
 */
const MCP_SETTLED_LATER =
  "once that expires, is settled by the replay policy when a daemon (idem daemon) runs on this ledger or a later call with the same key comes";

/** The exit code a program's command chose when it did its work but not all of it (printed already); else 0. */
const finishedWith = new WeakMap<Command, number>();

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
    .version(packageVersion(), "-V, --version")
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
        const [{ InvalidValueError }, { printOperations }] = await Promise.all([core(), import("./output.js")]);
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
      const { printOperation } = await import("./output.js");
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
        const [{ InvalidValueError }, { parseReceipt }, { requireSeen, onTheVersionShown }, { printOperation }] =
          await Promise.all([core(), import("./receipt.js"), ledgerCommands(), import("./output.js")]);
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
        const [{ requireSeen, onTheVersionShown, runRetried }, { printOperation }] = await Promise.all([
          ledgerCommands(),
          import("./output.js"),
        ]);
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
      const { pruneExpired } = await ledgerCommands();
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
      const { inOperatorsTerms } = await ledgerCommands();
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
      const [{ InvalidValueError }, { printStats }] = await Promise.all([core(), import("./output.js")]);
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
      const [{ pino }, { serveMcp }, { mcpTenant }] = await Promise.all([
        import("pino"),
        import("./mcp.js"),
        ledgerCommands(),
      ]);
      // stdout is the protocol's: what the stop says goes to stderr.
      const log = pino({ base: { mcp: hostname() } }, pino.destination(2));
      /** `mcp.stopTimeoutMs`, once the config is read. */
      let stopTimeoutMs: number | undefined;
      /** What the ledger's close left unrecorded (named in the log): exit 1. */
      let left: Closed = { lateAnswers: [], inFlight: [] };
      const signals = hearStopSignals(log, {
        get stopping() {
          return stopTimeoutMs === undefined
            ? "the server is stopping"
            : `the calls in flight have until ${stopTimeoutMs} ms after the stop`;
        },
        // Forced while the ledger is still opening (its database not answering): no call was served.
        get left() {
          return timer.stage === "open"
            ? "the ledger was still opening: nothing was served"
            : `a call in flight is left to its lease, and ${MCP_SETTLED_LATER}`;
        },
      });
      /**
       * Bounded, as the daemon's stop (stop-bound.ts): a provider that does not answer held the
       * calls in flight, and the close waiting for them, a lease, then the process for as long as
       * the provider took (its socket open), past a supervisor's grace; a database that does not
       * answer held the ledger's open as long.
       */
      const timer = new StopTimer(
        log,
        {
          who: "the MCP server",
          setting: "mcp.stopTimeoutMs",
          unopened: "nothing was served",
          work: (ms) =>
            `the MCP server did not stop within ${ms} ms of the stop: exiting; a call still in flight is left to its lease, and ${MCP_SETTLED_LATER}`,
          close: (ms) =>
            `closing the ledger did not finish (a call still to be recorded, the database not answering, or a loaded machine) within ${ms} ms of the stop: exiting; a call still in flight is left to its lease, and ${MCP_SETTLED_LATER}`,
        },
        () => left,
      );
      /** A stop: its signal, or the client gone (serving ended). The first one counts. */
      const stop = () => timer.stop();
      signals.signal.addEventListener("abort", stop, { once: true });
      try {
        await withLedger(
          g(),
          async (ledger, config) => {
            timer.stage = "work";
            try {
              await serveMcp(ledger, config, tenant!, signals.signal);
            } finally {
              stop(); // the client went away: a stop too, with the calls it made still in flight
              timer.stage = "close"; // withLedger closes the ledger once this returns
            }
          },
          {
            actions: true,
            beforeOpen: async (config) => {
              stopTimeoutMs = config.mcp.stopTimeoutMs;
              timer.bind(stopTimeoutMs); // stopped as the config was read: bounded from the stop
              tenant = mcpTenant(o.tenant, mcp.getOptionValueSource("tenant"), config);
            },
            close: async (ledger) => {
              const bound = timer.bound;
              left = await closeWithin(ledger, bound);
              sayLeftInFlight(log, left.inFlight, bound, MCP_SETTLED_LATER);
              sayUnawaited(log, left.lateAnswers, bound);
            },
          },
        );
      } finally {
        signals.signal.removeEventListener("abort", stop);
        signals.dispose();
        timer.stage = "done";
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
      const [{ pino }, { serveConsole }, { warnOfUnmatchedThresholds }] = await Promise.all([
        import("pino"),
        import("./console/server.js"),
        ledgerCommands(),
      ]);
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
      const [
        { pino },
        { Daemon },
        { DaemonMetrics },
        { alertActions, loadEmailClient, requireAlertSink },
        { warnOfUnmatchedThresholds },
        { redactUrl },
      ] = await Promise.all([
        import("pino"),
        import("./daemon.js"),
        import("./metrics.js"),
        import("./alerts.js"),
        ledgerCommands(),
        core(),
      ]);
      const log = pino({ base: { daemon: o.name } });
      let onResult: LedgerOptions["onResult"] = () => {};
      let stopTimeoutMs: number | undefined;
      let opened = false;
      /** The ledger's close returned (a close that threw, or a ledger never opened, did not). */
      let closed = false;
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
        // Forced while the ledger is still opening (or its database awaited): nothing was claimed.
        get left() {
          return timer.stage === "open"
            ? "the ledger was still opening: nothing was claimed or settled"
            : "the work in flight is left to its lease, and settled once that expires";
        },
      });
      /**
       * Bounded from the stop, whatever stage it came in (stop-bound.ts): a database or provider
       * that does not answer (a frozen one: its client's read timeout, 35 s by default) would hold
       * the stop past a supervisor's grace (Kubernetes: 30 s), which then kills it anyway; a
       * database that takes the connection and never answers held the ledger's open as long. What
       * is still in flight stays under its lease, and is settled by the replay policy once that
       * expires, as after a crash. The bound covers the close too, and says which stage it cut off.
       */
      const timer = new StopTimer(
        log,
        {
          who: "the daemon",
          setting: "daemon.stopTimeoutMs",
          unopened: "nothing was claimed or settled",
          work: (ms) =>
            `the work in flight did not end within ${ms} ms of the stop: exiting; its operations are left to their leases and settled once those expire`,
          // 1 for a close cut off too: it was waiting to record the late answer of a request cut
          // off (its operation stays unknown, or goes to a person, where the answer would have
          // settled it), or the database did not answer; either way the stop was not clean.
          close: (ms) =>
            `the daemon's work ended, but closing the ledger did not finish within ${ms} ms of the stop (a late answer still awaited, to be recorded, or the database not answering): exiting; an operation whose late answer was not recorded stays as its cut-off left it (unknown, checked again, or with a person)`,
        },
        () => ({ lateAnswers: unawaited, inFlight: leftInFlight }),
      );
      const bindStop = () => timer.stop();
      signals.signal.addEventListener("abort", bindStop, { once: true });
      let metrics: DaemonMetrics | undefined;
      const running = withLedger(
        g(),
        async (ledger, config, configured) => {
          metrics!.attach(ledger);
          const daemon = new Daemon(ledger, config, log, metrics!, o.name);
          // The stop's bound is the timer's (heard from the start); this lets the work in flight end.
          const stop = () => {
            log.info("stopping: finishing the work in flight");
            daemon.stop();
          };
          opened = true;
          timer.stage = signals.signal.aborted ? "close" : "work";
          if (signals.signal.aborted) return; // stopped as the database came back: withLedger closes it
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
            timer.stage = "close"; // withLedger closes the ledger once this returns
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
            stopTimeoutMs = config.daemon.stopTimeoutMs;
            timer.bind(stopTimeoutMs); // stopped as the config was read: bounded from the stop
            requireAlertSink(config); // before anything is served or opened
            // Not awaited: the start does not wait for it. An email sink whose client cannot be
            // loaded is said now, while the database is awaited, not when its first alert is due
            // (the Daemon built once it opens begins it too, and does not say it again).
            loadEmailClient(config, log);
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
            const bound = timer.bound;
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
        // Only the loop waits for its database, and only that wait ends with the stop's own reason:
        // anything else is a failure, stopped or not (a cron job hears of it). A --once pass does
        // not wait: its open that failed after a stop failed on its own (the database unreachable
        // or refusing), and the pass did not run.
        if (opened || error !== signals.signal.reason) throw error;
        log.info("daemon stopped before its database was reachable");
      } finally {
        signals.signal.removeEventListener("abort", bindStop);
        signals.dispose();
        await metrics?.close();
        timer.stage = "done";
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
  const held = heldBy(left);
  setTimeout(() => {
    log.warn(
      { onceExitMs: ONCE_EXIT_MS, ...(lateAnswers.length && { lateAnswers }), ...(inFlight.length && { inFlight }) },
      held
        ? `${since}, held by ${held}: not waiting for ${inFlight.length ? "them" : "their answers"}, exiting`
        : `${since}: exiting`,
    );
    exitFlushed(log, held ? EXIT.failure : undefined);
  }, ONCE_EXIT_MS).unref();
}

export async function main(argv: string[]): Promise<number> {
  try {
    const cmd = program();
    await cmd.parseAsync(argv);
    return finishedWith.get(cmd) ?? EXIT.ok;
  } catch (error) {
    if (error instanceof CommanderError) return error.exitCode === 0 ? EXIT.ok : EXIT.usage;
    // Any other error came from a command that ran: it loaded the ledger already.
    const { IdemError, InvalidTransitionError, LedgerConfigError, OperationNotFoundError } = await core();
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
