/**
 * What the console suites share: an action a person must decide, the console served for its
 * operators, and a browser that signs in and posts the console's forms as its pages do.
 */
import { existsSync } from "node:fs";
import { expect } from "vitest";
import { type Browser, chromium } from "playwright-core";
import { pino } from "pino";
import { defineAction, type Ledger } from "@idem/core";
import { parseConfig } from "@idem/cli";
import { serveConsole, type ConsoleServer } from "../src/console/server.js";

/** No capability, and its send may have happened: a person decides. */
export const parked = defineAction({
  type: "sms.parked",
  capabilities: {},
  execute: async () => {
    throw new Error("socket hang up after send");
  },
});

/** An operator of the console under test: the token is put in an environment variable of its own. */
export interface TestOperator {
  readonly name: string;
  readonly token: string;
  readonly tenants: "*" | string[];
}

let served = 0;

/**
 * The console over `ledger` (whose URL is `url`), for these operators, logging nothing: on a free
 * port, or on `port` (a console started again where it was); with `sessionSecret`, its sessions
 * outlive a restart (otherwise each start signs its own).
 */
export async function serveFor(
  ledger: Ledger,
  url: string,
  operators: readonly TestOperator[],
  at: { port?: number; sessionSecret?: string } = {},
): Promise<ConsoleServer> {
  // One process may run several suites (threads): each console's variables are its own.
  const n = ++served;
  const env = (name: string) => `IDEM_TEST_${process.pid}_${n}_${name.toUpperCase()}`;
  for (const o of operators) process.env[env(o.name)] = o.token;
  if (at.sessionSecret !== undefined) process.env[env("session")] = at.sessionSecret;
  const config = parseConfig({
    ledger: url,
    console: {
      port: at.port ?? 0,
      ...(at.sessionSecret !== undefined && { sessionSecretEnv: env("session") }),
      operators: operators.map((o) => ({ name: o.name, tokenEnv: env(o.name), tenants: o.tenants })),
    },
  });
  return serveConsole(ledger, config, pino({ level: "silent" }));
}

/**
 * A browser on the console at `base()` (a function: the server starts after the suite is
 * declared). Each sign-in comes from its own address, so that the sign-in limit never counts them
 * together.
 */
export function browserOn(base: () => string) {
  let n = 0;
  const session = async (token: string, at = base()) => {
    const res = await fetch(`${at}/login`, {
      method: "POST",
      redirect: "manual",
      headers: {
        origin: at,
        "x-forwarded-for": `198.51.100.${++n}`,
        "content-type": "application/x-www-form-urlencoded",
      },
      body: new URLSearchParams({ token }),
    });
    expect(res.status).toBe(303);
    return res.headers.get("set-cookie")!.split(";")[0]!;
  };
  const get = (cookie: string, path: string, at = base()) =>
    fetch(new URL(path, at), { redirect: "manual", headers: { cookie } });
  /** The form token of a page as this session is shown it. */
  const formTokenOf = async (cookie: string, path = "/", at = base()) =>
    /name="csrf" value="([^"]+)"/.exec(await (await get(cookie, path, at)).text())![1]!;
  /** Posts a console form as its page would (Origin), with this form token. */
  const postWith = (cookie: string, csrf: string, path: string, fields: [string, string][], at = base()) =>
    fetch(`${at}${path}`, {
      method: "POST",
      redirect: "manual",
      headers: { cookie, origin: at, "content-type": "application/x-www-form-urlencoded" },
      body: new URLSearchParams([["csrf", csrf], ...fields]),
    });
  /** Posts a console form as its page would: with the page's own form token. */
  const post = async (cookie: string, path: string, fields: [string, string][], at = base()) =>
    postWith(cookie, await formTokenOf(cookie, "/", at), path, fields, at);
  /** The note of the page a decision's redirect leads to. */
  const noteAfter = async (cookie: string, res: Response) => {
    expect(res.status).toBe(303);
    const page = await (await get(cookie, res.headers.get("location")!)).text();
    return /data-testid="flash">([^<]*)</.exec(page)?.[1];
  };
  return { session, get, formTokenOf, postWith, post, noteAfter };
}

const CHROMIUM = "/usr/bin/chromium";

/** Debian's Chromium, headless, driven by Playwright. */
export async function launchChromium(): Promise<Browser> {
  if (!existsSync(CHROMIUM))
    throw new Error(`${CHROMIUM} is missing: apt-get install chromium (pnpm test installs it)`);
  return chromium.launch({ executablePath: CHROMIUM, headless: true, args: ["--no-sandbox"] });
}

/** A browser context of its own, signed in to the console at `base` with `token` (as the sign-in page does it). */
export async function signInAs(browser: Browser, base: string, token: string, name: string) {
  const context = await browser.newContext({ viewport: { width: 1280, height: 800 } });
  const page = await context.newPage();
  await page.goto(`${base}/`);
  expect(new URL(page.url()).pathname).toBe("/login"); // nothing is served before sign-in
  await page.getByLabel("Operator token").fill(token);
  await page.getByRole("button", { name: "Sign in" }).click();
  await expect.poll(() => page.getByTestId("operator").textContent()).toBe(name);
  return { context, page };
}
