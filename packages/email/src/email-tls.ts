/**
 * TLS of the SMTP and IMAP connections: which server certificates the client trusts (`TlsTrust`,
 * handed to nodemailer's and imapflow's `tls`, which pass it to Node's `tls.connect`), and which
 * failures are the server's certificate or TLS refused by us (`tlsRefusal`): a configuration to
 * fix, which no retry gets past.
 *
 * The server's certificate is always verified; no option turns that off. A server whose
 * certificate a private CA signed is trusted by giving that CA's certificate; a server with a
 * self-signed certificate, by giving that certificate itself (pinned: a new one is refused until
 * the config has it). Not supported: client certificates, CRLs, pinning a public key.
 */
import { X509Certificate } from "node:crypto";
import type { ConnectionOptions } from "node:tls";
import { tlsRefused } from "@idem/core";
import { z } from "zod";

/** What to trust of a server's certificate, beyond Node's bundled public CAs (or instead of them). */
export interface TlsTrust {
  /**
   * The certificates to trust, PEM (one, a bundle, or a list): a private CA's, or the server's own
   * self-signed one. They replace Node's bundled public CAs for this connection, as Node's `ca`
   * does: a server whose certificate a public CA signed needs none. Default: the public CAs.
   */
  readonly ca?: string | Buffer | readonly (string | Buffer)[];
  /**
   * The name the server's certificate must carry (also sent as SNI), when it is not `host`: a
   * connection by IP address, or through a tunnel. Default: `host`.
   */
  readonly servername?: string;
  /** The lowest TLS version accepted. Default (and lowest): "TLSv1.2", Node's own floor. */
  readonly minVersion?: "TLSv1.2" | "TLSv1.3";
}

const PEM_CERTIFICATE = /-----BEGIN CERTIFICATE-----[\s\S]*?-----END CERTIFICATE-----/g;

/** Why `pem` cannot be trusted as given, or undefined: it must hold certificates Node can read. */
function caProblem(pem: string): string | undefined {
  const blocks = pem.match(PEM_CERTIFICATE);
  // A file's name where its contents belong is the likely mistake: Node would trust nothing.
  if (!blocks) return "must hold PEM certificates (-----BEGIN CERTIFICATE-----): the file's contents, not its name";
  for (const block of blocks) {
    try {
      new X509Certificate(block);
    } catch (cause) {
      return `holds a certificate that cannot be read (${(cause as Error).message})`;
    }
  }
  return undefined;
}

const pem = z.union([z.string(), z.instanceof(Buffer)]).superRefine((value, ctx) => {
  const problem = caProblem(value.toString());
  if (problem) ctx.addIssue({ code: "custom", message: problem });
});

const trustSchema = z
  .object({
    ca: z.union([pem, z.array(pem).min(1, "must hold at least one certificate")]).optional(),
    servername: z
      .string()
      .regex(/^[A-Za-z0-9.-]+$/, "must be a host name (the name the server's certificate carries)")
      .optional(),
    minVersion: z.enum(["TLSv1.2", "TLSv1.3"]).optional(),
  })
  .strict();

/**
 * `value` checked as a `TlsTrust` (`field` names it in the error): undefined stays undefined; an
 * option it does not know is refused, so that one meant to turn verification off (Node's
 * `rejectUnauthorized: false`) does not pass unnoticed. Throws a TypeError naming the field.
 */
export function parseTlsTrust(value: unknown, field: string): TlsTrust | undefined {
  if (value === undefined) return undefined;
  const parsed = trustSchema.safeParse(value);
  if (parsed.success) return value as TlsTrust;
  const issue = parsed.error.issues[0]!;
  const at = [field, ...issue.path.map(String)].join(".");
  if (issue.code === "unrecognized_keys")
    throw new TypeError(
      `email: ${at}: unknown option ${issue.keys.join(", ")}; the server's certificate is always verified: trust a private CA, or the server's self-signed certificate, with ${field}.ca`,
    );
  throw new TypeError(`email: ${at}: ${issue.message}`);
}

/** The options for Node's `tls.connect` (nodemailer's and imapflow's `tls`): only the three known, never more. */
export function tlsOptions(trust: TlsTrust | undefined): ConnectionOptions {
  if (!trust) return {};
  const { ca, servername, minVersion } = trust;
  return {
    ...(ca !== undefined && { ca: typeof ca === "string" || Buffer.isBuffer(ca) ? ca : [...ca] }),
    ...(servername !== undefined && { servername }),
    ...(minVersion !== undefined && { minVersion }),
  };
}

/**
 * What in `error` says we refused the TLS of `server` (its certificate not trusted, or no TLS
 * version in common), or undefined. Reads Node's `code`, or nodemailer's `originalCode` (it
 * recodes socket errors ESOCKET), as the core's `tlsRefused` does. Not a handshake cut off (ECONNRESET): that may pass.
 */
export function tlsRefusal(error: unknown, server = "the server"): string | undefined {
  const refused = tlsRefused(error);
  if (refused === undefined) return undefined;
  const message = (error as { message?: unknown }).message;
  const said = `${refused.code}: ${typeof message === "string" ? message : "no message"}`;
  return refused.refused === "certificate"
    ? `${server}'s certificate is not trusted (${said}): give the CA that signed it in tls.ca, or the name it carries in tls.servername`
    : `no TLS version both ${server} and the config accept (${said}): see tls.minVersion`;
}
