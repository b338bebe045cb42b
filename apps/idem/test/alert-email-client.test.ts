/**
 * `idem daemon` (a real process) with an email sink whose client, nodemailer, cannot be loaded: a
 * missing install, made by a module resolve hook in the child that finds no `nodemailer` while a
 * file exists (the package itself, and our code, as they are). The daemon says so at error as it
 * starts, before any alert is due; each alert then stays due ("nothing sent"), and once the
 * package can be found the alert is sent, the daemon not restarted. Before, nothing was said until
 * the first alert was due, and then only as that delivery's failure. Said once, though both the
 * command (before the ledger opens) and the `Daemon` it builds begin the load. On SQLite alone:
 * what is tested is the command's start, not the ledger.
 */
import { rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { afterEach, describe, expect, it } from "vitest";
import { openLedger } from "@idem/core";
import { freshDatabase, scaled, startChild, tempDir } from "@idem/testkit";
import { CLI, lostAnswer, smtpServer, until, withoutNodemailerWhile } from "./support.js";

const cleanups: (() => Promise<unknown>)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c().catch(() => {});
});

describe("idem daemon with an email sink whose nodemailer cannot be loaded", () => {
  it(
    "says so at error as it starts, before any alert is due; keeps each alert due; sends it once nodemailer can be loaded",
    async () => {
      const smtp = await smtpServer();
      cleanups.push(smtp.close);
      const url = await freshDatabase("sqlite");
      const ledger = await openLedger(url, { actions: [lostAnswer] }); // migrated: the daemon does not migrate
      cleanups.push(() => ledger.close());
      const dir = tempDir();
      const missing = join(dir, "nodemailer-missing");
      writeFileSync(missing, "");
      const config = join(dir, "idem.config.json");
      writeFileSync(
        config,
        JSON.stringify({
          ledger: url,
          alerts: {
            email: {
              smtp: { host: "127.0.0.1", port: smtp.port, requireTLS: false },
              from: "idem@example.test",
              to: ["ops@example.test"],
            },
          },
          daemon: { intervalMs: 50 },
        }),
      );
      // Killed when the test ends (startChild), passed or failed.
      const daemon = startChild(CLI, ["--config", config, "daemon", "--name", "d-email-client"], {
        NODE_OPTIONS: `${process.env.NODE_OPTIONS ?? ""} ${withoutNodemailerWhile(missing)}`,
      });
      const unloaded = JSON.parse(await daemon.waitFor(/email alerts cannot be sent/)) as {
        level: number;
        msg: string;
      };
      expect(unloaded.level).toBe(50);
      expect(unloaded.msg).toMatch(
        /^email alerts cannot be sent: nodemailer could not be loaded: Cannot find package 'nodemailer'/,
      );
      expect(smtp.connections()).toBe(0); // said with no alert due, none tried
      await daemon.waitFor(/"daemon started"/);

      // An alert falls due: not sent while nodemailer cannot be loaded, and kept due.
      const parked = await ledger.run(lostAnswer, { tenant: "acme", key: ["r"], args: { note: "x" } });
      expect(parked).toMatchObject({ state: "needs_review" });
      await daemon.waitFor(/nothing sent: nodemailer could not be loaded/);
      expect(smtp.taken).toEqual([]);
      expect((await ledger.daemon.alertsDue({ limit: 100 })).some((a) => a.id === parked.operationId)).toBe(true);

      // Installed: the next try loads it and sends the alert, once, with no restart.
      rmSync(missing);
      await until(() => smtp.taken.length > 0, 60_000, "the alert to be emailed");
      await daemon.waitFor(/alert sink email takes alerts again/);
      expect(smtp.taken).toHaveLength(1);
      expect(smtp.taken[0]).toContain(parked.operationId);
      daemon.proc.kill("SIGTERM");
      const { code, stderr } = await daemon.exited;
      expect(code, stderr).toBe(0);
      expect(daemon.lines.filter((l) => l.includes("email alerts cannot be sent"))).toHaveLength(1);
    },
    scaled(120_000),
  );
});
