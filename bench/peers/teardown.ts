/**
 * Everything the benchmark starts (servers, databases, clients) registers how to undo it here;
 * `run` undoes it in reverse order, once, whether the run ended, failed or was interrupted.
 */
export class Teardown {
  readonly #steps: { what: string; undo: () => unknown }[] = [];
  #ran: Promise<void> | undefined;

  add(what: string, undo: () => unknown): void {
    this.#steps.push({ what, undo });
  }

  /** Undoes every step, latest first; a step that fails is reported and the others still run. */
  run(): Promise<void> {
    this.#ran ??= (async () => {
      for (const { what, undo } of this.#steps.reverse()) {
        try {
          await undo();
        } catch (e) {
          console.error(`teardown: ${what} failed: ${e instanceof Error ? e.message : String(e)}`);
        }
      }
    })();
    return this.#ran;
  }
}
