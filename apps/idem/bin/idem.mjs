#!/usr/bin/env node
// The published entry: the compiled CLI. In this repository, run `pnpm idem …` (sources via tsx).
await import("../dist/bin.js");
