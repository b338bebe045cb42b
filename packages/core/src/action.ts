/**
 * The action contract: what a side effect is, what its provider can do for us, how its errors
 * are classified and how its outcome is looked up. The runner and the daemon decide from these
 * declarations alone, the same way every time (see policy.ts).
 */
import type { StandardSchemaV1 } from "@standard-schema/spec";
import { requireName } from "./keys.js";
import { InvalidValueError, LedgerConfigError } from "./errors.js";

/** What the provider behind an action can do for us. */
export interface Capabilities {
  /**
   * The provider dedupes requests that carry our key, for `retentionMs` after the first one
   * (Stripe: 24 h; counted from `OperationContext.firstSentAt`, not the operation's creation).
   * Inside that window the safe retry is the same request with the same key.
   * `marginMs` (default 1 h) is subtracted so a retry never lands on a key the provider forgot.
   */
  readonly dedupe?: { readonly retentionMs: number; readonly marginMs?: number };
  /**
   * The effect can be looked up (Sent folder by Message-ID, CRM read by external id, search by
   * metadata); `reconcile` must be given. Default false.
   */
  readonly lookup?: boolean;
  /**
   * The effect is harmless to repeat (a log line, a metric): an outcome that cannot be proven (a
   * worker that died mid-request, an unknown answer) is executed again with the same args, rather
   * than sent to a person, who could not check it either and would only be told twice. Never for
   * an effect a person would mind twice (money, a message, a record). Repeating is the whole
   * recovery, so it is declared alone: with `dedupe` or `lookup` (whose key window or lookup would
   * never be used) the action is refused (`LedgerConfigError`). Default false.
   */
  readonly repeatable?: boolean;
}

/**
 * What the provider's answer names, as fields an agent and an operator read without parsing a
 * reason: the provider's ids and codes only (`payment_intent: "pi_…"`, `decline_code:
 * "insufficient_funds"`), never card data, customer content or secrets, since it is stored in
 * the ledger and shown to the model. Bounded: at most `EVIDENCE_LIMITS.entries` entries, each key
 * and value a non-empty string of at most `EVIDENCE_LIMITS.chars` characters, without control,
 * format (bidi) or line-separator characters. An entry outside the bounds is dropped whole (never cut: a cut id names another
 * object, or none), the first ones in the record's order kept, and the failure is recorded
 * anyway, with the count dropped (`StoredError.evidenceDropped`).
 */
export type Evidence = Readonly<Record<string, string>>;

/** The bounds of `Evidence`: how many entries are kept, and how long a key or a value may be. */
export const EVIDENCE_LIMITS = { entries: 8, chars: 200 } as const;

/**
 * The five failure classes of docs/design.md. `classify` maps a thrown error to one of them; an error
 * it does not recognise must be `ambiguous`, because a failure we cannot explain may have
 * committed.
 */
export type Classification =
  /** Caught before anything left the process (invalid input). `failed`, no retry. */
  | { readonly kind: "rejected"; readonly reason: string }
  /**
   * The provider said no for good (validation, auth, policy). `failed`; `alert` for auth/policy.
   * `evidence`: what the answer names (the object it created, its codes), stored with the failure.
   */
  | {
      readonly kind: "permanent";
      readonly reason: string;
      readonly alert?: boolean;
      readonly providerRequestId?: string;
      readonly evidence?: Evidence;
      /**
       * The provider refused what it had taken whole (a mail server's 5xx after the body): a
       * refusal by its word, but some queue the request all the same. A person's retry of it
       * (`admin.retry`) looks the effect up first, as for an outcome that may have committed.
       */
      readonly mayHaveTaken?: boolean;
    }
  /** Rate limited: wait `retryAfterMs` (the provider's signal), then retry the same operation. */
  | {
      readonly kind: "rate_limited";
      readonly reason: string;
      readonly retryAfterMs: number;
      readonly providerRequestId?: string;
    }
  /** Known not to have committed (503 before execution, connection refused): retry with the same key. */
  | {
      readonly kind: "transient";
      readonly reason: string;
      readonly retryAfterMs?: number;
      readonly providerRequestId?: string;
    }
  /**
   * May have committed (timeout or socket closed after the request left): `unknown`, reconcile.
   * `replayable: false` when a replay with the same key can only return this same answer (the
   * provider saved an error under the key): recovery then looks the effect up instead.
   * `retryAfterMs`: the provider asked for a wait before it can be asked again (a rate-limited
   * read that would have told): the first check is no sooner. `alert`: a person must hear of it
   * now (a credential refused the read that would have told), though the outcome stays unknown.
   */
  | {
      readonly kind: "ambiguous";
      readonly reason: string;
      readonly providerRequestId?: string;
      readonly replayable?: boolean;
      readonly retryAfterMs?: number;
      readonly alert?: boolean;
    };

/**
 * Socket error codes of a connection that was never made (refused, unresolvable): no byte of the
 * request left, so nothing can have committed and the class is `transient`. Any other connection
 * error may have happened after the request was sent; see `neverSent` for one that says where.
 */
export const NOT_SENT_CODES: ReadonlySet<string> = new Set(["ECONNREFUSED", "ENOTFOUND", "EAI_AGAIN"]);

/** Unreachable host or network: at connect, nothing left; on an open connection (an ICMP error), after the request. */
const UNREACHABLE_CODES: ReadonlySet<string> = new Set(["EHOSTUNREACH", "ENETUNREACH"]);

/**
 * Whether a socket error proves the request never left: a code of `NOT_SENT_CODES`, or an
 * unreachable host or network reported by the connect itself (`syscall: "connect"`). The same
 * codes on a read or write say nothing of what the server did. Reads `code`, or nodemailer's
 * `originalCode`, and the `syscall` Node's socket errors carry (a client that drops it, as
 * node-fetch does, leaves an unreachable host "may have been sent").
 */
export function neverSent(error: unknown): boolean {
  const e = (error ?? {}) as { code?: unknown; originalCode?: unknown; syscall?: unknown };
  const codes = [e.code, e.originalCode].filter((c): c is string => typeof c === "string");
  if (codes.some((c) => NOT_SENT_CODES.has(c))) return true;
  return e.syscall === "connect" && codes.some((c) => UNREACHABLE_CODES.has(c));
}

/**
 * OpenSSL's certificate verification codes as Node reports them (`err.code`), and Node's own for
 * a name the certificate does not carry: the chain leads to no trusted certificate, or it is not
 * the server's, or not valid now.
 */
const CERTIFICATE_CODES: ReadonlySet<string> = new Set([
  "UNABLE_TO_GET_ISSUER_CERT",
  "UNABLE_TO_GET_ISSUER_CERT_LOCALLY",
  "UNABLE_TO_VERIFY_LEAF_SIGNATURE",
  "UNABLE_TO_DECRYPT_CERT_SIGNATURE",
  "UNABLE_TO_DECODE_ISSUER_PUBLIC_KEY",
  "CERT_SIGNATURE_FAILURE",
  "CERT_NOT_YET_VALID",
  "CERT_HAS_EXPIRED",
  "ERROR_IN_CERT_NOT_BEFORE_FIELD",
  "ERROR_IN_CERT_NOT_AFTER_FIELD",
  "DEPTH_ZERO_SELF_SIGNED_CERT",
  "SELF_SIGNED_CERT_IN_CHAIN",
  "CERT_CHAIN_TOO_LONG",
  "CERT_REVOKED",
  "INVALID_CA",
  "PATH_LENGTH_EXCEEDED",
  "INVALID_PURPOSE",
  "CERT_UNTRUSTED",
  "CERT_REJECTED",
  "HOSTNAME_MISMATCH",
  "ERR_TLS_CERT_ALTNAME_INVALID",
]);

/** No TLS version both sides accept (a `minVersion` above the server's, a server below Node's floor). */
const TLS_VERSION_CODES: ReadonlySet<string> = new Set([
  "ERR_SSL_UNSUPPORTED_PROTOCOL",
  "ERR_SSL_TLSV1_ALERT_PROTOCOL_VERSION",
  "ERR_SSL_NO_PROTOCOLS_AVAILABLE",
]);

/**
 * Whether a connection error is this client refusing the server's TLS: its `certificate` (not
 * trusted, another host's, not valid now) or no TLS `version` in common, with the code; undefined
 * otherwise. The handshake failed before any byte of the request was written, so nothing was
 * sent, and a retry meets the same certificate: a configuration for a person to fix (permanent,
 * with an alert). Reads `code`, or nodemailer's `originalCode`. Not a handshake cut off
 * (ECONNRESET): that may pass.
 */
export function tlsRefused(
  error: unknown,
): { readonly refused: "certificate" | "version"; readonly code: string } | undefined {
  const e = (error ?? {}) as { code?: unknown; originalCode?: unknown };
  for (const code of [e.originalCode, e.code]) {
    if (typeof code !== "string") continue;
    if (CERTIFICATE_CODES.has(code)) return { refused: "certificate", code };
    if (TLS_VERSION_CODES.has(code)) return { refused: "version", code };
  }
  return undefined;
}

/** What a lookup proved. */
export type ReconcileResult<R> =
  /**
   * The effect exists; this is its receipt. `twice`: the lookup found it more than once (copies of
   * two sends, two objects for one key), in words a person can check at the provider. The
   * operation settles with `receipt` all the same (it happened: nothing runs again), alerted as
   * two effects, never in silence.
   */
  | { readonly found: true; readonly receipt: R; readonly twice?: string }
  /** Proven absent (not merely not found): safe to run again with the same key. */
  | { readonly found: false; readonly proof: "absent"; readonly reason: string }
  /** Not found, but that proves nothing yet (search lag, settle window, provider down). */
  | { readonly found: false; readonly proof: "inconclusive"; readonly reason: string; readonly retryAfterMs?: number }
  /** The lookup can never prove absence for this operation (e.g. client-side APPEND): a person decides. */
  | { readonly found: false; readonly proof: "never"; readonly reason: string }
  /**
   * The provider's record shows it refused the request (a card declined at confirmation): its
   * final answer, as if it had answered so. The operation fails, and the failure is replayed.
   * `evidence`: what the record names (the object, its codes), as a permanent answer's.
   */
  | { readonly found: false; readonly proof: "refused"; readonly reason: string; readonly evidence?: Evidence };

/** What an action sees of the operation it performs. */
export interface OperationContext {
  readonly id: string;
  readonly tenant: string;
  /** The key hash: pass it downstream (idempotency key, Message-ID, external id). */
  readonly key: string;
  /** The readable identity, unless the caller kept only the hash. */
  readonly keyLabel: string | null;
  /** Fencing token: increases with every takeover. */
  readonly attempt: number;
  /** When the operation was first claimed (ms since epoch, database clock). */
  readonly createdAt: number;
  /**
   * When the operation's key was first sent (ms since epoch, database clock): the start of the
   * first execution since the operation was last known not done (any effect comes from a request
   * sent since, so a key the provider holds for it is no older). A provider keeps a key for its
   * retention from the first request that carried it (Stripe: 24 h), and an operation may send
   * its first request long after it was created (rate limited, then left pending for a day; a
   * person's retry): measure a key window from here, not from `createdAt`. Where the ledger cannot
   * tell, earlier, never later: `createdAt` on an operation from before it recorded this; an
   * earlier attempt's first send once that attempt's late answer came. For an attempt about to
   * send the first request, `now`. Undefined only from a runner older than this field (or a
   * hand-made context): then use `createdAt`, the earlier time.
   */
  readonly firstSentAt?: number;
  /**
   * The database's time when this attempt took the operation (ms since epoch). Compare it, and
   * only it, with `createdAt`, `firstSentAt` and `lastAttemptAt` (settle windows, key retention,
   * search lag): the process clock (`Date.now()`) may run ahead of or behind the database's.
   */
  readonly now: number;
  /**
   * The latest time an earlier attempt could have performed the effect: when the outcome became
   * unknown, or when a dead worker's lease ran out. A lookup's settle window (search lag, copies
   * that appear late) counts from here. For a first attempt it is the claim time.
   */
  readonly lastAttemptAt: number;
  /**
   * Whether an earlier attempt of this operation may have taken effect: false on its first attempt
   * and on an attempt run from a state known not done (`pending`: refused before any write, proven
   * absent, a person's retry), true on a replay of an outcome that may have committed (a lost
   * answer, a dead worker) and in a lookup. An effect found now, while false, was not made by this
   * operation's earlier requests. Undefined from a runner older than this field (or a hand-made
   * context): then only a first attempt (`attempt === 1`) is known to be the first.
   */
  readonly mayHaveCommitted?: boolean;
  /** The provider reference recorded before the effect, if the action gave one. */
  readonly providerReference: string | null;
  /**
   * Aborted when the lease is lost, when the caller gives up, when a settlement's time bound
   * ends, or when the ledger's `close` stops waiting for this call; pass it to the provider's
   * client. Its reason says which: `LeaseDeadlineError` when the lease could not be renewed in
   * time, a `LedgerUnavailableError` marked `closed` at the close (nothing more is recorded, and
   * the lease is no longer renewed: send nothing after it). An execute that has not
   * answered a second after it aborted (the caller's or the settlement's) is no longer awaited,
   * and its operation is unknown.
   */
  readonly signal: AbortSignal;
}

/** `A`: the args `execute` gets; `I`: what callers pass when an input schema turns it into `A` (defaults, coercions). */
export interface ActionDefinition<A, R, I = A> {
  /** Kind of side effect, e.g. "stripe.paymentIntents.create". Part of every key. */
  readonly type: string;
  readonly capabilities: Capabilities;
  /** Performs the effect once. Must pass `op.key` downstream where the provider accepts one. */
  execute(args: A, op: OperationContext): Promise<R>;
  /** Maps an error thrown by `execute` (or `reconcile`) to a failure class. Default: ambiguous. */
  classify?(error: unknown, op: OperationContext): Classification;
  /**
   * The lookup handle known before the effect (Message-ID, external id), stored on the row before
   * `execute` runs so reconciliation can find the effect after a crash. Kept for good once an
   * attempt may have performed the effect (every later attempt and lookup gets that one); an
   * attempt on an operation known not performed (pending, or never tried) makes and stores its
   * own, so a config corrected since applies.
   */
  providerReference?(args: A, op: Omit<OperationContext, "providerReference" | "signal">): string;
  /** Checks args before anything is claimed; throw to refuse: the call rejects with `InvalidValueError` and the message, nothing is written. */
  validate?(args: A): void;
  /**
   * The args' schema (any Standard Schema: zod, valibot, arktype). Given args are validated with
   * it before anything is claimed, and its output (defaults applied, unknown fields stripped, as
   * the schema says) is what is hashed, stored and executed; a refusal is an `InvalidValueError`
   * naming the field. Agent frameworks use it as the tool's input schema.
   */
  readonly input?: StandardSchemaV1<I, A>;
  /**
   * The receipt's schema. A person who resolves a `needs_review` operation as succeeded may give
   * the receipt they found; it is stored only if this schema accepts it, so every caller replays
   * a receipt of the action's own shape. Without it a person gives evidence, not a receipt.
   */
  readonly receipt?: StandardSchemaV1<unknown, R>;
  /** Looks the effect up. Given exactly when `capabilities.lookup` is true (see `LookupContract`). */
  reconcile?(args: A, op: OperationContext): Promise<ReconcileResult<R>>;
  /**
   * The provider's own id of the effect a receipt describes (Stripe's object id, HubSpot's record
   * id), where each effect gets an id of its own: a second effect would have another. A request's
   * late answer whose receipt differs from the one recorded (a lookup's finding, shaped otherwise)
   * is one effect told twice when their ids are equal, and alerted as a second effect when they
   * are not. Not for an id every attempt shares (a Message-ID set by us, alone: email adds the
   * send, which its copies name): without it, a late answer that differs from the recorded
   * receipt is alerted for a person to check. A lookup's finding of several effects (answered
   * with `twice`, alerted so) gives each one's id: a late answer whose id is among them is one of
   * those, not alerted again.
   */
  effectId?(receipt: R): string | readonly string[] | undefined;
  /**
   * What a person must hear about an effect that happened but not in full (a sent mail whose
   * Sent copy could not be filed, so no lookup can find it), in words: undefined when nothing.
   * Read on the receipt the ledger records as the success (execute's answer, a late one, a
   * lookup's finding): the text becomes the transition's reason and the operation is alerted
   * once (the daemon's `incomplete` alert; two effects, alerted as such, come first in the
   * reason). The agent still reads "done": the receipt is replayed unchanged, and a replay is not
   * alerted again. Not read on a receipt a person records when resolving (they know). Keep it
   * short and free of customer content (its first 500 characters are kept); a hook
   * that throws is said as such, alerted all the same.
   */
  attention?(receipt: R): string | undefined;
}

/**
 * What `defineAction` checks at compile time: an action that declares `lookup: true` must give
 * `reconcile`. (One that gives `reconcile` may compute `lookup`; it is run only when true.)
 */
export type LookupContract<A, R> =
  | { readonly capabilities: { readonly lookup?: false } }
  | { readonly capabilities: Capabilities; reconcile(args: A, op: OperationContext): Promise<ReconcileResult<R>> };

export interface Action<A = unknown, R = unknown, I = A> extends ActionDefinition<A, R, I> {
  readonly classify: (error: unknown, op: OperationContext) => Classification;
}

/** Validates and returns an action; every field is checked once here rather than at each run. */
export function defineAction<A, R, I = A>(
  definition: ActionDefinition<A, R, I> & LookupContract<A, R>,
): Action<A, R, I> {
  requireName(definition.type, "action.type");
  const caps = definition.capabilities ?? {};
  requireCapabilities({ ...definition, capabilities: caps });
  return {
    ...definition,
    capabilities: caps,
    classify: definition.classify ?? defaultClassify,
  };
}

/**
 * Refuses capabilities that contradict the action or each other, with a `LedgerConfigError`
 * naming the action and the fields: a lookup without `reconcile`, a dedupe window that is none,
 * `repeatable` with `dedupe` or `lookup` (recovery repeats it whatever it is: the key window or
 * the lookup declared would never be used, silently). Checked where an action is defined
 * (`defineAction`) and where one is registered (openLedger's `actions`, a hand-made one too),
 * before anything is opened.
 */
export function requireCapabilities(
  action: Pick<ActionDefinition<unknown, unknown>, "type" | "capabilities" | "reconcile">,
): void {
  const caps: Capabilities = action.capabilities ?? {};
  const unused = [caps.dedupe && "dedupe", caps.lookup && "lookup"].filter((f): f is string => typeof f === "string");
  if (caps.repeatable && unused.length > 0)
    throw new LedgerConfigError(
      `action ${action.type}: capabilities.repeatable cannot be declared with ${unused.join(" and ")}: a repeatable effect is run again whatever its outcome, so its ${unused.join(" and ")} would never be used; declare repeatable alone for an effect harmless twice (a log line), or drop it to be recovered by ${unused.join(" and ")}`,
    );
  if (caps.lookup && typeof action.reconcile !== "function")
    throw new LedgerConfigError(`action ${action.type} declares lookup but has no reconcile()`);
  if (caps.dedupe && !(caps.dedupe.retentionMs > 0))
    throw new LedgerConfigError(`action ${action.type}: dedupe.retentionMs must be positive`);
}

/** Validates a value (args by default) with a Standard Schema; returns the schema's output or an `InvalidValueError` naming the field. */
export async function parseArgs<A>(schema: StandardSchemaV1<unknown, A>, value: unknown, root = "args"): Promise<A> {
  return parseArgsNow(schema, value, root);
}

/**
 * `parseArgs`, answered at once when the schema validates synchronously (most do): a retry of a
 * settled operation is then replayed without a promise on the way (Ledger.run). Throws, or answers
 * a promise that rejects, with the same `InvalidValueError`.
 */
export function parseArgsNow<A>(schema: StandardSchemaV1<unknown, A>, value: unknown, root = "args"): A | Promise<A> {
  const result = schema["~standard"].validate(value);
  return result instanceof Promise ? result.then((r) => validated(r, root)) : validated(result, root);
}

function validated<A>(result: StandardSchemaV1.Result<A>, root: string): A {
  if (!result.issues) return result.value;
  const [first] = result.issues;
  const path = (first?.path ?? []).map((p) => (typeof p === "object" ? p.key : p));
  const where = path.reduce<string>((out, p) => out + (typeof p === "number" ? `[${p}]` : `.${String(p)}`), root);
  const more = result.issues.length > 1 ? ` (and ${result.issues.length - 1} more)` : "";
  throw new InvalidValueError(where, `${first?.message ?? "invalid"}${more}`);
}

/** An error the action did not classify may have committed: treat it as ambiguous. */
function defaultClassify(error: unknown): Classification {
  return { kind: "ambiguous", reason: `unclassified error: ${describeError(error)}` };
}

/** An error's name and message, for reasons stored in the ledger (never its stack). */
export function describeError(error: unknown): string {
  if (error instanceof Error) return `${error.name}: ${error.message}`;
  return String(error);
}
