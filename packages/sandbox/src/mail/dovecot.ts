/**
 * A private Dovecot IMAP server for tests and the demo: its own config in a temp directory,
 * listening on a free loopback port, plain-text login, one maildir per user owned by the `mail`
 * user, a `\Sent` special-use folder created for everyone. Without `tls` it offers no TLS at all;
 * with it, STARTTLS on that port and implicit TLS on another (`imapsPort`), both with the given
 * certificate. With `acl`, Dovecot's ACL plugin reads each user's rights from one global file
 * (`rights`; none: every owner has all rights), so that a mailbox the account may see but not read
 * answers its SELECT `NO [NOPERM]` (RFC 5530); no other server state gives NOPERM (a maildir the
 * imap process may not read is `NO [SERVERBUG]`). A refused login is answered at once (no
 * `auth_failure_delay`). Dovecot must be
 * installed (`apt-get install dovecot-imapd`; `pnpm test` does it where missing).
 */
import { spawn, execFileSync, type ChildProcess } from "node:child_process";
import { chmodSync, chownSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { createConnection } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { freeLoopbackPort } from "../ports.js";

export interface MailUser {
  readonly user: string;
  readonly pass: string;
}

/** A server certificate (PEM, with the chain up to its CA if any) and its private key (PEM). */
export interface ServerTls {
  readonly cert: string | Buffer;
  readonly key: string | Buffer;
}

const MAIL_UID = 8; // Debian's `mail` user owns the maildirs

export class Dovecot {
  private proc: ChildProcess | undefined;
  private dir = "";
  port = 0;
  /** The implicit-TLS port (IMAPS), with `tls`; 0 without. */
  imapsPort = 0;

  constructor(
    private readonly users: readonly MailUser[],
    private readonly options: { readonly tls?: ServerTls; readonly acl?: boolean } = {},
  ) {}

  /**
   * With `acl`: replaces the rights with these global ACL lines, `<mailbox> user=<name> <rights>`
   * (`li`: may see the mailbox and file into it, not read it); none: every owner has all rights.
   * Read anew by each session (one imap process per login).
   */
  rights(lines: readonly string[]): void {
    if (!this.options.acl || !this.dir) throw new Error("rights: this Dovecot was not started with acl: true");
    writeFileSync(join(this.dir, "acl"), lines.map((l) => `${l}\n`).join(""));
  }

  static installed(): boolean {
    try {
      execFileSync("dovecot", ["--version"], { stdio: "ignore" });
      return true;
    } catch {
      return false;
    }
  }

  async start(): Promise<{ host: string; port: number }> {
    if (!Dovecot.installed())
      throw new Error("dovecot is not installed: apt-get install dovecot-imapd (pnpm test installs it where missing)");
    this.dir = mkdtempSync(join(tmpdir(), "idem-dovecot-"));
    chmodSync(this.dir, 0o755);
    this.port = await freeLoopbackPort();
    const tls = this.options.tls;
    if (tls) {
      this.imapsPort = await freeLoopbackPort();
      // Read by Dovecot's master process (root) as it loads its config: the key is for no one else.
      writeFileSync(join(this.dir, "tls.crt"), tls.cert);
      writeFileSync(join(this.dir, "tls.key"), tls.key, { mode: 0o600 });
    }
    for (const d of ["run", "state", "mail", "home"]) mkdirSync(join(this.dir, d));
    for (const d of ["mail", "home"]) chownSync(join(this.dir, d), MAIL_UID, MAIL_UID);
    writeFileSync(join(this.dir, "users"), `${this.users.map((u) => `${u.user}:{PLAIN}${u.pass}::::::`).join("\n")}\n`);
    if (this.options.acl) writeFileSync(join(this.dir, "acl"), "");
    writeFileSync(
      join(this.dir, "dovecot.conf"),
      config(this.dir, this.port, tls ? this.imapsPort : undefined, this.options.acl === true),
    );
    this.proc = spawn("dovecot", ["-F", "-c", join(this.dir, "dovecot.conf")], { stdio: ["ignore", "ignore", "pipe"] });
    let stderr = "";
    this.proc.stderr!.on("data", (d) => (stderr += String(d)));
    const deadline = Date.now() + 10_000;
    while (!(await listening(this.port)) || (this.imapsPort && !(await listening(this.imapsPort)))) {
      if (this.proc.exitCode !== null || Date.now() > deadline) {
        const log = safeRead(join(this.dir, "dovecot.log"));
        await this.stop();
        throw new Error(`dovecot did not start: ${stderr}\n${log}`);
      }
      await new Promise((r) => setTimeout(r, 20));
    }
    return { host: "127.0.0.1", port: this.port };
  }

  async stop(): Promise<void> {
    const proc = this.proc;
    this.proc = undefined;
    if (proc && proc.exitCode === null) {
      const gone = new Promise((r) => proc.once("exit", r));
      proc.kill("SIGTERM");
      await Promise.race([gone, new Promise((r) => setTimeout(r, 3_000))]);
      if (proc.exitCode === null) proc.kill("SIGKILL");
    }
    if (this.dir) rmSync(this.dir, { recursive: true, force: true });
    this.imapsPort = 0;
  }
}

/**
 * `imapsPort`: TLS on (STARTTLS on `port`, implicit TLS there), with the certificate in `dir`;
 * `acl`: the ACL plugin, its rights in `dir`/acl.
 */
function config(dir: string, port: number, imapsPort: number | undefined, acl: boolean): string {
  const ssl = imapsPort === undefined ? "ssl = no" : `ssl = yes\nssl_cert = <${dir}/tls.crt\nssl_key = <${dir}/tls.key`;
  const rights = acl
    ? `mail_plugins = $mail_plugins acl\nprotocol imap {\n  mail_plugins = $mail_plugins imap_acl\n}\nplugin {\n  acl = vfile:${dir}/acl\n}`
    : "";
  return `${rights}
base_dir = ${dir}/run
state_dir = ${dir}/state
log_path = ${dir}/dovecot.log
listen = 127.0.0.1
protocols = imap
${ssl}
disable_plaintext_auth = no
auth_mechanisms = plain login
auth_failure_delay = 0
first_valid_uid = ${MAIL_UID}
mail_location = maildir:${dir}/mail/%u
passdb {
  driver = passwd-file
  args = scheme=PLAIN ${dir}/users
}
userdb {
  driver = static
  args = uid=${MAIL_UID} gid=${MAIL_UID} home=${dir}/home/%u
}
service imap-login {
  inet_listener imap {
    address = 127.0.0.1
    port = ${port}
  }
  inet_listener imaps {
    address = 127.0.0.1
    port = ${imapsPort ?? 0}
  }
}
service stats {
  unix_listener stats-reader {
    mode = 0666
  }
  unix_listener stats-writer {
    mode = 0666
  }
}
namespace inbox {
  inbox = yes
  separator = /
  mailbox Sent {
    special_use = \\Sent
    auto = subscribe
  }
  mailbox Journal {
    auto = subscribe
  }
}
`;
}

function listening(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const s = createConnection({ host: "127.0.0.1", port });
    s.once("connect", () => {
      s.destroy();
      resolve(true);
    });
    s.once("error", () => resolve(false));
  });
}

function safeRead(path: string): string {
  try {
    return readFileSync(path, "utf8").slice(-4000);
  } catch {
    return "";
  }
}
