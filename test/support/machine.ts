/**
 * How much slower than a quiet 4-core machine this one is right now: timeouts for process
 * start-up and for waiting on other processes are multiplied by it, so the suite passes on a
 * loaded 2-core machine without fixed generous timeouts everywhere. Between 1 and 4.
 */
import { availableParallelism, loadavg } from "node:os";

export function machineFactor(): number {
  const cores = availableParallelism();
  const load = loadavg()[0]! / cores; // 1 = every core busy on average over the last minute
  return Math.min(4, Math.max(1, 4 / cores, load));
}

/** `ms` on a quiet 4-core machine, scaled to this one. */
export const scaled = (ms: number): number => Math.round(ms * machineFactor());
