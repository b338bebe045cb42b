/**
 * `ledger.daemon.heartbeat` on SQLite and Postgres: each beat writes the daemon's row (so a ledger that
 * takes no writes fails the beat, as it fails the agents' claims: apps/idem/test/outage.test.ts
 * fills a disk under a daemon), by the database clock; rows of daemons gone for a week go.
 */
import { describe, expect, it } from "vitest";
import * as core from "@idem/core";
import { InvalidValueError } from "@idem/core";
import { databaseOf } from "@idem/core/testing";
import { DIALECTS } from "@idem/testkit";
import { ledgers } from "./support/ledgers.js";

const DAY = 24 * 3_600_000;

it("is on the daemon's surface (ledger.daemon.heartbeat), not a free function of the package", () => {
  // Never released as a free function (it came after 0.1.0): no deprecated alias to keep.
  expect("daemonHeartbeat" in core).toBe(false);
});

for (const dialect of DIALECTS) {
  describe(`the daemon's heartbeat on ${dialect}`, () => {
    const { open } = ledgers(dialect);
    const rows = async (ledger: Awaited<ReturnType<typeof open>>) =>
      (await databaseOf(ledger).selectFrom("idem_daemons").selectAll().orderBy("name").execute()).map((r) => ({
        name: r.name,
        beatAt: Number(r.beat_at),
        beats: Number(r.beats),
      }));

    it("writes the daemon's row at each beat, by the database clock; other daemons' rows are theirs", async () => {
      let now = 1_000 * DAY;
      const ledger = await open({ clock: () => now });
      await ledger.daemon.heartbeat("d-one");
      await ledger.daemon.heartbeat("d-two");
      now += 1_000;
      await ledger.daemon.heartbeat("d-one");
      // The same instant again: still a write (a page committed), never a no-op that proves nothing.
      await ledger.daemon.heartbeat("d-one");
      expect(await rows(ledger)).toEqual([
        { name: "d-one", beatAt: now, beats: 3 },
        { name: "d-two", beatAt: now - 1_000, beats: 1 },
      ]);
      await expect(ledger.daemon.heartbeat("")).rejects.toThrow(InvalidValueError);
    });

    it("a daemon's first beat removes the rows of daemons not heard from for a week", async () => {
      let now = 2_000 * DAY;
      const ledger = await open({ clock: () => now });
      await ledger.daemon.heartbeat("d-gone");
      await ledger.daemon.heartbeat("d-quiet");
      now += 7 * DAY + 1;
      await ledger.daemon.heartbeat("d-quiet"); // a beat, not its first: nothing removed
      expect((await rows(ledger)).map((r) => r.name)).toEqual(["d-gone", "d-quiet"]);
      await ledger.daemon.heartbeat("d-new");
      expect((await rows(ledger)).map((r) => r.name)).toEqual(["d-new", "d-quiet"]);
    });
  });
}
