export { defineAction, describeError, parseArgs } from "./action.js";
export type { Action, ActionDefinition, Capabilities, Classification, OperationContext, ReconcileResult } from "./action.js";
export { canonicalJson, sha256 } from "./canonical.js";
export type { Json } from "./canonical.js";
export {
  ArgsMismatchError, CompletionNotRecordedError, GuardrailError, IdemError, InvalidTransitionError, InvalidValueError, LedgerConfigError,
  LedgerUnavailableError, OperationNotFoundError, PayloadTooLargeError, UnknownActionError,
} from "./errors.js";
export { operationKey, sensitive } from "./keys.js";
export type { KeyPart, OperationKey, SensitivePart } from "./keys.js";
export { Ledger, openLedger } from "./ledger.js";
export type { LedgerOptions, Operation, OperationEvent, RunInput } from "./ledger.js";
export { DEFAULT_BUDGET, ESCALATED, TAKEOVER_FROM, backoff, checkDelay, decide, nextDelay, recoveryFor, statusAfter } from "./policy.js";
export type { Caller, Decision, Recovery, RetryBudget, Snapshot } from "./policy.js";
export { LeaseDeadlineError } from "./runner.js";
export type { Escalation } from "./runner.js";
export { describeResult } from "./result.js";
export type { RunResult, StoredError } from "./result.js";
export { STATUSES } from "./schema.js";
export type { Status } from "./schema.js";
export type { ListFilter } from "./store.js";
