/**
 * A library user's `Daemon` (built with `new Daemon(…)` in a child process, not `idem daemon`)
 * with an email sink whose client, nodemailer, cannot be loaded (a resolve hook finds no
 * `nodemailer` while a file exists, support.ts). The daemon says so at error as it is built,
 * before any alert is due and with no SMTP connection made; a second `Daemon` built in the same
 * process with the same log, and the alert it then fails to email, do not say it again; one built
 * with a log of its own says it there. Before, a library user heard
 * nothing until the first email alert was due (only `idem daemon` began the load), and then only
 * as that delivery's failure. On SQLite alone: what is tested is the daemon's construction, not
 * the ledger.
 */
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { afterEach, describe, expect, it } from "vitest";
import { openLedger } from "@idem/core";
import { freshDatabase, scaled, startChild, tempDir } from "@idem/testkit";
import { lostAnswer, smtpServer, withoutNodemailerWhile } from "./support.js";

const LIBRARY_DAEMON = fileURLToPath(new URL("./fixtures/library-email-daemon.ts", import.meta.url));
const UNLOADED = /email alerts cannot be sent/;

const cleanups: (() => Promise<unknown>)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c().catch(() => {});
});

describe("a Daemon built by a library with an email sink whose nodemailer cannot be loaded", () => {
  it(
    "says so at error as it is built, before any alert is due and with no SMTP connection; once in the process",
    async () => {
      const smtp = await smtpServer();
      cleanups.push(smtp.close);
      const url = await freshDatabase("sqlite");
      const ledger = await openLedger(url, { actions: [lostAnswer] }); // migrated: the child does not migrate
      cleanups.push(() => ledger.close());
      const missing = join(tempDir(), "nodemailer-missing");
      writeFileSync(missing, "");

      // Killed when the test ends (startChild), passed or failed.
      const child = startChild(LIBRARY_DAEMON, [], {
        LEDGER_URL: url,
        SMTP_PORT: String(smtp.port),
        NODE_OPTIONS: `${process.env.NODE_OPTIONS ?? ""} ${withoutNodemailerWhile(missing)}`,
      });
      await child.waitFor(/^constructed$/, 60_000);
      // Built, no tick run, nothing due: only the constructor can have said it.
      const unloaded = JSON.parse(await child.waitFor(UNLOADED)) as { level: number; msg: string };
      expect(unloaded.level).toBe(50);
      expect(unloaded.msg).toMatch(
        /^email alerts cannot be sent: nodemailer could not be loaded: Cannot find package 'nodemailer'/,
      );
      expect(await ledger.daemon.alertsDue({ limit: 100 })).toEqual([]);
      expect(smtp.connections()).toBe(0);

      // An alert falls due; a second Daemon of the same process delivers it: nothing sent, kept
      // due, and the line is not said again (by its construction or by the delivery).
      const parked = await ledger.run(lostAnswer, { tenant: "acme", key: ["r"], args: { note: "x" } });
      expect(parked).toMatchObject({ state: "needs_review" });
      child.send("tick");
      await child.waitFor(/^ticked$/, 60_000);
      expect(child.lines.some((l) => /nothing sent: nodemailer could not be loaded/.test(l))).toBe(true);
      expect(smtp.connections()).toBe(0);
      expect((await ledger.daemon.alertsDue({ limit: 100 })).some((a) => a.id === parked.operationId)).toBe(true);

      // A Daemon with a log of its own hears it on that log. Before, the process's one line had
      // gone to the first daemon's log, and this one's said nothing until its first email alert.
      child.send("another log");
      await child.waitFor(/^built with another log$/, 60_000);
      const other = JSON.parse(await child.waitFor(/"logger":"another".*email alerts cannot be sent/)) as {
        level: number;
      };
      expect(other.level).toBe(50);

      child.send("stop");
      const { code, stderr } = await child.exited;
      expect(code, stderr).toBe(0);
      // Once a log: the first daemon's (its second build, and its alert, said nothing more), and the other's.
      const said = child.lines.filter((l) => UNLOADED.test(l));
      expect(said).toHaveLength(2);
      expect(said.filter((l) => l.includes('"logger":"another"'))).toHaveLength(1);
    },
    scaled(120_000),
  );
});
