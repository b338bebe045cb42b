/**
 * The measuring side of the peers benchmark, in the style of bench/ledger.bench.ts: two
 * contestants side by side in one process, rounds alternating (and the order flipped each round,
 * so drift and warm caches hit both), the median round reported as a ratio idem / peer.
 */

/** One side of a comparison: an idempotent no-op called under a key. */
export interface Contestant {
  readonly name: string;
  /** Calls the no-op under `key` and checks the answer is the no-op's result. */
  call(key: string): Promise<void>;
  /** How many times the no-op itself ran (a replay must not add one). */
  executions(): number;
}

export interface Row {
  peer: string;
  scenario: string;
  idem: number;
  peerRate: number;
  /** idem ops/s divided by the peer's; above 1 means idem is faster. */
  ratio: number;
  /** Ratios of the single rounds, lowest and highest: how much one run can move. */
  roundRatios: [number, number];
  /** The ratio idem must reach, or undefined when the row is only reported. */
  target: number | undefined;
  /** This process's CPU time per call (µs, user + system), medians: the client's own cost. */
  idemCpuUs: number;
  peerCpuUs: number;
}

export function median(xs: readonly number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.floor(s.length / 2)]!;
}

/** Ops per second of `n` calls of `body` (awaited when it answers a promise), one after another. */
export async function rate(n: number, body: (i: number) => unknown): Promise<number> {
  const t0 = process.hrtime.bigint();
  for (let i = 0; i < n; i++) await body(i);
  return n / (Number(process.hrtime.bigint() - t0) / 1e9);
}

/** Ops per second of `workers` loops of `n` calls each, all in flight together. */
export async function concurrentRate(
  workers: number,
  n: number,
  body: (w: number, i: number) => Promise<unknown>,
): Promise<number> {
  const t0 = process.hrtime.bigint();
  await Promise.all(
    Array.from({ length: workers }, async (_, w) => {
      for (let i = 0; i < n; i++) await body(w, i);
    }),
  );
  return (workers * n) / (Number(process.hrtime.bigint() - t0) / 1e9);
}

/**
 * Runs `measure` for idem and the peer `rounds` times each, alternating (idem first in even
 * rounds, the peer first in odd ones), and returns the row of medians.
 */
export async function sideBySide(
  scenario: string,
  rounds: number,
  idem: Contestant,
  peer: Contestant,
  target: number | undefined,
  measure: (c: Contestant, round: number) => Promise<number>,
): Promise<Row> {
  const a: number[] = [];
  const b: number[] = [];
  const cpuA: number[] = [];
  const cpuB: number[] = [];
  // Ops/s as `measure` reports it, and this process's CPU per call over the same stretch.
  const timed = async (c: Contestant, r: number, rates: number[], cpu: number[]) => {
    const [cpu0, t0] = [process.cpuUsage(), process.hrtime.bigint()];
    const opsPerSecond = await measure(c, r);
    const [used, seconds] = [process.cpuUsage(cpu0), Number(process.hrtime.bigint() - t0) / 1e9];
    rates.push(opsPerSecond);
    cpu.push((used.user + used.system) / (opsPerSecond * seconds));
  };
  for (let r = 0; r < rounds; r++) {
    if (r % 2 === 0) {
      await timed(idem, r, a, cpuA);
      await timed(peer, r, b, cpuB);
    } else {
      await timed(peer, r, b, cpuB);
      await timed(idem, r, a, cpuA);
    }
  }
  const perRound = a.map((x, i) => x / b[i]!);
  const row: Row = {
    peer: peer.name,
    scenario,
    idem: median(a),
    peerRate: median(b),
    ratio: median(a) / median(b),
    roundRatios: [Math.min(...perRound), Math.max(...perRound)],
    target,
    idemCpuUs: median(cpuA),
    peerCpuUs: median(cpuB),
  };
  const fmt = (xs: number[]) => xs.map((x) => x.toFixed(0)).join(" ");
  console.log(
    `${peer.name}, ${scenario}: idem ${row.idem.toFixed(0)} ops/s [${fmt(a)}], ${peer.name} ${row.peerRate.toFixed(0)} ops/s [${fmt(b)}], ratio ${row.ratio.toFixed(2)}x; client CPU per call idem ${row.idemCpuUs.toFixed(0)} µs, ${peer.name} ${row.peerCpuUs.toFixed(0)} µs`,
  );
  return row;
}

/** The markdown table of the run; a peer that could not run gets a row saying why. */
export function table(rows: readonly Row[], failures: readonly { peer: string; reason: string }[]): string {
  const lines = [
    "| peer | scenario | idem ops/s | peer ops/s | ratio (idem / peer) | rounds' ratios | target | client CPU per call, idem / peer |",
    "| --- | --- | --- | --- | --- | --- | --- | --- |",
  ];
  for (const r of rows) {
    const target =
      r.target === undefined ? "(none: reported)" : `>= ${r.target}x: ${r.ratio >= r.target ? "met" : "**missed**"}`;
    lines.push(
      `| ${r.peer} | ${r.scenario} | ${r.idem.toFixed(0)} | ${r.peerRate.toFixed(0)} | ${r.ratio.toFixed(2)}x | ${r.roundRatios[0].toFixed(2)}-${r.roundRatios[1].toFixed(2)}x | ${target} | ${r.idemCpuUs.toFixed(0)} µs / ${r.peerCpuUs.toFixed(0)} µs |`,
    );
  }
  for (const f of failures) lines.push(`| ${f.peer} | could not run: ${f.reason.replaceAll("|", "/")} | | | | | | |`);
  return lines.join("\n");
}
