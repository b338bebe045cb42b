/**
 * The webhook alert sink against real receivers that do not answer as a webhook should, each a
 * defect found in review (h3) and reproduced here first: a receiver that redirects (its URL
 * moved: fetch followed a 301/302/303 with a GET that a page answered 200, and the alert was
 * counted delivered and acknowledged, its body never posted); a receiver whose host drops the
 * connection attempt (the request's own 10 s deadline cut the connect before undici's connect
 * timeout could say "not reached": the delivery went to review as "may have been sent", the alert
 * acknowledged, and nothing had left this process).
 */
import { afterEach, describe, expect, it } from "vitest";
import { createServer, type IncomingMessage, type Server } from "node:http";
import { connect, type AddressInfo, type Socket } from "node:net";
import { Writable } from "node:stream";
import { fileURLToPath } from "node:url";
import { defineAction, openLedger } from "@idem/core";
import { Daemon, DaemonMetrics, alertActions, parseConfig } from "@idem/cli";
import { pino } from "pino";
import { DIALECTS, freshDatabase, scaled, startChild } from "@idem/testkit";

const NO_ACCEPT = fileURLToPath(new URL("./fixtures/no-accept.ts", import.meta.url));

let n = 0;
const tenant = () => `wh${++n}-${Math.random().toString(36).slice(2, 7)}`;

/** An action whose answer is always lost and that nothing can look up: each run of it ends in review, alerted. */
const lostAnswer = defineAction<{ note: string }, { id: string }>({
  type: "review.neither",
  capabilities: {},
  execute: async () => {
    throw new Error("socket hang up");
  },
});

/** A logger that keeps every line it writes. */
function capture() {
  const lines: { level: number; msg: string; delivery?: { state?: string; reason?: string } }[] = [];
  const log = pino(
    { level: "info" },
    new Writable({
      write(chunk, _encoding, done) {
        for (const line of String(chunk).split("\n").filter(Boolean)) lines.push(JSON.parse(line));
        done();
      },
    }),
  );
  return { log, lines };
}

/**
 * A receiver whose webhook path answers `status` with a Location on the same server (`/moved`),
 * which answers 200 to anything: what a moved URL, an http-to-https upgrade or a login page does.
 */
async function redirecting(status: number) {
  const asked: { method: string; path: string; body: string }[] = [];
  const server: Server = createServer((req: IncomingMessage, res) => {
    let body = "";
    req.on("data", (c) => (body += c));
    req.on("end", () => {
      asked.push({ method: req.method!, path: req.url!, body });
      if (req.url === "/hook") res.writeHead(status, { location: "/moved" }).end();
      else res.writeHead(200).end("<html>a page</html>");
    });
  });
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}/hook`,
    asked,
    close: () => new Promise<void>((r) => server.close(() => r())),
  };
}

const cleanups: (() => Promise<unknown>)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c().catch(() => {});
});

for (const dialect of DIALECTS) {
  describe(`the webhook alert sink against receivers that misbehave (h3), ${dialect}`, () => {
    /** A ledger with one alert due (an operation in review), and a daemon alerting only through the webhook at `hook`. */
    async function alerting(hook: string, name: string) {
      const url = await freshDatabase(dialect);
      const { log, lines } = capture();
      const config = parseConfig({
        ledger: url,
        alerts: { log: false, webhook: { url: hook, format: "json" } },
        daemon: { intervalMs: 50 },
      });
      const ledger = await openLedger(url, { poolSize: 2, actions: alertActions(config, log) });
      cleanups.push(() => ledger.close());
      const parked = await ledger.run(lostAnswer, { tenant: tenant(), key: ["r"], args: { note: "x" } });
      expect(parked).toMatchObject({ status: "pending_verification", state: "needs_review" });
      const daemon = new Daemon(ledger, config, log, new DaemonMetrics(ledger, 1_000), name);
      const stillDue = async () =>
        (await ledger.daemon.alertsDue({ limit: 100 })).some((a) => a.id === parked.operationId);
      const delivery = async () => (await ledger.admin.list({ tenant: "idem-alerts" }))[0]?.status;
      return { daemon, lines, stillDue, delivery };
    }

    for (const status of [301, 302, 303, 307, 308]) {
      it(
        `a receiver answering ${status} (its URL moved) is not sent the alert elsewhere, nor counted as having taken it: the alert stays due, and the log says why`,
        async () => {
          const hook = await redirecting(status);
          cleanups.push(hook.close);
          const { daemon, lines, stillDue, delivery } = await alerting(hook.url, `d-redirect-${status}`);
          const tick = await daemon.tick();
          // Before: 301/302/303: fetch followed with a GET (no body) that the page answered 200: the
          // delivery succeeded, the alert was acknowledged, and no receiver ever had it. 307/308:
          // the alert was posted wherever the Location said, another host's included.
          expect({
            followed: hook.asked.filter((a) => a.path !== "/hook").map((a) => a.method),
            delivery: await delivery(),
            stillDue: await stillDue(),
            undelivered: tick.undelivered,
          }).toEqual({ followed: [], delivery: "pending", stillDue: true, undelivered: 1 });
          const said = lines.find((l) => l.delivery?.reason !== undefined)?.delivery?.reason;
          expect(said).toMatch(new RegExp(`receiver answered ${status} \\(a redirect\\), nothing delivered`));
          expect(said).not.toContain("/moved");
        },
        scaled(60_000),
      );
    }

    for (const status of [408, 425]) {
      it(
        `a receiver answering ${status} (it did not take the request, yet) keeps the alert due: tried again after a backoff, not refused for good`,
        async () => {
          const hook = await redirecting(status);
          cleanups.push(hook.close);
          const { daemon, lines, stillDue, delivery } = await alerting(hook.url, `d-not-yet-${status}`);
          const tick = await daemon.tick();
          // Before: "another 4xx refuses this alert itself": the delivery failed for good and the
          // alert was acknowledged, though the receiver had not processed the request.
          expect({ delivery: await delivery(), stillDue: await stillDue(), undelivered: tick.undelivered }).toEqual({
            delivery: "pending",
            stillDue: true,
            undelivered: 1,
          });
          const said = lines.find((l) => l.delivery?.reason !== undefined)?.delivery?.reason;
          expect(said).toMatch(new RegExp(`receiver answered ${status}; tried again after a backoff`));
        },
        scaled(60_000),
      );
    }

    it(
      "a receiver whose host drops the connection attempt (never connected) keeps the alert due, the delivery not in review: nothing was sent",
      async () => {
        const child = startChild(NO_ACCEPT);
        const port = Number((await child.waitFor(/^port \d+$/)).slice(5));
        // Two handshakes fill its backlog: every later connection attempt is dropped by the kernel.
        const fillers: Socket[] = [];
        cleanups.push(async () => {
          for (const s of fillers) s.destroy();
        });
        for (let i = 0; i < 2; i++) {
          const s = connect(port, "127.0.0.1");
          fillers.push(s);
          await new Promise<void>((resolve, reject) => s.once("connect", resolve).once("error", reject));
        }
        const { daemon, lines, stillDue, delivery } = await alerting(`http://127.0.0.1:${port}/hook`, "d-no-accept");
        const tick = await daemon.tick();
        // Before: the request's 10 s deadline fired first ("The operation was aborted due to
        // timeout"), read as a lost answer: the delivery in review, the alert acknowledged, unsent.
        expect({ delivery: await delivery(), stillDue: await stillDue(), undelivered: tick.undelivered }).toEqual({
          delivery: "pending",
          stillDue: true,
          undelivered: 1,
        });
        const said = lines.find((l) => l.delivery?.reason !== undefined)?.delivery?.reason;
        expect(said).toMatch(/receiver not reached \(UND_ERR_CONNECT_TIMEOUT\): nothing sent/);
      },
      scaled(90_000),
    );
  });
}
