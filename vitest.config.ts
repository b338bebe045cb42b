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
    // Two cores: two files at a time; the races spawn their own processes.
    maxWorkers: 2,
    testTimeout: 60_000,
    hookTimeout: 60_000,
  },
});
