/**
 * The operators' console in a real browser (Playwright driving Debian's Chromium), on SQLite and
 * Postgres. A worker sending an email in append mode is SIGKILLed after the SMTP server accepted
 * the message and before its APPEND to Sent: nothing can prove it either way, so it waits for a
 * person. The operator signs in, finds it in the queue, reads the recipient and subject, resolves
 * it with a reason; the ledger's audit trail names them. A second operator without that tenant
 * cannot see it, a stale page cannot decide it, and a form from elsewhere is refused.
 */
import { writeFileSync } from "node:fs";
import { request } from "node:http";
import { fileURLToPath } from "node:url";
import { defineAction, openLedger, type Ledger } from "@idem/core";
import { emailActions } from "@idem/email";
import { MailSandbox, SENDER } from "@idem/sandbox";
import { type Child, DIALECTS, freshDatabase, kill9, scaled, startChild, tempDir } from "@idem/testkit";
import type { Browser } from "playwright-core";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { launchChromium, signInAs } from "./console-support.js";
import { CLI, until } from "./support.js";

/** Writes `config`, runs `idem --config … <command>` and waits for the line saying where the console listens. */
async function serving(
  config: object,
  command: string[] = ["console"],
  env: Record<string, string> = {},
): Promise<{ child: Child; base: string }> {
  const file = `${tempDir()}/idem.config.json`;
  writeFileSync(file, JSON.stringify(config));
  const child = startChild(CLI, ["--config", file, ...command], env);
  const base = /"url":"([^"]+)"/.exec(await child.waitFor(/serving the console/))![1]!;
  return { child, base };
}

/** A migrated SQLite ledger of its own. */
async function sqliteLedger(): Promise<string> {
  const url = `sqlite:${tempDir()}/l.db`;
  await (await openLedger(url)).close();
  return url;
}

/** The status of a GET with these headers (node:http: fetch may not set Host). */
function statusFor(url: string, headers: Record<string, string>): Promise<number> {
  return new Promise((resolve, reject) => {
    request(url, { headers }, (res) => {
      res.resume();
      resolve(res.statusCode ?? 0);
    })
      .on("error", reject)
      .end();
  });
}
const MAIL_WORKER = fileURLToPath(new URL("../../../packages/email/test/children/mail-worker.ts", import.meta.url));
const SCREENSHOTS = fileURLToPath(new URL("../../../docs/images/", import.meta.url));
const TOKENS = { alice: "alice-token-7f3a9c", bob: "bob-token-51e0d2" };
const LEASE_MS = 1_500;

let browser: Browser;
let sandbox: MailSandbox;
let mail: { smtp: number; imap: number };
beforeAll(async () => {
  browser = await launchChromium();
  sandbox = new MailSandbox();
  const s = await sandbox.start();
  mail = { smtp: s.smtp.port, imap: s.imap.port };
}, scaled(60_000));
afterAll(async () => {
  await browser?.close();
  await sandbox?.close();
});

for (const dialect of DIALECTS) {
  describe(`the console on ${dialect}`, { timeout: scaled(180_000) }, () => {
    let url = "";
    let ledger: Ledger;
    let web: Child;
    let base = "";
    const tenant = `acme-${dialect}`;
    /** The bulk test's own tenant: its many operations stay out of the other tests' queue. */
    const bulkTenant = `bulk-${dialect}`;
    /** The test of the forms' choice: its own operations, none of the others'. */
    const choiceTenant = `choice-${dialect}`;
    /** The test of a bulk selection with an operation whose effect happened: its own operations. */
    const performedTenant = `performed-${dialect}`;
    let opId = "";

    beforeAll(async () => {
      url = await freshDatabase(dialect);
      const send = emailActions({
        // The sandbox offers no TLS (as its worker says too).
        smtp: { host: "127.0.0.1", port: mail.smtp, auth: SENDER, timeoutMs: 2_500, requireTLS: false },
        imap: { host: "127.0.0.1", port: mail.imap, auth: SENDER, requireTLS: false },
        from: SENDER.user,
        copy: { mode: "append" },
      }).send;
      ledger = await openLedger(url, { actions: [send], leaseMs: LEASE_MS });
      // The send, killed between the server's acceptance and the client's APPEND.
      sandbox.mode = "none";
      sandbox.faults.add({ kind: "hold_reply", delayMs: 60_000 });
      const accepted = new Promise<{ messageId: string }>((resolve) => sandbox.events.once("accepted", resolve));
      const worker = startChild(MAIL_WORKER, [], {
        LEDGER_URL: url,
        TENANT: tenant,
        KEY: "weekly-report",
        SMTP_PORT: String(mail.smtp),
        IMAP_PORT: String(mail.imap),
        USER: SENDER.user,
        PASS: SENDER.pass,
        LEASE_MS: String(LEASE_MS),
      });
      const { messageId } = await accepted;
      await kill9(worker);
      // After its lease, settling it finds nothing can prove the effect: a person decides.
      const [row] = await ledger.admin.list({ tenant });
      opId = row!.id;
      await until(
        async () => {
          const out = await ledger.daemon.settle({ tenant, id: opId, actor: "test-daemon" });
          return out.status === "pending_verification" && out.state === "needs_review";
        },
        30_000,
        "the killed send to reach needs_review",
      );
      expect(sandbox.count(messageId)).toBe(1);

      ({ child: web, base } = await serving(
        {
          ledger: url,
          console: {
            port: 0,
            sessionSecretEnv: "CONSOLE_SECRET",
            operators: [
              { name: "alice", tokenEnv: "ALICE_TOKEN", tenants: [tenant, bulkTenant, choiceTenant, performedTenant] },
              { name: "bob", tokenEnv: "BOB_TOKEN", tenants: ["globex"] },
            ],
          },
        },
        ["console"],
        { ALICE_TOKEN: TOKENS.alice, BOB_TOKEN: TOKENS.bob, CONSOLE_SECRET: "s3cret-for-tests" },
      ));
    });
    afterAll(async () => {
      if (web) await kill9(web);
      await ledger?.close();
    });

    const signIn = (who: keyof typeof TOKENS) => signInAs(browser, base, TOKENS[who], who);

    it("an operator finds the killed send in the queue, reads its recipient and subject, and resolves it; the audit trail names them", async () => {
      const { context, page } = await signIn("alice");
      // What the Content-Security-Policy blocked of the console's own pages (their style and script).
      const blocked: string[] = [];
      context.on("console", (m) => {
        if (/Content Security Policy/i.test(m.text())) blocked.push(m.text());
      });
      try {
        // The queue as loaded now; it will be stale by the end of this test.
        const stale = await context.newPage();
        await stale.goto(`${base}/`);
        // Stats for the tenant: the killed send waits for a person.
        const stats = await context.newPage();
        await stats.goto(`${base}/stats?tenant=${tenant}`);
        expect(await stats.getByTestId("stats").textContent()).toMatch(
          new RegExp(`${tenant}\\s*email\\.send\\s*needs_review\\s*1`),
        );

        const row = page.locator(`tr[data-operation="${opId}"]`);
        await expect.poll(() => row.count()).toBe(1);
        expect(await row.textContent()).toContain("needs_review");
        if (dialect === "sqlite") await page.screenshot({ path: `${SCREENSHOTS}console-queue.png`, fullPage: true });
        await page.getByRole("link", { name: opId }).click();
        const args = await page.getByTestId("args").textContent();
        expect(args).toContain('"to": "client@example.test"');
        expect(args).toContain('"subject": "Weekly report"');
        expect(await page.locator("#status").textContent()).toBe("needs_review");
        // When the key was first sent: the provider's key window counts from it.
        const firstSent = (await ledger.get({ tenant, id: opId })).operation.firstSentAt!;
        expect(await page.getByTestId("first-sent").textContent()).toBe(
          new Date(firstSent)
            .toISOString()
            .replace("T", " ")
            .replace(/\.\d+Z$/, "Z"),
        );

        // A second tab on the same operation sees the decision live, without reloading.
        const watcher = await context.newPage();
        await watcher.goto(page.url());
        if (dialect === "sqlite")
          await page.screenshot({ path: `${SCREENSHOTS}console-operation.png`, fullPage: true });

        await page.getByLabel("It happened: resolve as succeeded").check();
        await page.getByLabel("Reason (recorded with your name)").fill("found in the client's inbox by hand");
        await page
          .getByLabel("Evidence (what you checked: the provider's id or link)")
          .fill("inbox search: Weekly report");
        await page.getByRole("button", { name: "Record the decision" }).click();
        await expect.poll(() => page.getByTestId("flash").textContent()).toContain("Resolved as succeeded");
        expect(await page.getByTestId("verdict").textContent()).toContain(
          "succeeded by alice: found in the client's inbox by hand",
        );

        const { operation, events } = await ledger.get({ tenant, id: opId });
        expect(operation).toMatchObject({
          status: "succeeded",
          result: null,
          resolution: { actor: "alice", evidence: "inbox search: Weekly report" },
        });
        expect(events.at(-1)).toMatchObject({ from: "needs_review", to: "succeeded", actor: "alice" });

        await expect
          .poll(() => watcher.locator("#status").textContent(), { timeout: scaled(15_000) })
          .toBe("succeeded");
        expect(await watcher.locator("#changed").isVisible()).toBe(true);

        // Stats for the tenant: the resolved send no longer waits, and the hourly chart counts it.
        await page.goto(`${base}/stats?tenant=${tenant}`);
        expect(await page.getByTestId("stats").textContent()).not.toMatch(
          new RegExp(`${tenant}\\s*email\\.send\\s*needs_review`),
        );
        expect(await page.getByRole("img").getAttribute("aria-label")).toMatch(
          /^[1-9]\d* operations created in the last 24 hours$/,
        );

        // The stale queue still offers it; deciding from it is refused, and nothing changes.
        const box = stale.locator(`tr[data-operation="${opId}"] input[name="ops"]`);
        await stale.getByLabel("Select all").check(); // the page's script, served as a file
        expect(await box.isChecked()).toBe(true);
        await stale.getByLabel("Select all").uncheck();
        await box.check();
        await stale.getByLabel("It did not happen: run it again with the same key").check();
        await stale.locator("#bulk-reason").fill("not sent, run it again");
        await stale.getByRole("button", { name: "Record the decision" }).click();
        await expect
          .poll(() => stale.getByTestId("flash").textContent())
          .toMatch(
            new RegExp(
              `${opId}: it changed since the queue showed it: it was needs_review at attempt (\\d+), it is succeeded at attempt \\1 now · Reload the queue and decide again\\.`,
            ),
          );
        expect((await ledger.get({ tenant, id: opId })).operation.status).toBe("succeeded");

        // A form posted from another site is refused (its Origin), and so is one without the form's token.
        const forged = await page.request.post(`${base}/op/${tenant}/${opId}/decide`, {
          form: { outcome: "retry", reason: "forged" },
        });
        expect(forged.status()).toBe(403);
        const tokenless = await page.request.post(`${base}/op/${tenant}/${opId}/decide`, {
          form: { outcome: "retry", reason: "forged" },
          headers: { Origin: base },
        });
        expect(tokenless.status()).toBe(403);
        expect(await tokenless.text()).toMatch(/out of date or not from the console/);

        // No inline script runs: the policy allows the console's own files only, and the pages use no other.
        const policy = (await page.request.get(`${base}/`)).headers()["content-security-policy"];
        expect(policy).toContain("script-src 'self'");
        expect(policy).toContain("frame-ancestors 'none'");
        expect(policy).not.toContain("unsafe-inline");
        expect(await page.locator("script:not([src]), [style]").count()).toBe(0);
        expect(blocked).toEqual([]);
      } finally {
        await context.close();
      }
    });

    it("a page shown before the operation changed cannot decide it, even where the new status would allow the decision", async () => {
      // A second case for a person: an effect that nothing can check goes to review at once.
      const parked = defineAction({
        type: "sms.send",
        capabilities: {},
        execute: async () => {
          throw new Error("socket hang up after send");
        },
      });
      const second = await ledger.run(parked, { tenant, key: ["sms", 1], args: { to: "+100" } });
      expect(second).toMatchObject({ status: "pending_verification", state: "needs_review" });
      const { context, page } = await signIn("alice");
      try {
        await page.goto(`${base}/op/${tenant}/${second.operationId}`);
        const shownAt = Number(await page.locator("#status").getAttribute("data-updated"));
        // Meanwhile another operator decides it did not happen: failed, from which a retry is allowed.
        await ledger.admin.resolve({
          tenant,
          id: second.operationId,
          outcome: "failed",
          reason: "checked: not sent",
          actor: "carol",
        });
        // This page, as shown before, asks for a retry (submitted as a page whose live update had not arrived).
        await page.getByLabel("It did not happen: run it again with the same key").check();
        await page.locator("#one-reason").fill("not sent");
        await page
          .locator("#decide")
          .evaluate((form) => (form as unknown as { requestSubmit(): void }).requestSubmit());
        await expect
          .poll(() => page.getByTestId("flash").textContent())
          .toMatch(
            // Before: "Refused: the operation is failed and changed since it was shown; reload it …" (what it was shown as, unsaid).
            /Refused: it changed since it was shown: it was needs_review at attempt (\d+), it is failed at attempt \1 now\. Nothing was decided\. Reload it and decide on what it is now$/,
          );
        const now = (await ledger.get({ tenant, id: second.operationId })).operation;
        expect(now).toMatchObject({ status: "failed", resolution: { actor: "carol" } });
        expect(now.updatedAt).not.toBe(shownAt);
        // Its reload: the operation's page as it is now, offering what it takes now.
        await page.getByTestId("flash").getByRole("link", { name: "Reload it and decide on what it is now" }).click();
        await expect.poll(() => page.locator("#status").getAttribute("data-updated")).toBe(String(now.updatedAt));
        expect(new URL(page.url()).pathname).toBe(`/op/${tenant}/${second.operationId}`);
        expect(
          await page
            .locator('#decide input[name="outcome"]')
            .evaluateAll((rs) => rs.map((r) => r.getAttribute("value"))),
        ).toEqual(["retry"]);
      } finally {
        await context.close();
      }
    });

    it("an operation whose effect happened but whose receipt could not be stored offers only 'succeeded', and says why", async () => {
      // The SMS went out; its receipt holds a BigInt, which the ledger cannot store: parked with the proof.
      const sent = defineAction<{ to: string }, { id: string; segments: bigint }>({
        type: "sms.send",
        capabilities: {},
        execute: async () => ({ id: "sms_42", segments: 2n }),
      });
      await expect(ledger.run(sent, { tenant, key: ["performed", 1], args: { to: "+200" } })).rejects.toMatchObject({
        name: "InvalidValueError",
      });
      const [parked] = (await ledger.admin.list({ tenant, status: "needs_review" })).filter(
        (o) => o.action === "sms.send" && o.error?.kind === "invalid_result",
      );
      expect(parked).toBeDefined();
      const { context, page } = await signIn("alice");
      try {
        await page.goto(`${base}/op/${tenant}/${parked!.id}`);
        // Before: "failed" and "retry" were offered too, and core refused either once submitted.
        expect(
          await page
            .locator('#decide input[name="outcome"]')
            .evaluateAll((rs) => rs.map((r) => r.getAttribute("value"))),
        ).toEqual(["succeeded"]);
        expect(await page.getByTestId("performed").textContent()).toMatch(
          /effect happened \(attempt 1's request\).*receipt could not be stored.*only .It happened: resolve as succeeded., with the receipt you find at the provider \(the Receipt field of its page\) or your evidence, is accepted/,
        );
        // A form posted anyway (another client, an old page) is refused with the same why, nothing decided.
        const token = await page.locator('#decide input[name="csrf"]').inputValue();
        const seen = await page.locator('#decide input[name="seen"]').inputValue();
        const posted = await page.request.post(`${base}/op/${tenant}/${parked!.id}/decide`, {
          form: { csrf: token, seen, outcome: "retry", reason: "not in the SMS log" },
          headers: { Origin: base },
        });
        expect(posted.status()).toBe(409);
        expect(await posted.text()).toMatch(/Refused\. Its effect happened.*only .It happened: resolve as succeeded./);
        expect((await ledger.get({ tenant, id: parked!.id })).operation.status).toBe("needs_review");
        // What it accepts: succeeded, with the receipt found at the provider.
        await page.getByLabel("It happened: resolve as succeeded").check();
        await page.locator("#one-reason").fill("in the SMS provider's log");
        await page.locator("#one-evidence").fill("sms_42");
        await page.getByRole("button", { name: "Record the decision" }).click();
        await expect.poll(() => page.getByTestId("flash").textContent()).toContain("Resolved as succeeded");
      } finally {
        await context.close();
      }
    });

    it("a failure's page shows what names it at the provider as fields: the request id and each entry of evidence", async () => {
      // A CRM create refused because the record exists: the provider's answer names the one it has.
      const refused = defineAction<{ email: string }, { id: string }>({
        type: "crm.create",
        capabilities: {},
        execute: async () => {
          throw new Error("409 conflict");
        },
        classify: () => ({
          kind: "permanent",
          reason: "the contact exists already",
          providerRequestId: "req_<b>9</b>",
          evidence: { existing_id: "501", code: "CONFLICT" },
        }),
      });
      const out = await ledger.run(refused, { tenant, key: ["fields", 1], args: { email: "x@example.test" } });
      expect(out).toMatchObject({ status: "failed" });
      const { context, page } = await signIn("alice");
      try {
        await page.goto(`${base}/op/${tenant}/${out.operationId}`);
        // Before: only "permanent: the contact exists already"; the request id and the record's id were not shown.
        const fields = page.getByTestId("error-fields");
        expect(await fields.locator("dt").allTextContents()).toEqual(["provider request id", "existing_id", "code"]);
        expect(await fields.locator("dd").allTextContents()).toEqual(["req_<b>9</b>", "501", "CONFLICT"]);
        expect(await page.getByTestId("error").textContent()).toMatch(/^permanent: the contact exists already/);
      } finally {
        await context.close();
      }
    });

    it("a bulk selection with an operation whose effect happened offers only 'succeeded'; 'failed' posted anyway decides none of it and says which and why", async () => {
      const parked = defineAction({
        type: "sms.send",
        capabilities: {},
        execute: async () => {
          throw new Error("socket hang up after send");
        },
      });
      // The SMS went out; its receipt holds a BigInt, which the ledger cannot store: parked with the proof.
      const sent = defineAction<{ to: string }, { id: string; segments: bigint }>({
        type: "sms.send",
        capabilities: {},
        execute: async () => ({ id: "sms_77", segments: 2n }),
      });
      const open: string[] = [];
      for (const k of ["a", "b"])
        open.push(
          (await ledger.run(parked, { tenant: performedTenant, key: ["open", k], args: { to: `+${k}` } })).operationId,
        );
      await expect(
        ledger.run(sent, { tenant: performedTenant, key: ["done"], args: { to: "+300" } }),
      ).rejects.toMatchObject({ name: "InvalidValueError" });
      const [done] = (await ledger.admin.list({ tenant: performedTenant, status: "needs_review" })).filter(
        (o) => o.error?.kind === "invalid_result",
      );
      expect(done).toBeDefined();
      const statuses = async () =>
        Promise.all(
          [...open, done!.id].map(async (id) => (await ledger.get({ tenant: performedTenant, id })).operation.status),
        );
      const { context, page } = await signIn("alice");
      try {
        await page.goto(`${base}/?tenant=${performedTenant}`);
        await expect.poll(() => page.locator("tr[data-operation]").count()).toBe(3);
        const offered = () =>
          page
            .locator('form[action="/bulk"] input[name="outcome"]:enabled')
            .evaluateAll((rs) => rs.map((r) => r.getAttribute("value")));
        // Before: all three were offered for any selection, and core refused "failed" and a retry once submitted.
        await page.getByLabel("Select all").check();
        expect(await offered()).toEqual(["succeeded"]);
        expect(await page.getByTestId("bulk-limits").textContent()).toMatch(
          /^“failed” and a retry are not offered for this selection: 1 selected operation does not take them \(its Why says so\)/,
        );
        // Without it, every decision is offered again.
        await page.getByLabel(`Select ${done!.id}`).uncheck();
        expect(await offered()).toEqual(["succeeded", "failed", "retry"]);
        expect(await page.getByTestId("bulk-limits").isVisible()).toBe(false);

        // The whole selection posted with "failed" anyway (another client, a page without its script):
        // nothing is decided, and the note names the operation and why.
        const token = await page.locator('form[action="/bulk"] input[name="csrf"]').inputValue();
        const picked = await page
          .locator('input[name="ops"]')
          .evaluateAll((bs) => bs.map((b) => (b as unknown as { value: string }).value));
        const posted = await page.request.post(`${base}/bulk`, {
          data: new URLSearchParams([
            ["csrf", token],
            ["filter.tenant", performedTenant],
            ...picked.map((v): [string, string] => ["ops", v]),
            ["outcome", "failed"],
            ["reason", "none of them went out"],
          ]).toString(),
          headers: { Origin: base, "Content-Type": "application/x-www-form-urlencoded" },
        });
        expect(posted.ok()).toBe(true);
        const note = await posted.text();
        expect(note).toContain("Nothing was decided: 1 of 3 selected does not take “failed”");
        expect(note).toContain(
          `${done!.id}: its effect happened (attempt 1&#39;s request), but its receipt could not be stored: it takes only “succeeded”`,
        );
        expect(await statuses()).toEqual(["needs_review", "needs_review", "needs_review"]);

        // The two others, as failed; then the performed one, as succeeded.
        await page.goto(`${base}/?tenant=${performedTenant}`);
        for (const id of open) await page.getByLabel(`Select ${id}`).check();
        await page.getByLabel("It did not happen and must not be tried again: resolve as failed").check();
        await page.locator("#bulk-reason").fill("not in the SMS provider's log");
        await page.getByRole("button", { name: "Record the decision" }).click();
        await expect
          .poll(() => page.getByTestId("flash").textContent())
          .toBe("2 of 2 selected were decided: Resolved as failed.");
        await page.getByLabel(`Select ${done!.id}`).check();
        expect(await offered()).toEqual(["succeeded"]);
        await page.getByLabel("It happened: resolve as succeeded").check();
        await page.locator("#bulk-reason").fill("in the SMS provider's log");
        await page.getByRole("button", { name: "Record the decision" }).click();
        await expect
          .poll(() => page.getByTestId("flash").textContent())
          .toBe("1 of 1 selected was decided: Resolved as succeeded.");
        expect(await statuses()).toEqual(["failed", "failed", "succeeded"]);
      } finally {
        await context.close();
      }
    });

    it("a page whose live updates are refused says so, instead of showing a status that may be old", async () => {
      const { context, page } = await signIn("alice");
      const cookie = (await context.cookies()).map((c) => `${c.name}=${c.value}`).join("; ");
      const streams: AbortController[] = [];
      try {
        // alice's other tabs hold every live stream an operator may have. The pages of earlier
        // tests held some too: the console frees a stream's slot once it hears the tab closed, so a
        // refused one is asked again until that happened.
        const deadline = Date.now() + 30_000;
        while (streams.length < 16) {
          const stop = new AbortController();
          const res = await fetch(`${base}/op/${tenant}/${opId}/live`, { headers: { cookie }, signal: stop.signal });
          if (res.status === 200) {
            streams.push(stop);
            continue;
          }
          expect(res.status).toBe(429);
          await res.body?.cancel();
          if (Date.now() > deadline) throw new Error("earlier pages' live streams were never freed");
          await new Promise((r) => setTimeout(r, 100));
        }
        await page.goto(`${base}/op/${tenant}/${opId}`);
        await expect.poll(() => page.locator("#live-stopped").isVisible()).toBe(true);
        expect(await page.locator("#live-stopped").textContent()).toMatch(/Live updates stopped/);
      } finally {
        for (const s of streams) s.abort();
        await context.close();
      }
    });

    it("a bulk decision on 500 selected operations decides each once and shows what it did (it was a 431)", async () => {
      // 500 operations that wait for a person: an effect nothing can check goes to review at once.
      const parked = defineAction({
        type: "sms.send",
        capabilities: {},
        execute: async () => {
          throw new Error("socket hang up after send");
        },
      });
      const ids: string[] = [];
      for (let i = 0; i < 500; i += 50) {
        const batch = await Promise.all(
          Array.from({ length: 50 }, (_, j) =>
            ledger.run(parked, { tenant: bulkTenant, key: ["bulk", i + j], args: { to: `+${i + j}` } }),
          ),
        );
        for (const out of batch) {
          expect(out).toMatchObject({ status: "pending_verification", state: "needs_review" });
          ids.push(out.operationId);
        }
      }
      const { context, page } = await signIn("alice");
      // Deciding 500 takes a while on a loaded machine: so may the form's navigation.
      page.setDefaultNavigationTimeout(scaled(120_000));
      try {
        await page.goto(`${base}/?tenant=${bulkTenant}`);
        await expect.poll(() => page.locator("tr[data-operation]").count()).toBe(500);
        await page.getByLabel("Select all").check();
        expect(await page.locator('input[name="ops"]:checked').count()).toBe(500);
        await page.getByLabel("It happened: resolve as succeeded").check();
        await page.locator("#bulk-reason").fill("found every one in the SMS provider's log");
        // The queue the decision's redirect leads to. Before: its URL named every operation, and the server answered 431.
        const shown = page.waitForResponse((r) => r.request().method() === "GET" && new URL(r.url()).pathname === "/", {
          timeout: scaled(120_000),
        });
        await page.getByRole("button", { name: "Record the decision" }).click();
        expect((await shown).status()).toBe(200);
        expect(await page.getByTestId("flash").textContent()).toBe(
          "500 of 500 selected were decided: Resolved as succeeded.",
        );
        const queued = await page
          .locator("tr[data-operation]")
          .evaluateAll((rows) => rows.map((r) => r.getAttribute("data-operation")));
        expect(queued.filter((id) => ids.includes(id!))).toEqual([]); // none of them waits any more

        // Each was decided once, by alice, from needs_review: no other decision or success was recorded.
        for (const id of ids) {
          const { operation, events } = await ledger.get({ tenant: bulkTenant, id });
          expect(operation).toMatchObject({ status: "succeeded", resolution: { actor: "alice" } });
          expect(events.filter((e) => e.to === "succeeded" || e.actor === "alice")).toMatchObject([
            { from: "needs_review", to: "succeeded", actor: "alice" },
          ]);
        }
      } finally {
        await context.close();
      }
    });

    it("the decision forms choose nothing for the person: with every row selected, a reason alone decides nothing", async () => {
      const parked = defineAction({
        type: "sms.send",
        capabilities: {},
        execute: async () => {
          throw new Error("socket hang up after send");
        },
      });
      const ids: string[] = [];
      for (const k of ["a", "b", "c"])
        ids.push(
          (await ledger.run(parked, { tenant: choiceTenant, key: ["choice", k], args: { to: `+${k}` } })).operationId,
        );
      const { context, page } = await signIn("alice");
      try {
        const statuses = async () =>
          Promise.all(ids.map(async (id) => (await ledger.get({ tenant: choiceTenant, id })).operation.status));
        await page.goto(`${base}/?tenant=${choiceTenant}`);
        await expect.poll(() => page.locator("tr[data-operation]").count()).toBe(3);
        // Before: "It happened: resolve as succeeded" was chosen already, and this resolved all three as succeeded.
        expect(await page.locator('input[name="outcome"]:checked').count()).toBe(0);
        await page.getByLabel("Select all").check();
        await page.locator("#bulk-reason").fill("looked at them");
        await page.getByRole("button", { name: "Record the decision" }).click();
        // The browser asks for a choice; nothing is sent.
        expect(
          await page
            .locator('input[name="outcome"]')
            .first()
            .evaluate((r) => (r as unknown as { validity: { valueMissing: boolean } }).validity.valueMissing),
        ).toBe(true);
        await new Promise((r) => setTimeout(r, 500));
        expect(await statuses()).toEqual(["needs_review", "needs_review", "needs_review"]);
        // A form sent without a choice anyway (another client) is refused by the console, nothing decided.
        const token = await page.locator('input[name="csrf"]').first().inputValue();
        const picked = await page.locator('input[name="ops"]').first().inputValue();
        const posted = await page.request.post(`${base}/bulk`, {
          form: { csrf: token, ops: picked, reason: "looked at them" },
          headers: { Origin: base },
        });
        expect(posted.ok()).toBe(true);
        expect(await posted.text()).toContain("Choose a decision. Nothing was decided.");
        expect(await statuses()).toEqual(["needs_review", "needs_review", "needs_review"]);
        // The operation's own form neither.
        await page.goto(`${base}/op/${choiceTenant}/${ids[0]}`);
        expect(await page.locator('#decide input[name="outcome"]').count()).toBe(3);
        expect(await page.locator('#decide input[name="outcome"]:checked').count()).toBe(0);
        await page.locator("#one-reason").fill("looked at it");
        await page.getByRole("button", { name: "Record the decision" }).click();
        await new Promise((r) => setTimeout(r, 500));
        expect(await statuses()).toEqual(["needs_review", "needs_review", "needs_review"]);
        // A choice made decides, as before.
        await page.getByLabel("It did not happen and must not be tried again: resolve as failed").check();
        await page.getByRole("button", { name: "Record the decision" }).click();
        await expect.poll(() => page.getByTestId("flash").textContent()).toContain("Resolved as failed");
        expect(await statuses()).toEqual(["failed", "needs_review", "needs_review"]);
      } finally {
        await context.close();
      }
    });

    it("an operator without the tenant sees nothing of it, not even by its address", async () => {
      const { context, page } = await signIn("bob");
      try {
        expect(await page.locator(`tr[data-operation="${opId}"]`).count()).toBe(0);
        const direct = await page.goto(`${base}/op/${tenant}/${opId}`);
        expect(direct?.status()).toBe(404);
        expect(await page.content()).not.toContain("client@example.test");
        const live = await page.request.get(`${base}/op/${tenant}/${opId}/live`);
        expect(live.status()).toBe(404);
        await page.goto(`${base}/?tenant=${tenant}`);
        expect(await page.getByTestId("empty").isVisible()).toBe(true);
        await page.goto(`${base}/stats?tenant=${tenant}`);
        expect(await page.getByTestId("stats").textContent()).not.toContain(tenant);
      } finally {
        await context.close();
      }
    });

    it("a wrong token signs nobody in", async () => {
      const context = await browser.newContext();
      try {
        const page = await context.newPage();
        await page.goto(`${base}/login`);
        await page.getByLabel("Operator token").fill("not-a-token");
        await page.getByRole("button", { name: "Sign in" }).click();
        expect(await page.getByRole("alert").textContent()).toContain("does not belong to an operator");
        const home = await page.goto(`${base}/`);
        expect(new URL(page.url()).pathname).toBe("/login");
        expect(home?.ok()).toBe(true);
      } finally {
        await context.close();
      }
    });
  });
}

describe("the console behind an authenticating proxy, and beside the daemon", { timeout: scaled(120_000) }, () => {
  it("proxyHeader: the proxy's header names the operator; without it, or with a stranger's name, nothing is served", async () => {
    const { child: web, base } = await serving({
      ledger: await sqliteLedger(),
      console: { port: 0, proxyHeader: "X-Forwarded-User", operators: [{ name: "carol", tenants: ["acme"] }] },
    });
    try {
      const as = (user?: string) =>
        fetch(`${base}/`, { headers: user ? { "X-Forwarded-User": user } : {}, redirect: "manual" });
      const carol = await as("carol");
      expect(carol.status).toBe(200);
      expect(await carol.text()).toContain('<strong data-testid="operator">carol</strong>');
      expect((await as()).status).toBe(401);
      expect((await as("mallory")).status).toBe(401);
      expect((await fetch(`${base}/login`, { redirect: "manual" })).status).toBe(302); // no token sign-in in this mode
      // A page whose name was re-pointed at the console (DNS rebinding) sends its own Host: refused.
      expect(await statusFor(`${base}/`, { Host: "attacker.example", "X-Forwarded-User": "carol" })).toBe(421);
      expect(await statusFor(`${base}/`, { Host: "localhost", "X-Forwarded-User": "carol" })).toBe(200);
    } finally {
      await kill9(web);
    }
  });

  it("proxyHeader: the header is believed only from a trusted proxy's address", async () => {
    const operators = [{ name: "carol", tenants: ["acme"] }];
    const { child: web, base } = await serving({
      ledger: await sqliteLedger(),
      console: { port: 0, proxyHeader: "X-Forwarded-User", trustedProxies: ["10.9.8.7"], operators },
    });
    try {
      // This test connects from 127.0.0.1, which is not the proxy: whoever sends the header is not believed.
      expect(await statusFor(`${base}/`, { "X-Forwarded-User": "carol" })).toBe(401);
    } finally {
      await kill9(web);
    }
  });

  it("warns at start, as the daemon does, of thresholds.perAction keys naming no action of its config (did you mean); without the providers' credentials it says it could not check, and starts", async () => {
    const ledger = await sqliteLedger();
    const perAction = { "stripe.paymentIntent.create": 60_000, "stripe.refunds.create": 60_000, "sms.send": 60_000 };
    const config = {
      ledger,
      providers: { stripe: { apiKeyEnv: "IDEM_TEST_STRIPE_KEY" } },
      thresholds: { perAction },
      console: { port: 0, insecureNoAuth: true },
    };
    /** The warnings the console logged before it said where it listens. */
    const warningsOf = (lines: readonly string[]) =>
      lines
        .map((l) => JSON.parse(l) as { level: number; msg: string; key?: string; known?: string[] })
        .filter((l) => l.level === 40);
    const { child: web } = await serving(config, ["console"], { IDEM_TEST_STRIPE_KEY: "sk_test_unused" });
    try {
      const warnings = warningsOf(web.lines);
      // Before: none.
      expect(warnings.map((w) => w.key)).toEqual(["stripe.paymentIntent.create", "sms.send"]);
      expect(warnings[0]!.msg).toMatch(
        /^thresholds\.perAction\["stripe\.paymentIntent\.create"\] names no action of this config \(did you mean stripe\.paymentIntents\.create\?\)/,
      );
      expect(warnings[1]!.msg).not.toMatch(/did you mean/);
      expect(warnings[1]!.known).toEqual([
        "stripe.customers.create",
        "stripe.paymentIntents.create",
        "stripe.refunds.create",
      ]);
    } finally {
      await kill9(web);
    }
    // The console performs no action: it may run without the providers' credentials, as before.
    const { child: bare } = await serving(config, ["console"], { IDEM_TEST_STRIPE_KEY: "" });
    try {
      expect(warningsOf(bare.lines).map((w) => w.msg)).toEqual([
        "the config's actions could not be built, so a receipt given with a decision is refused (evidence is taken) and thresholds.perAction is not checked against them: invalid config: providers.stripe.apiKeyEnv: environment variable IDEM_TEST_STRIPE_KEY is not set",
      ]);
    } finally {
      await kill9(bare);
    }
  });

  it("the daemon with daemon.console serves it too, and stops it on SIGTERM", async () => {
    const { child: daemon, base } = await serving(
      {
        ledger: await sqliteLedger(),
        daemon: { console: true, intervalMs: 200 },
        console: { port: 0, insecureNoAuth: true },
      },
      ["daemon", "--name", "d-console"],
    );
    try {
      const home = await fetch(`${base}/`);
      expect(home.status).toBe(200);
      expect(await home.text()).toContain("Needs a person");
      daemon.proc.kill("SIGTERM");
      const { code } = await daemon.exited;
      expect(code).toBe(0);
      await expect(fetch(`${base}/`)).rejects.toThrow();
    } finally {
      if (daemon.proc.exitCode === null) await kill9(daemon);
    }
  });
});
