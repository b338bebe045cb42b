/**
 * Scripted faults, shared by every sandbox server: each fault applies to requests that match it,
 * after letting `skip` of them pass, for `times` of them. Tests say "close the connection after
 * the 2nd payment_intents POST commits" as data, and the servers ask `take()` per request.
 */
export interface FaultMatch {
  /** HTTP method (or SMTP stage); any when absent. */
  readonly method?: string;
  /** Substring or pattern of the path; any when absent. */
  readonly path?: string | RegExp;
}

export interface Fault<K extends string = string> {
  readonly kind: K;
  readonly match?: FaultMatch;
  /** Matching requests to let through before this fault applies (the Nth request: skip N-1). Default 0. */
  readonly skip?: number;
  /** How many matching requests it applies to. Default 1. */
  readonly times?: number;
  /** For delays: how long to hold the response. */
  readonly delayMs?: number;
  /** For a trickle: the time between two bytes of the never-ending body. Default 200. */
  readonly intervalMs?: number;
  /** For rate limits: the Retry-After the server announces, in seconds. */
  readonly retryAfterSec?: number;
  /**
   * For an error after the effect committed: the HTTP status answered (and saved). Default 500.
   * For a page in front of the provider (the HubSpot sandbox's `page`, `page_after_commit`): its status, 404 by default.
   */
  readonly status?: number;
}

export class FaultPlan<K extends string = string> {
  private readonly faults: { fault: Fault<K>; skip: number; left: number }[] = [];

  add(fault: Fault<K>): this {
    this.faults.push({ fault, skip: fault.skip ?? 0, left: fault.times ?? 1 });
    return this;
  }

  clear(): void {
    this.faults.length = 0;
  }

  /** The first pending fault this request triggers, consuming one of its uses. */
  take(method: string, path: string, kinds: readonly K[]): Fault<K> | undefined {
    for (const f of this.faults) {
      if (f.left <= 0 || !kinds.includes(f.fault.kind) || !matches(f.fault.match, method, path)) continue;
      if (f.skip > 0) {
        f.skip -= 1;
        continue;
      }
      f.left -= 1;
      return f.fault;
    }
    return undefined;
  }
}

function matches(m: FaultMatch | undefined, method: string, path: string): boolean {
  if (!m) return true;
  if (m.method && m.method.toUpperCase() !== method.toUpperCase()) return false;
  if (m.path === undefined) return true;
  return typeof m.path === "string" ? path.includes(m.path) : m.path.test(path);
}
