/**
 * Durations an operator types (`idem ls --older-than`, the console's age filter), read by `ms`:
 * plain milliseconds, or 90s, 10m, 2h, 30d, 1w, 1y. `ms` reads a unit in any case, so `1M` was one
 * minute, where many who type it mean a month (and a month has no fixed length): `M` alone as the
 * unit is refused as ambiguous, never guessed. Whole milliseconds, never negative.
 */
import ms from "ms";

/** A unit of `M` alone, as in `1M` or `6 M`: a minute to `ms`, a month to many. */
const MONTH_OR_MINUTE = /^\s*[\d.]+\s*M\s*$/;

/**
 * The duration in whole milliseconds, or why `text` is none: `ambiguous` (1M) says what to type
 * instead; `unreadable`, not a duration at all, is for each caller to word in its own place.
 */
export function readDuration(text: string): { ms: number } | { problem: string; kind: "ambiguous" | "unreadable" } {
  if (MONTH_OR_MINUTE.test(text))
    return {
      kind: "ambiguous",
      problem: `${text.trim()} is ambiguous: say ${text.replace(/M\s*$/, "").trim()}m for minutes, or days for months (30d)`,
    };
  let n: unknown;
  try {
    n = /^\d+$/.test(text) ? Number(text) : ms(text as ms.StringValue);
  } catch {
    n = undefined; // ms throws on an empty string
  }
  if (typeof n !== "number" || !(n >= 0 && n <= Number.MAX_SAFE_INTEGER))
    return { kind: "unreadable", problem: "must be a duration: milliseconds, or 90s, 10m, 2h, 30d" };
  return { ms: Math.round(n) }; // the ledger compares whole milliseconds (a bigint on Postgres)
}
