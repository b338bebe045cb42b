/** This package's version, read from its manifest (one level above src/ and dist/). */
import { readFileSync } from "node:fs";

export function packageVersion(): string {
  return (JSON.parse(readFileSync(new URL("../package.json", import.meta.url), "utf8")) as { version: string }).version;
}
