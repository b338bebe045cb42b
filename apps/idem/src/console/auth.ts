/**
 * Who is looking at the console, and what they may see. Three modes, from the config's `console`
 * section: a token per operator (signed in once, then a signed session cookie), a header set by
 * an authenticating reverse proxy, or, only on a loopback address and only when asked for, no
 * sign-in at all. Every state-changing form carries a token derived from the operator's session
 * (by token: the session's own id; by proxy or without sign-in, which have no session: the
 * operator's name) and the session key, checked with the request's Origin, so another site cannot
 * post for them and a form token copied from one session is refused in any other.
 */
import { createHash, createHmac, randomBytes, timingSafeEqual } from "node:crypto";
import { isIP } from "node:net";
import { getConnInfo } from "@hono/node-server/conninfo";
import type { Context } from "hono";
import { deleteCookie, getSignedCookie, setSignedCookie } from "hono/cookie";
import { ConfigError, secret, type IdemConfig } from "../config.js";

export interface Operator {
  readonly name: string;
  /** The tenants this operator may see and decide; "*" for every tenant. */
  readonly tenants: "*" | readonly string[];
  /**
   * The signed-in session the request came with (sign-in by token), whose forms alone it may post;
   * undefined when the proxy names the operator or there is no sign-in.
   */
  readonly session?: string;
}

const COOKIE = "idem_console";
const MIN_TOKEN_LENGTH = 16;
const SESSION_MS = 12 * 3_600_000;

export class Access {
  readonly #key: Buffer;
  readonly #tokens: { operator: Operator; digest: Buffer }[];
  readonly #byName: Map<string, Operator>;
  /**
   * Sessions signed out, by id, until they would have expired: a copy of the cookie is refused
   * after sign-out. Kept by this process (another console replica does not hear of it).
   */
  readonly #signedOut = new Map<string, number>();

  constructor(private readonly settings: IdemConfig["console"]) {
    const s = settings;
    this.#key = s.sessionSecretEnv
      ? Buffer.from(secret(s.sessionSecretEnv, "console.sessionSecretEnv"))
      : randomBytes(32);
    this.#byName = new Map(s.operators.map((o) => [o.name, { name: o.name, tenants: o.tenants }]));
    this.#tokens = s.operators
      .filter((o) => o.tokenEnv !== undefined)
      .map((o) => {
        const field = `console.operators[${o.name}].tokenEnv`;
        const token = secret(o.tokenEnv!, field);
        // A token is the operator's only credential: one a person could guess is refused.
        if (token.length < MIN_TOKEN_LENGTH)
          throw new ConfigError(
            `invalid config: ${field}: the token in ${o.tokenEnv} is ${token.length} characters; use at least ${MIN_TOKEN_LENGTH} random ones (e.g. openssl rand -hex 32)`,
          );
        return { operator: { name: o.name, tenants: o.tenants }, digest: digest(token) };
      });
    if (s.insecureNoAuth) {
      if (!isLoopback(s.host))
        throw new ConfigError(`console.insecureNoAuth serves without sign-in: only on a loopback host, not ${s.host}`);
    } else if (!s.proxyHeader && this.#tokens.length === 0) {
      throw new ConfigError(
        "the console needs operators with a tokenEnv, a proxyHeader, or insecureNoAuth for local use",
      );
    }
  }

  /** The operator of a request, or undefined (not signed in). */
  async operatorOf(c: Context): Promise<Operator | undefined> {
    if (this.settings.insecureNoAuth) return { name: "local", tenants: "*" };
    if (this.settings.proxyHeader) {
      // Only the proxy may name the operator: anyone else could send the header too.
      const peer = getConnInfo(c).remote.address;
      if (peer === undefined || !this.settings.trustedProxies.includes(peer)) return undefined;
      const name = c.req.header(this.settings.proxyHeader);
      return name === undefined ? undefined : this.#byName.get(name);
    }
    return (await this.#session(c))?.operator;
  }

  /**
   * The signed session of a request, if it still holds: not expired, not signed out, and made with
   * the operator's current token (a token replaced in the config ends the sessions it opened).
   */
  async #session(c: Context): Promise<{ operator: Operator; id: string; until: number } | undefined> {
    const value = await getSignedCookie(c, this.#key.toString("base64"), COOKIE);
    if (typeof value !== "string") return undefined;
    const [name, until, id, tag] = JSON.parse(value) as [string, number, string?, string?];
    if (!(Date.now() < until) || id === undefined || this.#signedOut.has(id)) return undefined;
    const entry = this.#tokens.find((t) => t.operator.name === name);
    return entry && tag === this.#tagOf(entry.digest)
      ? { operator: { ...entry.operator, session: id }, id, until }
      : undefined;
  }

  /** Names the token a session was opened with, without revealing anything of it. */
  #tagOf(digest: Buffer): string {
    return createHmac("sha256", this.#key).update("session:").update(digest).digest("base64url").slice(0, 22);
  }

  /** Signs in with a token: the operator it belongs to gets a session cookie. */
  async signIn(c: Context, token: string): Promise<Operator | undefined> {
    const given = digest(token);
    const match = this.#tokens.find((t) => timingSafeEqual(t.digest, given));
    if (!match) return undefined;
    await setSignedCookie(
      c,
      COOKIE,
      JSON.stringify([
        match.operator.name,
        Date.now() + SESSION_MS,
        randomBytes(16).toString("base64url"),
        this.#tagOf(match.digest),
      ]),
      this.#key.toString("base64"),
      {
        httpOnly: true,
        sameSite: "Strict",
        path: "/",
        maxAge: SESSION_MS / 1000,
        // Behind a TLS-terminating proxy the request reaches us as http: its X-Forwarded-Proto says https.
        secure: c.req.url.startsWith("https:") || c.req.header("x-forwarded-proto") === "https",
      },
    );
    return match.operator;
  }

  /** Ends the request's session: its cookie is deleted, and refused from now on if sent again. */
  async signOut(c: Context): Promise<void> {
    const session = await this.#session(c);
    if (session) {
      const now = Date.now();
      for (const [id, until] of this.#signedOut) if (until <= now) this.#signedOut.delete(id);
      this.#signedOut.set(session.id, session.until);
    }
    deleteCookie(c, COOKIE, { path: "/" });
  }

  /**
   * Whether the request names a host the console answers to: its own address, localhost, or one
   * of `allowedHosts`. Anything else is refused, so a hostile page whose name was re-pointed at
   * this address (DNS rebinding) cannot read pages or post decisions as the operator.
   */
  allowsHost(c: Context): boolean {
    const host = c.req.header("host");
    if (host === undefined) return false;
    const name = host.startsWith("[") ? host.slice(1, host.indexOf("]")) : host.replace(/:\d+$/, "");
    const known = new Set(["localhost", "127.0.0.1", "::1", this.settings.host, ...this.settings.allowedHosts]);
    return known.has(name.toLowerCase());
  }

  /**
   * Who is signing in, for counting failed sign-ins: the peer's address or, from a trusted proxy,
   * the nearest address of its X-Forwarded-For that is not a trusted proxy too. Read from the
   * right: proxies append the address they saw, and what is left of it the client wrote itself.
   */
  clientAddress(c: Context): string {
    const trusted = this.settings.trustedProxies;
    let address = getConnInfo(c).remote.address ?? "unknown";
    const forwarded = (c.req.header("x-forwarded-for") ?? "").split(",").map((a) => a.trim());
    while (trusted.includes(address) && forwarded.length > 0) address = forwarded.pop() || address;
    return address;
  }

  /** Whether sign-in is by token (a login page), rather than by the proxy or not at all. */
  get byToken(): boolean {
    return !this.settings.insecureNoAuth && !this.settings.proxyHeader;
  }

  /**
   * The anti-forgery token of this operator's forms, bound to their session when they signed in
   * by token: a token read from another session's page (another operator's, or their own signed
   * out) does not post in this one.
   */
  formToken(operator: Operator): string {
    return createHmac("sha256", this.#key)
      .update(`form:${operator.name}\n${operator.session ?? ""}`)
      .digest("base64url");
  }

  /**
   * The query that shows `message` once after a redirect (`?done=…&seal=…`). Sealed for this
   * operator, so that a link made elsewhere cannot put its own words in the console's pages.
   */
  flashQuery(operator: Operator, message: string): string {
    return new URLSearchParams({ done: message, seal: this.#seal(operator, message) }).toString();
  }

  /** The message of a redirect's query, when the console sealed it for this operator. */
  flashOf(operator: Operator, done: string | undefined, seal: string | undefined): string | undefined {
    if (!done || !seal) return undefined;
    const want = Buffer.from(this.#seal(operator, done));
    const got = Buffer.from(seal);
    return want.length === got.length && timingSafeEqual(want, got) ? done : undefined;
  }

  #seal(operator: Operator, message: string): string {
    return createHmac("sha256", this.#key).update(`flash:${operator.name}\n${message}`).digest("base64url");
  }

  checkFormToken(operator: Operator, given: unknown): boolean {
    if (typeof given !== "string") return false;
    const want = Buffer.from(this.formToken(operator));
    const got = Buffer.from(given);
    return want.length === got.length && timingSafeEqual(want, got);
  }
}

export function allows(operator: Operator, tenant: string): boolean {
  return operator.tenants === "*" || operator.tenants.includes(tenant);
}

function digest(token: string): Buffer {
  return createHash("sha256").update(token).digest();
}

function isLoopback(host: string): boolean {
  if (host === "localhost") return true;
  if (isIP(host) === 4) return host.startsWith("127.");
  return host === "::1";
}
