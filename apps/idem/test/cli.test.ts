/** The idem command as a user runs it, on SQLite and Postgres: output, exit codes, audit, tenants, config errors. */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { existsSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { defineAction, openLedger, type Ledger } from "@idem/core";
import { databaseOf, openTestLedger } from "@idem/core/testing";
import { DIALECTS, freshDatabase, scaled, startChild, tempDir } from "@idem/testkit";
import { emailActions } from "@idem/email";
import { HubSpotSandbox } from "@idem/sandbox";
import { actionsOf, parseConfig } from "../src/config.js";
import { operationVersion } from "../src/output.js";
import { CLI, idem } from "./support.js";

/** The version `idem show` prints of the operation as it is now: what a person who just looked decides on. */
/** `idem retry --now` of `id` with the config `file`, on the version the ledger has now. */
async function retryNow(ledger: Ledger, file: string, tenant: string, id: string) {
  const seen = await versionOf(ledger, tenant, id);
  return idem([
    "--config",
    file,
    "retry",
    id,
    "--tenant",
    tenant,
    "--seen",
    seen,
    "--reason",
    "checked: never sent",
    "--now",
  ]);
}

async function versionOf(ledger: Ledger, tenant: string, id: string): Promise<string> {
  return operationVersion((await ledger.get({ tenant, id })).operation);
}

const parked = defineAction({
  type: "sms.send",
  capabilities: {},
  execute: async () => {
    throw new Error("timeout after send");
  },
});

for (const dialect of DIALECTS) {
  describe(`idem CLI on ${dialect}`, { timeout: scaled(180_000) }, () => {
    let url = "";
    let ledger: Ledger;
    let reviewId = "";
    beforeAll(async () => {
      url = await freshDatabase(dialect);
      ledger = await openLedger(url);
      reviewId = (await ledger.run(parked, { tenant: "acme", key: ["sms", 1], args: { to: "+100" }, actor: "agent-1" }))
        .operationId;
    });
    afterAll(() => ledger.close());

    it("lists and shows a tenant's operations, in human and JSON form", async () => {
      const ls = await idem(["--ledger", url, "ls", "--tenant", "acme", "--status", "needs_review"]);
      expect(ls.code).toBe(0);
      expect(ls.stdout).toMatch(new RegExp(`^${reviewId}\\s+needs_review\\s+sms\\.send`, "m"));
      const json = await idem(["--ledger", url, "--json", "show", reviewId, "--tenant", "acme"]);
      expect(json.code).toBe(0);
      const shown = JSON.parse(json.stdout);
      expect(shown.operation).toMatchObject({ id: reviewId, status: "needs_review" });
      expect(shown.events.map((e: { to: string }) => e.to)).toEqual(["running", "unknown", "running", "needs_review"]);
      // The version a decision names (--seen): the operation's status, attempt, checks and last change.
      const { operation: op } = await ledger.get({ tenant: "acme", id: reviewId });
      const version = `needs_review.2.${op.checks}.${op.updatedAt}`;
      expect(shown.version).toBe(version);
      const human = await idem(["--ledger", url, "show", reviewId, "--tenant", "acme"]);
      expect(human.stdout).toMatch(new RegExp(`^version\\s+${version.replaceAll(".", "\\.")}$`, "m"));
      // When the key was first sent (the provider's key window counts from it): its first attempt's
      // claim, kept by the replay of attempt 2, by the database clock.
      expect(op.firstSentAt).toBeGreaterThanOrEqual(op.createdAt);
      expect(shown.operation.firstSentAt).toBe(op.firstSentAt);
      const at = new Date(op.firstSentAt!).toISOString().replace("T", " ").slice(0, 19);
      expect(human.stdout).toMatch(new RegExp(`^first sent\\s+${at}`, "m"));
      expect(ls.stdout).toMatch(
        new RegExp(`^${reviewId}\\s+needs_review\\s+sms\\.send\\s+2\\s+\\S+ \\S+\\s+${version}\\s`, "m"),
      );
      const listed = await idem(["--ledger", url, "--json", "ls", "--tenant", "acme", "--status", "needs_review"]);
      expect(JSON.parse(listed.stdout)).toEqual([expect.objectContaining({ id: reviewId, version })]);
    });

    it("a retry of an operation whose last run may have done it is shown as looked up first (show, retry, ls --json)", async () => {
      const tenant = "look-first";
      const { operationId: id } = await ledger.run(parked, { tenant, key: ["sms", 3], args: { to: "+300" } });
      const before = JSON.parse((await idem(["--ledger", url, "--json", "show", id, "--tenant", tenant])).stdout);
      expect(before.operation).toMatchObject({ status: "needs_review", lookFirst: false });
      const retried = await idem([
        "--ledger",
        url,
        "retry",
        id,
        "--tenant",
        tenant,
        "--seen",
        await versionOf(ledger, tenant, id),
        "--reason",
        "nothing in the SMS log",
      ]);
      expect(retried.code, retried.stderr).toBe(0);
      // Before: a plain pending row, read as known not done, though its next run looks first.
      expect(retried.stdout).toMatch(/^looks first\s+its last run may have done it: whoever runs it next/m);
      const shown = JSON.parse((await idem(["--ledger", url, "--json", "show", id, "--tenant", tenant])).stdout);
      expect(shown.operation).toMatchObject({ status: "pending", lookFirst: true });
      const listed = JSON.parse((await idem(["--ledger", url, "--json", "ls", "--tenant", tenant])).stdout);
      expect(listed).toEqual([expect.objectContaining({ id, lookFirst: true })]);
      const human = await idem(["--ledger", url, "show", reviewId, "--tenant", "acme"]);
      expect(human.stdout).not.toMatch(/^looks first/m);
    });

    it("another tenant's operator cannot see or resolve the operation (exit 3), and nothing changes", async () => {
      const show = await idem(["--ledger", url, "show", reviewId, "--tenant", "globex"]);
      expect(show.code).toBe(3);
      const resolve = await idem([
        "--ledger",
        url,
        "resolve",
        reviewId,
        "--tenant",
        "globex",
        "--succeeded",
        "--seen",
        await versionOf(ledger, "acme", reviewId),
        "--reason",
        "looks done",
      ]);
      expect(resolve.code).toBe(3);
      expect(resolve.stderr).toMatch(/no operation/);
      expect((await ledger.get({ tenant: "acme", id: reviewId })).operation.status).toBe("needs_review");
    });

    it("an operator's queue across tenants, paged with --before; --tenant and --all-tenants together are refused", async () => {
      const other = await ledger.run(parked, { tenant: "globex", key: ["sms", 2], args: { to: "+200" } });
      const queue = await idem(["--ledger", url, "--json", "ls", "--all-tenants", "--status", "needs_review"]);
      expect(queue.code, queue.stderr).toBe(0);
      const rows = JSON.parse(queue.stdout) as { id: string; tenant: string }[];
      expect(rows.map((r) => [r.tenant, r.id])).toEqual([
        ["globex", other.operationId],
        ["acme", reviewId],
      ]); // newest first
      const human = await idem(["--ledger", url, "ls", "--all-tenants", "--status", "needs_review", "--limit", "1"]);
      expect(human.stdout).toMatch(/^TENANT\s+ID/m);
      expect(human.stdout).toMatch(new RegExp(`^globex\\s+${other.operationId}\\s+needs_review`, "m"));
      expect(human.stdout).toContain(`more may follow: add --before ${other.operationId}`);
      const next = await idem([
        "--ledger",
        url,
        "--json",
        "ls",
        "--all-tenants",
        "--status",
        "needs_review",
        "--limit",
        "1",
        "--before",
        other.operationId,
      ]);
      expect((JSON.parse(next.stdout) as { id: string }[]).map((r) => r.id)).toEqual([reviewId]);
      const both = await idem(["--ledger", url, "ls", "--all-tenants", "--tenant", "acme"]);
      expect(both.code).toBe(2);
      expect(both.stderr).toMatch(/--tenant or --all-tenants, not both/);
      await ledger.admin.resolve({
        tenant: "globex",
        id: other.operationId,
        outcome: "failed",
        reason: "not sent",
        actor: "test",
      });
    });

    it("a receipt given with resolve must be checked by the action's receipt schema: without one it is refused (exit 2), nothing changes", async () => {
      const out = await idem([
        "--ledger",
        url,
        "resolve",
        reviewId,
        "--tenant",
        "acme",
        "--succeeded",
        "--seen",
        await versionOf(ledger, "acme", reviewId),
        "--reason",
        "found",
        "--receipt",
        '{"sid":"SM42"}',
      ]);
      expect(out.code).toBe(2);
      expect(out.stderr).toMatch(/receipt: action sms\.send .* has no receipt schema registered/);
      expect((await ledger.get({ tenant: "acme", id: reviewId })).operation.status).toBe("needs_review");
      expect(
        (
          await idem([
            "--ledger",
            url,
            "resolve",
            reviewId,
            "--tenant",
            "acme",
            "--succeeded",
            "--seen",
            await versionOf(ledger, "acme", reviewId),
            "--reason",
            "found",
            "--receipt",
            "{nope",
          ])
        ).code,
      ).toBe(2);
    });

    it("resolve records the verdict and evidence apart from the receipt, with the actor in the audit trail; a second resolve is refused (exit 4)", async () => {
      const out = await idem([
        "--ledger",
        url,
        "--json",
        "resolve",
        reviewId,
        "--tenant",
        "acme",
        "--succeeded",
        "--seen",
        await versionOf(ledger, "acme", reviewId),
        "--reason",
        "found in the SMS console",
        "--evidence",
        "SM42",
        "--actor",
        "ops:alice",
      ]);
      expect(out.code, out.stderr).toBe(0);
      const { events, operation } = await ledger.get({ tenant: "acme", id: reviewId });
      // The provider reference stays the action's (none here), and no receipt of another shape is made up.
      expect(operation).toMatchObject({ status: "succeeded", providerReference: null, result: null });
      expect(operation.resolution).toEqual({
        outcome: "succeeded",
        actor: "ops:alice",
        reason: "found in the SMS console",
        evidence: "SM42",
        at: operation.completedAt,
      });
      expect(JSON.parse(out.stdout).operation.resolution).toMatchObject({ actor: "ops:alice", evidence: "SM42" });
      expect(events.at(-1)).toMatchObject({ from: "needs_review", to: "succeeded", actor: "ops:alice" });
      // A later caller gets the verdict, not a receipt it would misread.
      expect(await ledger.run(parked, { tenant: "acme", key: ["sms", 1], args: { to: "+100" } })).toMatchObject({
        status: "succeeded",
        receipt: null,
        replayed: true,
        resolution: { actor: "ops:alice" },
      });
      const shown = await idem(["--ledger", url, "show", reviewId, "--tenant", "acme"]);
      expect(shown.stdout).toMatch(
        /^verdict\s+succeeded by ops:alice at .*: found in the SMS console \(evidence: SM42\)$/m,
      );
      const again = await idem([
        "--ledger",
        url,
        "resolve",
        reviewId,
        "--tenant",
        "acme",
        "--failed",
        "--seen",
        await versionOf(ledger, "acme", reviewId),
        "--reason",
        "changed my mind",
      ]);
      expect(again.code).toBe(4);
    });

    it("retry of an unknown operation is bound to the version the operator was shown: without --seen refused (exit 2), an older version refused (exit 7, a stale view), saying to show it again", async () => {
      // An unknown outcome the daemon keeps checking: a provider that dedupes on our key, whose answer was lost.
      const charge = defineAction({
        type: "charge.lost",
        capabilities: { dedupe: { retentionMs: 86_400_000 } },
        execute: async () => {
          throw new Error("socket hang up");
        },
        classify: () => ({ kind: "ambiguous", reason: "no answer" }),
      });
      const once = await openLedger(url, { budget: { attempts: 1 } });
      const { operationId: id } = await once.run(charge, { tenant: "acme", key: ["charge", 1], args: { cents: 100 } });
      await once.close();
      expect((await ledger.get({ tenant: "acme", id })).operation).toMatchObject({ status: "unknown", attempt: 1 });
      const shown = await versionOf(ledger, "acme", id);
      // The daemon checks it again meanwhile (its clock an hour on: due), and cannot tell either.
      const daemon = await openTestLedger(url, {
        clock: () => Date.now() + 3_600_000,
        actions: [charge],
        budget: { attempts: 1 },
      });
      await daemon.daemon.settle({ tenant: "acme", id, actor: "idem-daemon:test" });
      await daemon.close();
      expect((await ledger.get({ tenant: "acme", id })).operation).toMatchObject({ status: "unknown", attempt: 2 });
      const retry = (...more: string[]) =>
        idem(["--ledger", url, "retry", id, "--tenant", "acme", "--reason", "not in the dashboard", ...more]);
      const bare = await retry();
      expect(bare.code).toBe(2);
      expect(bare.stderr).toMatch(
        new RegExp(
          `retry needs --seen <version>, the version you checked, as \`idem show ${id} --tenant acme\` prints it`,
        ),
      );
      // An attempt number alone cannot tell a view from a newer one at the same attempt.
      const byAttempt = await retry("--attempt", "2");
      expect(byAttempt.code).toBe(2);
      expect(byAttempt.stderr).toMatch(/--attempt is replaced by --seen <version>/);
      const malformed = await retry("--seen", "2");
      expect(malformed.code).toBe(2);
      expect(malformed.stderr).toMatch(
        /--seen <version>' argument '2' is invalid\. Expected a version as idem show prints it/,
      );
      // Well formed but mistyped (a digit off): never this operation's version. Before: "changed
      // since it was shown" (exit 4), sending the person to look for a change that never was.
      const current = await versionOf(ledger, "acme", id);
      const [st, at, ck, up] = current.split(".");
      for (const [typo, words] of [
        [`${st}.${Number(at) + 1}.${ck}.${up}`, "ahead of"],
        [`${st}.${at}.${ck}.${Number(up) + 10_000}`, "ahead of"],
        [`${st}.${at}.${ck}.${Number(up) - 86_400_000}`, "older than"],
      ] as const) {
        const mistyped = await retry("--seen", typo);
        expect(mistyped.code, mistyped.stderr).toBe(2);
        expect(mistyped.stderr).toBe(
          `idem: seen: ${typo} is ${words} operation ${id}${words === "ahead of" ? "'s version" : " itself"} (it is now ${current}): a mistyped version? Nothing was decided. Give the version idem show ${id} --tenant acme prints\n`,
        );
      }
      expect(await versionOf(ledger, "acme", id)).toBe(current); // nothing decided
      const stale = await retry("--seen", shown);
      expect(stale.code).toBe(7); // a stale view, apart from a status that does not allow it (4)
      expect(stale.stderr).toMatch(
        new RegExp(
          `^idem: operation ${id} changed since it was shown \\(version ${shown.replaceAll(".", "\\.")}\\): it is now unknown at attempt 2 \\(version \\S+\\); nothing was decided\\. Show it again \\(idem show ${id} --tenant acme\\) and decide on what you see now\n$`,
        ),
      );
      expect((await ledger.get({ tenant: "acme", id })).operation.status).toBe("unknown"); // nothing changed
      // A script reads the code: read it again and decide, rather than give up as on INVALID_TRANSITION.
      const json = await idem([
        "--ledger",
        url,
        "--json",
        "retry",
        id,
        "--tenant",
        "acme",
        "--reason",
        "x",
        "--seen",
        shown,
      ]);
      expect(json.code).toBe(7);
      expect(JSON.parse(json.stderr)).toMatchObject({ error: "CHANGED_SINCE_SEEN" });
      const ok = await retry("--seen", await versionOf(ledger, "acme", id));
      expect(ok.code, ok.stderr).toBe(0);
      expect((await ledger.get({ tenant: "acme", id })).operation).toMatchObject({ status: "pending", attempt: 2 });
    });

    it("retry --evidence keeps what the person checked in the retry's audit event, apart from the reason; show prints it", async () => {
      const t = "evidence";
      const { operationId: id } = await ledger.run(parked, { tenant: t, key: ["sms", "e"], args: { to: "+400" } });
      const evidence = "SMS log searched for +400, 09:00-10:00: nothing";
      const decide = async (...more: string[]) =>
        idem([
          "--ledger",
          url,
          "--json",
          "retry",
          id,
          "--tenant",
          t,
          "--seen",
          await versionOf(ledger, t, id),
          ...more,
        ]);
      // Bounded as resolve's: refused (exit 2), nothing decided.
      const over = await decide("--reason", "not sent", "--evidence", "x".repeat(1_001));
      expect(over.code).toBe(2);
      expect(over.stderr).toMatch(/"evidence: must be a string of at most 1000 characters"/);
      expect((await ledger.get({ tenant: t, id })).operation.status).toBe("needs_review");
      const out = await decide("--reason", "not in the SMS log", "--evidence", evidence, "--actor", "ops:bob");
      expect(out.code, out.stderr).toBe(0);
      const { events } = await ledger.get({ tenant: t, id });
      expect(events.at(-1)).toMatchObject({
        to: "pending",
        actor: "ops:bob",
        reason: "retry asked: not in the SMS log",
        evidence,
      });
      expect(JSON.parse(out.stdout).events.at(-1)).toMatchObject({ evidence });
      const shown = await idem(["--ledger", url, "show", id, "--tenant", t]);
      expect(shown.stdout).toMatch(
        new RegExp(
          `needs_review\\s+pending\\s+2\\s+ops:bob\\s+retry asked: not in the SMS log \\(evidence: ${evidence.replace("+", "\\+")}\\)$`,
          "m",
        ),
      );
    });

    it("retry and resolve without --seen are refused (exit 2), saying to read the version with idem show: a retry checked at attempt 2 never applies to attempt 4", async () => {
      const t = "bound";
      const { operationId: id } = await ledger.run(parked, { tenant: t, key: ["sms", "b"], args: { to: "+300" } });
      expect((await ledger.get({ tenant: t, id })).operation).toMatchObject({ status: "needs_review", attempt: 2 });
      const decide = (...more: string[]) => idem(["--ledger", url, ...more, id, "--tenant", t]);
      // A and B are both shown attempt 2. A checked it (never sent) and retried it; the run went to review again, at attempt 4.
      const shown = await versionOf(ledger, t, id);
      const first = await decide("retry", "--seen", shown, "--reason", "A: checked, never sent");
      expect(first.code, first.stderr).toBe(0);
      expect(await ledger.run(parked, { tenant: t, key: ["sms", "b"], args: { to: "+300" } })).toMatchObject({
        state: "needs_review",
      });
      expect((await ledger.get({ tenant: t, id })).operation).toMatchObject({ status: "needs_review", attempt: 4 });
      // B says too late, or not at all, what they were shown. Without it, attempt 4 (which may have
      // been sent) would be marked not done, to be sent again.
      const bare = await decide("retry", "--reason", "B: checked, never sent");
      expect(bare.code, bare.stderr).toBe(2);
      expect(bare.stderr).toMatch(
        new RegExp(
          `retry needs --seen <version>, the version you checked, as \`idem show ${id} --tenant ${t}\` prints it`,
        ),
      );
      const resolve = await decide("resolve", "--failed", "--reason", "B: never sent");
      expect(resolve.code, resolve.stderr).toBe(2);
      expect(resolve.stderr).toMatch(/resolve needs --seen <version>/);
      const stale = await decide("retry", "--seen", shown, "--reason", "B: checked, never sent");
      expect(stale.code).toBe(7);
      expect(stale.stderr).toMatch(
        /changed since it was shown .*: it is now needs_review at attempt 4 .*Show it again/,
      );
      expect((await ledger.get({ tenant: t, id })).operation).toMatchObject({ status: "needs_review", attempt: 4 });
      // A failed operation too.
      const done = await decide(
        "resolve",
        "--failed",
        "--seen",
        await versionOf(ledger, t, id),
        "--reason",
        "never sent",
      );
      expect(done.code, done.stderr).toBe(0);
      const again = await decide("retry", "--reason", "the cause is fixed");
      expect(again.code, again.stderr).toBe(2);
      expect((await ledger.get({ tenant: t, id })).operation).toMatchObject({ status: "failed", attempt: 4 });
      // A version the operation has now, in a status the decision does not apply to: refused as before (exit 4).
      const wrong = await decide("resolve", "--succeeded", "--seen", await versionOf(ledger, t, id), "--reason", "x");
      expect(wrong.code).toBe(4);
      expect(wrong.stderr).toMatch(/is failed; it cannot become succeeded this way/);
      const wrongJson = await idem([
        ...["--ledger", url, "--json", "resolve", id, "--tenant", t, "--succeeded"],
        ...["--seen", await versionOf(ledger, t, id), "--reason", "x"],
      ]);
      expect([wrongJson.code, JSON.parse(wrongJson.stderr).error]).toEqual([4, "INVALID_TRANSITION"]);
    });

    it("retry and resolve are bound to the view idem show printed (--seen): a late 'may have committed' answer recorded after the person looked, at the same attempt, refuses the decision (exit 7, a stale view)", async () => {
      let open: () => void = () => {};
      const gate = new Promise<void>((r) => (open = r));
      let effects = 0;
      const late = defineAction<{ to: string }, { sid: string }>({
        type: "sms.late",
        capabilities: {},
        execute: async () => {
          await gate;
          effects += 1; // the provider commits the effect
          throw new Error("timeout after the request was sent");
        },
      });
      let now = Date.now();
      const clocked = await openTestLedger(url, {
        clock: () => now,
        leaseMs: 30_000,
        actions: [late],
        budget: { attempts: 1 },
      });
      const t = "late";
      try {
        const first = clocked.run(late, { tenant: t, key: ["sms"], args: { to: "+1" } }).catch((e: unknown) => e);
        let id = "";
        for (const deadline = Date.now() + 10_000; !id; ) {
          id = (await clocked.admin.list({ tenant: t, status: ["running"] }))[0]?.id ?? "";
          if (Date.now() > deadline) throw new Error("the send never started");
          await new Promise((r) => setTimeout(r, 20));
        }
        // Its worker looks dead (its lease is over): the daemon sends it to a person.
        now += 31_000;
        expect(await clocked.daemon.settle({ tenant: t, id, actor: "idem-daemon:test" })).toMatchObject({
          state: "needs_review",
        });
        // The person looks, and checks the provider: nothing there yet.
        const looked = await idem(["--ledger", url, "show", id, "--tenant", t]);
        const attempt = /^attempt\s+(\d+)$/m.exec(looked.stdout)?.[1];
        expect(attempt).toMatch(/^\d+$/);
        // Then attempt 1's request lands, and its answer (a timeout after sending: it may have committed) is recorded.
        open();
        await first;
        const after = (await ledger.get({ tenant: t, id })).operation;
        // The same attempt as shown: --attempt cannot tell the views apart.
        expect(after).toMatchObject({ status: "needs_review", attempt: Number(attempt) });
        // Before: `--attempt` (the attempt shown) was accepted: exit 0, the operation marked not done
        // and run again by the next call (a second effect).
        const byAttempt = await idem([
          "--ledger",
          url,
          "retry",
          id,
          "--tenant",
          t,
          "--attempt",
          attempt!,
          "--reason",
          "nothing at the provider",
        ]);
        expect(byAttempt.code, byAttempt.stderr).toBe(2);
        expect((await ledger.get({ tenant: t, id })).operation).toEqual(after);
        // What idem show printed names the view itself: a decision on it is refused now.
        const shown = /^version\s+(\S+)$/m.exec(looked.stdout)?.[1];
        expect(shown).toMatch(new RegExp(`^needs_review\\.${attempt}\\.\\d+\\.\\d+$`));
        for (const verdict of [["retry"], ["resolve", "--failed"]]) {
          const out = await idem([
            "--ledger",
            url,
            ...verdict,
            id,
            "--tenant",
            t,
            "--seen",
            shown!,
            "--reason",
            "nothing at the provider",
          ]);
          expect(out.code, `${verdict.join(" ")}: ${out.stderr}`).toBe(7);
          expect(out.stderr).toMatch(/changed since it was shown.*Show it again .* and decide on what you see now/);
        }
        expect((await ledger.get({ tenant: t, id })).operation).toEqual(after); // nothing decided
        // Shown again, the person sees the late answer, checks again, and finds the message sent.
        const again = /^version\s+(\S+)$/m.exec((await idem(["--ledger", url, "show", id, "--tenant", t])).stdout)?.[1];
        expect(again).not.toBe(shown);
        const ok = await idem([
          "--ledger",
          url,
          "resolve",
          id,
          "--tenant",
          t,
          "--succeeded",
          "--seen",
          again!,
          "--reason",
          "found in the provider's log",
        ]);
        expect(ok.code, ok.stderr).toBe(0);
        expect(effects).toBe(1);
      } finally {
        open();
        await clocked.close();
      }
    });

    it("an operation a person resolves keeps the retention its application claimed it with (null never expires, not pruned a month later), whatever the config says; one claimed before 0007 takes the config's", async () => {
      const dir = tempDir();
      // The config's retention differs from each application's: the row's own must win.
      const cases = { keep: [null, 60_000], minute: [60_000, null], core: [undefined, null] } as const;
      const later = await openTestLedger(url, { clock: () => Date.now() + 31 * 86_400_000 });
      const resolve = async (file: string, t: string, id: string) =>
        idem([
          "--config",
          file,
          "resolve",
          id,
          "--tenant",
          t,
          "--succeeded",
          "--seen",
          await versionOf(ledger, t, id),
          "--reason",
          "found in the SMS console",
        ]);
      try {
        for (const [name, [app, config]] of Object.entries(cases)) {
          const t = `kept-${name}`;
          const file = join(dir, `${name}.json`);
          writeFileSync(file, JSON.stringify({ ledger: url, retentionMs: config }));
          const own = await openLedger(url, app === undefined ? {} : { retentionMs: app });
          const { operationId: id } = await own.run(parked, { tenant: t, key: ["sms"], args: { to: "+1" } });
          await own.close();
          const out = await resolve(file, t, id);
          expect(out.code, out.stderr).toBe(0);
          const { operation } = await ledger.get({ tenant: t, id });
          expect(operation.status).toBe("succeeded");
          // Before: the CLI's own retention (the core's 30 days unless configured), so `idem prune`
          // deleted after a month what the applications keep for ever, and a redelivered job ran again.
          const kept = app === undefined ? 30 * 86_400_000 : app;
          expect(operation.expiresAt, name).toBe(kept === null ? null : operation.completedAt! + kept);
          expect(await later.admin.prune({ tenant: t }), name).toBe(kept === null ? 0 : 1);
        }
        expect((await ledger.admin.list({ tenant: "kept-keep" })).map((o) => o.status)).toEqual(["succeeded"]);
        // A row claimed before migration 0007 recorded no retention: the config's applies.
        const t = "kept-old";
        const file = join(dir, "old.json");
        writeFileSync(file, JSON.stringify({ ledger: url, retentionMs: null }));
        const { operationId: id } = await ledger.run(parked, { tenant: t, key: ["sms"], args: { to: "+1" } });
        await databaseOf(ledger)
          .updateTable("idem_operations")
          .set({ retention_ms: null })
          .where("id", "=", id)
          .execute();
        expect((await resolve(file, t, id)).code).toBe(0);
        expect((await ledger.get({ tenant: t, id })).operation.expiresAt).toBeNull();
        expect(await later.admin.prune({ tenant: t })).toBe(0);
      } finally {
        await later.close();
      }
    });

    it("idem retry --now whose run fails after the retry was recorded says the retry stands and where the operation is (exit 1, not 2)", async () => {
      const dir = tempDir();
      const effects = join(dir, "effects");
      const file = join(dir, "idem.config.mjs");
      // The effect is a line in a file; the receipt is one the ledger cannot keep: not JSON, or over 64 KiB.
      writeFileSync(
        file,
        `import { appendFileSync } from "node:fs";
export default {
  ledger: ${JSON.stringify(url)},
  actions: [{
    type: "sms.send",
    capabilities: {},
    execute: async (args) => {
      appendFileSync(${JSON.stringify(effects)}, args.to + "\\n");
      return args.to === "+nan" ? { sid: "SM1", price: Number.NaN } : { sid: "SM2", blob: "x".repeat(70_000) };
    },
  }],
};
`,
      );
      for (const [to, failure] of [
        ["+nan", /result\.price: NaN is not a JSON number/],
        ["+big", /result is \d+ bytes, over the limit of 65536/],
      ] as const) {
        const t = `rerun${to.slice(1)}`;
        const { operationId: id } = await ledger.run(parked, { tenant: t, key: ["sms"], args: { to } });
        const out = await retryNow(ledger, file, t, id);
        // Before: exit 2 ("bad usage") for the NaN, and for both only the run's error, as if nothing was done.
        expect(out.code, out.stderr).toBe(1);
        expect(out.stderr).toMatch(
          new RegExp(
            `^idem: retried: the retry of ${id} is recorded; running it now failed: ${failure.source}.*; it is now needs_review at attempt 3: see idem show ${id} --tenant ${t}\n$`,
          ),
        );
        expect(out.stdout).toMatch(/^status\s+needs_review$/m);
        expect(
          readFileSync(effects, "utf8")
            .split("\n")
            .filter((l) => l === to),
        ).toHaveLength(1); // performed once
        const { operation, events } = await ledger.get({ tenant: t, id });
        expect(operation).toMatchObject({ status: "needs_review", attempt: 3 });
        expect(events.map((e) => e.to).slice(-3)).toEqual(["pending", "running", "needs_review"]);
      }
    });

    it("idem retry --now exits 0 only when the run succeeded: declined or sent to a person is exit 6, printed as it is", async () => {
      const dir = tempDir();
      const file = join(dir, "idem.config.mjs");
      // The run's answer is named by the number it sends to.
      writeFileSync(
        file,
        `export default {
  ledger: ${JSON.stringify(url)},
  actions: [{
    type: "sms.send",
    capabilities: {},
    execute: async (args) => {
      if (args.to === "+ok") return { sid: "SM1" };
      throw new Error(args.to);
    },
    classify: (error) =>
      error.message === "+declined"
        ? { kind: "permanent", reason: "number blocked" }
        : { kind: "ambiguous", reason: "timeout after send" },
  }],
};
`,
      );
      for (const [to, code, status] of [
        ["+ok", 0, "succeeded"],
        ["+declined", 6, "failed"],
        ["+timeout", 6, "needs_review"], // nothing can check this provider: a person decides
      ] as const) {
        const t = `rerun-ends${to.slice(1)}`;
        const { operationId: id } = await ledger.run(parked, { tenant: t, key: ["sms"], args: { to } });
        const out = await retryNow(ledger, file, t, id);
        // Before: exit 0 for all three, so a script read a declined card as done.
        expect(out.code, `${to}: ${out.stderr}`).toBe(code);
        expect(out.stdout).toMatch(new RegExp(`^status\\s+${status}$`, "m"));
        expect((await ledger.get({ tenant: t, id })).operation.status).toBe(status);
      }
    });

    it("ls never shows two long keys alike: a cut label ends with the start of the key's hash", async () => {
      const long = "weekly-report-for-the-customer-with-a-long-name";
      const sms = defineAction({ type: "sms.ok", capabilities: {}, execute: async () => ({ ok: true }) });
      for (const week of ["2026-W01", "2026-W02"])
        await ledger.run(sms, { tenant: "keys", key: [long, week], args: { to: "+1" } });
      const out = await idem(["--ledger", url, "ls", "--tenant", "keys"]);
      const cells = out.stdout
        .split("\n")
        .slice(1)
        .filter(Boolean)
        .map((l) => l.slice(l.indexOf("[")));
      expect(cells).toHaveLength(2);
      expect(new Set(cells).size).toBe(2);
      for (const c of cells) expect(c).toMatch(/… #[0-9a-f]{8}$/);
    });

    it("show gives an operator the args to decide a case, with secrets, attachments and long texts kept out", async () => {
      const mail = defineAction({
        type: "mail.parked",
        capabilities: {},
        execute: async () => {
          throw new Error("timeout after DATA");
        },
      });
      const body = "Dear customer, ".repeat(40);
      const args = {
        to: "ada@example.com",
        subject: "Your invoice",
        text: body,
        apiKey: "sk_live_do_not_show",
        attachments: [{ filename: "inv.pdf", content: "JVBERi0x".repeat(100), contentType: "application/pdf" }],
        // Named otherwise than the first secrets (helper-141, helper-143): before, shown whole.
        headers: { Cookie: "sid=cookie_do_not_show" },
        credentials: { user: "svc", pass: "cred_do_not_show" },
        private_key: "pk_do_not_show",
        bank: { account_number: "acct_do_not_show", routing_number: "rout_do_not_show" },
      };
      const id = (await ledger.run(mail, { tenant: "shown", key: ["m"], args })).operationId;
      const out = await idem(["--ledger", url, "--json", "show", id, "--tenant", "shown"]);
      expect(out.code, out.stderr).toBe(0);
      const shown = JSON.parse(out.stdout);
      expect(shown.args).toMatchObject({
        to: "ada@example.com",
        subject: "Your invoice",
        apiKey: "[redacted]",
        attachments: [{ filename: "inv.pdf", contentType: "application/pdf", size: 800 }],
      });
      expect(shown.args.text).toMatch(/… \(600 characters\)$/);
      expect(out.stdout).not.toContain("sk_live_do_not_show");
      for (const secret of ["cookie", "cred", "pk", "acct", "rout"])
        expect(out.stdout).not.toContain(`${secret}_do_not_show`);
      expect(out.stdout).not.toContain("JVBERi0xJVBERi0x");
      const human = await idem(["--ledger", url, "show", id, "--tenant", "shown"]);
      expect(human.stdout).toMatch(
        /^args\s+\{"apiKey":"\[redacted\]",.*"subject":"Your invoice",.*"to":"ada@example.com"\}$/m,
      );
    });

    it("show keeps secrets out of a failure's evidence too, the codes an operator needs shown", async () => {
      const declined = defineAction({
        type: "pay.declined",
        capabilities: {},
        execute: async () => {
          throw new Error("declined");
        },
        // The action names its evidence as it likes: a token among the codes.
        classify: () => ({
          kind: "permanent",
          reason: "card declined",
          evidence: { decline_code: "insufficient_funds", payment_token: "tok_do_not_show" },
        }),
      });
      const run = await ledger.run(declined, { tenant: "shown-error", key: ["d"], args: { amount: 5 } });
      expect(run.status).toBe("failed");
      for (const json of [true, false]) {
        const out = await idem([
          "--ledger",
          url,
          ...(json ? ["--json"] : []),
          "show",
          run.operationId,
          "--tenant",
          "shown-error",
        ]);
        expect(out.code, out.stderr).toBe(0);
        // Before: the evidence printed whole.
        expect(out.stdout).not.toContain("tok_do_not_show");
        expect(out.stdout).toContain("insufficient_funds");
        if (json)
          expect(JSON.parse(out.stdout).operation.error.evidence).toEqual({
            decline_code: "insufficient_funds",
            payment_token: "[redacted]",
          });
      }
    });

    it("show says an operation whose effect happened takes only resolve --succeeded; retry and resolve --failed are refused saying so (exit 4)", async () => {
      // The SMS went out; its receipt holds a BigInt, which the ledger cannot store: parked with the proof.
      const sent = defineAction<{ to: string }, { id: string; segments: bigint }>({
        type: "sms.sent",
        capabilities: {},
        execute: async () => ({ id: "sms_5", segments: 2n }),
      });
      await expect(ledger.run(sent, { tenant: "performed", key: ["p"], args: { to: "+5" } })).rejects.toMatchObject({
        name: "InvalidValueError",
      });
      const { id } = (await ledger.admin.list({ tenant: "performed" }))[0]!;
      const show = await idem(["--ledger", url, "show", id, "--tenant", "performed"]);
      expect(show.code, show.stderr).toBe(0);
      // Before: nothing said which decision it takes; retry and resolve --failed were refused only once run.
      expect(show.stdout).toMatch(
        /^decide\s+only resolve --succeeded: its effect happened \(attempt 1's request\), but its receipt could not be stored; resolve --failed and retry are refused$/m,
      );
      const seen = await versionOf(ledger, "performed", id);
      for (const decision of [["retry"], ["resolve", "--failed"]]) {
        const out = await idem([
          "--ledger",
          url,
          ...decision.slice(0, 1),
          id,
          ...decision.slice(1),
          "--tenant",
          "performed",
          "--seen",
          seen,
          "--reason",
          "not in the log",
        ]);
        expect(out.code, decision.join(" ")).toBe(4);
        expect(out.stderr).toMatch(/its effect happened \(attempt 1\).*resolve it as succeeded/);
      }
      expect((await ledger.get({ tenant: "performed", id })).operation.status).toBe("needs_review");
      // An operation without that proof has no such line.
      expect((await idem(["--ledger", url, "show", reviewId, "--tenant", "acme"])).stdout).not.toMatch(/^decide/m);
    });

    it("prune deletes every expired operation of the tenant, a batch per statement; --max bounds a run and says more may remain (exit 5)", async () => {
      const done = defineAction({ type: "sms.done", capabilities: {}, execute: async () => ({ ok: true }) });
      const expiring = await openLedger(url, { retentionMs: 0 }); // completed rows are past retention at once
      for (let i = 0; i < 25; i++) await expiring.run(done, { tenant: "pruned", key: ["p", i], args: {} });
      await expiring.run(done, { tenant: "pruned-next-door", key: ["p"], args: {} });
      await expiring.run(parked, { tenant: "pruned", key: ["parked"], args: { to: "+1" } }); // needs_review: kept
      await expiring.close();
      const left = async (tenant: string) => (await ledger.admin.list({ tenant, limit: 100 })).length;
      const prune = (...more: string[]) => idem(["--ledger", url, ...more]);
      // Before: at most one batch (10,000) a run, `pruned 10000 operations` and exit 0 with more left.
      const bounded = await prune("prune", "--tenant", "pruned", "--batch", "10", "--max", "5");
      expect(bounded.code, bounded.stderr).toBe(5);
      expect(bounded.stdout).toBe("pruned 5 operations; stopped at --max 5: more may remain, run idem prune again\n");
      expect(await left("pruned")).toBe(21);
      const batches = await prune("--json", "prune", "--tenant", "pruned", "--batch", "5", "--max", "12");
      expect(batches.code, batches.stderr).toBe(5);
      expect(JSON.parse(batches.stdout)).toEqual({ pruned: 12, more: true });
      expect(await left("pruned")).toBe(9);
      const rest = await prune("--json", "prune", "--tenant", "pruned", "--batch", "3");
      expect(rest.code, rest.stderr).toBe(0);
      expect(JSON.parse(rest.stdout)).toEqual({ pruned: 8, more: false });
      expect(await left("pruned")).toBe(1); // the operation a person must decide
      expect(await left("pruned-next-door")).toBe(1); // another tenant's
      const none = await prune("prune", "--tenant", "pruned");
      expect([none.code, none.stdout]).toEqual([0, "pruned 0 operations\n"]);
    });

    it("--version prints the package's version", async () => {
      const out = await idem(["--version"]);
      expect(out.code).toBe(0);
      expect(out.stdout.trim()).toBe(
        JSON.parse(readFileSync(new URL("../package.json", import.meta.url), "utf8")).version,
      );
    });

    it("usage errors exit 2", async () => {
      expect((await idem(["--ledger", url, "ls"])).code).toBe(2); // no tenant
      expect((await idem(["--ledger", url, "resolve", reviewId, "--tenant", "acme", "--reason", "x"])).code).toBe(2); // neither verdict
    });
  });
}

describe("idem flag values", { timeout: scaled(120_000) }, () => {
  it("a bad --limit or --older-than is a usage error (exit 2) naming the flag, said once, before any ledger is opened", async () => {
    const db = join(tempDir(), "x.db");
    const bad = [
      ["--limit", "abc"],
      ["--limit", "0"],
      ["--limit", "-5"],
      ["--older-than", "soon"],
    ] as const;
    const [json, ...outs] = await Promise.all([
      idem(["--ledger", `sqlite:${db}`, "--json", "ls", "--tenant", "acme", "--limit", "abc"]),
      ...bad.map(([flag, value]) => idem(["--ledger", `sqlite:${db}`, "ls", "--tenant", "acme", flag, value])),
    ]);
    bad.forEach(([flag, value], i) => {
      const out = outs[i]!;
      expect(out.code, out.stderr).toBe(2);
      expect(out.stderr).toBe(`${out.stderr.split("\n")[0]}\n`); // one line, not repeated by main()
      expect(out.stderr).toMatch(
        new RegExp(`^idem: option '[^']*${flag} <[^']*' argument '${value}' is invalid\\. Expected`),
      );
    });
    expect(json!.code).toBe(2);
    expect(JSON.parse(json!.stderr)).toMatchObject({
      error: "USAGE",
      message: expect.stringMatching(/--limit <n>' argument 'abc' is invalid/),
    });
    expect(existsSync(db)).toBe(false);
  });

  it("--older-than 1M is refused as ambiguous (a month to many, a minute to ms), naming what to say instead; 1m, 2h, 30d are read", async () => {
    const db = join(tempDir(), "x.db");
    // Before: read as one minute, listing what was created over a minute ago as "a month old".
    const months = ["1M", "1 M", "6M"].map((month) =>
      idem(["--ledger", `sqlite:${db}`, "ls", "--tenant", "acme", "--older-than", month]),
    );
    for (const out of await Promise.all(months)) {
      expect(out.code, out.stderr).toBe(2);
      expect(out.stderr).toMatch(
        /argument '[^']+' is invalid\. [^.]+ is ambiguous: say \S+m for minutes, or days for months \(30d\)/,
      );
    }
    expect(existsSync(db)).toBe(false);
    const url = `sqlite:${join(tempDir(), "ok.db")}`;
    expect((await idem(["--ledger", url, "migrate"])).code).toBe(0);
    const fine = ["1m", "2h", "30d", "90s"].map((age) =>
      idem(["--ledger", url, "ls", "--tenant", "acme", "--older-than", age]),
    );
    for (const out of await Promise.all(fine)) expect(out.code, out.stderr).toBe(0);
  });

  it("a valid --limit still limits the listing", async () => {
    const url = `sqlite:${join(tempDir(), "ok.db")}`;
    const done = defineAction({ type: "sms.send", capabilities: {}, execute: async () => ({ ok: true }) });
    const ledger = await openLedger(url);
    for (let i = 0; i < 4; i++) await ledger.run(done, { tenant: "acme", key: ["sms", i], args: {}, actor: "agent-1" });
    await ledger.close();
    const out = await idem(["--ledger", url, "--json", "ls", "--tenant", "acme", "--limit", "3"]);
    expect(out.code, out.stderr).toBe(0);
    expect(JSON.parse(out.stdout)).toHaveLength(3);
  });
});

describe("idem config", { timeout: scaled(120_000) }, () => {
  it("refuses to serve a console nobody signs in to, and an unauthenticated one off loopback (exit 2)", async () => {
    const dir = tempDir();
    const ledger = `sqlite:${join(dir, "l.db")}`;
    expect((await idem(["--ledger", ledger, "migrate"])).code).toBe(0);
    const cases = [
      [{}, /the console needs operators with a tokenEnv, a proxyHeader, or insecureNoAuth/],
      [
        { insecureNoAuth: true, host: "0.0.0.0" },
        /insecureNoAuth serves without sign-in: only on a loopback host, not 0\.0\.0\.0/,
      ],
      [
        { operators: [{ name: "alice", tokenEnv: "NO_SUCH_TOKEN_VAR", tenants: "*" }] },
        /environment variable NO_SUCH_TOKEN_VAR is not set/,
      ],
      [
        {
          operators: [
            { name: "alice", tokenEnv: "NO_SUCH_TOKEN_VAR", tenants: ["acme"] },
            { name: "alice", tokenEnv: "NO_SUCH_TOKEN_VAR_2", tenants: "*" },
          ],
        },
        /console\.operators.*operator names must be unique/,
      ],
    ] as const;
    for (const [i, [console, message]] of cases.entries()) {
      const file = join(dir, `console-${i}.json`);
      writeFileSync(file, JSON.stringify({ ledger, console: { port: 0, ...console } }));
      const out = await idem(["--config", file, "console"]);
      expect(out.code, out.stderr).toBe(2);
      expect(out.stderr).toMatch(message);
    }
  });

  it("a config file that is not valid JSON is refused saying where, without repeating its text (a secret may be near the fault)", async () => {
    // helper-141: Node's JSON.parse quotes about 10 characters around the fault, and a ledger URL's
    // password one typo away from it was printed.
    const file = join(tempDir(), "idem.config.json");
    writeFileSync(file, '{\n  "ledger": postgres://idem:s3cretpass@db.internal/idem\n}\n');
    const out = await idem(["--config", file, "migrate"]);
    expect(out.code, out.stderr).toBe(2);
    expect(out.stderr).toMatch(/cannot read config .*: not valid JSON/);
    expect(out.stderr).not.toMatch(/s3cret|postgres:/);
    // Where the parser gives a position: its line and column.
    writeFileSync(file, '{\n  "ledger": "postgres://idem:s3cretpass@db.internal/idem",\n}\n');
    const comma = await idem(["--config", file, "migrate"]);
    expect(comma.code, comma.stderr).toBe(2);
    expect(comma.stderr).toMatch(/not valid JSON at line 3, column 1/);
    expect(comma.stderr).not.toMatch(/s3cret|postgres:/);
  });

  it("refuses a daemon whose alerts go nowhere (alerts.log false, no webhook, no email): exit 2 naming alerts, run once or serving its console", async () => {
    const dir = tempDir();
    const ledger = `sqlite:${join(dir, "l.db")}`;
    expect((await idem(["--ledger", ledger, "migrate"])).code).toBe(0);
    const file = join(dir, "idem.config.json");
    const console = { port: 0, insecureNoAuth: true };
    writeFileSync(file, JSON.stringify({ ledger, alerts: { log: false }, daemon: { console: true }, console }));
    // Before: exit 0, and the daemon acknowledged every alert with nowhere to send it.
    const once = await idem(["--config", file, "daemon", "--once"]);
    expect(once.code, once.stderr).toBe(2);
    expect(once.stderr).toMatch(/^idem: invalid config .*: alerts: no sink \(log is false, and no webhook or email\)/);
    const daemon = startChild(CLI, ["--config", file, "daemon"]); // killed when the test ends, if it ran
    const started = daemon.waitFor(/"msg":"daemon started"/).then(
      () => "started",
      () => "exited",
    );
    expect(await Promise.race([daemon.exited.then(({ code }) => code), started])).toBe(2);
    expect((await daemon.exited).stderr).toMatch(/alerts: no sink/);
    // Still accepted where no alert is delivered.
    expect((await idem(["--config", file, "stats"])).code).toBe(0);
  });

  it("refuses a webhook URL holding a user name or password, written or in urlEnv (exit 2, naming the key; the password never said)", async () => {
    const dir = tempDir();
    const ledger = `sqlite:${join(dir, "l.db")}`;
    expect((await idem(["--ledger", ledger, "migrate"])).code).toBe(0);
    const withCredentials = "https://alerts:hunter2-pw@hooks.example.test/in";
    for (const [webhook, said] of [
      [{ url: withCredentials }, /alerts\.webhook\.url: must not hold a user name or password/],
      [
        { urlEnv: "IDEM_TEST_HOOK_URL" },
        /alerts\.webhook\.urlEnv: the URL in environment variable IDEM_TEST_HOOK_URL must not hold a user name or password/,
      ],
      [{ url: "https://hooks.example.test/in", urlEnv: "IDEM_TEST_HOOK_URL" }, /alerts\.webhook: give url or urlEnv/],
      [{ url: "ftp://hooks.example.test/in" }, /alerts\.webhook\.url: must be an http or https URL/],
    ] as const) {
      const file = join(dir, "idem.config.json");
      writeFileSync(file, JSON.stringify({ ledger, alerts: { webhook } }));
      // Before: accepted; fetch refused every delivery, which went to review with the password in its reason.
      const out = await idem(["--config", file, "daemon", "--once"], { IDEM_TEST_HOOK_URL: withCredentials });
      expect(out.code, out.stderr).toBe(2);
      expect(out.stderr).toMatch(said);
      if (said.source.includes("password")) expect(out.stderr).toMatch(/in a header \(authorizationEnv: /);
      expect(out.stderr + out.stdout).not.toContain("hunter2");
    }
  });

  it("refuses a malformed config file, naming the bad fields (exit 2)", async () => {
    const file = join(tempDir(), "idem.config.json");
    writeFileSync(
      file,
      JSON.stringify({
        ledger: "sqlite::memory:",
        alerts: { webhook: { url: "not a url" } },
        daemon: { intervalMs: -5 },
        providers: { stripe: { apiKeyEnv: "sk_test_literal_key" } },
      }),
    );
    const out = await idem(["--config", file, "stats"]);
    expect(out.code).toBe(2);
    expect(out.stderr).toMatch(/alerts\.webhook\.url/);
    expect(out.stderr).toMatch(/daemon\.intervalMs/);
    expect(out.stderr).toMatch(/providers\.stripe\.apiKeyEnv: must be the NAME of an environment variable/);
    expect(out.stderr).not.toContain("sk_test_literal_key");
  });

  it("refuses email in journal mode without the account the journal address delivers to (exit 2)", async () => {
    const file = join(tempDir(), "idem.config.json");
    const imap = { host: "127.0.0.1", port: 143, userEnv: "HOME", passEnv: "HOME" };
    const email = { smtp: { host: "127.0.0.1", port: 25 }, imap, from: "agent@example.test", copy: "journal" };
    writeFileSync(
      file,
      JSON.stringify({
        ledger: "sqlite::memory:",
        providers: { email: { ...email, journalAddress: "journal@example.test" } },
      }),
    );
    const out = await idem(["--config", file, "daemon", "--once"]);
    expect(out.code).toBe(2);
    expect(out.stderr).toMatch(/providers\.email\.journalImap \(the account it delivers to\) are required/);
  });

  it("refuses journal keys without copy: journal, and a Message-ID domain with a space (exit 2, naming the field)", async () => {
    const imap = { host: "127.0.0.1", port: 143, userEnv: "HOME", passEnv: "HOME" };
    const email = { smtp: { host: "127.0.0.1", port: 25 }, imap, from: "agent@example.test", copy: "provider-saves" };
    for (const [extra, said] of [
      // Before: ignored, so the operator believed copies were searched in that mailbox.
      [{ journalMailbox: "Journal" }, /providers\.email\.journalMailbox applies only with copy: journal/],
      // Before: a TypeError from the email package, exit 1, naming no field.
      [{ messageIdDomain: "mail example.test" }, /providers\.email\.messageIdDomain: .*space or an angle bracket/],
    ] as const) {
      const file = join(tempDir(), "idem.config.json");
      writeFileSync(file, JSON.stringify({ ledger: "sqlite::memory:", providers: { email: { ...email, ...extra } } }));
      const out = await idem(["--config", file, "daemon", "--once"]);
      expect(out.code, out.stderr).toBe(2);
      expect(out.stderr).toMatch(said);
    }
  });

  it("refuses a config module without a default export instead of running on the defaults (exit 2)", async () => {
    const file = join(tempDir(), "idem.config.mjs");
    writeFileSync(file, `export const config = { ledger: "sqlite::memory:" };\n`);
    const out = await idem(["--config", file, "stats"]);
    // Before: the defaults (sqlite:./idem.db), and `idem daemon --migrate` created and watched that.
    expect(out.code).toBe(2);
    expect(out.stderr).toMatch(/has no default export/);
  });

  it("refuses an SMTP sign-in with a user and no password, or the reverse (exit 2), instead of turning it off", async () => {
    const file = join(tempDir(), "idem.config.json");
    const smtp = { host: "127.0.0.1", port: 25, userEnv: "HOME" };
    writeFileSync(
      file,
      JSON.stringify({
        ledger: "sqlite::memory:",
        alerts: { email: { smtp, from: "a@example.test", to: ["b@example.test"] } },
      }),
    );
    const out = await idem(["--config", file, "stats"]);
    expect(out.code).toBe(2);
    expect(out.stderr).toMatch(/alerts\.email\.smtp: give both userEnv and passEnv/);
  });

  it("daemon --once exits 1 when due operations could not be settled (a cron job hears of it)", async () => {
    const url = `sqlite:${join(tempDir(), "once.db")}`;
    const l = await openLedger(url, { budget: { attempts: 1, baseDelayMs: 1 } });
    const busy = defineAction({
      type: "sms.busy",
      capabilities: {},
      execute: async () => {
        throw new Error("busy");
      },
      classify: () => ({ kind: "transient", reason: "try later" }),
    });
    const out = await l.run(busy, { tenant: "acme", key: ["once"], args: { to: "+1" } });
    expect(out).toMatchObject({ status: "pending_verification", state: "pending" });
    const due = async () =>
      ((await l.get({ tenant: "acme", id: out.operationId })).operation.nextCheckAt ?? 0) < Date.now();
    const deadline = Date.now() + 20_000;
    while (!(await due()) && Date.now() < deadline) await new Promise((r) => setTimeout(r, 20));
    await l.close();
    // sms.busy is in no config: the row cannot be settled. Before: exit 0.
    const once = await idem(["--ledger", url, "daemon", "--once"]);
    expect(once.code, once.stderr).toBe(1);
    expect(once.stderr).toMatch(/1 due operation\(s\) could not be settled/);
  });

  it("daemon warns of thresholds.perAction keys that name no action of its config (an agents' action, or a typo), suggesting the near one", async () => {
    const dir = tempDir();
    const ledger = `sqlite:${join(dir, "l.db")}`;
    expect((await idem(["--ledger", ledger, "migrate"])).code).toBe(0);
    const file = join(dir, "idem.config.json");
    const perAction = { "stripe.paymentIntent.create": 60_000, "stripe.refunds.create": 60_000, "sms.send": 60_000 };
    writeFileSync(
      file,
      JSON.stringify({
        ledger,
        providers: { stripe: { apiKeyEnv: "IDEM_TEST_STRIPE_KEY" } },
        thresholds: { perAction },
      }),
    );
    const out = await idem(["--config", file, "daemon", "--once"], { IDEM_TEST_STRIPE_KEY: "sk_test_unused" });
    // Not refused: a daemon may watch actions only agents run (it still reports them stuck).
    expect(out.code, out.stderr).toBe(0);
    const warnings = out.stdout
      .split("\n")
      .filter(Boolean)
      .map((l) => JSON.parse(l) as { level: number; msg: string; key?: string; known?: string[] })
      .filter((l) => l.level === 40);
    // Before: no warning, and the typo's threshold never applied.
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
  });

  it("the daemon's email config can say what an agent's can (journal mailbox, Sent folder, Message-ID domain, type): the same reference", async () => {
    // Before: no journalMailbox (always INBOX), so every pending email of an agent whose journal
    // is another mailbox was refused by the daemon's retry; no sentMailbox, so its lookups
    // searched another Sent folder than the agent's copies are in.
    const imap = { host: "127.0.0.1", port: 143, userEnv: "HOME", passEnv: "HOME" };
    const config = parseConfig({
      ledger: "sqlite::memory:",
      providers: {
        email: {
          smtp: { host: "127.0.0.1", port: 25 },
          imap,
          from: "agent@example.test",
          copy: "journal",
          journalAddress: "journal@example.test",
          journalImap: { ...imap, host: "imap.example.test" },
          journalMailbox: "Journal/2026",
          sentMailbox: "Sent Items",
          messageIdDomain: "mail.example.test",
          type: "email.billing.send",
        },
      },
    });
    const [send] = await actionsOf(config);
    const auth = { user: process.env.HOME!, pass: process.env.HOME! };
    const agents = emailActions({
      smtp: { host: "127.0.0.1", port: 25 },
      imap: { host: "127.0.0.1", port: 143, auth },
      from: "agent@example.test",
      copy: {
        mode: "journal",
        address: "journal@example.test",
        imap: { host: "imap.example.test", port: 143, auth },
        mailbox: "Journal/2026",
      },
      sentMailbox: "Sent Items",
      messageIdDomain: "mail.example.test",
      type: "email.billing.send",
    }).send;
    // The type too: the daemon settles the agents' operations with the action of their type.
    expect(send!.type).toBe(agents.type);
    const op = {
      id: "op_1",
      tenant: "t",
      key: "ab".repeat(32),
      keyLabel: null,
      attempt: 1,
      createdAt: 0,
      now: 0,
      lastAttemptAt: 0,
    };
    const args = { to: "client@example.test", subject: "Report" };
    const reference = send!.providerReference!(args, op);
    expect(reference).toMatch(/^<idem\.[0-9a-f]{40}@mail\.example\.test> copy=journal .*\/Journal\/2026$/);
    expect(reference).toBe(agents.providerReference!(args, op));
  });

  it("providers.hubspot takes uniqueProperty and mode, and an action listed in `actions` wins over a provider's of its type", async () => {
    const hub = new HubSpotSandbox();
    const server = await hub.start();
    process.env.IDEM_TEST_HUBSPOT_TOKEN = server.accessToken;
    try {
      hub.crm.createProperty("deals", {
        name: "erp_ref",
        label: "ERP reference",
        type: "string",
        fieldType: "text",
        groupName: "dealinformation",
        hasUniqueValue: true,
      });
      const mine = defineAction({
        type: "hubspot.contacts.create",
        capabilities: {},
        execute: async () => ({ mine: true }),
      });
      // Before: refused ("Unrecognized keys"), so the daemon read by idem_external_id what the agents wrote in erp_ref.
      const config = parseConfig({
        ledger: "sqlite::memory:",
        actions: [mine],
        providers: {
          hubspot: {
            accessTokenEnv: "IDEM_TEST_HUBSPOT_TOKEN",
            basePath: server.basePath,
            uniqueProperty: "erp_ref",
            mode: "create",
            objectTypes: ["contacts", "deals"],
          },
        },
      });
      const actions = await actionsOf(config);
      // The ledger keeps the last action given per type. Before: the provider's, given after the listed one.
      expect(actions.filter((a) => a.type === "hubspot.contacts.create").at(-1)).toBe(mine);
      const deals = actions.find((a) => a.type === "hubspot.deals.create")!;
      const ledger = await openLedger("sqlite::memory:");
      try {
        const out = await ledger.run(deals, { tenant: "t", key: ["deal"], args: { properties: { dealname: "D" } } });
        expect(out).toMatchObject({ status: "succeeded", receipt: { new: true } });
        const { operation } = await ledger.get({ tenant: "t", id: out.operationId });
        expect(hub.crm.all("deals").map((r) => r.properties.erp_ref)).toEqual([operation.key]);
        // A create (mode "create"), not a batch upsert.
        expect(hub.requests.filter((r) => r.method === "POST").map((r) => r.path)).toEqual(["/crm/v3/objects/deals"]);
      } finally {
        await ledger.close();
      }
      for (const [hubspot, field] of [
        [{ mode: "merge" }, "mode"],
        [{ uniqueProperty: "ERP Reference" }, "uniqueProperty"],
      ] as const)
        expect(() => parseConfig({ providers: { hubspot: { accessTokenEnv: "HOME", ...hubspot } } })).toThrow(
          new RegExp(`providers\\.hubspot\\.${field}: `),
        );
    } finally {
      delete process.env.IDEM_TEST_HUBSPOT_TOKEN;
      await hub.close();
    }
  });

  it("refuses a tenant the ledger would refuse (alerts, mcp, console operators) when the config is read, naming the field", () => {
    // Before: min(1) only. A 201-character alerts.tenant was read, and every tick of the daemon
    // then failed on its first alert (the ledger refuses such a tenant), with no alert delivered.
    const long = "t".repeat(201);
    const bad = [long, "tab\there", "\u0007"];
    for (const tenant of bad) {
      expect(() => parseConfig({ alerts: { log: true, tenant } })).toThrow(
        /alerts\.tenant: must be a non-empty printable string/,
      );
      expect(() => parseConfig({ mcp: { tenant } })).toThrow(/mcp\.tenant: must be a non-empty printable string/);
    }
    expect(parseConfig({ alerts: { log: true, tenant: "ops-alerts" } }).alerts.tenant).toBe("ops-alerts");
  });

  it("refuses a thresholds.perAction key no action type could be (the stuck read could never match it), naming it", () => {
    for (const key of ["", "tab\there", "a".repeat(201)])
      expect(() => parseConfig({ thresholds: { perAction: { [key]: 60_000 } } })).toThrow(
        /thresholds\.perAction\..*: an action type must be a non-empty printable string/,
      );
    expect(parseConfig({ thresholds: { perAction: { "mail.send": 60_000 } } }).thresholds.perAction).toEqual({
      "mail.send": 60_000,
    });
  });

  it("reads the email provider's deadlines (smtp.deadlineMs, imap.deadlineMs), and refuses one that is no positive whole number of ms, naming the field", () => {
    const imap = { host: "127.0.0.1", port: 143, userEnv: "HOME", passEnv: "HOME" };
    const email = (smtp: object, imapMore: object = {}) => ({
      providers: {
        email: {
          smtp: { host: "127.0.0.1", port: 25, ...smtp },
          imap: { ...imap, ...imapMore },
          from: "agent@example.test",
          copy: "provider-saves",
        },
      },
    });
    // Before: refused as unknown keys, so a daemon's sends and lookups had only inactivity timeouts.
    const read = parseConfig(email({ deadlineMs: 60_000 }, { deadlineMs: 30_000 })).providers.email;
    expect(read).toMatchObject({ smtp: { deadlineMs: 60_000 }, imap: { deadlineMs: 30_000 } });
    for (const bad of [0, -1, 1.5, 2 ** 31]) {
      expect(() => parseConfig(email({ deadlineMs: bad }))).toThrow(/providers\.email\.smtp\.deadlineMs: /);
      expect(() => parseConfig(email({}, { deadlineMs: bad }))).toThrow(/providers\.email\.imap\.deadlineMs: /);
    }
  });

  it("refuses daemon.intervalMs, claimMs or leaseMs past the longest a timer waits (2^31-1 ms), naming the field: the daemon's timers fired at once", async () => {
    // Before: accepted, and Node fired each such timer after 1 ms: a daemon with an interval of
    // about 35 days ticked without pause, against the ledger, logging a warning each time.
    for (const field of ["intervalMs", "claimMs", "leaseMs"]) {
      expect(() => parseConfig({ daemon: { [field]: 2 ** 31 } })).toThrow(new RegExp(`daemon\\.${field}: `));
      expect(parseConfig({ daemon: { [field]: 2 ** 31 - 1 } }).daemon).toMatchObject({ [field]: 2 ** 31 - 1 });
    }
    const file = join(tempDir(), "idem.config.json");
    writeFileSync(file, JSON.stringify({ ledger: "sqlite::memory:", daemon: { intervalMs: 3_000_000_000 } }));
    const out = await idem(["--config", file, "daemon", "--once"]);
    expect(out.code, out.stderr).toBe(2);
    expect(out.stderr).toMatch(/daemon\.intervalMs: Too big/);
  });

  it("refuses providers.hubspot.settleMs or providers.email.settleMs past 2^31-1 ms (about 24.8 days), naming the field, as the daemon's timers are bounded", () => {
    const imap = { host: "127.0.0.1", port: 143, userEnv: "HOME", passEnv: "HOME" };
    const email = (settleMs: number) => ({
      email: { smtp: { host: "127.0.0.1", port: 25 }, imap, from: "a@example.test", copy: "append", settleMs },
    });
    const hubspot = (settleMs: number) => ({ hubspot: { accessTokenEnv: "HOME", settleMs } });
    for (const [providers, field] of [
      [email, "email"],
      [hubspot, "hubspot"],
    ] as const) {
      // Before: read, whatever its size (3e9 ms: a settle window of 35 days, or 1e300).
      for (const settleMs of [2 ** 31, 3_000_000_000, 1e300])
        expect(() => parseConfig({ providers: providers(settleMs) }), `${field} ${settleMs}`).toThrow(
          new RegExp(`providers\\.${field}\\.settleMs: must be at most 2147483647 ms \\(about 24\\.8 days\\)`),
        );
      expect(parseConfig({ providers: providers(2 ** 31 - 1) }).providers[field]).toMatchObject({
        settleMs: 2 ** 31 - 1,
      });
    }
  });

  it("names the missing environment variable of a provider's secret", async () => {
    const file = join(tempDir(), "idem.config.json");
    writeFileSync(
      file,
      JSON.stringify({ ledger: "sqlite::memory:", providers: { stripe: { apiKeyEnv: "IDEM_TEST_NO_SUCH_KEY" } } }),
    );
    const out = await idem(["--config", file, "daemon", "--once"]);
    expect(out.code).toBe(2);
    expect(out.stderr).toMatch(/providers\.stripe\.apiKeyEnv: environment variable IDEM_TEST_NO_SUCH_KEY is not set/);
  });
});

for (const dialect of DIALECTS) {
  describe(`idem never creates or migrates a ledger by accident, on ${dialect}`, { timeout: scaled(180_000) }, () => {
    it("a path with no ledger is refused (sqlite), an unmigrated database is refused; only idem migrate migrates", async () => {
      if (dialect === "sqlite") {
        const typo = join(tempDir(), "dmeo.db");
        const out = await idem(["--ledger", `sqlite:${typo}`, "ls", "--tenant", "acme"]);
        expect(out.code).toBe(2);
        expect(out.stderr).toMatch(/no SQLite ledger at .*dmeo\.db: nothing was created/);
        expect(existsSync(typo)).toBe(false);
      }
      const url = dialect === "sqlite" ? `sqlite:${join(tempDir(), "ledger.db")}` : await freshDatabase(dialect);
      if (dialect === "sqlite") writeFileSync(url.slice("sqlite:".length), ""); // an empty file: a SQLite database with no schema
      for (const args of [["ls", "--tenant", "acme"], ["stats"], ["daemon", "--once"]]) {
        const out = await idem(["--ledger", url, ...args]);
        expect(out.code, args.join(" ")).toBe(2);
        expect(out.stderr).toMatch(/needs migrations 0001-init, .*run `idem migrate` first/);
      }
      const migrated = await idem(["--ledger", url, "--json", "migrate"]);
      expect(migrated.code, migrated.stderr).toBe(0);
      expect(JSON.parse(migrated.stdout).applied[0]).toBe("0001-init");
      expect((await idem(["--ledger", url, "ls", "--tenant", "acme"])).code).toBe(0);
    });

    it("a ledger migrated by a newer idem is refused with a clear message", async () => {
      const url = dialect === "sqlite" ? `sqlite:${join(tempDir(), "newer.db")}` : await freshDatabase(dialect);
      const l = await openLedger(url);
      await databaseOf(l)
        .insertInto("idem_migration" as never)
        .values({ name: "9999-from-the-future", timestamp: new Date().toISOString() } as never)
        .execute();
      await l.close();
      const out = await idem(["--ledger", url, "ls", "--tenant", "acme"]);
      expect(out.code).toBe(2);
      // Before: "upgrade @idem/core to use it", a package the operator of the command does not install.
      const cli = JSON.parse(readFileSync(new URL("../package.json", import.meta.url), "utf8")).version;
      expect(out.stderr).toBe(
        `idem: this ledger was migrated by a newer idem (9999-from-the-future) than this idem command (@idem/cli ${cli}): upgrade @idem/cli to use it\n`,
      );
      // A library user upgrades the library.
      await expect(openLedger(url)).rejects.toThrow(
        /newer idem \(9999-from-the-future\): upgrade @idem\/core to use it/,
      );
    });
  });
}
