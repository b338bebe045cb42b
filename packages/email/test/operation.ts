/**
 * An operation as the runner hands it to an email action (`execute`, `reconcile`), for the tests
 * that call an action directly: a fresh key, attempt 1; `now` is the database's time, not ours.
 */
import { randomBytes } from "node:crypto";
import type { OperationContext } from "@idem/core";

export function op(
  t: { lastAttemptAt: number; now: number },
  signal: AbortSignal = new AbortController().signal,
): OperationContext {
  const key = randomBytes(32).toString("hex");
  return {
    id: `op_${key.slice(0, 8)}`,
    tenant: "t",
    key,
    keyLabel: null,
    attempt: 1,
    createdAt: t.lastAttemptAt,
    lastAttemptAt: t.lastAttemptAt,
    now: t.now,
    providerReference: null,
    signal,
  };
}

/** An operation just begun. */
export const fresh = (signal?: AbortSignal): OperationContext =>
  op({ lastAttemptAt: Date.now(), now: Date.now() }, signal);
