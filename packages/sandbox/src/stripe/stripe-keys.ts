/**
 * Stripe's idempotency keys, as documented (docs.stripe.com/api/idempotent_requests): the first
 * answer for a key is saved and replayed; the same key with other parameters (endpoint, method,
 * parameters in any order) is refused; a key whose first request still executes is in use; a
 * key is forgotten once it is `retentionMs` old, counted from its first request. What is saved
 * and when is the server's decision (stripe-server.ts): this keeps the keys, per API key and
 * account (the server's slot names both).
 */

/** What Stripe holds for a key: the request it first came with, and its answer once there is one. */
export interface SavedAnswer {
  readonly fingerprint: string;
  /** When the key's first request came (sandbox clock, ms). */
  readonly at: number;
  readonly state: "in_flight" | "done";
  readonly status?: number;
  readonly body?: string;
  readonly requestId?: string;
}

export class StripeKeys {
  private readonly saved = new Map<string, SavedAnswer>();

  constructor(
    private readonly now: () => number,
    private readonly retentionMs: number,
  ) {}

  /** What is held for `slot`, unless it was forgotten (at least `retentionMs` old: Stripe may prune it then). */
  held(slot: string): SavedAnswer | undefined {
    const saved = this.saved.get(slot);
    if (saved && this.now() - saved.at > this.retentionMs) {
      this.saved.delete(slot);
      return undefined;
    }
    return saved;
  }

  /** The key's first request began executing. */
  begin(slot: string, fingerprint: string): void {
    this.saved.set(slot, { fingerprint, at: this.now(), state: "in_flight" });
  }

  /** Its answer, saved and replayed from now on; the key keeps the time of its first request. */
  finish(slot: string, fingerprint: string, answer: { status: number; body: string; requestId: string }): void {
    this.saved.set(slot, { fingerprint, at: this.saved.get(slot)!.at, state: "done", ...answer });
  }

  /** Nothing saved: the request failed before it executed (validation), as if the key never came. */
  forget(slot: string): void {
    this.saved.delete(slot);
  }
}

/** The request a key came with: method, path and parameters, whose order must not matter. */
export function fingerprintOf(method: string, path: string, params: Record<string, unknown>): string {
  return `${method} ${path} ${canonicalParams(params)}`;
}

function canonicalParams(v: unknown): string {
  if (Array.isArray(v)) return `[${v.map(canonicalParams).join(",")}]`;
  if (v && typeof v === "object")
    return `{${Object.keys(v)
      .sort()
      .map((k) => `${k}:${canonicalParams((v as Record<string, unknown>)[k])}`)
      .join(",")}}`;
  return JSON.stringify(v ?? null);
}
