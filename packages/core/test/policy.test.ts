import { describe, expect, it } from "vitest";
import { DEFAULT_BUDGET, nextDelay, recoveryFor, statusAfter } from "@idem/core";

const HOUR = 3_600_000;

describe("recoveryFor (the replay policy table)", () => {
  const stripeLike = { dedupe: { retentionMs: 24 * HOUR }, lookup: true };
  it("replays with the same key while the provider retains it (minus the margin)", () => {
    expect(recoveryFor(stripeLike, 0, 22 * HOUR).kind).toBe("replay");
    expect(recoveryFor({ dedupe: { retentionMs: 24 * HOUR } }, 0, 22 * HOUR).kind).toBe("replay");
  });
  it("looks the effect up once the key retention (with its margin) has passed", () => {
    expect(recoveryFor(stripeLike, 0, 23.5 * HOUR).kind).toBe("reconcile");
    expect(recoveryFor(stripeLike, 0, 30 * HOUR).kind).toBe("reconcile");
  });
  it("honours a custom margin", () => {
    expect(recoveryFor({ dedupe: { retentionMs: 10_000, marginMs: 1_000 } }, 0, 8_999).kind).toBe("replay");
    expect(recoveryFor({ dedupe: { retentionMs: 10_000, marginMs: 1_000 } }, 0, 9_000).kind).toBe("review");
  });
  it("looks the effect up instead of replaying when the provider saved an error under the key", () => {
    expect(recoveryFor(stripeLike, 0, HOUR, { replayable: false }).kind).toBe("reconcile");
    expect(recoveryFor({ dedupe: { retentionMs: 24 * HOUR } }, 0, HOUR, { replayable: false }).kind).toBe("review");
    expect(recoveryFor(stripeLike, 0, HOUR, { replayable: true }).kind).toBe("replay");
  });
  it("reconciles a provider that can only be queried", () => {
    expect(recoveryFor({ lookup: true }, 0, 1).kind).toBe("reconcile");
  });
  it("sends to review when the provider neither dedupes nor can be queried", () => {
    expect(recoveryFor({}, 0, 1).kind).toBe("review");
    expect(recoveryFor({ dedupe: { retentionMs: HOUR * 24 } }, 0, 48 * HOUR).kind).toBe("review");
  });
});

describe("statusAfter (failure classes)", () => {
  it.each([
    ["rejected", "failed"],
    ["permanent", "failed"],
    ["rate_limited", "pending"],
    ["transient", "pending"],
    ["ambiguous", "unknown"],
  ] as const)("%s leaves the operation %s", (kind, status) => {
    const cls = kind === "rate_limited" ? { kind, reason: "r", retryAfterMs: 1 } : { kind, reason: "r" };
    expect(statusAfter(cls)).toBe(status);
  });
});

describe("nextDelay (retry budget)", () => {
  const budget = { ...DEFAULT_BUDGET, attempts: 4, elapsedMs: 1_000, baseDelayMs: 100, maxDelayMs: 300 };
  it("backs off exponentially, capped", () => {
    expect([1, 2, 3].map((n) => nextDelay(budget, n, 0))).toEqual([100, 200, 300]);
  });
  it("stops after the attempts", () => {
    expect(nextDelay(budget, 4, 0)).toBeNull();
  });
  it("stops when the wait would pass the elapsed budget", () => {
    expect(nextDelay(budget, 1, 950)).toBeNull();
  });
  it("waits as long as the provider says, never shorter", () => {
    expect(nextDelay(budget, 1, 0, 700)).toBe(700);
    expect(nextDelay(budget, 1, 0, 2_000)).toBeNull();
  });
});
