/**
 * Which `apiVersion` settings are Stripe API versions, checked before any request: a version that
 * is not one is sent on every request and refused by Stripe at the first (400 "Invalid Stripe API
 * version"), in the middle of a run or of the daemon's replays, where it can only be alerted.
 *
 * Checked: the form, `YYYY-MM-DD` optionally followed by `.<release name>` in lowercase letters
 * (2024-06-20, 2025-03-31.basil), then any preview features (`; feature_beta=v3`), and that the date is a day of the calendar (not 2024-13-45 nor
 * 2024-02-30). Not checked, since it changes with every Stripe release and this package would be
 * wrong the day after one: whether Stripe released that version (a date between two releases, a
 * date after 2024-09-30 without its release's name, a name that is not its date's release).
 * Stripe's refusal of those is a setup error (stripe-classify.ts: permanent, alerted).
 */

/** Preview features follow the version (stripe-node's README: `2022-08-01; feature_beta=v3`). */
const FORM = /^(\d{4})-(\d{2})-(\d{2})(?:\.[a-z]+)?(?:; ?[a-z0-9_]+=v\d+)*$/;

/**
 * What is wrong with `version` as a Stripe API version, or undefined when nothing is (see the
 * module's comment for what is checked). Worded to follow the setting's name:
 * `apiVersion: 2024-02-30 is not a calendar date: month 02 of 2024 has 29 days`.
 */
export function stripeApiVersionProblem(version: string): string | undefined {
  const m = typeof version === "string" ? FORM.exec(version) : null;
  if (!m)
    return `not a Stripe API version: ${JSON.stringify(version)} (YYYY-MM-DD or YYYY-MM-DD.name, as 2024-06-20 or 2025-03-31.basil)`;
  const [, y = "", mm = "", dd = ""] = m;
  const [year, month, day] = [Number(y), Number(mm), Number(dd)];
  const date = `${y}-${mm}-${dd}`;
  if (month < 1 || month > 12) return `${date} is not a calendar date: there is no month ${mm}`;
  const days = daysIn(year, month);
  if (day < 1 || day > days) return `${date} is not a calendar date: month ${mm} of ${y} has ${days} days`;
  return undefined;
}

/** Days of `month` (1 to 12) in `year` of the Gregorian calendar (Date.UTC would read year 0-99 as 1900-1999). */
function daysIn(year: number, month: number): number {
  if (month === 2) return year % 4 === 0 && (year % 100 !== 0 || year % 400 === 0) ? 29 : 28;
  return [4, 6, 9, 11].includes(month) ? 30 : 31;
}
