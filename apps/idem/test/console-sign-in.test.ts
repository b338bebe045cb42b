/**
 * Signing in to the console by token, over HTTP (the browser test, console.test.ts, covers the
 * pages): guessing is limited per address, and a token a person could guess is refused at start.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { pino } from "pino";
import { defineAction, openLedger, type Ledger } from "@idem/core";
import { setTimeout as sleep } from "node:timers/promises";
import { ConfigError, parseConfig } from "@idem/cli";
import { serveConsole, type ConsoleServer } from "../src/console/server.js";

const TOKEN = "alice-token-3b8e1d0c";
const config = (tokenEnv: string) =>
  parseConfig({
    ledger: "sqlite::memory:",
    console: { port: 0, operators: [{ name: "alice", tokenEnv, tenants: "*" }] },
  });

describe("console sign-in", () => {
  let ledger: Ledger;
  let web: ConsoleServer;
  beforeAll(async () => {
    process.env.IDEM_TEST_ALICE_TOKEN = TOKEN;
    process.env.IDEM_TEST_SHORT_TOKEN = "admin";
    ledger = await openLedger("sqlite::memory:");
    web = await serveConsole(ledger, config("IDEM_TEST_ALICE_TOKEN"), pino({ level: "silent" }));
  });
  afterAll(async () => {
    await web?.close();
    await ledger?.close();
  });

  /** A sign-in from `client` (the console's proxy, loopback, names it in X-Forwarded-For). */
  const signIn = (token: string, client: string) =>
    fetch(`${web.url}/login`, {
      method: "POST",
      redirect: "manual",
      headers: { origin: web.url, "x-forwarded-for": client, "content-type": "application/x-www-form-urlencoded" },
      body: new URLSearchParams({ token }),
    });

  it("ten failed sign-ins from one address, then that address waits; another signs in", async () => {
    for (let i = 0; i < 10; i++) expect((await signIn(`guess-${i}`, "203.0.113.7")).status).toBe(401);
    const refused = await signIn(TOKEN, "203.0.113.7"); // even the right token, until the wait is over
    expect(refused.status).toBe(429);
    expect(Number(refused.headers.get("retry-after"))).toBeGreaterThan(0);
    expect(await refused.text()).toMatch(/Too many failed sign-ins/);
    const other = await signIn(TOKEN, "198.51.100.2");
    expect(other.status).toBe(303);
    expect(other.headers.get("set-cookie")).toMatch(/^idem_console=/);
  });

  it("counts the address the proxy saw, not what the client wrote before it in X-Forwarded-For", async () => {
    // The proxy (loopback: trusted) appends the address it saw; the client makes up the rest.
    for (let i = 0; i < 10; i++) expect((await signIn(`guess-${i}`, `10.9.8.${i}, 203.0.113.9`)).status).toBe(401);
    expect((await signIn(TOKEN, "10.9.8.200, 203.0.113.9")).status).toBe(429);
  });

  it("a successful sign-in does not clear the address's failures: guesses between sign-ins with a token of one's own still meet the limit", async () => {
    // A holder of one token, guessing at other operators' tokens. Before: each sign-in cleared the
    // count, so nine guesses, a sign-in, nine more… never met the limit.
    for (let round = 0; round < 3; round++) {
      for (let i = 0; i < 3; i++) expect((await signIn(`guess-${round}-${i}`, "192.0.2.5")).status).toBe(401);
      expect((await signIn(TOKEN, "192.0.2.5")).status).toBe(303); // a sign-in itself is not counted
    }
    expect((await signIn("guess-last", "192.0.2.5")).status).toBe(401); // the tenth failure
    expect((await signIn("guess-more", "192.0.2.5")).status).toBe(429);
    expect((await signIn(TOKEN, "192.0.2.5")).status).toBe(429);
    // Signing in again and again, without a failure, is never refused.
    for (let i = 0; i < 12; i++) expect((await signIn(TOKEN, "192.0.2.6")).status).toBe(303);
  });

  /** The session cookie a sign-in set (name=value), from an address no other test uses. */
  const session = async (client: string) => {
    const res = await signIn(TOKEN, client);
    expect(res.status).toBe(303);
    return res.headers.get("set-cookie")!.split(";")[0]!;
  };
  const home = (cookie: string, url = web.url) => fetch(`${url}/`, { redirect: "manual", headers: { cookie } });
  /** A form of the console posted as its page would: with the page's form token and Origin. */
  const postForm = async (cookie: string, path: string) => {
    const csrf = /name="csrf" value="([^"]+)"/.exec(await (await home(cookie)).text())![1]!;
    return fetch(`${web.url}${path}`, {
      method: "POST",
      redirect: "manual",
      headers: { cookie, origin: web.url, "content-type": "application/x-www-form-urlencoded" },
      body: new URLSearchParams({ csrf }),
    });
  };

  it("a session signed out is refused if its cookie is sent again; another session of the operator goes on", async () => {
    const cookie = await session("192.0.2.40");
    const other = await session("192.0.2.41");
    expect((await home(cookie)).status).toBe(200);
    const out = await postForm(cookie, "/logout");
    expect(out.status).toBe(303);
    expect(out.headers.get("set-cookie")).toMatch(/^idem_console=;/); // deleted in the browser
    const replayed = await home(cookie); // a copy kept elsewhere
    expect(replayed.status).toBe(302);
    expect(replayed.headers.get("location")).toBe("/login");
    expect((await home(other)).status).toBe(200);
  });

  it("a note in the URL shows only when the console sealed it: a link from elsewhere cannot put words in the page", async () => {
    const cookie = await session("192.0.2.43");
    const forged = await fetch(`${web.url}/?done=${encodeURIComponent("Refund approved by finance")}`, {
      headers: { cookie },
    });
    expect(forged.status).toBe(200);
    expect(await forged.text()).not.toMatch(/Refund approved by finance/);
    // The console's own redirect after a bulk decision with nothing picked: its note shows.
    const bulk = await postForm(cookie, "/bulk");
    expect(bulk.status).toBe(303);
    const shown = await fetch(new URL(bulk.headers.get("location")!, web.url), { headers: { cookie } });
    expect(await shown.text()).toMatch(/Nothing was selected\./);
  });

  /** A bulk decision posted as the queue's form would: the form token, then these fields. */
  const postBulk = async (cookie: string, fields: [string, string][], origin = web.url) => {
    const csrf = /name="csrf" value="([^"]+)"/.exec(await (await home(cookie)).text())![1]!;
    return fetch(`${web.url}/bulk`, {
      method: "POST",
      redirect: "manual",
      headers: { cookie, origin, "content-type": "application/x-www-form-urlencoded" },
      body: new URLSearchParams([["csrf", csrf], ...fields]),
    });
  };
  /** An operation that waits for a person, and how its page shows it (a queue checkbox's value). */
  const waiting = async (tenant: string, key: string) => {
    const parked = defineAction({
      type: "sms.parked",
      capabilities: {},
      execute: async () => {
        throw new Error("socket hang up after send");
      },
    });
    const out = await ledger.run(parked, { tenant, key: [key], args: {} });
    const { operation: o } = await ledger.get({ tenant, id: out.operationId });
    expect(o.status).toBe("needs_review");
    const seen = { status: o.status, attempt: o.attempt, checks: o.checks, updatedAt: o.updatedAt };
    return { id: o.id, pick: JSON.stringify({ tenant, id: o.id, seen }) };
  };
  const decision: [string, string][] = [
    ["outcome", "succeeded"],
    ["reason", "checked by hand"],
  ];

  it("a bulk decision's note stays short however many it leaves undecided: it names ten and counts the rest", async () => {
    const cookie = await session("192.0.2.70");
    const op = await waiting("t-bulk-note", "decided");
    // 300 selections that are no operation (another tenant's, gone since, or made up), and one that is.
    const { seen } = JSON.parse(op.pick) as { seen: unknown };
    const missing = Array.from({ length: 300 }, (_, i): [string, string] => [
      "ops",
      JSON.stringify({ tenant: "t-bulk-note", id: `gone-${i}`, seen }),
    ]);
    const res = await postBulk(cookie, [...decision, ...missing, ["ops", op.pick]]);
    expect(res.status).toBe(303);
    const location = res.headers.get("location")!;
    expect(location.length).toBeLessThan(4_000); // a URL of every id was the 431
    const shown = await fetch(new URL(location, web.url), { headers: { cookie } });
    expect(shown.status).toBe(200);
    const note = /data-testid="flash">([^<]*)</.exec(await shown.text())![1]!;
    // Selections the queue did not show refuse the whole decision (console-forms.test).
    expect(note).toBe(
      [
        "Nothing was decided: 300 of 301 selected are not operations the queue showed you",
        ...Array.from({ length: 10 }, (_, i) => `gone-${i}: not found`),
        "and 290 more",
        "Reload the queue and decide again.",
      ].join(" · "),
    );
    expect((await ledger.get({ tenant: "t-bulk-note", id: op.id })).operation.status).toBe("needs_review");
  });

  it("a bulk decision goes back to the queue as it was filtered", async () => {
    const cookie = await session("192.0.2.72");
    const ops = [await waiting("t-bulk-filter", "a"), await waiting("t-bulk-filter", "b")];
    // The filtered queue's own form: its hidden filters, as a browser posts them.
    const page = await (
      await fetch(`${web.url}/?tenant=t-bulk-filter&status=needs_review&olderThan=1ms`, { headers: { cookie } })
    ).text();
    const hidden = [...page.matchAll(/<input type="hidden" name="(filter\.[a-zA-Z]+)" value="([^"]*)">/g)].map(
      (m): [string, string] => [m[1]!, m[2]!],
    );
    expect(hidden).toEqual([
      ["filter.tenant", "t-bulk-filter"],
      ["filter.status", "needs_review"],
      ["filter.olderThan", "1ms"],
    ]);
    const res = await postBulk(cookie, [...hidden, ...decision, ["ops", ops[0]!.pick]]);
    const location = new URL(res.headers.get("location")!, web.url);
    // Before: "/?done=…", the whole queue of every tenant, unfiltered.
    expect([...location.searchParams.keys()]).toEqual(["tenant", "status", "olderThan", "done", "seal"]);
    const shown = await (await fetch(location, { headers: { cookie } })).text();
    expect(shown).toMatch(/data-testid="flash">1 of 1 selected was decided/);
    expect(shown).toContain(`data-operation="${ops[1]!.id}"`);
    expect(shown).not.toContain(`data-operation="${ops[0]!.id}"`);
    expect(shown).toMatch(/<input id="f-tenant" name="tenant" value="t-bulk-filter">/);
  });

  it("a bulk decision without a reason decides nothing and says so once", async () => {
    const cookie = await session("192.0.2.71");
    const ops = [await waiting("t-bulk-reason", "a"), await waiting("t-bulk-reason", "b")];
    const res = await postBulk(cookie, [
      ["outcome", "succeeded"],
      ...ops.map((o): [string, string] => ["ops", o.pick]),
    ]);
    const shown = await fetch(new URL(res.headers.get("location")!, web.url), { headers: { cookie } });
    expect(await shown.text()).toMatch(/data-testid="flash">A decision needs a reason\. Nothing was decided\.</);
    for (const o of ops)
      expect((await ledger.get({ tenant: "t-bulk-reason", id: o.id })).operation.status).toBe("needs_review");
  });

  it("a bulk decision larger than the console takes is refused whole with a page that says so; only an operator may send a large one", async () => {
    const cookie = await session("192.0.2.72");
    const op = await waiting("t-bulk-large", "first");
    // More than every row of the fullest queue (2,000) with the longest tenant names: refused before anything is decided.
    const pad = "x".repeat(1_000);
    const many = Array.from({ length: 6_000 }, (_, i): [string, string] => [
      "ops",
      JSON.stringify({ tenant: "t-bulk-large", id: `${pad}${i}`, seen: {} }),
    ]);
    const refused = await postBulk(cookie, [...decision, ["ops", op.pick], ...many]);
    expect(refused.status).toBe(413);
    expect(await refused.text()).toMatch(/Nothing was decided: that is more than the console takes at once/);
    expect((await ledger.get({ tenant: "t-bulk-large", id: op.id })).operation.status).toBe("needs_review");
    // 300 KB, past a form's 256 KB: an operator's bulk decision takes it; without a session it is refused unread.
    const big = Array.from({ length: 300 }, (_, i): [string, string] => [
      "ops",
      JSON.stringify({ tenant: "t-bulk-large", id: `${pad}${i}`, seen: {} }),
    ]);
    const taken = await postBulk(cookie, [...decision, ["ops", op.pick], ...big]);
    expect(taken.status).toBe(303); // read and checked (its made-up selections refuse it: console-forms.test)
    const note = await (await fetch(new URL(taken.headers.get("location")!, web.url), { headers: { cookie } })).text();
    expect(note).toMatch(/Nothing was decided: 300 of 301 selected are not operations the queue showed you/);
    expect((await postBulk(cookie, [...decision, ["ops", op.pick]])).status).toBe(303);
    expect((await ledger.get({ tenant: "t-bulk-large", id: op.id })).operation.status).toBe("succeeded");
    const anonymous = await fetch(`${web.url}/bulk`, {
      method: "POST",
      redirect: "manual",
      headers: { origin: web.url, "content-type": "application/x-www-form-urlencoded" },
      body: new URLSearchParams(big),
    });
    expect(anonymous.status).toBe(413);
  });

  it("a filter the ledger refuses is the operator's input: 400 with its reason, not a 500", async () => {
    const cookie = await session("192.0.2.61");
    const get = (query: string) => fetch(`${web.url}/${query}`, { redirect: "manual", headers: { cookie } });
    const negative = await get("?olderThan=-1h");
    expect(negative.status).toBe(400);
    expect(await negative.text()).toMatch(/olderThan: must be a duration/);
    expect((await get("?olderThan=soon")).status).toBe(400); // not silently unfiltered
    expect((await get("?olderThan=0.0001s")).status).toBe(200); // whole milliseconds
    // Before: 1M filtered by one minute (ms reads M as m), where many mean a month.
    const month = await get("?olderThan=1M");
    expect(month.status).toBe(400);
    expect(await month.text()).toMatch(/olderThan: 1M is ambiguous: say 1m for minutes, or days for months \(30d\)/);
    const control = await get(`?tenant=${encodeURIComponent("a\u0001b")}`);
    expect(control.status).toBe(400);
    expect(await control.text()).toMatch(/tenant/);
    expect((await get(`stats?tenant=${encodeURIComponent("a\u0001b")}`)).status).toBe(400);
  });

  it("an operator holds at most 16 live pages at once; one closed frees its place", async () => {
    const sms = defineAction({ type: "sms.live", capabilities: {}, execute: async () => ({ ok: true }) });
    const op = await ledger.run(sms, { tenant: "t-live", key: ["k"], args: {} });
    const cookie = await session("192.0.2.42");
    const open = async () => {
      const stop = new AbortController();
      const res = await fetch(`${web.url}/op/t-live/${op.operationId}/live`, {
        headers: { cookie },
        signal: stop.signal,
      });
      return { res, stop };
    };
    const streams = [];
    try {
      for (let i = 0; i < 16; i++) streams.push(await open());
      expect(streams.map((s) => s.res.status)).toEqual(Array(16).fill(200));
      const refused = await open();
      expect(refused.res.status).toBe(429);
      expect(await refused.res.text()).toMatch(/16 live pages are open/);
      streams.pop()!.stop.abort();
      // The server hears of the closed stream at its next write or poll: within a second or two.
      let again = await open();
      for (let i = 0; again.res.status === 429 && i < 50; i++) {
        await sleep(100);
        again = await open();
      }
      streams.push(again);
      expect(again.res.status).toBe(200);
    } finally {
      for (const s of streams) s.stop.abort();
    }
  });

  it("past 100 failed sign-ins from all addresses together, every address waits", async () => {
    // Made-up addresses (through a tunnel the header is all the client's) meet the backstop.
    let refused = 0;
    for (let i = 0; i < 120; i++)
      if ((await signIn(`guess-${i}`, `10.0.${i >> 8}.${i & 255}`)).status === 429) refused++;
    expect(refused).toBeGreaterThan(0);
    expect((await signIn(TOKEN, "198.51.100.77")).status).toBe(429);
  });

  it("a token replaced in the config ends the sessions it opened (same session secret)", async () => {
    process.env.IDEM_TEST_SESSION_SECRET = "a-session-secret-shared-by-replicas";
    process.env.IDEM_TEST_ALICE_NEW_TOKEN = "alice-new-token-7f2c9a41";
    const withSecret = (tokenEnv: string) =>
      parseConfig({
        ledger: "sqlite::memory:",
        console: {
          port: 0,
          sessionSecretEnv: "IDEM_TEST_SESSION_SECRET",
          operators: [{ name: "alice", tokenEnv, tenants: "*" }],
        },
      });
    const before = await serveConsole(ledger, withSecret("IDEM_TEST_ALICE_TOKEN"), pino({ level: "silent" }));
    const after = await serveConsole(ledger, withSecret("IDEM_TEST_ALICE_NEW_TOKEN"), pino({ level: "silent" }));
    const again = await serveConsole(ledger, withSecret("IDEM_TEST_ALICE_TOKEN"), pino({ level: "silent" }));
    try {
      const res = await fetch(`${before.url}/login`, {
        method: "POST",
        redirect: "manual",
        headers: { origin: before.url, "content-type": "application/x-www-form-urlencoded" },
        body: new URLSearchParams({ token: TOKEN }),
      });
      const cookie = res.headers.get("set-cookie")!.split(";")[0]!;
      expect((await home(cookie, again.url)).status).toBe(200); // the same token: a replica accepts it
      expect((await home(cookie, after.url)).status).toBe(302); // the token was replaced
    } finally {
      await Promise.all([before.close(), after.close(), again.close()]);
    }
  });

  it("refuses, at start, a token a person could guess", async () => {
    await expect(serveConsole(ledger, config("IDEM_TEST_SHORT_TOKEN"), pino({ level: "silent" }))).rejects.toThrow(
      ConfigError,
    );
    await expect(serveConsole(ledger, config("IDEM_TEST_SHORT_TOKEN"), pino({ level: "silent" }))).rejects.toThrow(
      /IDEM_TEST_SHORT_TOKEN is 5 characters; use at least 16/,
    );
  });
});
