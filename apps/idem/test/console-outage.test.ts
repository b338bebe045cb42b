/**
 * The console when the ledger fails in the middle of a decision, over real HTTP on SQLite and
 * Postgres. SQLite: its disk turns read-only under it (an ext4 file system on a loop device, made
 * to fail as a disk error does, `errors=remount-ro`: the only way a disk goes read-only under a
 * process writing to it, the kernel refusing a plain `remount,ro` while files are open for
 * writing). Postgres: the connection is cut, and every new one refused (a proxy in front). A bulk
 * decision cut there said only "the ledger is unavailable" (a 503, the queue it led back to
 * unreadable): not that the rows before were decided. It now names every row by what became of it.
 * A live page's stream that connects during the outage (a browser reconnecting) was answered 503,
 * and the browser's EventSource gave up for good: it now opens, says the outage and recovers.
 */
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { openLedger, type Ledger } from "@idem/core";
import { DIALECTS, freshDatabase, pgProxy, scaled, type TestDialect } from "@idem/testkit";
import { dialectFor, hooked } from "../../../packages/core/test/support/dialects.js";
import type { ConsoleServer } from "../src/console/server.js";
import { browserOn, parked, serveFor } from "./console-support.js";
import { failingDisk, loopMountable } from "./disk-support.js";

const TOKEN = "alice-token-outage-0177";

/**
 * The ledger (at `url`, for the test's own reads and writes) and the console's, whose database
 * fails as the first write naming `failOn()` is sent; `close()` undoes what was set up.
 */
interface Failing {
  url: string;
  console: Ledger;
  /** Fails it now. */
  fail(): void;
  /** The outage ends: Postgres takes connections again (a read-only disk stays so until every file on it is closed). */
  recover?(): void;
  close(): Promise<void>;
}

async function failingLedger(dialect: TestDialect, failOn: () => string | undefined): Promise<Failing> {
  if (dialect === "sqlite") {
    const disk = failingDisk();
    const url = `sqlite:${join(disk.dir, "ledger.db")}`;
    await (await openLedger(url)).close(); // migrated
    // Its own driver runs every statement; the disk fails just before this one's.
    const console = await openLedger(
      hooked(await dialectFor(dialect, url), {
        query: async (q, run) => {
          const id = failOn();
          if (id && /^\s*(update|insert)/i.test(q.sql) && q.parameters.includes(id)) disk.fail();
          return run();
        },
      }),
      { migrate: false },
    );
    return {
      url,
      console,
      fail: () => disk.fail(),
      close: async () => {
        // On a failed disk a close cannot write its checkpoint: what is committed is in the log.
        await console.close().catch(() => {});
        disk.close();
      },
    };
  }
  const url = await freshDatabase("postgres");
  // The connection carrying the decision's write (its statement prepared once, so known by the
  // reason it binds) is cut before the write reaches the server, and every new one refused.
  const proxy = await pgProxy(new URL(url), (client, upstream) => {
    client.on("data", (chunk: Buffer) => {
      const id = failOn();
      if (id && chunk.includes(id) && chunk.includes("resolved by a person")) return void proxy.down();
      upstream.write(chunk);
    });
    upstream.pipe(client);
  });
  const console = await openLedger(proxy.url, { migrate: false });
  return {
    url,
    console,
    fail: () => proxy.down(),
    recover: () => proxy.up(),
    close: async () => {
      await console.close().catch(() => {});
      await proxy.close();
    },
  };
}

/** An event stream's text as it comes, and `read`, which reads on until `until` matches it, for at most 30 s (scaled). */
function streamOf(res: Response) {
  const reader = res.body!.pipeThrough(new TextDecoderStream()).getReader();
  const s = {
    reader,
    text: "",
    async read(until: RegExp, what: string) {
      let timer: NodeJS.Timeout | undefined;
      const late = new Promise<never>((_, reject) => {
        timer = setTimeout(
          () => reject(new Error(`timed out waiting for ${what}; got ${JSON.stringify(s.text)}`)),
          scaled(30_000),
        );
      });
      try {
        while (!until.test(s.text)) {
          const { value, done } = await Promise.race([reader.read(), late]);
          if (done) throw new Error(`the stream ended before ${what}; got ${JSON.stringify(s.text)}`);
          s.text += value;
        }
      } finally {
        clearTimeout(timer);
      }
    },
  };
  return s;
}

for (const dialect of DIALECTS) {
  const skip = dialect === "sqlite" ? loopMountable() : "";
  if (skip) console.warn(`skipping the console's read-only disk test: ${skip}`);
  describe.skipIf(skip !== "")(`the console on ${dialect} when the ledger fails`, () => {
    let db: Failing;
    let writer: Ledger;
    let web: ConsoleServer;
    /** The operation whose decision's first write meets the failure. */
    let failOn: string | undefined;
    // Each test its own ledger: a failed one stays failed.
    beforeEach(async () => {
      failOn = undefined;
      db = await failingLedger(dialect, () => failOn);
      writer = await openLedger(db.url);
      web = await serveFor(db.console, db.url, [{ name: "alice", token: TOKEN, tenants: "*" }]);
    }, scaled(60_000));
    afterEach(async () => {
      await web?.close();
      await writer?.close().catch(() => {});
      await db?.close();
    });

    const browser = browserOn(() => web.url);
    const tenant = `outage-${dialect}`;
    const waiting = async (key: string) => {
      const out = await writer.run(parked, { tenant, key: [key], args: { to: "+15550100" } });
      const { operation: o } = await writer.get({ tenant, id: out.operationId });
      expect(o.status).toBe("needs_review");
      const seen = { status: o.status, attempt: o.attempt, checks: o.checks, updatedAt: o.updatedAt };
      return { id: o.id, pick: JSON.stringify({ tenant, id: o.id, seen }) };
    };

    it(
      "a bulk decision cut by the outage names each row: decided, not decided (read back) or not known, and the rest not tried",
      async () => {
        const rows = [await waiting("a"), await waiting("b"), await waiting("c")];
        const cookie = await browser.session(TOKEN);
        const csrf = await browser.formTokenOf(cookie);
        failOn = rows[1]!.id;
        const res = await browser.postWith(cookie, csrf, "/bulk", [
          ["outcome", "failed"],
          ["reason", "checked at the provider: not sent"],
          ...rows.map((r): [string, string] => ["ops", r.pick]),
        ]);
        const body = await res.text();
        const note = /data-testid="flash">([^<]*)</.exec(body)?.[1] ?? body.slice(0, 400);
        // Before: a 503 page saying "the ledger database failed: …", the first row's decision untold.
        expect(res.status).toBe(503);
        expect(note).toContain(`1 of 3 selected was decided (Resolved as failed.): ${rows[0]!.id}`);
        // SQLite's disk still answers reads: the row reads as shown, so it was not decided. Postgres
        // is gone: a commit whose answer was lost may have landed, so it is not known.
        expect(note).toContain(
          dialect === "sqlite"
            ? `${rows[1]!.id}: not decided: the ledger takes no writes now`
            : `${rows[1]!.id}: not known whether it was decided`,
        );
        expect(note).toContain(`not decided, not tried: ${rows[2]!.id}`);
        // What the note says is what the ledger holds.
        const statuses = await Promise.all(
          rows.map(async (r) => (await writer.get({ tenant, id: r.id })).operation.status),
        );
        expect(statuses).toEqual(["failed", "needs_review", "needs_review"]);
      },
      scaled(120_000),
    );

    it(
      "an operation's live stream says the ledger is unavailable once, and stays open: not silent, no crash, no hang",
      async () => {
        const row = await waiting("live");
        const cookie = await browser.session(TOKEN);
        const stop = new AbortController();
        const res = await fetch(`${web.url}/op/${tenant}/${row.id}/live`, { headers: { cookie }, signal: stop.signal });
        expect(res.status).toBe(200);
        const stream = streamOf(res);
        try {
          await stream.read(/"status":"needs_review"/, "the operation's state");
          db.fail();
          if (dialect === "postgres") {
            // Before: nothing, the page showing its status as live through the outage.
            await stream.read(/event: unavailable\ndata: [^\n]*the ledger database failed/, "the outage to be said");
            // Once so far: each poll after meets the outage again, and says nothing more.
            expect(stream.text.match(/event: unavailable/g)).toHaveLength(1);
          } else {
            // A read-only disk still answers reads: the stream goes on, and sees a change made by
            // another writer. None can be made here (the disk takes no writes): it stays quiet.
            expect((await db.console.get({ tenant, id: row.id })).operation.status).toBe("needs_review");
            expect(stream.text).not.toMatch(/event: unavailable/);
          }
          // The console itself still answers (a page reading the ledger says the outage, 503 on Postgres).
          const queue = await browser.get(cookie, "/");
          expect(queue.status).toBe(dialect === "postgres" ? 503 : 200);
          await queue.body?.cancel();
        } finally {
          stop.abort();
          await stream.reader.cancel().catch(() => {});
        }
      },
      scaled(120_000),
    );

    it(
      "a live page's stream that connects during the outage opens and says so, and follows the operation once the ledger is back (was: 503, the browser giving up for good)",
      async () => {
        const row = await waiting("reconnect");
        const cookie = await browser.session(TOKEN);
        db.fail();
        const stop = new AbortController();
        const res = await fetch(`${web.url}/op/${tenant}/${row.id}/live`, { headers: { cookie }, signal: stop.signal });
        const stream = streamOf(res);
        try {
          // Before, on Postgres: 503, which ends a browser's EventSource for good (it retries only a dropped stream).
          expect(res.status).toBe(200);
          expect(res.headers.get("content-type")).toMatch(/^text\/event-stream/);
          if (dialect === "postgres") {
            await stream.read(/event: unavailable\ndata: [^\n]*the ledger database failed/, "the outage to be said");
            expect(stream.text).not.toMatch(/"status"/);
            // Decided meanwhile by another (its own connection, not through the proxy), then the ledger is back.
            await writer.admin.resolve({ tenant, id: row.id, outcome: "succeeded", reason: "found", actor: "carol" });
            db.recover!();
            await stream.read(/"status":"succeeded"/, "the operation's state once the ledger is back");
          } else {
            // A read-only disk still answers reads: the stream opens with the operation's state.
            await stream.read(/"status":"needs_review"/, "the operation's state");
            expect(stream.text).not.toMatch(/event: unavailable/);
          }
        } finally {
          stop.abort();
          await stream.reader.cancel().catch(() => {});
        }
      },
      scaled(120_000),
    );

    it(
      "a live page's stream for no operation, begun during the outage, ends once the ledger answers: not found, never followed",
      async () => {
        const cookie = await browser.session(TOKEN);
        db.fail();
        const path = `/op/${tenant}/op_none_of_these/live`;
        const stop = new AbortController();
        const res = await fetch(`${web.url}${path}`, { headers: { cookie }, signal: stop.signal });
        try {
          if (dialect === "sqlite") {
            // A read-only disk answers reads: not found at once.
            expect(res.status).toBe(404);
            return;
          }
          // Whether it exists cannot be read: the stream opens, as for one that does (nothing told).
          expect(res.status).toBe(200);
          const stream = streamOf(res);
          await stream.read(/event: unavailable/, "the outage to be said");
          db.recover!();
          // It ends once read; the browser's reconnection is told "not found" (404), and it stops.
          await expect(stream.read(/"status"/, "a state")).rejects.toThrow(/the stream ended before a state/);
          expect(stream.text).toMatch(/^event: unavailable\n[^\n]*\n\n$/);
          const again = await fetch(`${web.url}${path}`, { headers: { cookie } });
          expect(again.status).toBe(404);
          await again.body?.cancel();
        } finally {
          stop.abort();
          await res.body?.cancel().catch(() => {});
        }
      },
      scaled(120_000),
    );
  });
}
