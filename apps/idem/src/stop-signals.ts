/**
 * The stop signals of a command that runs until stopped (`idem daemon`, `idem console`, `idem mcp`),
 * heard for the command's whole life: from before its ledger opens to after its last work ended.
 *
 * Node's default for a signal nobody listens to is to die at once, whichever signal and whoever
 * sent it. With `once` handlers a second signal met that default: the request in flight that the
 * stop was finishing was abandoned (one no lookup can find goes to a person), and so was a signal
 * between two handlers (the daemon's wait for its database, then its loop). A supervisor
 * (Kubernetes, systemd, docker stop) sends one SIGTERM, then SIGKILL when its grace ends; a
 * repeated SIGTERM comes from a wrapper forwarding it or a script sending it again: it is said and
 * the stop goes on (the command's own bound ends it). A SIGINT after the stop is a person pressing
 * Ctrl-C again to force it: it exits at once (130), saying what is left. Either within
 * REPEAT_SIGNAL_MS of the stop is the same signal delivered twice, not a second one.
 */
import type { Logger } from "pino";

/**
 * A signal repeated within this long of the stop is the same one delivered twice, not a person
 * asking again: a package manager's script runner (npm run, pnpm run) forwards Ctrl-C to its child,
 * which the terminal has signalled too.
 */
export const REPEAT_SIGNAL_MS = 1_000;
/** The exit code of a stop forced by a second Ctrl-C: 128 + SIGINT, as a shell reports an interrupt. */
const FORCED_EXIT = 130;
/** How long an exit waits for pino's buffered lines to be written (its exit hook writes what is left). */
const FLUSH_MS = 1_000;

export interface StopSignals {
  /** Aborted by the first SIGTERM or SIGINT. */
  readonly signal: AbortSignal;
  /** Stops hearing them: the command has ended (Node's defaults again). */
  dispose(): void;
}

/**
 * Hears SIGTERM and SIGINT until `dispose()`. `stopping`: what a repeated SIGTERM is told goes on;
 * `left`: what a forced exit leaves behind.
 */
export function hearStopSignals(log: Logger, say: { stopping: string; left: string }): StopSignals {
  const stop = new AbortController();
  let since = 0;
  const heard = (name: NodeJS.Signals) => () => {
    if (!stop.signal.aborted) {
      since = performance.now();
      stop.abort(new Error(`stopped (${name})`));
      return;
    }
    if (performance.now() - since < REPEAT_SIGNAL_MS) return;
    if (name === "SIGINT") {
      log.warn(`interrupted again while stopping: exiting at once; ${say.left}`);
      exitFlushed(log, FORCED_EXIT);
      return;
    }
    log.info(`already stopping (${name} again): ${say.stopping}; Ctrl-C (SIGINT) again exits at once`);
  };
  const onInt = heard("SIGINT");
  const onTerm = heard("SIGTERM");
  process.on("SIGINT", onInt);
  process.on("SIGTERM", onTerm);
  return {
    signal: stop.signal,
    dispose: () => {
      process.off("SIGINT", onInt);
      process.off("SIGTERM", onTerm);
    },
  };
}

/**
 * `process.exit(code)` once pino wrote what it buffered, or after `FLUSH_MS` (its exit hook then
 * writes the rest); without `code`, the exit code set already (`process.exitCode`). Every exit a
 * command takes before its end (a stop's bound, a forced stop, a `--once` pass held open) goes
 * through here, so none depends on how its logger was built. With pino's own destination (no
 * `minLength`) nothing is held back and the exit is at once: the line in flight is written as the
 * process ends, and the exit hook writes those queued behind it.
 */
export function exitFlushed(log: Logger, code?: number): void {
  // Not process.exit(undefined): that sets the exit code to undefined, 0, and a command that
  // failed (its code set by then) exited 0.
  const exit = () => (code === undefined ? process.exit() : process.exit(code));
  log.flush(exit);
  setTimeout(exit, FLUSH_MS).unref();
}

/** Resolves at the first stop signal. */
export function stopped(signal: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    if (signal.aborted) resolve();
    else signal.addEventListener("abort", () => resolve(), { once: true });
  });
}
