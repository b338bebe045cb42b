/**
 * Runs past their threshold (`thresholds`: `stuckAfterMs`, or the action's own in `perAction`),
 * for the daemon's stuck alerts and the console's queue. Each threshold is read apart, with its
 * own limit: read once at the least of them, the oldest rows (an action's many long runs, still
 * within its own longer threshold) filled the limit and hid another action's stuck run.
 */
import type { Ledger, Operation } from "@idem/core";
import type { IdemConfig } from "./config.js";

/**
 * Running operations past their threshold, oldest first within each threshold, at most `limit`
 * a threshold. `tenants`, `action`: only these (as `ledger.daemon.stuck` takes them).
 */
export async function stuckRuns(
  ledger: Ledger,
  thresholds: IdemConfig["thresholds"],
  only: { readonly limit?: number; readonly tenants?: readonly string[]; readonly action?: string } = {},
): Promise<(Operation & { runningForMs: number })[]> {
  const own = Object.entries(thresholds.perAction); // names, as the config's schema checks them
  const scope = {
    ...(only.limit !== undefined && { limit: only.limit }),
    ...(only.tenants && { tenants: only.tenants }),
  };
  const reads = [
    ...own
      .filter(([action]) => only.action === undefined || only.action === action)
      .map(([action, olderThanMs]) => ledger.daemon.stuck({ ...scope, olderThanMs, action })),
    ...(only.action === undefined || !own.some(([action]) => action === only.action)
      ? [
          ledger.daemon.stuck({
            ...scope,
            olderThanMs: thresholds.stuckAfterMs,
            ...(only.action !== undefined ? { action: only.action } : { exceptActions: own.map(([a]) => a) }),
          }),
        ]
      : []),
  ];
  return (await Promise.all(reads)).flat();
}
