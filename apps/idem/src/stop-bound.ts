/**
 * The bound of a stop of a command that runs until stopped and holds a ledger (`idem daemon`,
 * `idem mcp`): from the stop (its signal, or the command's own reason to end), whatever stage it
 * came in, the command has `stopTimeoutMs` to end; past it the process exits, saying which stage it
 * cut off. A stop while the ledger is still opening is bounded too: a database that takes the
 * connection and never answers held the open (and the process) until the open gave up by itself,
 * past a supervisor's grace. What the stages say is the command's own (`StopWords`); the stages,
 * the timer and the exit are here, the same for both.
 */
import type { Closed } from "@idem/core";
import type { Logger } from "pino";
import { heldBy, type StopBound } from "./close-report.js";
import { exitFlushed } from "./stop-signals.js";

/** How far the command got: opening its ledger, its work, closing the ledger, then it ended. */
export type StopStage = "open" | "work" | "close" | "done";

/** What a command says when its stop's bound cuts a stage off (`ms`: the bound), and who it is. */
export interface StopWords {
  /** As the log names it: "the daemon", "the MCP server". */
  readonly who: string;
  /** The config's setting of the bound, as a close's log line names it: "daemon.stopTimeoutMs". */
  readonly setting: string;
  /** What a stop before the ledger opened leaves: nothing done ("nothing was served"). */
  readonly unopened: string;
  /** The work in flight did not end. */
  work(ms: number): string;
  /** The work ended, and the ledger's close did not. */
  close(ms: number): string;
}

export class StopTimer {
  /** Set by the command as it goes; `done` once it ended (its exit code set). */
  stage: StopStage = "open";
  private stoppedAt: number | undefined;
  private ms: number | undefined;
  private armed: StopBound | undefined;

  /** `left`: what the ledger's close left unrecorded, named when something still holds the process open. */
  constructor(
    private readonly log: Logger,
    private readonly words: StopWords,
    private readonly left: () => Closed,
  ) {}

  /** The stop came (its signal, or the command ending by itself, its client gone): the first one counts. */
  stop(): void {
    this.stoppedAt ??= performance.now();
    this.arm();
  }

  /** The bound (`stopTimeoutMs`), once the config is read: a stop that came before is bounded from the stop. */
  bind(ms: number): void {
    this.ms ??= ms;
    this.arm();
  }

  /** The stop's bound, for the ledger's close (close-report.ts `closeWithin`); undefined while nobody stopped. */
  get bound(): StopBound | undefined {
    return this.armed;
  }

  private arm(): void {
    if (this.armed || this.stoppedAt === undefined || this.ms === undefined) return;
    const { ms, stoppedAt } = this;
    this.armed = { setting: this.words.setting, ms, stoppedAt };
    setTimeout(() => this.expired(ms), Math.max(0, stoppedAt + ms - performance.now())).unref();
  }

  private expired(ms: number): void {
    const { log, words } = this;
    if (this.stage === "done") {
      // Everything was closed, and what was left named; something else holds the process open.
      // The command's own code (set once it ended), as if it had exited by itself.
      const held = heldBy(this.left());
      log.warn(
        { stopTimeoutMs: ms },
        `${words.who} stopped, but the process was still open ${ms} ms after the stop${held ? `, held by ${held}` : ""}: exiting`,
      );
      exitFlushed(log);
      return;
    }
    // 1: the stop was not clean, whichever stage it cut off.
    log.error(
      { stopTimeoutMs: ms },
      this.stage === "open"
        ? `the ledger did not open within ${ms} ms of the stop (the database not answering, or a loaded machine): exiting; ${words.unopened}`
        : this.stage === "work"
          ? words.work(ms)
          : words.close(ms),
    );
    exitFlushed(log, 1);
  }
}
