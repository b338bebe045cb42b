export { main, program } from "./cli.js";
export { ConfigError, actionsOf, loadConfig, parseConfig } from "./config.js";
export type { IdemConfig } from "./config.js";
export { Daemon } from "./daemon.js";
export { DaemonMetrics, runResultCounters } from "./metrics.js";
export { alertActions, alertText } from "./alerts.js";
export type { Alert, AlertKind } from "./alerts.js";
