export { DIALECTS, freshDatabase, ledgersFor, tempDir } from "./databases.js";
export type { TestDialect } from "./databases.js";
export { kill9, startChild } from "./children.js";
export type { Child } from "./children.js";
export { freePort } from "./ports.js";
export { startPgServer, whileLocked, type PgServer, type StopMode } from "./pg-server.js";
export { machineFactor, scaled } from "./machine.js";
export { untrustedServer, type UntrustedServer } from "./untrusted-tls.js";
export { forward, gatedProxy, type Forwarded, type GatedProxy } from "./gated-proxy.js";
