/**
 * The interleaving of interleavings.test.ts's seed 154, without its schedule: attempt 1's request is
 * out past its lease; attempt 2 replays it under the same key (the provider dedupes), reaches the
 * provider first and is refused for good, so the operation fails and its callers are told "failed"
 * (a replay too); then attempt 1's request commits and its receipt arrives. The receipt proves
 * the effect: the operation succeeds with it, one effect at the provider, and a person is alerted
 * that a "failed" its callers were told is overruled: a caller (a model) may have acted on it,
 * sending the same work again under another key. Before: settled silently (helper-226's finding).
 * A person's "failed" overruled is its own alert (verdict-overruled-late.test.ts). Both databases.
 */
import { describe, expect, it } from "vitest";
import { sql } from "kysely";
import { defineAction, isFailureOverruled, type Ledger } from "@idem/core";
import { databaseOf } from "@idem/core/testing";
import { DIALECTS } from "@idem/testkit";
import { ledgers, uniqueTenant } from "./support/ledgers.js";

const HOUR = 3_600_000;
/** How the reason starts: the daemon tells its alert (`failure_overruled`) by it. */
const FAILURE_OVERRULED = 'a "failed" replayed to its callers is overruled: ';

class Refused extends Error {}

/**
 * A provider that dedupes on our key: the first request holds until released, then commits (or is
 * answered the key's effect); the second is refused at once (validation), having found no effect.
 */
function provider(type: string) {
  const effects: { key: string; id: string }[] = [];
  let out!: () => void;
  const sent = new Promise<void>((r) => (out = r));
  let release!: () => void;
  const gate = new Promise<void>((r) => (release = r));
  let calls = 0;
  const action = defineAction<{ to: string }, { id: string }>({
    type,
    capabilities: { dedupe: { retentionMs: 24 * HOUR } },
    execute: async (_args, op) => {
      if (++calls > 1) {
        if (effects.some((e) => e.key === op.key)) throw new Error("the test refuses only before the effect");
        throw new Refused("validation: refused");
      }
      out();
      await gate;
      const id = effects.find((e) => e.key === op.key)?.id ?? `obj_${effects.length + 1}`;
      if (!effects.some((e) => e.id === id)) effects.push({ key: op.key, id });
      return { id };
    },
    classify: (e) =>
      e instanceof Refused ? { kind: "permanent", reason: e.message } : { kind: "ambiguous", reason: String(e) },
  });
  return { action, effects, sent, release };
}

async function stored(ledger: Ledger, id: string) {
  const { rows } = await sql<{ status: string; alert_pending: number; reason: string | null }>`
    select status, alert_pending, reason from idem_operations where id = ${id}`.execute(databaseOf(ledger));
  return { status: rows[0]!.status, alertPending: Number(rows[0]!.alert_pending), reason: rows[0]!.reason ?? "" };
}

for (const dialect of DIALECTS) {
  describe(`a provider's "failed" overruled by an earlier attempt's late receipt on ${dialect}`, () => {
    const db = ledgers(dialect);

    it("the replay refused before the earlier request committed: told failed, then the receipt settles it, one effect, alerted", async () => {
      const p = provider("failed.overruled.late");
      const tenant = uniqueTenant();
      const worker = await db.open({ actions: [p.action] });
      // An hour on: attempt 1's lease ran out; the provider still retains the key, so it is replayed.
      const later = await db.open({ clock: () => Date.now() + HOUR, actions: [p.action] });
      const input = { tenant, key: ["late"], args: { to: "x" } };
      const first = worker.run(p.action, input);
      await p.sent;
      expect(await later.run(p.action, input)).toMatchObject({
        status: "failed",
        error: { kind: "permanent", reason: "validation: refused" },
        replayed: false,
        attempt: 2,
      });
      expect(await later.run(p.action, input)).toMatchObject({ status: "failed", replayed: true, attempt: 2 });
      p.release(); // attempt 1's request commits, and its answer arrives
      expect(await first).toMatchObject({ status: "succeeded", receipt: { id: "obj_1" }, attempt: 1 });
      const [row] = await later.admin.list({ tenant });
      expect(await stored(later, row!.id)).toEqual({
        status: "succeeded",
        alertPending: 1,
        reason: `${FAILURE_OVERRULED}attempt 1's receipt proves the effect happened, after attempt 2 failed; a caller told "failed" may have acted on it (the same work sent again under another key, say): a person must check the provider`,
      });
      expect((await later.daemon.alertsDue({ limit: 10 })).map((a) => a.id)).toContain(row!.id);
      expect(await later.run(p.action, input)).toMatchObject({
        status: "succeeded",
        receipt: { id: "obj_1" },
        replayed: true,
      });
      expect(p.effects).toHaveLength(1);
      expect(isFailureOverruled((await stored(later, row!.id)).reason)).toBe(true);
    });
  });
}
