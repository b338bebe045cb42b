/**
 * The schedule of a failing alert sink (sink-backoff.ts), on a clock the test moves: no wait after
 * a first failure, then doubling from the interval, spread, never past the cap; said once failing,
 * once back. The daemon's use of it against real receivers: alert-sink-backoff.test.ts.
 */
import { describe, expect, it } from "vitest";
import { SINK_BACKOFF_MAX_MS, SinkBackoff } from "../src/sink-backoff.js";
import { capturedLog } from "./support.js";

const capture = () => capturedLog<{ level: number; msg: string; nextTryAt?: string }>();

/** A delivery to the webhook that was not taken, for `reason`. */
const notTaken = (reason = "transient: receiver answered 500; retry budget spent") => ({
  fields: {
    delivery: { status: "pending_verification", state: "pending", reason, operationId: "op_1", attempt: 1 } as const,
  },
  msg: "alert delivery to webhook did not succeed",
});

describe("the backoff of a failing alert sink", () => {
  for (const [name, random] of [
    ["longest", () => 1],
    ["shortest", () => 0],
  ] as const)
    it(`holds a sink back for no time after one failure, then doubling from the interval up to the cap (${name} spread)`, async () => {
      let now = 1_000_000;
      const { log } = capture();
      const backoff = new SinkBackoff(log, 100, async () => now, random);
      const doubling = [0, 200, 400, 800, 1_600, 3_200, 6_400, 12_800, 25_600, 51_200, 102_400, 204_800];
      const longest = [...doubling, ...Array<number>(4).fill(SINK_BACKOFF_MAX_MS)];
      for (const ms of longest.map((ms) => (random() === 1 ? ms : ms / 2))) {
        await backoff.failed("webhook", notTaken());
        const held = async () => (await backoff.heldBack()).has("webhook");
        now += Math.max(0, ms - 1);
        expect({ ms, held: await held() }).toEqual({ ms, held: ms > 0 });
        now += 1;
        expect({ ms, held: await held() }).toEqual({ ms, held: false });
      }
    });

  it("says once that a sink fails and once that it is back; another sink is not held back", async () => {
    const now = 5_000;
    const { log, lines } = capture();
    const backoff = new SinkBackoff(log, 100, async () => now);
    for (let i = 0; i < 5; i++) await backoff.failed("webhook", notTaken());
    expect(await backoff.heldBack()).toEqual(new Set(["webhook"]));
    backoff.took("webhook");
    backoff.took("webhook"); // already back: nothing more to say
    expect(await backoff.heldBack()).toEqual(new Set());
    expect(lines.map((l) => l.msg.split(";")[0]!.split(":")[0])).toEqual([
      "alert delivery to webhook did not succeed",
      "alert sink webhook takes alerts again after 5 failed tries",
    ]);
  });

  it("says at warn, once each, another reason the sink fails for while it keeps failing, with when it is tried next", async () => {
    const now = 5_000;
    const { log, lines } = capture();
    const backoff = new SinkBackoff(
      log,
      100,
      async () => now,
      () => 1,
    );
    const refused = "transient: receiver answered 503, nothing delivered; retry budget spent";
    const unreachable = "transient: receiver not reached (ECONNREFUSED): nothing sent; retry budget spent";
    // Before: every try after the first at debug, whatever it failed for.
    for (const reason of [refused, refused, unreachable, unreachable, refused, "known not done; retried in 4800 ms"])
      await backoff.failed("webhook", notTaken(reason));
    await backoff.failed("webhook", notTaken("known not done; retried in 4700 ms")); // the same wait, later
    expect(lines.map((l) => [l.level, l.msg.split(" (alert delivery")[0]!.split(";")[0], l.nextTryAt])).toEqual([
      [50, "alert delivery to webhook did not succeed", new Date(5_000).toISOString()],
      [
        40,
        "alert sink webhook is still failing, now for another reason: transient: receiver not reached (ECONNREFUSED): nothing sent",
        new Date(5_400).toISOString(),
      ],
      [
        40,
        "alert sink webhook is still failing, now for another reason: known not done",
        new Date(5_000 + 3_200).toISOString(),
      ],
    ]);
  });
});
