import { defineConfig } from "vitest/config";

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
    testTimeout: 60_000,
    hookTimeout: 60_000,
  },
});
