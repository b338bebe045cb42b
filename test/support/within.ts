/**
 * Bounds on a promise's answer, for tests that must not hang when the code under test does: a
 * hang becomes a failure that names what did not answer, not a test that runs out its time. The
 * timer is cleared either way, so a passing test leaves nothing behind.
 */

/** The answer of `promise`, or a rejection naming `what` once `ms` passed without one. */
export async function within<T>(ms: number, what: string, promise: Promise<T>): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const late = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`${what}: no answer within ${ms} ms`)), ms);
  });
  try {
    return await Promise.race([promise, late]);
  } finally {
    clearTimeout(timer);
  }
}

/** The answer of `promise`, or `late` once `ms` passed without one (a test that asserts a wait). */
export async function orLate<T, L>(promise: Promise<T>, ms: number, late: L): Promise<T | L> {
  let timer: NodeJS.Timeout | undefined;
  const after = new Promise<L>((resolve) => {
    timer = setTimeout(() => resolve(late), ms);
  });
  try {
    return await Promise.race([promise, after]);
  } finally {
    clearTimeout(timer);
  }
}
