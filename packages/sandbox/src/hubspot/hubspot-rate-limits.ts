/**
 * The X-HubSpot-RateLimit headers HubSpot sends on its answers (developer changelog 2018-11-06,
 * "Rate limit information headers will be included in HTTP responses"), as its usage guidelines
 * describe them: Max requests per window of Interval-Milliseconds (the ten-secondly rolling
 * window) and Remaining in it; the Secondly pair, deprecated but still sent; Daily and
 * Daily-Remaining for private apps' tokens (OAuth calls have no daily limit and no Daily pair).
 * Counted, not enforced: only the `rate_limit` fault answers 429, and Remaining stays at 0 past
 * the limit meanwhile.
 */
const INTERVAL_MS = 10_000;
const MAX = 100;
const DAILY = 250_000;
const DAY_MS = 86_400_000;

export class RateLimitHeaders {
  private readonly window: number[] = [];
  private day = -1;
  private today = 0;

  constructor(private readonly now: () => number) {}

  /** Counts a request HubSpot answers, and the headers of its answer (`exhausted`: a 429's). */
  count(exhausted = false): Record<string, string> {
    const at = this.now();
    while (this.window.length > 0 && this.window[0]! <= at - INTERVAL_MS) this.window.shift();
    this.window.push(at);
    const day = Math.floor(at / DAY_MS);
    if (day !== this.day) [this.day, this.today] = [day, 0];
    this.today += 1;
    const remaining = exhausted ? 0 : Math.max(0, MAX - this.window.length);
    return {
      "x-hubspot-ratelimit-interval-milliseconds": String(INTERVAL_MS),
      "x-hubspot-ratelimit-max": String(MAX),
      "x-hubspot-ratelimit-remaining": String(remaining),
      "x-hubspot-ratelimit-secondly": String(MAX / 10),
      "x-hubspot-ratelimit-secondly-remaining": String(Math.ceil(remaining / 10)),
      "x-hubspot-ratelimit-daily": String(DAILY),
      "x-hubspot-ratelimit-daily-remaining": String(Math.max(0, DAILY - this.today)),
    };
  }
}
