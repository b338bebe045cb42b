/**
 * Canonical JSON: one byte string per value, whatever the machine, process or release, so that
 * hashes of keys and args compare across them. Object keys are sorted by UTF-16 code units;
 * arrays keep their order; numbers use JavaScript's shortest round-trip form.
 *
 * A field whose value is undefined is left out, as JSON.stringify does, so `{ note: undefined }`
 * (an optional field a schema or a model left unset) hashes like `{}`. Elsewhere undefined is
 * refused: in an array it would silently become null.
 *
 * Refused (with the path of the offending value): undefined (outside object fields), NaN and ±Infinity, BigInt,
 * functions, symbols, Dates and other class instances (their JSON form depends on time zones or
 * toJSON methods), cycles, and strings that are not well-formed Unicode (an unpaired surrogate
 * has no UTF-8 form: a provider, or Postgres, would receive U+FFFD in its place, so two values
 * that hash apart would arrive as one). A caller who means a date passes its ISO string on purpose.
 */
import * as crypto from "node:crypto";
import { InvalidValueError } from "./errors.js";

const LONE_SURROGATE = /\p{Cs}/u;

/**
 * Whether a string has no unpaired surrogate: `String.prototype.isWellFormed` (ES2024, in Node
 * 20's V8; about half the time of the regular expression), else the expression.
 */
export const wellFormed: (text: string) => boolean =
  typeof (String.prototype as { isWellFormed?: unknown }).isWellFormed === "function"
    ? (text) => (text as string & { isWellFormed(): boolean }).isWellFormed()
    : (text) => !LONE_SURROGATE.test(text);

export type Json = null | boolean | number | string | Json[] | { [key: string]: Json };

/** Canonical JSON text of `value`; throws `InvalidValueError` naming the path of a bad value. */
export function canonicalJson(value: unknown, root = "value"): string {
  return write(value, [root], new Set());
}

/** The path of the value being written, joined only when it is reported (every call hashes). */
type Path = (string | number)[];
const pathText = (path: Path) =>
  path.map((p, i) => (i === 0 ? p : typeof p === "number" ? `[${p}]` : `.${p}`)).join("");
const refuse = (path: Path, reason: string): never => {
  throw new InvalidValueError(pathText(path), reason);
};

function write(value: unknown, path: Path, seen: Set<object>): string {
  switch (typeof value) {
    case "string":
      if (!wellFormed(value))
        refuse(path, "is not well-formed Unicode (an unpaired surrogate: a string cut inside a character?)");
      return JSON.stringify(value);
    case "boolean":
      return value ? "true" : "false";
    case "number":
      if (!Number.isFinite(value)) refuse(path, `${value} is not a JSON number`);
      // JSON writes a finite number as String does (half the time); -0 and 0 are one key.
      return value === 0 ? "0" : String(value);
    case "undefined":
      return refuse(path, "undefined has no stable JSON form in an array or as a whole value; use null");
    case "bigint":
      return refuse(path, "BigInt is not JSON; pass it as a string");
    case "function":
    case "symbol":
      return refuse(path, `a ${typeof value} cannot be stored or hashed`);
    case "object":
      break;
  }
  if (value === null) return "null";
  const obj = value as object;
  if (seen.has(obj)) refuse(path, "cycle: the value contains itself");
  seen.add(obj);
  try {
    if (Array.isArray(obj)) {
      let out = "[";
      for (let i = 0; i < obj.length; i++) {
        path.push(i);
        out += (i === 0 ? "" : ",") + write(obj[i], path, seen);
        path.pop();
      }
      return `${out}]`;
    }
    const proto = Object.getPrototypeOf(obj);
    if (proto !== Object.prototype && proto !== null) {
      refuse(
        path,
        `a ${obj.constructor?.name ?? "object"} instance has no stable JSON form; pass plain data (e.g. an ISO string)`,
      );
    }
    if (Object.getOwnPropertySymbols(obj).length > 0)
      refuse(path, "symbol-keyed properties cannot be stored or hashed");
    const record = obj as Record<string, unknown>;
    const own = Object.keys(record);
    const keys: string[] = [];
    for (let i = 0; i < own.length; i++) if (record[own[i]!] !== undefined) keys.push(own[i]!);
    keys.sort();
    let out = "{";
    for (let i = 0; i < keys.length; i++) {
      const k = keys[i]!;
      path.push(k);
      if (!wellFormed(k)) refuse(path, "the field name is not well-formed Unicode (an unpaired surrogate)");
      out += `${i === 0 ? "" : ","}${JSON.stringify(k)}:${write(record[k], path, seen)}`;
      path.pop();
    }
    return `${out}}`;
  } finally {
    seen.delete(obj);
  }
}

/** Hex SHA-256 of a string. */
export function sha256(text: string): string {
  // crypto.hash (Node >= 20.12) skips the Hash object: a third of the cost for short inputs.
  return typeof crypto.hash === "function"
    ? crypto.hash("sha256", text, "hex")
    : crypto.createHash("sha256").update(text).digest("hex");
}

/**
 * `sha256` of texts that come back: a retry's key identity and args, hashed again on every call.
 * The hashes of the texts hashed most recently (the last `size` distinct ones at least, twice as
 * many at most, in two generations as Store's RecentKeys) are looked up instead. A hash costs
 * about 0.45 µs even of a short text (the call into OpenSSL), the key's and the args' together a
 * seventh of a SQLite replay (issue 16); a lookup from next to nothing (a short text) to about
 * 0.25 µs (an 80-character key identity, a string built anew by each call). A text is its own
 * key, so the answer is the hash of exactly that text, as sha256 gives it. Texts longer than
 * `maxLength` are hashed every time: the memory stays bounded, and their hash is a smaller part of
 * their call.
 */
export class RecentHashes {
  private young = new Map<string, string>();
  private old = new Map<string, string>();

  constructor(
    private readonly size: number,
    private readonly maxLength: number,
  ) {}

  sha256(text: string): string {
    if (text.length > this.maxLength) return sha256(text);
    let hash = this.young.get(text);
    if (hash !== undefined) return hash;
    hash = this.old.get(text) ?? sha256(text);
    this.young.set(text, hash);
    if (this.young.size >= this.size) {
      this.old = this.young;
      this.young = new Map();
    }
    return hash;
  }
}
