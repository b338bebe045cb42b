export { guard } from "./guard.js";
export type { GuardOptions, Guarded, ToolCall } from "./guard.js";
export { outcomeOf, outcomeOfError } from "./outcome.js";
export type { Outcome } from "./outcome.js";
export { STATUS_TOOL, statusTool } from "./status.js";
export type { StatusInput, StatusToolOptions } from "./status.js";
export { defineTool } from "./tool.js";
export type { ToolDefinition } from "./tool.js";
