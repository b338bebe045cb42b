/**
 * What an operator is shown, over real HTTP and the CLI as a child process (helper-62's review;
 * the first four tests failed first): the queue's stuck runs scoped before their limit and
 * filtered by age, a live page that ends with its session, `idem show` printing no forged lines.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { rmSync } from "node:fs";
import { Writable } from "node:stream";
import { pino } from "pino";
import { defineAction, openLedger, type Ledger } from "@idem/core";
import { databaseOf } from "@idem/core/testing";
import { DIALECTS, freshDatabase, pgProxy } from "@idem/testkit";
import { parseConfig } from "@idem/cli";
import { serveConsole, type ConsoleServer } from "../src/console/server.js";
import { idem } from "./support.js";

const ALICE = "alice-token-review-0001";
const BOB = "bob-token-review-00000002";

const parked = defineAction({
  type: "sms.parked",
  capabilities: {},
  execute: async () => {
    throw new Error("socket hang up after send");
  },
});
/** A time as the console says it when a change is no more than that. */
const iso = (ms: number) => new Date(ms).toISOString();
const ok = defineAction({ type: "sms.ok", capabilities: {}, execute: async () => ({ ok: true }) });

describe("what an operator is shown", () => {
  let ledger: Ledger;
  let web: ConsoleServer;
  beforeAll(async () => {
    process.env.IDEM_SCOPING_ALICE = ALICE;
    process.env.IDEM_SCOPING_BOB = BOB;
    ledger = await openLedger("sqlite::memory:");
    web = await serveConsole(
      ledger,
      parseConfig({
        ledger: "sqlite::memory:",
        console: {
          port: 0,
          operators: [
            { name: "alice", tokenEnv: "IDEM_SCOPING_ALICE", tenants: "*" },
            { name: "bob", tokenEnv: "IDEM_SCOPING_BOB", tenants: ["t-bob"] },
          ],
        },
      }),
      pino({ level: "silent" }),
    );
  });
  afterAll(async () => {
    await web?.close();
    await ledger?.close();
  });

  let n = 0;
  const session = async (token: string) => {
    const res = await fetch(`${web.url}/login`, {
      method: "POST",
      redirect: "manual",
      headers: {
        origin: web.url,
        "x-forwarded-for": `192.0.2.${++n}`,
        "content-type": "application/x-www-form-urlencoded",
      },
      body: new URLSearchParams({ token }),
    });
    expect(res.status).toBe(303);
    return res.headers.get("set-cookie")!.split(";")[0]!;
  };
  const get = (cookie: string, path: string) => fetch(`${web.url}${path}`, { redirect: "manual", headers: { cookie } });

  /** Makes an operation look like a run in flight since `ageMs` ago (created then too). */
  const running = async (tenant: string, id: string, ageMs: number, createdAgoMs = ageMs) => {
    await databaseOf(ledger)
      .updateTable("idem_operations")
      .set({
        status: "running",
        updated_at: Date.now() - ageMs,
        created_at: Date.now() - createdAgoMs,
        lease_owner: "w",
        lease_expires_at: Date.now() + 3_600_000,
      } as never)
      .where("tenant_id", "=", tenant)
      .where("id", "=", id)
      .execute();
  };

  it("the queue's Older than filter applies to stuck runs too", async () => {
    const fresh = await ledger.run(ok, { tenant: "t-age", key: ["fresh"], args: {} });
    await running("t-age", fresh.operationId, 10 * 60_000); // created and stuck 10 minutes ago
    const cookie = await session(ALICE);
    const unfiltered = await (await get(cookie, "/?tenant=t-age")).text();
    expect(unfiltered).toContain(`data-operation="${fresh.operationId}"`);
    const filtered = await (await get(cookie, "/?tenant=t-age&olderThan=1h")).text();
    expect(filtered).not.toContain(`data-operation="${fresh.operationId}"`);
  });

  it("another tenant's stuck runs do not hide this operator's stuck run from the queue", async () => {
    const mine = await ledger.run(ok, { tenant: "t-bob", key: ["stuck"], args: {} });
    await running("t-bob", mine.operationId, 3_600_000); // stuck for an hour
    const cookie = await session(BOB);
    // Before the other tenant's outage: bob's queue shows it.
    expect(await (await get(cookie, "/?tenant=t-bob")).text()).toContain(`data-operation="${mine.operationId}"`);
    // 1000 runs of another tenant stuck for 2 h (an outage at its provider), older than bob's.
    for (let i = 0; i < 1_000; i++) await ledger.run(ok, { tenant: "noisy", key: ["n", i], args: {} });
    await databaseOf(ledger)
      .updateTable("idem_operations")
      .set({ status: "running", updated_at: Date.now() - 7_200_000, lease_owner: "w" } as never)
      .where("tenant_id", "=", "noisy")
      .execute();
    for (const path of ["/", "/?tenant=t-bob", "/?tenant=t-bob&status=running"]) {
      const page = await (await get(cookie, path)).text();
      expect(page, path).toContain(`data-operation="${mine.operationId}"`);
    }
  });

  it("a live page stops telling an operation's changes once its session is signed out", async () => {
    const op = await ledger.run(parked, { tenant: "t-bob", key: ["live"], args: {} });
    const cookie = await session(BOB);
    const stop = new AbortController();
    const res = await fetch(`${web.url}/op/t-bob/${op.operationId}/live`, { headers: { cookie }, signal: stop.signal });
    expect(res.status).toBe(200);
    const reader = res.body!.getReader();
    const text = new TextDecoder();
    const first = text.decode((await reader.read()).value);
    expect(first).toMatch(/needs_review/);
    // Sign out (the session's cookie is refused from now on).
    const home = await (await get(cookie, "/")).text();
    const csrf = /name="csrf" value="([^"]+)"/.exec(home)![1]!;
    const out = await fetch(`${web.url}/logout`, {
      method: "POST",
      redirect: "manual",
      headers: { cookie, origin: web.url, "content-type": "application/x-www-form-urlencoded" },
      body: new URLSearchParams({ csrf }),
    });
    expect(out.status).toBe(303);
    expect((await get(cookie, "/")).status).toBe(302);
    const { operation: o } = await ledger.get({ tenant: "t-bob", id: op.operationId });
    await ledger.admin.resolve({
      tenant: "t-bob",
      id: o.id,
      outcome: "succeeded",
      reason: "checked",
      actor: "someone",
    });
    const next = await Promise.race([
      reader.read().then((r) => (r.done ? "ended" : text.decode(r.value))),
      new Promise<string>((r) => setTimeout(() => r("quiet"), 3_000)),
    ]);
    stop.abort();
    expect(next).not.toMatch(/succeeded/);
  });

  it("(sound) values from the ledger and the URL are escaped; other tenants are not found", async () => {
    const evil = `x"><script>alert(1)</script>`;
    const op = await ledger.run(parked, { tenant: evil, key: [evil], args: { to: evil } });
    const alice = await session(ALICE);
    const q = await (
      await get(alice, `/?tenant=${encodeURIComponent(evil)}&action=${encodeURIComponent(evil)}`)
    ).text();
    expect(q).not.toContain("<script>alert");
    const page = await (await get(alice, `/op/${encodeURIComponent(evil)}/${op.operationId}`)).text();
    expect(page).toContain(op.operationId);
    expect(page).not.toContain("<script>alert");
    const bob = await session(BOB);
    expect((await get(bob, `/op/${encodeURIComponent(evil)}/${op.operationId}`)).status).toBe(404);
    expect((await get(bob, `/op/t-bob/${op.operationId}`)).status).toBe(404);
    expect((await get(bob, `/op/${encodeURIComponent(evil)}/${op.operationId}/live`)).status).toBe(404);
    const stats = await (await get(bob, `/stats?tenant=${encodeURIComponent(evil)}`)).text();
    expect(stats).not.toContain("<script>");
    expect(stats).toMatch(/0 operations created in the last 24 hours/);
  });

  it("(sound) decisions: other tenants' operations, stale views, forged forms and the bulk redirect's filters", async () => {
    const other = await ledger.run(parked, { tenant: "t-alice", key: ["o"], args: {} });
    const mine = await ledger.run(parked, { tenant: "t-bob", key: ["m"], args: {} });
    const view = async (tenant: string, id: string) => {
      const { operation: o } = await ledger.get({ tenant, id });
      return { status: o.status, attempt: o.attempt, checks: o.checks, updatedAt: o.updatedAt };
    };
    const bob = await session(BOB);
    const csrf = /name="csrf" value="([^"]+)"/.exec(await (await get(bob, "/")).text())![1]!;
    const post = (path: string, fields: [string, string][], headers: Record<string, string> = { origin: web.url }) =>
      fetch(`${web.url}${path}`, {
        method: "POST",
        redirect: "manual",
        headers: { cookie: bob, "content-type": "application/x-www-form-urlencoded", ...headers },
        body: new URLSearchParams(fields),
      });
    const decision: [string, string][] = [
      ["outcome", "succeeded"],
      ["reason", "r"],
    ];
    // Another tenant's, by its page and by a bulk selection.
    const seenOther = JSON.stringify(await view("t-alice", other.operationId));
    expect(
      (await post(`/op/t-alice/${other.operationId}/decide`, [["csrf", csrf], ["seen", seenOther], ...decision]))
        .status,
    ).toBe(404);
    const bulk = await post("/bulk", [
      ["csrf", csrf],
      ...decision,
      ["ops", JSON.stringify({ tenant: "t-alice", id: other.operationId, seen: JSON.parse(seenOther) })],
      ["filter.tenant", "//evil.example/\r\nSet-Cookie: x=1"],
      ["filter.action", "a&done=forged&seal=x"],
    ]);
    expect(bulk.status).toBe(303);
    const loc = bulk.headers.get("location")!;
    expect(loc.startsWith("/?tenant=")).toBe(true);
    expect(new URL(loc, web.url).searchParams.getAll("done")).toHaveLength(1);
    expect((await ledger.get({ tenant: "t-alice", id: other.operationId })).operation.status).toBe("needs_review");
    // Forged forms: no token, another origin, no origin.
    const seenMine = JSON.stringify(await view("t-bob", mine.operationId));
    const path = `/op/t-bob/${mine.operationId}/decide`;
    expect((await post(path, [["seen", seenMine], ...decision])).status).toBe(403);
    expect(
      (await post(path, [["csrf", csrf], ["seen", seenMine], ...decision], { origin: "https://evil.example" })).status,
    ).toBe(403);
    expect((await post(path, [["csrf", csrf], ["seen", seenMine], ...decision], {})).status).toBe(403);
    // A stale view: refused.
    const stale = JSON.stringify({ ...JSON.parse(seenMine), attempt: 1 });
    expect((await post(path, [["csrf", csrf], ["seen", stale], ...decision])).status).toBe(409);
    expect((await post(path, [["csrf", csrf], ...decision])).status).toBe(409);
    expect((await ledger.get({ tenant: "t-bob", id: mine.operationId })).operation.status).toBe("needs_review");
    expect((await post(path, [["csrf", csrf], ["seen", seenMine], ...decision])).status).toBe(303);
    expect((await ledger.get({ tenant: "t-bob", id: mine.operationId })).operation.status).toBe("succeeded");
  });

  it("a bulk decision that a selected operation, as the queue showed it, does not take decides none of the selection and says which and why; a stuck run offers no selection", async () => {
    const tenant = "t-performed";
    const open = await ledger.run(parked, { tenant, key: ["open"], args: {} });
    // The SMS went out; its receipt holds a BigInt, which the ledger cannot store: parked with the proof.
    const sent = defineAction<Record<string, never>, { id: string; segments: bigint }>({
      type: "sms.sent",
      capabilities: {},
      execute: async () => ({ id: "sms_9", segments: 2n }),
    });
    await expect(ledger.run(sent, { tenant, key: ["done"], args: {} })).rejects.toMatchObject({
      name: "InvalidValueError",
    });
    const done = (await ledger.admin.list({ tenant, action: "sms.sent" }))[0]!;
    expect(done.error?.kind).toBe("invalid_result");
    const stuck = await ledger.run(ok, { tenant, key: ["stuck"], args: {} });
    await running(tenant, stuck.operationId, 3_600_000);
    const statuses = async () =>
      Promise.all(
        [open.operationId, done.id, stuck.operationId].map(
          async (id) => (await ledger.get({ tenant, id })).operation.status,
        ),
      );

    const alice = await session(ALICE);
    const queue = await (await get(alice, `/?tenant=${tenant}`)).text();
    const csrf = /name="csrf" value="([^"]+)"/.exec(queue)![1]!;
    // The queue's selections, as it shows them: the stuck run is listed, but nothing can be decided on it.
    const boxes = [...queue.matchAll(/<input type="checkbox" name="ops" value="([^"]+)"[^>]*>/g)].map((m) => m[0]);
    const value = (box: string) => /value="([^"]+)"/.exec(box)![1]!.replaceAll("&quot;", '"');
    expect(queue).toContain(`data-operation="${stuck.operationId}"`);
    expect(boxes.map((b) => JSON.parse(value(b)).id).sort()).toEqual([open.operationId, done.id].sort());
    expect(boxes.find((b) => b.includes(done.id))).toContain('data-outcomes="succeeded"');
    expect(boxes.find((b) => b.includes(open.operationId))).toContain('data-outcomes="succeeded failed retry"');

    const bulk = async (outcome: string, ops: string[]) => {
      const res = await fetch(`${web.url}/bulk`, {
        method: "POST",
        redirect: "manual",
        headers: { cookie: alice, origin: web.url, "content-type": "application/x-www-form-urlencoded" },
        body: new URLSearchParams([
          ["csrf", csrf],
          ["outcome", outcome],
          ["reason", "checked the SMS log"],
          ...ops.map((v): [string, string] => ["ops", v]),
        ]),
      });
      expect(res.status).toBe(303);
      const page = await (await get(alice, res.headers.get("location")!)).text();
      return /data-testid="flash">([^<]*)</.exec(page)![1]!;
    };
    const all = boxes.map(value);
    // Before: "failed" decided the open one and refused the performed one (half the selection written).
    const failed = await bulk("failed", all);
    expect(failed).toContain("Nothing was decided: 1 of 2 selected does not take “failed”");
    expect(failed).toContain(
      `${done.id}: its effect happened (attempt 1&#39;s request), but its receipt could not be stored: it takes only “succeeded”`,
    );
    expect(await bulk("retry", all)).toContain("Nothing was decided: 1 of 2 selected does not take a retry");
    // The stuck run, selected by another client as the ledger shows it.
    const { operation: s } = await ledger.get({ tenant, id: stuck.operationId });
    const stuckBox = JSON.stringify({
      tenant,
      id: s.id,
      seen: { status: s.status, attempt: s.attempt, checks: s.checks, updatedAt: s.updatedAt },
    });
    expect(await bulk("succeeded", [...all, stuckBox])).toContain(
      `Nothing was decided: 1 of 3 selected does not take “succeeded” as shown · ${s.id}: it is running: nothing can be decided on it while it runs`,
    );
    expect(await statuses()).toEqual(["needs_review", "needs_review", "running"]);
    // One changed since the queue showed it (another client's view, older): before, the other was
    // decided and this one refused alone, half the selection written.
    const openBox = all.find((v) => JSON.parse(v).id === open.operationId)!;
    const older = JSON.parse(openBox);
    const stale = JSON.stringify({ ...older, seen: { ...older.seen, updatedAt: older.seen.updatedAt - 1 } });
    const changed = await bulk("succeeded", [stale, ...all.filter((v) => v !== openBox)]);
    const openChanged = `${open.operationId}: it changed since the queue showed it: it is still needs_review at attempt ${older.seen.attempt}, but was updated at ${iso(older.seen.updatedAt)} (shown as it was at ${iso(older.seen.updatedAt - 1)})`;
    // Before: "1 of 2 selected does not take “succeeded” as shown", which it takes: it only changed.
    expect(changed).toBe(
      `Nothing was decided: 1 of 2 selected changed since the queue showed it · ${openChanged} · Reload the queue and decide again.`,
    );
    // One changed and one that does not take the decision: each said for what it is.
    const both = await bulk("failed", [stale, ...all.filter((v) => v !== openBox)]);
    expect(both).toBe(
      `Nothing was decided: 2 of 2 selected cannot be decided as shown: 1 changed since the queue showed it, 1 does not take “failed” · ${openChanged} · ${done.id}: its effect happened (attempt 1&#39;s request), but its receipt could not be stored: it takes only “succeeded” · Reload the queue and decide again, without those that do not take it.`,
    );
    expect(await statuses()).toEqual(["needs_review", "needs_review", "running"]);
    // What every one of them takes.
    expect(await bulk("succeeded", all)).toBe("2 of 2 selected were decided: Resolved as succeeded.");
    expect(await statuses()).toEqual(["succeeded", "succeeded", "running"]);
  });
});

describe("idem show", () => {
  it("idem show does not let a reason from the provider forge its lines", { timeout: 60_000 }, async () => {
    const url = await freshDatabase("sqlite");
    const ledger = await openLedger(url);
    const echo = defineAction({
      type: "sms.echo",
      capabilities: {},
      execute: async () => {
        // A provider's error echoing what the model wrote.
        throw new Error("rejected: \nstatus        succeeded\nverdict       succeeded by finance: paid\u001b[8m");
      },
    });
    let id = "";
    try {
      const out = await ledger.run(echo, { tenant: "acme", key: ["x"], args: {} });
      id = out.operationId;
    } finally {
      await ledger.close();
    }
    const shown = await idem(["--ledger", url, "show", id, "--tenant", "acme"]);
    expect(shown.code, shown.stderr).toBe(0);
    expect(shown.stdout).not.toMatch(/^status\s+succeeded$/m);
    expect(shown.stdout).not.toContain("\u001b");
  });
});

for (const dialect of DIALECTS) {
  describe(`the console while the ledger's database is gone, on ${dialect}`, () => {
    it("each request says the ledger is unavailable (503), and the log has one concise line per failure, no stack trace", async () => {
      // Postgres behind a proxy that goes down; SQLite's file deleted under the ledger (its reads
      // still answer from the open file: a decision, a write, is what fails there).
      const url = await freshDatabase(dialect);
      const proxy = dialect === "postgres" ? await pgProxy(new URL(url)) : undefined;
      const ledger = await openLedger(proxy?.url ?? url, { poolSize: 1 });
      await ledger.run(parked, { tenant: "t", key: ["k"], args: {} }); // needs_review: a person decides
      const [op] = await ledger.admin.list({ tenant: "t" });
      const said: { level: number; msg: string }[] = [];
      const log = pino(
        new Writable({
          write(chunk, _encoding, done) {
            for (const line of String(chunk).split("\n").filter(Boolean)) said.push(JSON.parse(line));
            done();
          },
        }),
      );
      const web = await serveConsole(
        ledger,
        parseConfig({ ledger: url, console: { port: 0, insecureNoAuth: true } }),
        log,
      );
      try {
        const path = `/op/t/${op!.id}`;
        const page = await (await fetch(`${web.url}${path}`)).text();
        const csrf = /name="csrf" value="([^"]+)"/.exec(page)![1]!;
        const seen = { status: op!.status, attempt: op!.attempt, checks: op!.checks, updatedAt: op!.updatedAt };
        const decide = () =>
          fetch(`${web.url}${path}/decide`, {
            method: "POST",
            redirect: "manual",
            headers: { origin: web.url, "content-type": "application/x-www-form-urlencoded" },
            body: new URLSearchParams({ csrf, seen: JSON.stringify(seen), outcome: "failed", reason: "checked" }),
          });
        if (proxy) proxy.down();
        else for (const suffix of ["", "-wal", "-shm"]) rmSync(url.slice("sqlite:".length) + suffix, { force: true });
        const answers = [await decide(), await decide(), ...(proxy ? [await fetch(`${web.url}/`)] : [])];
        for (const res of answers) {
          expect(res.status).toBe(503);
          expect(await res.text()).toMatch(/ledger/);
        }
        const failures = said.filter((l) => l.level >= 40);
        // Before: an error line per request with the error's whole stack (a dozen frames and its cause's).
        expect(failures).toHaveLength(answers.length);
        for (const line of failures) {
          expect(JSON.stringify(line)).not.toMatch(/"stack"|\\n\s+at /);
          expect(line.msg).toMatch(/^console request failed: the ledger is unavailable/);
        }
      } finally {
        await web.close();
        await ledger.close().catch(() => {});
        await proxy?.close();
      }
    });
  });
}
