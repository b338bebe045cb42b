export { EVIDENCE_LIMITS, NOT_SENT_CODES, defineAction, neverSent, parseArgs, tlsRefused } from "./action.js";
export type {
  Action,
  ActionDefinition,
  Capabilities,
  Classification,
  Evidence,
  LookupContract,
  OperationContext,
  ReconcileResult,
} from "./action.js";
export type { LedgerAdmin, Resolve, Retry } from "./admin.js";
export type { Escalation } from "./call.js";
export { canonicalJson } from "./canonical.js";
export type { Json } from "./canonical.js";
export type { Closed, Operation, OperationEvent, OperationRef, Seen, Verdict } from "./context.js";
export type { DueOperation, LedgerDaemon, SettleOptions } from "./daemon.js";
export type { TenantActions } from "./store.js";
export {
  ArgsMismatchError,
  CompletionNotRecordedError,
  GuardrailError,
  IdemError,
  InvalidTransitionError,
  ChangedSinceSeenError,
  MigrationWaitError,
  InvalidValueError,
  LeaseDeadlineError,
  LedgerConfigError,
  LedgerUnavailableError,
  NewerLedgerError,
  OperationNotFoundError,
  PayloadTooLargeError,
  UnknownActionError,
} from "./errors.js";
export type { IdemErrorCode } from "./errors.js";
export { operationKey, requireName, sensitive, sensitiveHash } from "./keys.js";
export type { KeyPart, OperationKey, SensitivePart } from "./keys.js";
export { openLedger } from "./ledger.js";
export type { Ledger, LedgerOptions, RunInput } from "./ledger.js";
export { redactUrl } from "./open.js";
export type { ConnectionOptions } from "./open.js";
export { DEFAULT_BUDGET, ESCALATED, ESCALATED_NOT_DONE, isEscalation, spread } from "./policy.js";
export type { RetryBudget } from "./policy.js";
export { isFoundOnRetry } from "./runner.js";
export { isFailureOverruled, isPossiblyTwo, isVerdictOverruled, twoEffectsTold } from "./reasons.js";
export { describeEvidence, describeResult, performedProof } from "./result.js";
export type { Resolution, RunResult, StoredError, Unsettled } from "./result.js";
export { STATUSES } from "./schema.js";
export type { Status } from "./schema.js";
export type { LedgerStats, ListFilter, ReadsAtOnce, StatsRow, StuckFilter, UnsettledStatus } from "./reports.js";
