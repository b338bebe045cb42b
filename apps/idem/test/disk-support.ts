/**
 * A disk that fails as a real one does, for a SQLite ledger's file: an ext4 file system on a loop
 * device (root only), mounted `errors=remount-ro`. `fail()` raises a file system error through
 * ext4's own sysfs switch (`trigger_fs_error`), as a failing disk's I/O error does: the kernel
 * remounts it read-only (`emergency_ro`) under the processes that hold files open for writing, and
 * every write fails (EROFS) while reads pass. A plain `mount -o remount,ro` is refused (EBUSY)
 * while a file is open for writing, and a `chattr +i` is bypassed by descriptors already open: only
 * an error makes a disk read-only under a running ledger. It cannot be made writable again without
 * closing every file on it (unmount, fsck): a process recovers from it by a restart.
 */
import { execFileSync, spawnSync } from "node:child_process";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { basename, join } from "node:path";

/** Why a loop-mounted ext4 cannot be had here, or "" when it can. */
export function loopMountable(): string {
  if (process.getuid?.() !== 0) return "mounting a loop device needs root";
  try {
    failingDisk().close();
    return "";
  } catch (e) {
    return `cannot mount an ext4 loop device here: ${(e as Error).message.split("\n")[0]}`;
  }
}

export interface FailingDisk {
  /** The mounted file system's root. */
  readonly dir: string;
  /** The disk fails: read-only from now on, for every process. */
  fail(): void;
  /**
   * What an operator does once every process closed its files on it: unmount, check and repair
   * (`fsck -y`), mount again. Returns fsck's exit code (0 clean, 1 errors corrected).
   */
  repair(): number;
  /** Unmounts (lazily if something still holds it) and removes the image. */
  close(): void;
}

/** A fresh 32 MB ext4 file system on a loop device, mounted to fail read-only on an error. */
export function failingDisk(): FailingDisk {
  const base = mkdtempSync(join(tmpdir(), "idem-disk-"));
  const image = join(base, "disk.img");
  const dir = join(base, "mnt");
  execFileSync("mkdir", [dir]);
  execFileSync("truncate", ["-s", "32M", image]);
  execFileSync("mkfs.ext4", ["-q", "-F", image], { stdio: "pipe" });
  const mount = () => {
    execFileSync("mount", ["-o", "loop,errors=remount-ro", image, dir], { stdio: "pipe" });
    return basename(execFileSync("findmnt", ["-n", "-o", "SOURCE", dir], { encoding: "utf8" }).trim());
  };
  let device = mount();
  return {
    dir,
    fail: () => writeFileSync(`/sys/fs/ext4/${device}/trigger_fs_error`, "1"),
    repair() {
      execFileSync("umount", [dir], { stdio: "pipe" });
      const checked = spawnSync("fsck.ext4", ["-y", "-f", image], { stdio: "pipe" });
      if (checked.status !== 0 && checked.status !== 1)
        throw new Error(`fsck.ext4 exited ${checked.status}: ${checked.stdout}${checked.stderr}`);
      device = mount();
      return checked.status;
    },
    close() {
      try {
        execFileSync("umount", [dir], { stdio: "pipe" });
      } catch {
        // Mounted no more (a repair that failed), or still held: lazily, then.
        spawnSync("umount", ["-l", dir], { stdio: "pipe" });
      }
      rmSync(base, { recursive: true, force: true });
    },
  };
}
