/**
 * The Stripe adapter's settings (`StripeConfig`), refused when the actions are made, naming the
 * setting: an `apiVersion` that is not a Stripe API version (a date that is not on the calendar is
 * well formed, and Stripe refuses it only at the first request, in the middle of a run), and a
 * `searchLagMs` no window can be measured with. No request is sent.
 */
import { describe, expect, it } from "vitest";
import { stripeActions, stripeApiVersionProblem } from "@idem/stripe";

const made = (more: { apiVersion?: string; searchLagMs?: number }) => () =>
  stripeActions({ apiKey: "sk_test_x", ...more });

describe("stripeApiVersionProblem", () => {
  it.each([
    ["a version before Stripe named its releases", "2024-06-20"],
    // stripe-node's README: preview features are asked for in apiVersion (helper-144's review: refused).
    ["a preview feature after the version, as stripe-node documents", "2022-08-01; feature_beta=v3"],
    ["two preview features", "2025-03-31.basil; feature_beta=v3; other_beta=v1"],
    ["a named release", "2025-03-31.basil"],
    ["the 29th of February of a leap year", "2024-02-29"],
    ["the 29th of February of a year divisible by 400", "2000-02-29"],
    ["the last day of a 31-day month", "2023-12-31"],
  ])("takes %s (%s)", (_, version) => {
    expect(stripeApiVersionProblem(version)).toBeUndefined();
  });

  it.each([
    ["a month past December", "2024-13-45", /2024-13-45 is not a calendar date: there is no month 13/],
    ["month 00", "2024-00-10", /2024-00-10 is not a calendar date: there is no month 00/],
    ["a day its month does not have", "2024-02-30", /2024-02-30 is not a calendar date: month 02 of 2024 has 29 days/],
    ["the 29th of February of a common year", "2023-02-29", /month 02 of 2023 has 28 days/],
    ["the 29th of February of a century not divisible by 400", "1900-02-29", /month 02 of 1900 has 28 days/],
    ["day 00", "2024-04-00", /month 04 of 2024 has 30 days/],
    ["the 31st of a 30-day month", "2024-04-31", /month 04 of 2024 has 30 days/],
    ["a named release on a day that does not exist", "2025-02-30.basil", /2025-02-30 is not a calendar date/],
  ])("refuses %s (%s), saying why", (_, version, why) => {
    expect(stripeApiVersionProblem(version)).toMatch(why);
  });

  it.each([
    ["a word", "latest"],
    ["a date not written YYYY-MM-DD", "2019-2-19"],
    ["a release name in capitals", "2025-03-31.Basil"],
    ["another header after it", "2024-06-20\r\nStripe-Account: acct_1"],
    ["nothing", ""],
    ["a preview feature without its version", "2024-06-20; feature_beta"],
  ])("refuses %s as not written as a Stripe API version", (_, version) => {
    expect(stripeApiVersionProblem(version)).toMatch(/^not a Stripe API version: .* \(YYYY-MM-DD/);
  });
});

describe("stripeActions refuses a setting no request could be made with, naming it", () => {
  it("an apiVersion that is not a calendar date or not a Stripe API version", () => {
    // Before: taken, and sent on every request (Stripe: 400 "Invalid Stripe API version").
    for (const apiVersion of ["2024-13-45", "2024-02-30", "2023-02-29.acacia", "latest"])
      expect(made({ apiVersion }), apiVersion).toThrow(/^apiVersion: /);
    expect(made({ apiVersion: "2024-13-45" })).toThrow(RangeError);
    expect(made({ apiVersion: "2024-02-29" })).not.toThrow();
    expect(made({ apiVersion: "2025-03-31.basil" })).not.toThrow();
  });

  it("a searchLagMs that is not a whole number of ms from 0 to 2^31-1", () => {
    // Before: taken; a negative or NaN lag skipped the wait for Search to catch up with a write.
    for (const searchLagMs of [-1, 1.5, Number.NaN, Number.POSITIVE_INFINITY, Number.NEGATIVE_INFINITY, 2 ** 31])
      expect(made({ searchLagMs }), String(searchLagMs)).toThrow(/^searchLagMs must be a whole number of ms/);
    expect(made({ searchLagMs: -1 })).toThrow(RangeError);
    expect(made({ searchLagMs: 0 })).not.toThrow();
    expect(made({ searchLagMs: 2 ** 31 - 1 })).not.toThrow();
  });
});
