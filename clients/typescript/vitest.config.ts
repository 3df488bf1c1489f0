import { defineConfig } from "vitest/config";

export default defineConfig({
  test: {
    include: ["test/**/*.test.ts"],
    testTimeout: 60_000,
    hookTimeout: 120_000,
    // The end-to-end tests start servers; the machine may be small.
    fileParallelism: false,
  },
});
