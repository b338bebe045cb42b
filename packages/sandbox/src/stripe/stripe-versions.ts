/**
 * Which `Stripe-Version` headers the Stripe sandbox takes. Stripe answers a version it does not
 * know with 400 `invalid_request_error` "Invalid Stripe API version: <the header>", for a version
 * not written as a date (2019-2-19), for a date that was never a release (2022-08-02), and for a
 * release without its name (2024-12-18 for 2024-12-18.acacia), as public reports show. The
 * sandbox does not hold Stripe's list of releases; it takes a version when:
 * - it is `YYYY-MM-DD`, or `YYYY-MM-DD.<name>` in lowercase letters, and the date is a calendar
 *   date (not 2024-13-45 nor 2023-02-30);
 * - the date is from 2011-06-21 (the first version in Stripe's API changelog) to the newest
 *   version the sandbox knows, NEWEST_STRIPE_VERSION (stripe-node's pinned default, so every
 *   request the SDK makes by default is taken; a later date is a version Stripe has not released);
 * - it carries a name exactly when the date is from 2024-09-30 on, the name of the release its
 *   date falls in (RELEASES: 2025-04-30.basil, not 2025-04-30.acacia nor 2024-06-20.basil).
 *
 * Not modelled: a date inside those bounds that was never released (2022-08-02,
 * 2025-04-01.basil) is taken, though Stripe refuses it; beta flags after the version
 * (`2024-06-20; some_beta=v1`) are refused, since the sandbox knows no beta.
 */

/**
 * The newest API version the sandbox knows: stripe-node 23.1.0's pinned default
 * (`Stripe.API_VERSION`). The sandbox's tests fail when the SDK's default moves past it.
 */
export const NEWEST_STRIPE_VERSION = "2026-10-28.endive";

/** The first version in Stripe's API changelog (docs.stripe.com/changelog). */
const FIRST_STRIPE_VERSION = "2011-06-21";

/**
 * Since 2024-09-30.acacia every version names its release, from the release's first version on
 * (docs.stripe.com/api-versions; the pinned versions in stripe-node's CHANGELOG.md). Newest last.
 */
const RELEASES: readonly (readonly [from: string, name: string])[] = [
  ["2024-09-30", "acacia"],
  ["2025-03-31", "basil"],
  ["2025-09-30", "clover"],
  ["2026-03-25", "dahlia"],
  ["2026-09-30", "endive"],
];

/** Whether Stripe, as the sandbox models it (see above), knows `version` as an API version. */
export function isStripeVersion(version: string): boolean {
  const m = /^(\d{4}-\d{2}-\d{2})(?:\.([a-z]+))?$/.exec(version);
  if (!m) return false;
  const [, date = "", name] = m;
  // Date.parse takes 2023-02-30 as March 2nd: the day must read back the same.
  const day = new Date(`${date}T00:00:00Z`);
  if (Number.isNaN(day.getTime()) || day.toISOString().slice(0, 10) !== date) return false;
  if (date < FIRST_STRIPE_VERSION || date > NEWEST_STRIPE_VERSION.slice(0, 10)) return false;
  const release = RELEASES.findLast(([from]) => date >= from);
  return name === release?.[1];
}

/**
 * The first API version that names a payment intent's statuses as they are named now
 * (docs.stripe.com/changelog/2019-02-11/renames-several-statuses-payment-intents): before it,
 * `requires_payment_method` was `requires_source` and `requires_action` was `requires_source_action`.
 */
const INTENT_STATUSES_RENAMED = "2019-02-11";
const OLD_INTENT_STATUS: Readonly<Record<string, string>> = {
  requires_payment_method: "requires_source",
  requires_action: "requires_source_action",
};

/**
 * An answer's body as Stripe renders it under `version` (the request's `Stripe-Version`; none: the
 * account's default, taken as the newest): payment intents, wherever the body holds one (the
 * object, a list's or a search's `data`, a decline's `error.payment_intent`), with their statuses
 * named as that version names them. A copy: the objects kept are not changed. Only the status
 * names are modelled; other fields a version renamed (`next_source_action`) are not.
 */
export function renderedFor(version: string | undefined, body: unknown): unknown {
  if (version === undefined || version.slice(0, 10) >= INTENT_STATUSES_RENAMED) return body;
  const walk = (v: unknown): unknown => {
    if (Array.isArray(v)) return v.map(walk);
    if (v === null || typeof v !== "object") return v;
    const copy = Object.fromEntries(Object.entries(v).map(([k, x]) => [k, walk(x)]));
    const old = copy.object === "payment_intent" ? OLD_INTENT_STATUS[String(copy.status)] : undefined;
    return old ? { ...copy, status: old } : copy;
  };
  return walk(body);
}
