/**
 * Powertools for AWS Lambda idempotency, outside Lambda: `makeIdempotent` around a no-op, its
 * idempotency key taken from the payload's `key` field, records kept by the Redis (cache)
 * persistence layer through one @redis/client connection. No local in-memory cache (the default),
 * so every call, replays included, goes to Redis.
 *
 * Outside Lambda there is no invocation deadline to bound an in-progress record by (Powertools
 * warns on every call without one): a stand-in context gives it 30 s, idem's lease.
 */
import { IdempotencyConfig, makeIdempotent } from "@aws-lambda-powertools/idempotency";
import { CachePersistenceLayer } from "@aws-lambda-powertools/idempotency/cache";
import { createClient } from "@redis/client";
import type { Contestant } from "./harness.js";

/** How long an in-progress record holds its key: idem's default lease. */
const IN_PROGRESS_MS = 30_000;

export async function connectPowertools(redisUrl: string): Promise<Contestant & { close(): Promise<void> }> {
  let executions = 0;
  const client = await createClient({ url: redisUrl }).connect();
  const config = new IdempotencyConfig({ eventKeyJmesPath: "key", useLocalCache: false });
  const lambdaContext = { getRemainingTimeInMillis: () => IN_PROGRESS_MS };
  config.registerLambdaContext(lambdaContext as unknown as Parameters<typeof config.registerLambdaContext>[0]);
  const noop = makeIdempotent(
    async (_payload: { key: string; args: Record<string, never> }) => {
      executions++;
      return { ok: true };
    },
    {
      persistenceStore: new CachePersistenceLayer({ client }),
      config,
      keyPrefix: "bench.noop",
    },
  );
  return {
    name: "Powertools",
    async call(key) {
      const out = await noop({ key, args: {} });
      if (out?.ok !== true) throw new Error(`Powertools answered ${JSON.stringify(out)} for ${key}`);
    },
    executions: () => executions,
    close: async () => {
      await client.quit();
    },
  };
}
