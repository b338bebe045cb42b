/**
 * RunResults read from ledger rows, so that the runner, the ledger's reads, the daemon and admin
 * say the same of the same row: a settled row replayed (`replayOf`), an unsettled one reported
 * (`pending`), a person's verdict (`resolutionOf`), and whether a row holds the proof of an effect
 * whose receipt could not be stored (`knownPerformed`). Also the size limit on the args and
 * receipts a row stores (`checkSize`).
 */
import { PayloadTooLargeError } from "./errors.js";
import { performedProof, type Resolution, type RunResult, type StoredError, type Unsettled } from "./result.js";
import type { Row } from "./store.js";

/**
 * How the reason of a person's verdict starts (`admin.resolve`), on the row and in the error of
 * their "failed": what tells their "failed" from the provider's once a reopen voided the verdict.
 */
export const RESOLVED_BY_PERSON = "resolved by a person: ";

export function checkSize(what: "args" | "result", json: string, limit: number, operationId?: string): void {
  const bytes = Buffer.byteLength(json);
  if (bytes > limit) throw new PayloadTooLargeError(what, bytes, limit, operationId);
}

/** The columns the results below are built from. */
type Settled = Pick<Row, "id" | "attempt" | "status">;

/** A settled row's stored outcome, as every later caller gets it (`ledger.status` too). */
export function replayOf<R>(
  row: Settled & Pick<Row, "result_json" | "error_json" | "resolution_json"> & { completed_at?: number | null },
): RunResult<R> {
  // No person's verdict (the usual replay): the result as one object literal; spreading it into
  // another cost a replay more.
  if (row.resolution_json === null)
    return row.status === "failed"
      ? failed<R>(row, JSON.parse(row.error_json!) as StoredError, true)
      : succeeded(row, JSON.parse(row.result_json!) as R, true);
  const resolution = resolutionOf(row);
  const by = resolution === undefined ? {} : { resolution };
  if (row.status === "failed") return { ...failed<R>(row, JSON.parse(row.error_json!) as StoredError, true), ...by };
  // A person may have said "it happened" without a receipt: then there is none to replay.
  if (row.result_json === null && resolution)
    return {
      status: "succeeded",
      receipt: null,
      replayed: true,
      operationId: row.id,
      attempt: row.attempt,
      resolution,
    };
  return { ...succeeded(row, JSON.parse(row.result_json!) as R, true), ...by };
}

/** The stored verdict of a person, if one settled the row; its time is the row's completion. */
export function resolutionOf(
  row: Pick<Row, "resolution_json"> & { completed_at?: number | null; updated_at?: number },
): Resolution | undefined {
  if (row.resolution_json === null) return undefined;
  const stored = JSON.parse(row.resolution_json) as Omit<Resolution, "at">;
  return { ...stored, evidence: stored.evidence ?? null, at: row.completed_at ?? row.updated_at ?? 0 };
}

export function succeeded<R>(row: Settled, receipt: R, replayed: boolean): RunResult<R> {
  return { status: "succeeded", receipt, replayed, operationId: row.id, attempt: row.attempt };
}
export function failed<R>(row: Settled, error: StoredError, replayed: boolean): RunResult<R> {
  return { status: "failed", error, replayed, operationId: row.id, attempt: row.attempt };
}
export function pending<R>(row: Settled, reason: string, performed = false, stalled = false): RunResult<R> {
  // Callers pass unsettled rows only: a settled one is replayed (replayOf), never reported pending.
  return {
    status: "pending_verification",
    state: row.status as Unsettled,
    reason,
    operationId: row.id,
    attempt: row.attempt,
    ...(performed && { performed: true }),
    ...(stalled && { stalled: true }),
  };
}

/**
 * Parked because its receipt could not be stored (`unstorable`): the effect happened. What every
 * reader goes by: the runner (a caller is told it was performed, a second such receipt is a second
 * effect), a mismatch of args, and a person's decision (admin: no retry, no "failed").
 */
export function knownPerformed(row: Pick<Row, "status" | "error_json">): boolean {
  return rowPerformedProof(row) !== undefined;
}

/** The proof on a row whose effect is known performed (result.ts `performedProof`), or undefined. */
export function rowPerformedProof(row: Pick<Row, "status" | "error_json">): StoredError | undefined {
  // Only a row waiting for a person can hold one: no other's error is parsed.
  if (row.status !== "needs_review" || row.error_json === null) return undefined;
  return performedProof({ status: row.status, error: JSON.parse(row.error_json) as StoredError });
}
