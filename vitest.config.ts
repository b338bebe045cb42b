import { defineConfig } from "vitest/config";
import { machineFactor } from "./test/support/machine.js";

// Per-test and hook timeouts are for a quiet 4-core machine; a loaded 2-core one gets more.
const factor = machineFactor();

export default defineConfig({
  resolve: {
    // Workspace packages resolve to their TypeScript sources (see tsconfig.base.json).
    conditions: ["idem-source"],
  },
  ssr: { resolve: { conditions: ["idem-source"] } },
  test: {
    include: ["packages/*/test/**/*.test.ts", "apps/*/test/**/*.test.ts", "test/**/*.test.ts"],
    globalSetup: ["./test/support/global-setup.ts"],
    pool: "forks",
    // One file at a time: the race, crash and daemon suites spawn dozens of processes each and
    // measure timeouts and leases; two such files side by side on two cores starve each other.
    maxWorkers: 1,
    testTimeout: Math.round(60_000 * factor),
    hookTimeout: Math.round(60_000 * factor),
  },
});
