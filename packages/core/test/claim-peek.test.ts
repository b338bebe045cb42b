/**
 * A key this worker has not seen goes through the claim statement, which on Postgres also reads
 * the row already holding the key, in the same round trip; since issue 16's leaner claim that
 * row's peek comes back packed in one column (a JSON array), so that a fresh claim, the common
 * case, is answered a few columns instead of 22. Whatever the row holds, the answer must be the
 * one a worker that has seen the key gets from its plain read of the row (another statement), on
 * a ledger opened from a URL (the driver's own executor) and from a kysely dialect alike.
 */
import { afterEach, describe, expect, it } from "vitest";
import { defineAction, openLedger, type Ledger, type RunResult } from "@idem/core";
import { DIALECTS } from "@idem/testkit";
import { dialectFor } from "./support/dialects.js";
import { ledgers, uniqueTenant } from "./support/ledgers.js";

/** Text every column that carries words must keep as written: quotes, escapes, a line separator, astral characters, JSON. */
const WORDS = 'naïve "quoted" \\ back\nslash \u2028 ✓ 𝄞 {"json":[1,2]} \'single\'';

for (const dialect of DIALECTS) {
  describe(`a key this worker has not seen, on ${dialect}`, () => {
    const db = ledgers(dialect);
    const fromDialects: Ledger[] = [];
    afterEach(async () => {
      for (const l of fromDialects.splice(0)) await l.close();
    });

    it("is answered as a worker that has seen it answers: succeeded, failed, running, with a person", async () => {
      let release!: () => void;
      const gate = new Promise<void>((r) => (release = r));
      const done = defineAction({
        type: "peek.done",
        capabilities: {},
        execute: async (a: { n: number }) => ({ words: WORDS, n: a.n, big: 2 ** 52 + 1, none: null }),
      });
      const refused = defineAction({
        type: "peek.refused",
        capabilities: {},
        execute: async (): Promise<{ never: true }> => {
          throw new Error("refused");
        },
        classify: () => ({ kind: "permanent", reason: `refused: ${WORDS}` }),
      });
      const slow = defineAction({
        type: "peek.slow",
        capabilities: {},
        execute: async () => {
          await gate;
          return { late: true };
        },
      });
      // Neither dedupes nor can be looked up: an ambiguous end goes to a person.
      const unclear = defineAction({
        type: "peek.unclear",
        capabilities: {},
        execute: async (): Promise<{ never: true }> => {
          throw new Error("socket hang up");
        },
        classify: () => ({ kind: "ambiguous", reason: `socket hang up: ${WORDS}` }),
      });
      const actions = [done, refused, slow, unclear];
      const seen = await db.open({ actions });
      const tenant = uniqueTenant();
      const calls = [
        () => seen.run(done, { tenant, key: ["done"], args: { n: 1 }, actor: 'agent ✓ 𝄞 "quoted"' }),
        () => seen.run(refused, { tenant, key: ["refused"], args: {} }),
        () => seen.run(unclear, { tenant, key: ["unclear"], args: {} }),
      ];
      for (const call of calls) await call();
      const running = seen.run(slow, { tenant, key: ["slow"], args: {} });
      try {
        await expect.poll(async () => (await seen.admin.list({ tenant, status: "running" })).length).toBe(1);
        // Each key again: from the worker that made it (its plain read), then from two that never saw it.
        const again = (l: Ledger): Promise<RunResult<unknown>>[] => [
          l.run(done, { tenant, key: ["done"], args: { n: 1 } }),
          l.run(refused, { tenant, key: ["refused"], args: {} }),
          l.run(unclear, { tenant, key: ["unclear"], args: {} }),
          l.run(slow, { tenant, key: ["slow"], args: {} }),
        ];
        // A live lease's time left is read at the database's time of each read: the rest is the same.
        const left = (results: RunResult<unknown>[]) =>
          JSON.parse(JSON.stringify(results).replace(/for \d+ ms more/g, "for N ms more")) as unknown;
        const expected = await Promise.all(again(seen));
        expect(expected.map((r) => r.status)).toEqual([
          "succeeded",
          "failed",
          "pending_verification",
          "pending_verification",
        ]);
        expect(expected[0]).toMatchObject({ replayed: true, receipt: { words: WORDS, big: 2 ** 52 + 1, none: null } });
        expect(expected[3]).toMatchObject({ state: "running" });
        const fromUrl = await db.open({ actions });
        const fromDialect = await openLedger(await dialectFor(dialect, db.url(), { max: 2 }), { actions });
        fromDialects.push(fromDialect);
        for (const other of [fromUrl, fromDialect])
          expect(left(await Promise.all(again(other)))).toEqual(left(expected));
      } finally {
        release();
        await running;
      }
    });
  });
}
