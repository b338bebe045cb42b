/**
 * An operation's live page when its console goes away and comes back on the same address (the
 * daemon serving it restarted behind a load balancer, its sessions signed with a shared secret), in
 * a real browser on SQLite and Postgres. While it is away the page says so: the status it shows
 * may be old, and a decision tried then is not sent (the page says nothing was decided), where
 * before the page looked live and the decision led to the browser's "site can't be reached",
 * decided or not untold. Once back, the page shows the change made meanwhile, without a reload,
 * and a decision is recorded once.
 */
import { openLedger, type Ledger } from "@idem/core";
import { DIALECTS, freshDatabase, scaled } from "@idem/testkit";
import type { Browser, Page } from "playwright-core";
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import type { ConsoleServer } from "../src/console/server.js";
import { launchChromium, parked, serveFor, signInAs } from "./console-support.js";

const ALICE = { name: "alice", token: "alice-token-reconnect-5521", tenants: "*" } as const;
const SESSION_SECRET = "shared-by-every-console-behind-the-balancer";

let browser: Browser;
beforeAll(async () => {
  browser = await launchChromium();
}, scaled(60_000));
afterAll(async () => {
  await browser?.close();
});

for (const dialect of DIALECTS) {
  describe(`a live page on ${dialect} when its console restarts`, { timeout: scaled(120_000) }, () => {
    const tenant = `reconnect-${dialect}`;
    let url = "";
    let writer: Ledger;
    /** The console, and the ledger it opened (a restart opens its own again). */
    let web: { server: ConsoleServer; ledger: Ledger } | undefined;

    beforeAll(async () => {
      url = await freshDatabase(dialect);
      writer = await openLedger(url);
    }, scaled(60_000));
    afterEach(stop);
    afterAll(async () => {
      await writer?.close();
    });

    async function start(port?: number): Promise<ConsoleServer> {
      const ledger = await openLedger(url);
      const server = await serveFor(ledger, url, [ALICE], {
        sessionSecret: SESSION_SECRET,
        ...(port !== undefined && { port }),
      });
      web = { server, ledger };
      return server;
    }
    async function stop() {
      const was = web;
      web = undefined;
      await was?.server.close();
      await was?.ledger.close();
    }

    /** An operation waiting for a person. */
    async function waiting(key: string) {
      const out = await writer.run(parked, { tenant, key: [key], args: { to: "+15550100" } });
      expect(out).toMatchObject({ status: "pending_verification", state: "needs_review" });
      return out.operationId;
    }

    /** The operation's page, once its live stream is open; marked, so that a reload would show. */
    async function opened(page: Page, base: string, id: string) {
      const streaming = page.waitForResponse((r) => r.url().endsWith(`/op/${tenant}/${id}/live`) && r.ok());
      await page.goto(`${base}/op/${tenant}/${id}`);
      await streaming;
      await page.evaluate('document.body.setAttribute("data-loaded-once", "")');
    }
    const reloaded = async (page: Page) => !(await page.locator("body[data-loaded-once]").count());

    it("says it is disconnected while the console is down, and once back shows the change made meanwhile, once, without a reload", async () => {
      const id = await waiting("meanwhile");
      const server = await start();
      const { context, page } = await signInAs(browser, server.url, ALICE.token, ALICE.name);
      try {
        await opened(page, server.url, id);
        const history = await page.getByTestId("history").locator("li").count();
        expect(await page.locator("#live-lost").isVisible()).toBe(false);

        await stop();
        // Before: nothing said, the page showing needs_review as live while nothing followed it.
        await expect.poll(() => page.locator("#live-lost").isVisible()).toBe(true);
        expect(await page.locator("#live-lost").textContent()).toMatch(
          /Disconnected from the console: the status shown may be old/,
        );
        // Decided by another meanwhile, while this page cannot hear of it.
        await writer.admin.resolve({ tenant, id, outcome: "failed", reason: "checked: not sent", actor: "carol" });

        await start(server.port);
        await expect.poll(() => page.locator("#status").textContent(), { timeout: scaled(30_000) }).toBe("failed");
        expect(await page.locator("#live-lost").isVisible()).toBe(false);
        expect(await page.locator("#changed").isVisible()).toBe(true);
        // Its decision is not offered on the page as it was shown.
        expect(
          await page.locator("#decide button").evaluateAll((bs) => bs.map((b) => b.hasAttribute("disabled"))),
        ).toEqual([true]);
        // The same page (no reload), with one status and the history it was shown, not a row more.
        expect(await reloaded(page)).toBe(false);
        expect(await page.locator("#status").count()).toBe(1);
        expect(await page.getByTestId("history").locator("li").count()).toBe(history);
        const { events } = await writer.get({ tenant, id });
        expect(events.filter((e) => e.to === "failed").map((e) => e.actor)).toEqual(["carol"]);
      } finally {
        await context.close();
      }
    });

    it("a decision tried while the console is down is not sent, and the page says nothing was decided; once back it is decided once", async () => {
      const id = await waiting("decided-once");
      const server = await start();
      const { context, page } = await signInAs(browser, server.url, ALICE.token, ALICE.name);
      try {
        await opened(page, server.url, id);
        await page.getByLabel("It did not happen and must not be tried again: resolve as failed").check();
        await page.locator("#one-reason").fill("checked at the provider: not sent");

        await stop();
        await expect.poll(() => page.locator("#live-lost").isVisible()).toBe(true);
        await page.getByRole("button", { name: "Record the decision" }).click();
        // Before: the browser's own error page, whether anything was decided untold.
        await expect.poll(() => page.locator("#not-sent").isVisible()).toBe(true);
        expect(await page.locator("#not-sent").textContent()).toBe(
          " Not sent: nothing was decided. Decide once the console is back.",
        );
        expect(await reloaded(page)).toBe(false);
        expect((await writer.get({ tenant, id })).operation.status).toBe("needs_review");

        await start(server.port);
        await expect.poll(() => page.locator("#live-lost").isVisible(), { timeout: scaled(30_000) }).toBe(false);
        expect(await page.locator("#not-sent").isVisible()).toBe(false);
        // Unchanged meanwhile: the decision, as filled in, is sent now, and recorded once.
        await page.getByRole("button", { name: "Record the decision" }).click();
        await expect.poll(() => page.getByTestId("flash").textContent()).toBe("Resolved as failed.");
        const { operation, events } = await writer.get({ tenant, id });
        expect(operation.status).toBe("failed");
        expect(events.filter((e) => e.to === "failed").map((e) => e.actor)).toEqual(["alice"]);
      } finally {
        await context.close();
      }
    });

    it("a decision whose answer was lost (the console cut off after it was recorded), sent again by a reload, says it was recorded already, and is recorded once", async () => {
      const id = await waiting("answer-lost");
      const server = await start();
      const { context, page } = await signInAs(browser, server.url, ALICE.token, ALICE.name);
      try {
        await opened(page, server.url, id);
        // The first decision reaches the console and is recorded; its answer never reaches the browser.
        let sent = 0;
        await page.route(`**/op/${tenant}/${id}/decide`, async (route) => {
          if (++sent > 1) return route.continue();
          // As the page sent it (an intercepted request's Origin reads "null" here).
          const headers = { ...route.request().headers(), origin: server.url };
          const answer = await route.fetch({ headers, maxRedirects: 0 });
          expect(answer.status()).toBe(303);
          return route.abort("connectionreset");
        });
        await page.getByLabel("It did not happen and must not be tried again: resolve as failed").check();
        await page.locator("#one-reason").fill("checked at the provider: not sent");
        await page.getByRole("button", { name: "Record the decision" }).click();
        await expect.poll(() => page.url()).toMatch(/^chrome-error:/);
        expect((await writer.get({ tenant, id })).operation.status).toBe("failed");

        // The person, told nothing, reloads: the browser sends the same form again.
        await page.reload();
        expect(sent).toBe(2);
        // Before: "Refused: it changed since it was shown: it was needs_review at attempt 1, it is
        // failed at attempt 1 now. Nothing was decided.", their own decision untold.
        await expect
          .poll(() => page.getByTestId("flash").textContent())
          .toBe(
            "Already decided: your decision on it as shown (“It did not happen and must not be tried again: resolve as failed”) was recorded; sent again, it decided nothing. It is failed now.",
          );
        const { events } = await writer.get({ tenant, id });
        expect(events.filter((e) => e.to === "failed").map((e) => e.actor)).toEqual(["alice"]);
      } finally {
        await context.close();
      }
    });
  });
}
