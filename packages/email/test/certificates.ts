/**
 * Test helper: a private certificate authority and a server certificate it signed, made with the
 * openssl command (installed wherever Dovecot is: dovecot-core depends on it), as a company's
 * internal CA makes them. Node cannot make certificates by itself.
 */
import { execFileSync } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

export interface TestPki {
  /** The private CA's certificate (PEM): what a client must trust. */
  readonly ca: string;
  /** The server's certificate (PEM), signed by `ca`, for `localhost` and 127.0.0.1. */
  readonly cert: string;
  /** The server certificate's private key (PEM). */
  readonly key: string;
  /** Another CA's certificate (PEM), which signed nothing here: trusting it is trusting the wrong one. */
  readonly otherCa: string;
  /** A self-signed server certificate for `localhost` and 127.0.0.1 (no CA), and its key: trusted only pinned. */
  readonly selfSigned: { readonly cert: string; readonly key: string };
  /** A file holding `ca` (for a config that names a file), removed by `remove()`. */
  readonly caFile: string;
  remove(): void;
}

export function testPki(): TestPki {
  const dir = mkdtempSync(join(tmpdir(), "idem-pki-"));
  const at = (name: string) => join(dir, name);
  const openssl = (args: string[]) => execFileSync("openssl", args, { stdio: "pipe" });
  const key = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"];
  const caExt = ["-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign"];
  for (const ca of ["ca", "other-ca"])
    openssl([
      "req",
      "-x509",
      ...key,
      "-days",
      "2",
      "-subj",
      `/CN=idem test ${ca}`,
      ...caExt,
      "-keyout",
      at(`${ca}.key`),
      "-out",
      at(`${ca}.crt`),
    ]);
  openssl(["req", ...key, "-subj", "/CN=localhost", "-keyout", at("server.key"), "-out", at("server.csr")]);
  writeFileSync(
    at("server.ext"),
    "subjectAltName=DNS:localhost,IP:127.0.0.1\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n",
  );
  openssl(
    ["x509", "-req", "-in", at("server.csr"), "-CA", at("ca.crt"), "-CAkey", at("ca.key"), "-CAcreateserial"].concat([
      "-days",
      "2",
      "-extfile",
      at("server.ext"),
      "-out",
      at("server.crt"),
    ]),
  );
  openssl(
    ["req", "-x509", ...key, "-days", "2", "-subj", "/CN=localhost"].concat(
      ["-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1", "-addext", "basicConstraints=critical,CA:FALSE"],
      ["-keyout", at("self.key"), "-out", at("self.crt")],
    ),
  );
  const read = (name: string) => readFileSync(at(name), "utf8");
  return {
    ca: read("ca.crt"),
    cert: read("server.crt"),
    key: read("server.key"),
    otherCa: read("other-ca.crt"),
    selfSigned: { cert: read("self.crt"), key: read("self.key") },
    caFile: at("ca.crt"),
    remove: () => rmSync(dir, { recursive: true, force: true }),
  };
}
