#!/usr/bin/env node
/** The `idem` command's entry point (the package's `bin` runs the compiled one). */
import { main } from "./cli.js";

process.exitCode = await main(process.argv);
