/**
 * Runs past their threshold (`thresholds`: `stuckAfterMs`, or the action's own in `perAction`),
 * for the daemon's stuck alerts and the console's queue. Each threshold is read apart, with its
 * own limit: read once at the least of them, the oldest rows (an action's many long runs, still
 * within its own longer threshold) filled the limit and hid another action's stuck run.
 */
import type { Ledger, Operation, StuckFilter } from "@idem/core";
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
  return (await Promise.all(stuckReads(thresholds, only).map((read) => ledger.daemon.stuck(read)))).flat();
}

/**
 * The reads `stuckRuns` makes, one a threshold, as `ledger.daemon.stuck` (and
 * `ledger.admin.readAtOnce`, for a page read at once) takes them.
 */
export function stuckReads(
  thresholds: IdemConfig["thresholds"],
  only: { readonly limit?: number; readonly tenants?: readonly string[]; readonly action?: string } = {},
): StuckFilter[] {
  const own = Object.entries(thresholds.perAction); // names, as the config's schema checks them
  const scope = {
    ...(only.limit !== undefined && { limit: only.limit }),
    ...(only.tenants && { tenants: only.tenants }),
  };
  return [
    ...own
      .filter(([action]) => only.action === undefined || only.action === action)
      .map(([action, olderThanMs]) => ({ ...scope, olderThanMs, action })),
    ...(only.action === undefined || !own.some(([action]) => action === only.action)
      ? [
          {
            ...scope,
            olderThanMs: thresholds.stuckAfterMs,
            ...(only.action !== undefined ? { action: only.action } : { exceptActions: own.map(([a]) => a) }),
          },
        ]
      : []),
  ];
}
