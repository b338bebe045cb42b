/**
 * Operation keys come from the business identity of the work: the tenant, the action type and
 * parts such as ["weekly-report", clientId, isoWeek]. Same identity, same key, on any machine and
 * in any release (known vectors are pinned in test/keys.test.ts; changing the derivation is a
 * breaking change). A timestamp or a random value is not an identity: a deliberate resend is a
 * new revision in the parts, hence a new key.
 *
 * Parts wrapped with `sensitive()` are replaced by their SHA-256 before anything is stored, so an
 * email address can identify the work without appearing in the ledger.
 */
import { canonicalJson, sha256, wellFormed } from "./canonical.js";
import { InvalidValueError } from "./errors.js";

const SENSITIVE = Symbol.for("idem.sensitive");

/** A key part that is hashed before it is stored or shown. */
export interface SensitivePart {
  readonly [SENSITIVE]: string;
}

/** What is kept of a sensitive value: `sha256:<hex>` of its canonical JSON (as `sensitive()` keeps a key part). */
export function sensitiveHash(value: unknown): string {
  return `sha256:${sha256(canonicalJson(value, "sensitive part"))}`;
}

/** Marks a key part as sensitive: only `sha256:<hex>` of its canonical JSON is kept. */
export function sensitive(value: unknown): SensitivePart {
  return { [SENSITIVE]: sensitiveHash(value) };
}

export type KeyPart = unknown;

export interface OperationKey {
  /** 64 hex chars; the ledger's unique key with the tenant, and what providers receive. */
  readonly hash: string;
  /** The canonical identity, readable by an operator; sensitive parts appear only hashed. */
  readonly label: string;
  /**
   * The tenant and action type it was derived for (set by `operationKey`). `run` refuses the key
   * for another: its hash names another operation, whose receipt would be replayed to the wrong
   * action. A key made by hand without them is checked once its row is read: an operation of
   * another action is refused too.
   */
  readonly tenant?: string;
  readonly action?: string;
}

/** Version tag inside every hashed identity, so a future derivation cannot collide with this one. */
const KEY_VERSION = "idem.key.v1";
/** The start of every hashed identity: `[` and the version tag, as canonicalJson writes them. */
const KEY_PREFIX = `[${JSON.stringify(KEY_VERSION)},`;

/**
 * Derives the key of an operation. `parts` is a non-empty array of JSON values (objects are
 * canonicalised with sorted keys). Throws `InvalidValueError` for values without a stable form.
 */
export function operationKey(input: { tenant: string; action: string; parts: readonly KeyPart[] }): OperationKey {
  return deriveKey(input, sha256);
}

/**
 * `operationKey`, its identity hashed by `hash` (a SHA-256 of it: the ledger's looks up the
 * identities it hashed recently, `RecentHashes`).
 */
export function deriveKey(
  input: { tenant: string; action: string; parts: readonly KeyPart[] },
  hash: (text: string) => string,
): OperationKey {
  requireName(input.tenant, "tenant");
  requireName(input.action, "action");
  if (!Array.isArray(input.parts) || input.parts.length === 0) {
    throw new InvalidValueError("key", "a key needs at least one part from the business identity of the work");
  }
  // Most parts are strings and numbers: only objects are walked (and given a path to walk with).
  const parts = input.parts.map((p) => (p === null || typeof p !== "object" ? p : unwrapSensitive(p, new Set())));
  const label = canonicalJson(parts, "key");
  // = canonicalJson([KEY_VERSION, tenant, action, parts]): strings are written by JSON.stringify
  // and arrays joined by commas, so the label is reused instead of canonicalising the parts twice.
  const identity = `${KEY_PREFIX}${JSON.stringify(input.tenant)},${JSON.stringify(input.action)},${label}]`;
  return { hash: hash(identity), label, tenant: input.tenant, action: input.action };
}

/**
 * Replaces sensitive parts by their hash, at any depth. What it cannot walk (class instances,
 * cycles) it leaves as it is, for canonicalJson to refuse with the path.
 */
function unwrapSensitive(part: unknown, path: Set<object>): unknown {
  if (part === null || typeof part !== "object" || path.has(part)) return part;
  if (SENSITIVE in part) return (part as SensitivePart)[SENSITIVE];
  const proto = Object.getPrototypeOf(part);
  if (!Array.isArray(part) && proto !== Object.prototype && proto !== null) return part;
  path.add(part);
  try {
    if (Array.isArray(part)) return part.map((v) => unwrapSensitive(v, path));
    return Object.fromEntries(Object.entries(part).map(([k, v]) => [k, unwrapSensitive(v, path)]));
  } finally {
    path.delete(part);
  }
}

/** C0 control characters and DEL: never part of a name. */
// biome-ignore lint/suspicious/noControlCharactersInRegex: matching control characters is this check's purpose
const CONTROL = /[\u0000-\u001f\u007f]/;

/**
 * Tenants, action types and actors are short printable names; an empty one is always a caller bug.
 * They must be well-formed Unicode: an unpaired surrogate (a name cut inside an emoji) has no
 * UTF-8 form, and Postgres would store U+FFFD in its place, so "org-\ud83d" and "org-\ud83e"
 * would become one tenant there and two on SQLite.
 */
export function requireName(value: unknown, what: string): asserts value is string {
  if (typeof value !== "string" || value.length === 0 || value.length > 200 || CONTROL.test(value)) {
    throw new InvalidValueError(what, `must be a non-empty printable string of at most 200 characters`);
  }
  requireWellFormed(value, what);
}

/** Free text stored as it is (reasons, references): any length up to `max`, but storable the same on both databases. */
export function requireText(value: unknown, what: string, max = 10_000): asserts value is string {
  if (typeof value !== "string" || value.length > max)
    throw new InvalidValueError(what, `must be a string of at most ${max} characters`);
  if (value.includes("\u0000"))
    throw new InvalidValueError(what, "must not contain NUL (U+0000): Postgres cannot store it");
  requireWellFormed(value, what);
}

const LONE_SURROGATE = /\p{Cs}/u; // not global: exec keeps no state between calls

/** Refuses unpaired UTF-16 surrogates (in `u` mode a surrogate pair is one code point, so only lone halves match). */
export function requireWellFormed(value: string, what: string): void {
  if (wellFormed(value)) return;
  const lone = LONE_SURROGATE.exec(value);
  if (lone)
    throw new InvalidValueError(
      what,
      `is not well-formed Unicode: an unpaired surrogate at index ${lone.index} (a string cut inside a character?)`,
    );
}

/** A count or a duration in ms given to an operator's or the daemon's call: a whole number ≥ `min`. */
export function requireWhole(n: unknown, what: string, min: number): asserts n is number {
  if (!(Number.isInteger(n) && (n as number) >= min))
    throw new InvalidValueError(what, `must be a whole number ≥ ${min}`);
}

/** One tenant's name, or a list of them (an operator's tenants), each checked as `requireName` does. */
export function requireTenants(tenant: string | readonly string[], what = "tenant"): void {
  if (typeof tenant === "string") requireName(tenant, what);
  else for (const [i, t] of tenant.entries()) requireName(t, `${what}[${i}]`);
}
