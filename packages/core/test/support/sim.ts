/**
 * What the seeded simulations share (interleavings.test.ts, operator-races.test.ts): the seeded
 * generator, the provider's kinds and their capabilities, and which seeds a run takes.
 */
import type { Capabilities, Classification } from "@idem/core";
import type { TestDialect } from "@idem/testkit";

// Virtual times. Leases expire only when the script jumps the clock (real heartbeats never fire:
// the real lease is long). No jump is longer than half the dedupe margin: the margin is what
// absorbs the time between a decision to replay and the request reaching the provider.
export const LEASE_MS = 30_000;
export const RETENTION_MS = 10 * 60_000;
export const MARGIN_MS = 120_000;
export const MAX_JUMP_MS = MARGIN_MS / 2;

/** mulberry32: a small seeded generator, so a seed replays the same script. */
export function rng(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/** A provider's answer, thrown with how it classifies. */
export class Fail extends Error {
  constructor(readonly cls: Classification) {
    super(cls.reason);
  }
}

export type Kind = "dedupe" | "lookup" | "both" | "neither";
export const CAPS: Record<Kind, Capabilities> = {
  dedupe: { dedupe: { retentionMs: RETENTION_MS, marginMs: MARGIN_MS } },
  lookup: { lookup: true },
  both: { dedupe: { retentionMs: RETENTION_MS, marginMs: MARGIN_MS }, lookup: true },
  neither: {},
};
export const dedupes = (kind: Kind) => kind === "dedupe" || kind === "both";

/** The seeds a run takes: `SIM_SEED=n` one, else `SIM_SEEDS` (default `defaults[dialect]`) from `SIM_SEED_FROM` (1). */
export function seedsOf(defaults: Record<TestDialect, number>, dialect: TestDialect) {
  const only = process.env.SIM_SEED === undefined ? undefined : Number(process.env.SIM_SEED);
  const from = Number(process.env.SIM_SEED_FROM ?? 1);
  const seeds = only === undefined ? Number(process.env.SIM_SEEDS ?? defaults[dialect]) : 1;
  return { only, from, seeds };
}
