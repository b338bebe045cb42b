/**
 * A provider stand-in for ledger tests: it counts effects at the target (not in the ledger) and
 * can dedupe on our key or be looked up, like the real providers the adapters talk to. Faults are
 * scripted per call: throw before the effect (no commit) or after it (commit, then the answer is
 * lost).
 */
import {
  defineAction,
  type Action,
  type ActionDefinition,
  type Capabilities,
  type Classification,
  type LookupContract,
} from "@idem/core";

export class ProviderError extends Error {
  constructor(readonly cls: Classification) {
    super(cls.reason);
  }
}

type Fault = { when: "before" | "after"; cls: Classification };

export class TestProvider {
  /** Every effect performed, in order: what the target received. */
  readonly effects: { key: string; args: unknown; id: string }[] = [];
  readonly faults: Fault[] = [];
  calls = 0;
  /** How many lookups were asked (`reconcile` entered). */
  lookups = 0;
  /** Resolves each execute only when released (to hold a lease open). */
  gate: Promise<void> | undefined;
  /** "hang": the lookup never answers, and ignores op.signal (a client with no timeout). */
  lookupAnswer: "real" | "inconclusive" | "never" | "refused" | "hang" = "real";

  /** Resolves once `execute` has been entered `n` times (the worker holds its claim by then). */
  async called(n = 1, timeoutMs = 20_000): Promise<void> {
    const until = Date.now() + timeoutMs;
    while (this.calls < n) {
      if (Date.now() > until)
        throw new Error(`execute was called ${this.calls} times, not ${n}, within ${timeoutMs} ms`);
      await new Promise((r) => setTimeout(r, 5));
    }
  }

  effectsFor(key: string) {
    return this.effects.filter((e) => e.key === key);
  }

  action(type: string, capabilities: Capabilities) {
    type Args = { to: string; n?: number };
    type Receipt = { id: string; replayed?: boolean };
    // `capabilities` is chosen by each test; defineAction still checks lookup has its reconcile.
    return defineAction<Args, Receipt>({
      type,
      capabilities,
      execute: async (args, op) => {
        this.calls += 1;
        const fault = this.faults.shift();
        if (fault?.when === "before") throw new ProviderError(fault.cls);
        if (this.gate) await this.gate;
        let receipt: { id: string; replayed?: boolean };
        const earlier = capabilities.dedupe ? this.effectsFor(op.key)[0] : undefined;
        if (earlier) {
          receipt = { id: earlier.id, replayed: true };
        } else {
          const id = `obj_${this.effects.length + 1}`;
          this.effects.push({ key: op.key, args, id });
          receipt = { id };
        }
        if (fault?.when === "after") throw new ProviderError(fault.cls);
        return receipt;
      },
      classify: (error) => (error instanceof ProviderError ? error.cls : { kind: "ambiguous", reason: String(error) }),
      ...(capabilities.lookup && {
        reconcile: async (_args, op) => {
          this.lookups += 1;
          if (this.lookupAnswer === "inconclusive")
            return { found: false, proof: "inconclusive", reason: "index lags", retryAfterMs: 50 } as const;
          if (this.lookupAnswer === "hang") return new Promise<never>(() => {});
          if (this.lookupAnswer === "refused")
            return { found: false, proof: "refused", reason: "the provider's record shows it declined" } as const;
          if (this.lookupAnswer === "never")
            return { found: false, proof: "never", reason: "copies are appended by the client" } as const;
          const hit = this.effectsFor(op.key)[0];
          return hit
            ? { found: true, receipt: { id: hit.id } }
            : ({ found: false, proof: "absent", reason: "not at the provider" } as const);
        },
      }),
    } as ActionDefinition<Args, Receipt> & LookupContract<Args, Receipt>);
  }
}

/** `action`'s type and lookup, its request held until `answer()`, then answered with `cls` (a later attempt's provider). */
export function answering(action: Action<{ to: string }, { id: string }>, cls: Classification) {
  let answer: () => void = () => {};
  const answered = new Promise<void>((r) => (answer = r));
  let entered: () => void = () => {};
  const sent = new Promise<void>((r) => (entered = r));
  const refusing = defineAction<{ to: string }, { id: string }>({
    type: action.type,
    capabilities: { lookup: true },
    execute: async () => {
      entered();
      await answered;
      throw new ProviderError(cls);
    },
    classify: (e) => (e instanceof ProviderError ? e.cls : { kind: "ambiguous", reason: String(e) }),
    reconcile: action.reconcile!,
  });
  return { action: refusing, sent, answer };
}
