/**
 * Runs past their threshold (`thresholds`: `stuckAfterMs`, or the action's own in `perAction`),
 * for the daemon's stuck alerts and the console's queue. Each threshold is read apart, with its
 * own limit: read once at the least of them, the oldest rows (an action's many long runs, still
 * within its own longer threshold) filled the limit and hid another action's stuck run.
 */
import type { Ledger, Operation, StuckFilter, TenantActions } from "@idem/core";
import type { IdemConfig } from "./config.js";

/** A stuck read's own limit (`ledger.daemon.stuck`'s default). */
const READ_LIMIT = 1_000;

/**
 * Running operations past their threshold, oldest first within each threshold, at most 1,000 a
 * threshold, but for `except` (the daemon's own deliveries, left out before each read's limit);
 * and how many there are in all: a read that filled its limit is counted, so the count is never
 * capped by the rows read.
 */
export async function stuckRunsCounted(
  ledger: Ledger,
  thresholds: IdemConfig["thresholds"],
  except: TenantActions,
): Promise<{ runs: (Operation & { runningForMs: number })[]; count: number }> {
  const answers = await Promise.all(
    stuckReads(thresholds, { limit: READ_LIMIT, except }).map(async (read) => {
      const runs = await ledger.daemon.stuck(read);
      const { limit: _, ...all } = read;
      return { runs, count: runs.length < READ_LIMIT ? runs.length : await ledger.daemon.countStuck(all) };
    }),
  );
  return { runs: answers.flatMap((a) => a.runs), count: answers.reduce((n, a) => n + a.count, 0) };
}

/**
 * The reads `stuckRunsCounted` makes, one a threshold, as `ledger.daemon.stuck` (and
 * `ledger.admin.readAtOnce`, for a page read at once) takes them.
 */
export function stuckReads(
  thresholds: IdemConfig["thresholds"],
  only: {
    readonly limit?: number;
    readonly tenants?: readonly string[];
    readonly action?: string;
    readonly except?: TenantActions;
  } = {},
): StuckFilter[] {
  const own = Object.entries(thresholds.perAction); // names, as the config's schema checks them
  const scope = {
    ...(only.limit !== undefined && { limit: only.limit }),
    ...(only.tenants && { tenants: only.tenants }),
    ...(only.except && { except: only.except }),
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
