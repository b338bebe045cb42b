#!/usr/bin/env node
// The published entry: the compiled CLI. In this repository, run `pnpm idem …` (sources via tsx).
const { main } = await import("../dist/cli.js");
process.exitCode = await main(process.argv);
