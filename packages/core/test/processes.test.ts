/**
 * Separate processes against one ledger: 64 racing one key, and a worker SIGKILLed inside the
 * action after its effect. Effects are counted at the target (a file), not in the ledger.
 */
import { describe, expect, it } from "vitest";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { setTimeout as sleep } from "node:timers/promises";
import { DIALECTS, kill9, scaled, startChild, tempDir } from "@idem/testkit";
import { defineAction, operationKey } from "@idem/core";
import { ledgers, uniqueTenant } from "./support/ledgers.js";
import { effectLines, fileAction, type ProviderKind } from "./support/file-provider.js";

const WORKER = fileURLToPath(new URL("./children/worker.ts", import.meta.url));
const RACERS = 64;

for (const dialect of DIALECTS) {
  describe(`separate processes on ${dialect}`, () => {
    const db = ledgers(dialect);

    it(
      `${RACERS} workers racing one key: one effect, one receipt for all`,
      async () => {
        const ledger = await db.open(); // migrates before the workers start
        const tenant = uniqueTenant();
        const file = join(tempDir(), "effects");
        const env = {
          LEDGER_URL: db.url(),
          TENANT: tenant,
          KEY: "race",
          EFFECT_FILE: file,
          KIND: "neither",
          LEASE_MS: "10000",
          MODE: "race",
        };
        const children = Array.from({ length: RACERS }, () => startChild(WORKER, [], env));
        await Promise.all(children.map((c) => c.waitFor(/^ready$/, 90_000)));
        for (const c of children) c.send("go");
        const results = await Promise.all(
          children.map(async (c) => JSON.parse((await c.waitFor(/^result /, 90_000)).slice(7))),
        );
        await Promise.all(children.map((c) => c.exited));

        const effects = effectLines(file);
        expect(effects).toHaveLength(1);
        const statuses = results.map((r) => `${r.status}:${r.replayed}`);
        expect(statuses.filter((s) => s === "succeeded:false")).toHaveLength(1);
        expect(statuses.filter((s) => s === "succeeded:true")).toHaveLength(RACERS - 1);
        expect(new Set(results.map((r) => r.receipt.id))).toEqual(new Set([effects[0]!.id]));
        expect(new Set(results.map((r) => r.operationId)).size).toBe(1);
        const [op] = await ledger.admin.list({ tenant });
        expect(op).toMatchObject({ status: "succeeded", attempt: 1 });
      },
      scaled(180_000),
    );

    it(
      "64 callers in one process SIGKILLed mid-flight: every effect has its claim in the ledger, every answer its commit, and each key ends with one effect",
      async () => {
        const ledger = await db.open();
        const tenant = uniqueTenant();
        const file = join(tempDir(), "effects");
        const leaseMs = 1_500;
        const child = startChild(WORKER, [], {
          LEDGER_URL: db.url(),
          TENANT: tenant,
          KEY: "job",
          EFFECT_FILE: file,
          KIND: "lookup",
          LEASE_MS: String(leaseMs),
          MODE: "flight",
        });
        await child.waitFor(/^flying$/, 90_000);
        await kill9(child); // wherever it is: inside a shared commit, between a claim and its effect, …

        const rows = await ledger.admin.list({ tenant, limit: 100_000 });
        const byKey = new Map(rows.map((r) => [r.key, r]));
        const effects = effectLines(file);
        expect(effects.length).toBeGreaterThanOrEqual(200);
        // An effect is done only after its claim was answered, which is only after its commit.
        const orphans = effects.filter((e) => !byKey.has(e.key));
        expect(orphans).toEqual([]);
        expect(new Set(effects.map((e) => e.key)).size).toBe(effects.length);
        for (const r of rows) if (r.status === "succeeded") expect(effects.some((e) => e.key === r.key)).toBe(true);
        // A caller told "succeeded" was told so only once the completion was committed.
        const answered = readFileSync(`${file}.answered`, "utf8").split("\n").filter(Boolean);
        expect(answered.length).toBeGreaterThan(0);
        const byId = new Map(rows.map((r) => [r.id, r]));
        for (const line of answered) {
          const [id, status] = line.split(" ");
          expect(status).toBe("succeeded");
          expect(byId.get(id!)?.status).toBe("succeeded");
        }

        // Once the dead worker's leases have run out, every key it claimed is called again.
        await sleep(leaseMs + 200);
        const action = fileAction("lookup", file);
        const keys = await Promise.all(
          rows.map(async (r) => {
            const out = await ledger.run(action, {
              tenant,
              key: JSON.parse(r.keyLabel!) as string[],
              args: { note: "x" },
            });
            expect(out.status).toBe("succeeded");
            return r.key;
          }),
        );
        const after = effectLines(file);
        for (const key of keys) expect(after.filter((e) => e.key === key)).toHaveLength(1);
        expect(after.length).toBe(keys.length);
      },
      scaled(120_000),
    );

    it(
      "64 callers in one process retrying pending operations, SIGKILLed mid-flight: no effect under a takeover the ledger lost, every answer its commit, each key one effect",
      async () => {
        const ledger = await db.open();
        const tenant = uniqueTenant();
        const file = join(tempDir(), "effects");
        const leaseMs = 1_500;
        // The keys the worker's callers go through first, each left pending by a first call (a 503
        // before the send): the worker takes each over (on SQLite in shared commits) and sends.
        const PER_CALLER = 8;
        const refused = defineAction<{ note: string }, { id: string }>({
          type: "file.lookup",
          capabilities: { lookup: true },
          execute: async () => {
            throw new Error("503 before execution");
          },
          classify: () => ({ kind: "transient", reason: "503 before execution" }),
          reconcile: async () => ({ found: false, proof: "absent", reason: "nothing sent" }),
        });
        const keys = Array.from({ length: 64 }, (_, c) =>
          Array.from({ length: PER_CALLER }, (_, n) => `job-${c}-${n}`),
        ).flat();
        for (let i = 0; i < keys.length; i += 64)
          for (const out of await Promise.all(
            keys
              .slice(i, i + 64)
              .map((k) => ledger.run(refused, { tenant, key: [k], args: { note: "x" }, budget: { attempts: 1 } })),
          ))
            expect(out).toMatchObject({ status: "pending_verification", state: "pending" });
        const child = startChild(WORKER, [], {
          LEDGER_URL: db.url(),
          TENANT: tenant,
          KEY: "job",
          EFFECT_FILE: file,
          KIND: "lookup",
          LEASE_MS: String(leaseMs),
          MODE: "flight",
        });
        try {
          await child.waitFor(/^flying$/, 90_000); // the 200th effect: among the pending keys
        } finally {
          await kill9(child); // wherever it is: inside a shared commit, between a takeover and its send, …
        }

        const rows = await ledger.admin.list({ tenant, limit: 100_000 });
        const byKey = new Map(rows.map((r) => [r.key, r]));
        const effects = effectLines(file);
        expect(effects.length).toBeGreaterThanOrEqual(200);
        expect(new Set(effects.map((e) => e.key)).size).toBe(effects.length);
        // An effect was sent only once its takeover was answered, so committed: its row is not
        // "known not done" at the attempt before (which the next caller would send again).
        for (const e of effects) {
          const row = byKey.get(e.key);
          const sentBy = Number(e.id.split("_").at(-1));
          expect(row, e.key).toBeDefined();
          expect(row!.status, e.key).not.toBe("pending");
          expect(row!.attempt, e.key).toBeGreaterThanOrEqual(sentBy);
        }
        const answered = readFileSync(`${file}.answered`, "utf8").split("\n").filter(Boolean);
        expect(answered.length).toBeGreaterThan(0);
        const byId = new Map(rows.map((r) => [r.id, r]));
        for (const line of answered) {
          const [id, status] = line.split(" ");
          expect(status).toBe("succeeded");
          expect(byId.get(id!)?.status).toBe("succeeded");
        }

        // Once the dead worker's leases have run out, every key is called again: one effect each.
        await sleep(leaseMs + 200);
        const action = fileAction("lookup", file);
        await Promise.all(
          rows.map(async (r) => {
            const out = await ledger.run(action, {
              tenant,
              key: JSON.parse(r.keyLabel!) as string[],
              args: { note: "x" },
            });
            expect(out.status).toBe("succeeded");
          }),
        );
        const after = effectLines(file);
        for (const r of rows)
          expect(
            after.filter((e) => e.key === r.key),
            r.key,
          ).toHaveLength(1);
        expect(after.length).toBe(rows.length);
      },
      scaled(120_000),
    );

    const expected: Record<ProviderKind, { status: string; effects: number }> = {
      dedupe: { status: "succeeded", effects: 1 }, // replayed with the same key; the provider answered with the first object
      lookup: { status: "succeeded", effects: 1 }, // reconciled: found by key
      neither: { status: "pending_verification", effects: 1 }, // needs_review, never a second effect
    };
    for (const kind of ["dedupe", "lookup", "neither"] as const) {
      it(
        `SIGKILL after the effect, provider that can ${kind === "neither" ? "neither dedupe nor be queried" : kind}: ${expected[kind].status}, ${expected[kind].effects} effect`,
        async () => {
          const ledger = await db.open();
          const tenant = uniqueTenant();
          const file = join(tempDir(), "effects");
          const leaseMs = 2_000; // long enough that the checks below run inside the dead worker's lease, even under load
          const child = startChild(WORKER, [], {
            LEDGER_URL: db.url(),
            TENANT: tenant,
            KEY: "job-1",
            EFFECT_FILE: file,
            KIND: kind,
            LEASE_MS: String(leaseMs),
            MODE: "crash",
          });
          await child.waitFor(/^effect-done$/);
          await kill9(child);

          const key = operationKey({ tenant, action: `file.${kind}`, parts: ["job-1"] }).hash;
          const [left] = await ledger.admin.list({ tenant });
          expect(left).toMatchObject({ status: "running", attempt: 1, key });
          expect(effectLines(file)).toHaveLength(1);

          // While the dead worker's lease is live, a caller is told "in progress", nothing more.
          const action = fileAction(kind, file);
          const early = await ledger.run(action, { tenant, key: ["job-1"], args: { note: "x" } });
          expect(early).toMatchObject({ status: "pending_verification", state: "running" });

          await sleep(leaseMs + 200);
          const out = await ledger.run(action, { tenant, key: ["job-1"], args: { note: "x" } });
          expect(out.status).toBe(expected[kind].status);
          expect(effectLines(file)).toHaveLength(expected[kind].effects);
          const { operation, events } = await ledger.get({ tenant, id: out.operationId });
          if (kind === "neither") {
            expect(operation.status).toBe("needs_review");
          } else {
            expect(operation).toMatchObject({
              status: "succeeded",
              attempt: 2,
              result: { id: effectLines(file)[0]!.id },
            });
          }
          expect(events[1]).toMatchObject({ from: "running", to: "running", attempt: 2 });
          expect(events[1]!.reason).toMatch(/lease expired/);
        },
        scaled(60_000),
      );
    }
  });
}
