/**
 * Answers that keep coming and never end (the HTTP sandboxes' `trickle_after_commit` fault): the
 * status and headers go out, then the body a space at a time, never finished. Each byte resets a
 * client's inactivity timeout, so only a deadline from the request's start ends the wait. Spaces,
 * not the answer's own bytes: what arrived is never a complete answer to be mistaken for one.
 * An answer trickles until its connection closes (the client gave up) or `cut` ends it; its timer
 * never keeps a process alive.
 */
import { once, EventEmitter } from "node:events";
import type { ServerResponse } from "node:http";

export class TricklingAnswers {
  private readonly open = new Map<ServerResponse, NodeJS.Timeout>();
  private readonly closed = new EventEmitter();

  /**
   * Sends the head, then a space every `intervalMs` (default 200), until the connection closes. An
   * answer that carries no body (204, 304) goes out whole: Node drops its body's bytes, so its head,
   * which waits for the first of them, never went out at all.
   */
  start(res: ServerResponse, status: number, headers: Record<string, string>, intervalMs = 200): void {
    res.writeHead(status, headers);
    if (status === 204 || status === 304) {
      res.end();
      return;
    }
    this.open.set(res, setInterval(() => res.write(" "), intervalMs).unref());
    res.on("close", () => {
      clearInterval(this.open.get(res));
      this.open.delete(res);
      this.closed.emit("close");
    });
  }

  /** Answers still trickling: each a connection its client holds open. */
  get count(): number {
    return this.open.size;
  }

  /**
   * How many still trickle once none does or `withinMs` passed: a client's close reaches the
   * server a moment after the client made it.
   */
  async countAfter(withinMs: number): Promise<number> {
    const signal = AbortSignal.timeout(withinMs);
    while (this.open.size > 0 && !signal.aborted) await once(this.closed, "close", { signal }).catch(() => undefined);
    return this.open.size;
  }

  /** Ends every trickling answer's connection: a test that failed lets its call go; the server closes. */
  cut(): void {
    for (const [res, timer] of this.open) {
      clearInterval(timer);
      res.destroy();
    }
  }
}
