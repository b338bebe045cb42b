/**
 * Callers in separate processes and a running daemon, all at once, on operations that already
 * exist in each non-fresh state: pending, unknown, running with an expired lease (its worker
 * SIGKILLed), and pending again after a person's `retry` of a needs_review. Every key runs in
 * every racer; providers that dedupe, can be looked up, or neither. Effects are counted at the
 * target (a file), on SQLite and on Postgres.
 */
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import { appendFileSync } from "node:fs";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { defineAction, openLedger, type Capabilities, type Ledger } from "@idem/core";
import { DIALECTS, freshDatabase, kill9, scaled, startChild, tempDir, type Child } from "@idem/testkit";
import { fileAction, lines, type Kind } from "./fixtures/file-actions.js";
import { CLI, CONFIG, until, webhookReceiver } from "./support.js";

const RACER = fileURLToPath(new URL("./fixtures/racer.ts", import.meta.url));
const HOLDER = fileURLToPath(new URL("./fixtures/holder.ts", import.meta.url));
const RACERS = 4;
const PER_KIND = 6;
const KINDS: Kind[] = ["dedupe", "lookup", "neither"];
const CAPS: Record<Kind, Capabilities> = {
  dedupe: { dedupe: { retentionMs: 24 * 3_600_000 } },
  lookup: { lookup: true },
  neither: {},
};
const SETTLED = ["succeeded", "failed", "needs_review"];

/** An action of the same type as the fixtures', that fails as told (for seeding rows). */
function failing(kind: Kind, dir: string, how: "transient" | "ambiguous-after-effect" | "ambiguous-no-effect") {
  return defineAction<{ note: string }, { id: string }>({
    type: `file.${kind}`,
    capabilities: CAPS[kind],
    async execute(_args, op) {
      if (how === "ambiguous-after-effect") appendFileSync(join(dir, "effects"), `${op.key} eff_seed_${op.attempt}\n`);
      throw new Error(how);
    },
    classify: (e) =>
      (e as Error).message === "transient"
        ? { kind: "transient", reason: "503 before execution" }
        : { kind: "ambiguous", reason: "timeout" },
    // The fixtures' lookup; consulted only where the kind declares `lookup`.
    reconcile: fileAction("lookup", dir).reconcile!,
  });
}

type State = "pending" | "unknown" | "expired" | "retried";

for (const dialect of DIALECTS) {
  describe(`existing rows under racing callers and the daemon, ${dialect}`, () => {
    let url = "";
    let ledger: Ledger;
    let hook: Awaited<ReturnType<typeof webhookReceiver>>;
    const children: Child[] = [];
    beforeAll(async () => {
      url = await freshDatabase(dialect);
      ledger = await openLedger(url, { poolSize: 2, budget: { attempts: 1 } });
      hook = await webhookReceiver();
    });
    afterEach(async () => {
      // A failing test must not leave its processes behind.
      for (const c of children.splice(0))
        if (c.proc.exitCode === null && c.proc.signalCode === null) await kill9(c).catch(() => {});
    });
    afterAll(async () => {
      await ledger.close();
      await hook.close();
    });

    const cases: [State, string][] = [
      ["pending", "transient failures left them pending (budget spent)"],
      ["unknown", "timeouts (half after the effect) left them unknown"],
      ["expired", "their worker was SIGKILLed holding the lease (half after the effect)"],
      ["retried", "a person sent them back to pending after needs_review"],
    ];
    for (const [state, how] of cases) {
      it(
        `${state}: ${how}; ${RACERS} racing processes and a daemon: never a second effect`,
        async () => {
          const tenant = `${state}-${Math.random().toString(36).slice(2, 7)}`;
          const dir = tempDir();
          const kinds = state === "retried" ? (["neither"] as Kind[]) : KINDS;
          const keys = kinds.flatMap((kind) =>
            Array.from({ length: PER_KIND }, (_, i) => ({
              kind,
              key: `${kind}-${i}`,
              effect: state !== "pending" && state !== "retried" && i % 2 === 1,
            })),
          );

          if (state === "expired") {
            const holder = startChild(HOLDER, [], {
              LEDGER_URL: url,
              TENANT: tenant,
              EFFECT_DIR: dir,
              KEYS: JSON.stringify(keys.map((k) => [k.kind, k.key, k.effect ? "after" : "before"])),
            });
            children.push(holder);
            await holder.waitFor(/^holding$/, 60_000);
            await kill9(holder);
          } else {
            for (const k of keys) {
              const mode =
                state === "pending" ? "transient" : k.effect ? "ambiguous-after-effect" : "ambiguous-no-effect";
              await ledger.run(failing(k.kind, dir, mode), { tenant, key: [k.key], args: { note: k.key } });
            }
            if (state === "retried") {
              const settler = await openLedger(url, {
                actions: [failing("neither", dir, "ambiguous-no-effect")],
                poolSize: 1,
              });
              for (const op of await ledger.admin.list({ tenant })) {
                expect((await settler.daemon.settle({ tenant, id: op.id, actor: "test" })).status).toBe(
                  "pending_verification",
                );
                await ledger.admin.retry({
                  tenant,
                  id: op.id,
                  actor: "ops@example.com",
                  reason: "checked the provider: not sent",
                });
              }
              await settler.close();
            }
          }
          const seeded = await ledger.admin.list({ tenant, limit: 1_000 });
          // An unknown outcome nothing can check (neither) is handed to a person at once.
          const seededAs = (o: { action: string }) =>
            state === "expired"
              ? "running"
              : state === "retried"
                ? "pending"
                : state === "unknown" && o.action === "file.neither"
                  ? "needs_review"
                  : state;
          expect(seeded.map((o) => o.status)).toEqual(seeded.map(seededAs));
          const before = new Map(keys.map((k) => [k.key, k.effect ? 1 : 0]));

          const env = {
            LEDGER_URL: url,
            TENANT: tenant,
            EFFECT_DIR: dir,
            KEYS: JSON.stringify(keys.map((k) => [k.kind, k.key])),
          };
          const racers = Array.from({ length: RACERS }, (_, i) =>
            startChild(RACER, [], { ...env, SEED: String(i + 1) }),
          );
          children.push(...racers);
          const daemon = startChild(CLI, ["--config", CONFIG, "daemon", "--name", `d-${state}`], {
            LEDGER_URL: url,
            EFFECT_DIR: dir,
            WEBHOOK_URL: hook.url,
          });
          children.push(daemon);
          await Promise.all([
            ...racers.map((r) => r.waitFor(/^ready$/, 90_000)),
            daemon.waitFor(/daemon started/, 90_000),
          ]);
          for (const r of racers) r.send("go");
          await Promise.all(racers.map((r) => r.waitFor(/^result /, 90_000)));
          await until(
            async () => (await ledger.admin.list({ tenant, limit: 1_000 })).every((o) => SETTLED.includes(o.status)),
            90_000,
            "every operation to settle",
          );
          daemon.proc.kill("SIGTERM");
          const stopped = await daemon.exited;
          expect(stopped.code, stopped.stderr).toBe(0);

          const effects = lines(join(dir, "effects"));
          const ops = await ledger.admin.list({ tenant, limit: 1_000 });
          for (const k of keys) {
            const key = ops.find((o) => o.keyLabel === JSON.stringify([k.key]))!;
            const mine = effects.filter((e) => e[0] === key.key);
            const trail = (await ledger.get({ tenant, id: key.id })).events
              .map((e) => `${e.from}>${e.to}@${e.attempt} ${e.actor}`)
              .join(", ");
            expect(mine.length, `${k.key}: ${trail}`).toBeLessThanOrEqual(1);
            if (k.kind === "neither" && state !== "pending" && state !== "retried") {
              // may have committed and nothing can prove it: a person decides, nothing is resent
              expect(key.status, trail).toBe("needs_review");
              expect(mine.length).toBe(before.get(k.key));
            } else {
              expect(key.status, trail).toBe("succeeded");
              expect(mine.length, trail).toBe(1);
              expect(key.result).toEqual({ id: mine[0]![1] });
            }
          }
        },
        scaled(240_000),
      );
    }
  });
}
