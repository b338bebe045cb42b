/**
 * An agent starting up: opens the ledger at LEDGER_URL with migrations on, as `openLedger` does by
 * default. Prints "ready" once loaded and opens on "go" (so that all open at once), then prints
 * "opened" and exits 0; a failed open exits non-zero with the error on stderr.
 */
import { createInterface } from "node:readline";
import { openLedger } from "@idem/core";

const url = process.env.LEDGER_URL;
if (!url) throw new Error("LEDGER_URL is required");
await import("better-sqlite3"); // loaded before "ready", so the opens race on the file and not on module loading
console.log("ready");
const lines = createInterface({ input: process.stdin });
for await (const line of lines) if (line === "go") break;
lines.close();
const ledger = await openLedger(url);
console.log("opened");
await ledger.close();
