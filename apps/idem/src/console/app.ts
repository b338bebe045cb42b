/**
 * The console's routes (Hono). Every page and action is scoped to the operator's tenants: another
 * tenant's operation is "not found", as in the CLI. Decisions go through `ledger.admin` with the
 * operator's name as the actor and the page's `updatedAt`, so a stale page cannot decide an
 * operation that changed; the result is shown, never a raw exception.
 */
import {
  ChangedSinceSeenError,
  IdemError,
  InvalidTransitionError,
  InvalidValueError,
  OperationNotFoundError,
  performedProof,
  type Ledger,
  type Operation,
  type OperationEvent,
  type Seen,
} from "@idem/core";
import { Hono, type Context } from "hono";
import { bodyLimit } from "hono/body-limit";
import { csrf } from "hono/csrf";
import { HTTPException } from "hono/http-exception";
import { secureHeaders } from "hono/secure-headers";
import { streamSSE } from "hono/streaming";
import ms from "ms";
import type { Logger } from "pino";
import { RateLimiterMemory } from "rate-limiter-flexible";
import type { IdemConfig } from "../config.js";
import { decisionsFor, type Outcome } from "../decisions.js";
import { parseReceipt } from "../receipt.js";
import { readDuration } from "../durations.js";
import { stuckReads } from "../stuck.js";
import { ASSET_FILES } from "./assets.js";
import { allows, type Access, type Operator } from "./auth.js";
import {
  changedNote,
  FILTERS,
  flashNote,
  layout,
  loginPage,
  notTakenNote,
  OUTCOME_LABELS,
  OUTCOME_NAMES,
  operationPage,
  performedNote,
  queuePage,
  statsPage,
  type QueueRow,
  untakenNote,
} from "./pages.js";

/** Failed sign-ins an address may make in a quarter of an hour. */
const SIGN_IN_FAILURES = 10;
/** And every address together: addresses behind a proxy can be made up. */
const SIGN_IN_FAILURES_ALL = 100;

/**
 * Live pages an operator may hold open at once, and how long one lasts: each polls the ledger
 * every second. A browser's EventSource reconnects by itself when a stream ends (checking the
 * session again).
 */
const LIVE_STREAMS = 16;
const LIVE_STREAM_MS = 10 * 60_000;
/** A live stream's last word while the ledger cannot be read. */
const UNAVAILABLE = "unavailable";

/**
 * What a retry's note says. An operation whose last run may have done it is looked up first (where
 * its action can be): a request that landed after the person looked settles it, not a second run.
 */
const RETRIED =
  "Marked not done: it will run again with the same key (looked up first where its last run may have done it).";
/** Rows the queue shows at most: `admin.list`'s per status, and `daemon.stuck`'s for the stuck ones. */
const QUEUE_PER_STATUS = 500;
const QUEUE_STUCK = 1_000;
const QUEUE_ROWS = 2 * QUEUE_PER_STATUS + QUEUE_STUCK;
/** A form's body, but for a bulk decision. */
const FORM_BODY_MAX = 256 * 1024;
/**
 * A bulk decision's body: one field per selected row, so enough for every row of the fullest
 * queue, each at most 2,500 bytes as sent (its operation, as the queue showed it, with a tenant
 * name of 200 characters of three bytes each, URL-encoded), and the decision's fields.
 */
const BULK_BODY_MAX = QUEUE_ROWS * 2_500 + FORM_BODY_MAX;
/** Undecided operations a bulk decision's note names one by one; the rest are counted. */
const BULK_NOTE_NAMES = 10;

type Env = { Variables: { operator: Operator } };
/** A person's decision, as a form gives it: the same for every operation of a bulk decision. */
interface Decision {
  readonly outcome: Outcome;
  readonly reason: string;
  readonly evidence: string | undefined;
  /** With "succeeded" on an operation's page: the receipt the person found, as `idem resolve --receipt` takes it. */
  readonly receipt?: unknown;
}
/**
 * What became of one operation's decision. `already`: it was this very decision, sent again after
 * it was recorded (a reload or double submit after its answer was lost): it stands, and this send
 * decided nothing. `stale`: refused because the operation changed since
 * the person was shown it (core's `CHANGED_SINCE_SEEN`), which a reload and a new decision may
 * settle, unlike a decision its status does not take. `outage`: the ledger failed during it
 * (`unknown`: it may have been written, a commit whose answer was lost; `undecided`: it was not,
 * the operation read back unchanged or changed by another) or before it (`untried`, in a bulk
 * decision cut by the outage).
 */
type Decided =
  | { ok: true; message: string; already?: true }
  | { ok: false; status: 403 | 404 | 409; message: string; stale?: true }
  | { ok: false; status: 503; message: string; outage: "unknown" | "undecided" | "untried" };

export function consoleApp(ledger: Ledger, config: IdemConfig, access: Access, log: Logger): Hono<Env> {
  const app = new Hono<Env>();
  // Only for the console's own names (no DNS rebinding), small bodies, and state-changing requests
  // from its own pages (Origin checked), besides the form token.
  app.use(async (c, next) => {
    if (!access.allowsHost(c)) return c.text("unknown host: add it to console.allowedHosts", 421);
    await next();
    return undefined;
  });
  // A bulk decision carries a field per selected row (a full queue is megabytes, and its note
  // counts rather than names them): that much is taken only from a signed-in operator, and
  // a body too large is refused whole, before anything is decided, with a page that says so.
  const tooLarge = (c: Context) => {
    // The body is left unread: the connection ends with this answer, so no other request follows on it.
    c.header("Connection", "close");
    return c.html(
      layout(
        "Too large",
        undefined,
        undefined,
        flashNote(
          "error",
          c.req.path === "/bulk"
            ? "Nothing was decided: that is more than the console takes at once. Select fewer operations (filter the queue by tenant, action or status) and decide them in parts."
            : "This form is larger than the console takes.",
        ),
      ),
      413,
    );
  };
  const formLimit = bodyLimit({ maxSize: FORM_BODY_MAX, onError: tooLarge });
  const bulkLimit = bodyLimit({ maxSize: BULK_BODY_MAX, onError: tooLarge });
  app.use(async (c, next) => {
    const bulk = c.req.method === "POST" && c.req.path === "/bulk" && (await access.operatorOf(c)) !== undefined;
    return (bulk ? bulkLimit : formLimit)(c, next);
  });
  app.use(csrf());
  // Scripts, styles and connections from the console only (no inline script or handler runs),
  // forms posted only to it, and no page framed by another site; hono's other secure defaults too.
  app.use(
    secureHeaders({
      contentSecurityPolicy: {
        defaultSrc: ["'none'"],
        scriptSrc: ["'self'"],
        styleSrc: ["'self'"],
        imgSrc: ["'self'"],
        connectSrc: ["'self'"],
        formAction: ["'self'"],
        frameAncestors: ["'none'"],
        baseUri: ["'none'"],
      },
    }),
  );
  // The pages' style and script (assets.ts): public, the same for every operator.
  app.get("/assets/:file", (c) => {
    const asset = ASSET_FILES.get(c.req.path);
    if (!asset) return c.notFound();
    c.header("Cache-Control", "public, max-age=31536000, immutable"); // the name changes with the content
    return c.body(asset.body, 200, { "Content-Type": asset.type });
  });
  app.onError((error, c) => {
    if (error instanceof HTTPException) return error.getResponse(); // the CSRF check's 403
    // A filter the ledger refuses (a tenant name, a duration): the operator's input, said as such.
    const refused = error instanceof IdemError && error.code === "INVALID_VALUE";
    const unavailable = error instanceof IdemError && error.code === "LEDGER_UNAVAILABLE";
    // An outage fails every page view alike: one line each, saying why, not a stack trace each
    // (the daemon beside it says the outage once, with its own).
    if (unavailable)
      log.warn({ path: c.req.path }, `console request failed: the ledger is unavailable: ${error.message}`);
    else if (!refused) log.error({ err: error }, "console request failed");
    const text = error instanceof IdemError ? error.message : "the console could not complete this request";
    return c.html(
      layout("Error", undefined, undefined, flashNote("error", text)),
      refused ? 400 : unavailable ? 503 : 500,
    );
  });

  app.get("/login", (c) =>
    access.byToken ? c.html(layout("Sign in", undefined, undefined, loginPage())) : c.redirect("/"),
  );
  // Sign-ins per address, and for the whole console as a backstop: guessing tokens gets
  // SIGN_IN_FAILURES tries an address a quarter of an hour. A try is counted before the token is
  // checked (so that requests sent together cannot all pass the check) and given back if it signed
  // in: only that try. A sign-in does not clear the address's earlier failures, or a holder of one
  // token could guess at the others' without end, signing in with their own between guesses. A
  // failure is counted against its address (and the backstop) only, never against an operator:
  // a token names no operator until it matches, and a remote guesser must not lock anyone out.
  const perAddress = new RateLimiterMemory({ points: SIGN_IN_FAILURES, duration: 15 * 60 });
  const everyone = new RateLimiterMemory({ points: SIGN_IN_FAILURES_ALL, duration: 15 * 60 });
  app.post("/login", async (c) => {
    const peer = access.clientAddress(c);
    try {
      await perAddress.consume(peer);
      await everyone.consume("all");
    } catch (refused) {
      const wait = Math.max(1, Math.ceil(((refused as { msBeforeNext?: number }).msBeforeNext ?? 60_000) / 1000));
      c.header("Retry-After", String(wait));
      log.warn({ peer }, "console sign-in refused: too many failed sign-ins");
      return c.html(
        layout(
          "Sign in",
          undefined,
          undefined,
          loginPage(`Too many failed sign-ins: try again in ${ms(wait * 1000)}.`),
        ),
        429,
      );
    }
    const form = await c.req.parseBody();
    const operator = typeof form.token === "string" ? await access.signIn(c, form.token) : undefined;
    if (!operator) {
      log.warn({ peer }, "console sign-in refused");
      return c.html(
        layout("Sign in", undefined, undefined, loginPage("That token does not belong to an operator.")),
        401,
      );
    }
    await Promise.all([perAddress.reward(peer, 1), everyone.reward("all", 1)]);
    log.info({ operator: operator.name }, "console sign-in");
    return c.redirect("/", 303);
  });

  // Everything below needs an operator.
  app.use(async (c, next) => {
    const operator = await access.operatorOf(c);
    if (!operator) {
      if (access.byToken && c.req.method === "GET") return c.redirect("/login");
      return c.text("not signed in", 401);
    }
    if (c.req.method === "POST" && !access.checkFormToken(operator, (await c.req.parseBody()).csrf)) {
      return c.text("this form is out of date or not from the console: reload the page", 403);
    }
    c.set("operator", operator);
    await next();
    return undefined;
  });

  const page = (
    c: Context<Env>,
    title: string,
    body: Parameters<typeof layout>[3],
    status: 200 | 403 | 404 | 409 | 503 = 200,
  ) => c.html(layout(title, c.var.operator, access.formToken(c.var.operator), body), status);

  app.post("/logout", async (c) => {
    await access.signOut(c);
    return c.redirect(access.byToken ? "/login" : "/", 303);
  });

  app.get("/", async (c) => {
    const operator = c.var.operator;
    const f = {
      tenant: c.req.query("tenant") || undefined,
      action: c.req.query("action") || undefined,
      status: c.req.query("status") || undefined,
      olderThan: c.req.query("olderThan") || undefined,
    };
    // Whole milliseconds, as the ledger takes them; a duration that is none (negative, 1M) is refused, not ignored.
    const parsed = f.olderThan ? readDuration(f.olderThan) : undefined;
    if (parsed && "problem" in parsed)
      throw new InvalidValueError(
        "olderThan",
        parsed.kind === "unreadable" ? "must be a duration such as 30m, 2h or 30d" : parsed.problem,
      );
    const rows = await queue(ledger, config, operator, { ...f, olderThanMs: parsed?.ms });
    const flash = flashOf(c);
    // Ages on the database's clock, on which createdAt was written (the console may run elsewhere).
    return page(c, "Queue", queuePage(rows, f, access.formToken(operator), await ledger.admin.now(), flash));
  });

  app.get("/stats", async (c) => {
    const operator = c.var.operator;
    // One tenant (if the operator may see it), or all of the operator's.
    const asked = c.req.query("tenant") || undefined;
    const tenant =
      asked !== undefined
        ? allows(operator, asked)
          ? asked
          : []
        : operator.tenants === "*"
          ? undefined
          : operator.tenants;
    const rows = (await ledger.admin.stats(typeof tenant === "string" ? { tenant } : {})).unsettled.filter(
      (r) => allows(operator, r.tenant) && (asked === undefined || r.tenant === asked),
    );
    const activity = await ledger.admin.activity(tenant === undefined ? {} : { tenant });
    return page(c, "Stats", statsPage(rows, activity, await ledger.admin.now(), asked));
  });

  app.get("/op/:tenant/:id", async (c) => {
    const found = await visible(c);
    if (!found) return page(c, "Not found", flashNote("error", "No such operation for the tenants you may see."), 404);
    const flash = flashOf(c);
    return page(c, found.operation.id, operationPage(found, access.formToken(c.var.operator), flash));
  });

  const live = new Map<string, number>(); // open live streams, by operator
  app.get("/op/:tenant/:id/live", async (c) => {
    // Asked while the ledger cannot be read (a browser reconnecting in an outage), the stream opens
    // all the same and says so: a 503 would end the page's EventSource for good, the page never
    // following the operation again once the ledger is back. Whether it exists is read then: one
    // that does not ends the stream (its reconnection is told "not found"). Another tenant's needs
    // no read: it is not found at once.
    const found = await visible(c).catch((e: unknown) => {
      if (e instanceof IdemError && e.code === "LEDGER_UNAVAILABLE") return UNAVAILABLE;
      throw e;
    });
    if (!found) return c.text("not found", 404);
    const who = c.var.operator.name;
    if ((live.get(who) ?? 0) >= LIVE_STREAMS)
      return c.text(`${LIVE_STREAMS} live pages are open already: close some`, 429);
    live.set(who, (live.get(who) ?? 0) + 1);
    const ref = { tenant: c.req.param("tenant"), id: c.req.param("id") };
    const ends = Date.now() + LIVE_STREAM_MS;
    return streamSSE(c, async (stream) => {
      try {
        let last = "";
        while (!stream.aborted && Date.now() < ends) {
          // The session may end while the page is open (signed out, its token replaced): so does the stream.
          const still = await access.operatorOf(c);
          if (!still || still.name !== who || !allows(still, ref.tenant)) break;
          const now = await ledger.get(ref).catch((e: unknown) => (e instanceof Error ? e : new Error(String(e))));
          // Gone (pruned meanwhile), or never there (asked in an outage): not followed.
          if (now instanceof OperationNotFoundError) break;
          if (now instanceof IdemError && now.code === "LEDGER_UNAVAILABLE") {
            // Said once, and the stream stays open: the page says its status may be old, and the
            // state is sent again once a read passes. Silent, the page looked live through the outage.
            if (last !== UNAVAILABLE) await stream.writeSSE({ event: "unavailable", data: now.message });
            last = UNAVAILABLE;
          } else if (!(now instanceof Error)) {
            const state = JSON.stringify({ status: now.operation.status, updatedAt: now.operation.updatedAt });
            if (state !== last) await stream.writeSSE({ data: state });
            last = state;
          }
          await stream.sleep(1_000);
        }
      } finally {
        const n = (live.get(who) ?? 1) - 1;
        if (n > 0) live.set(who, n);
        else live.delete(who);
      }
    });
  });

  app.post("/op/:tenant/:id/decide", async (c) => {
    const found = await visible(c);
    if (!found) return page(c, "Not found", flashNote("error", "No such operation for the tenants you may see."), 404);
    const form = await c.req.parseBody();
    const decision = decisionOf(form, { receipt: true });
    const result =
      typeof decision === "string"
        ? ({ ok: false, status: 409, message: decision } as const)
        : await decide(c.var.operator, found.operation, decision, form.seen);
    // The ledger failed: its page cannot be read back to show the note on.
    if (!result.ok && result.status === 503)
      return page(c, found.operation.id, flashNote("error", result.message), 503);
    // Shown on its page as it is now, a stale view's refusal with the way to a page of its own
    // (this one's address is the form's: reloaded, it would post the form again).
    const reload = {
      href: `/op/${encodeURIComponent(found.operation.tenant)}/${found.operation.id}`,
      label: "Reload it and decide on what it is now",
    };
    if (!result.ok)
      return page(
        c,
        found.operation.id,
        operationPage(
          await ledger.get(found.operation),
          access.formToken(c.var.operator),
          flashNote("error", result.message, "stale" in result ? reload : undefined),
        ),
        result.status,
      );
    return c.redirect(
      `/op/${encodeURIComponent(found.operation.tenant)}/${found.operation.id}?${access.flashQuery(c.var.operator, result.message)}`,
      303,
    );
  });

  app.post("/bulk", async (c) => {
    const operator = c.var.operator;
    const form = await c.req.parseBody({ all: true });
    // A selection named twice (the same operation as the same view) is decided once: its second
    // decision would be refused, and the note would say it was not decided.
    const picked = [
      ...new Set(([] as unknown[]).concat(form.ops ?? []).filter((v): v is string => typeof v === "string")),
    ];
    // Back to the queue as it was filtered (the form carries its filters), with the note.
    const filters = new URLSearchParams(
      FILTERS.flatMap((k): [string, string][] => {
        const v = form[`filter.${k}`];
        return typeof v === "string" && v !== "" ? [[k, v]] : [];
      }),
    );
    const back = (note: string) =>
      c.redirect(`/?${[filters.toString(), access.flashQuery(operator, note)].filter(Boolean).join("&")}`, 303);
    if (picked.length === 0) return back("Nothing was selected.");
    // The decision is the same for every operation: a form without one is said once, and nothing is decided.
    const decision = decisionOf(form);
    if (typeof decision === "string") return back(`${decision} Nothing was decided.`);
    // Every selection is checked before anything is written, and one that is not as the queue
    // showed it refuses the whole decision: the person decided for a selection, and half of it done
    // is not what they asked. Not one the queue made (unreadable, no view of the operation: a form
    // made elsewhere, or edited), or no operation of the operator's tenants ("not found", as on
    // its page: another tenant's is not told apart): the queue never showed it. Changed since it
    // was shown (it may have become known performed): `decide` would refuse it alone and write the
    // rest. Not taking this decision as shown (core would refuse it: known performed, unknown,
    // running): the page's script offers only what every selected row takes; this is for a form
    // sent anyway.
    const targets: { tenant: string; id: string; seen: Seen }[] = [];
    const unshown: { id: string; message: string }[] = [];
    const untaken: { id: string; message: string; changed?: true }[] = [];
    // Changed since shown by this very decision, sent before (its answer lost, or a double submit):
    // it stands, as on an operation's page, neither refusing the rest nor decided again.
    const already: (Decided & { id: string })[] = [];
    for (const { tenant, id, seen } of picked.map(pickedOf)) {
      if (tenant === undefined || id === undefined) {
        unshown.push({ id: "(unreadable)", message: "not a selection the queue made" });
        continue;
      }
      const shown = seenOf(seen);
      const found = await find(operator, tenant, id);
      const now = found?.operation;
      const again =
        found && shown && !sameVersion(found.operation, shown)
          ? alreadyDecided(operator, found, shown, decision.outcome)
          : undefined;
      if (!now) unshown.push({ id, message: "not found" });
      else if (!shown) unshown.push({ id, message: "sent without the view the queue showed of it" });
      else if (again) already.push({ ...again, id });
      else if (!sameVersion(now, shown))
        untaken.push({
          id,
          message: `it changed since the queue showed it: ${changedNote(shown, now)}`,
          changed: true,
        });
      else if (!decisionsFor(now).includes(decision.outcome)) untaken.push({ id, message: untakenNote(now) });
      else targets.push({ tenant, id, seen: shown });
    }
    if (unshown.length > 0) return back(unshownBulkNote(unshown, picked.length));
    if (untaken.length > 0) return back(untakenBulkNote(decision.outcome, untaken, already.length, picked.length));
    // What is refused now changed after the check above (another person, the daemon): said one by one.
    const results: (Decided & { id: string })[] = [...already];
    for (const { tenant, id, seen } of targets) {
      // After an outage the rest are not tried: each would wait on the same database (a frozen one: its timeouts).
      const cut = results.some((r) => "outage" in r);
      results.push({
        ...(cut
          ? ({ ok: false, status: 503, message: "not decided: not tried", outage: "untried" } as const)
          : await decide(operator, { tenant, id }, decision, seen)),
        id,
      });
    }
    if (results.some((r) => "outage" in r)) {
      // Said here, on a page of its own: the queue a redirect leads to cannot be read now, and its
      // error page would hide that some rows were decided. Every row is named, by what became of it.
      const by = (f: (r: Decided) => boolean) => results.filter(f).map((r) => r.id);
      log.warn(
        {
          operator: operator.name,
          outcome: decision.outcome,
          decided: by((r) => r.ok),
          unknown: by((r) => "outage" in r && r.outage === "unknown"),
          undecided: by((r) => !r.ok && !("outage" in r && r.outage === "unknown")),
        },
        "a bulk decision was cut by a ledger outage",
      );
      return page(c, "Bulk decision", flashNote("error", outageBulkNote(decision.outcome, results)), 503);
    }
    // The note travels in the redirect's URL: it counts, and names only the first few left undecided.
    return back(bulkNote(decision.outcome, results));
  });

  /** The note a redirect after a decision asked for, if the console sealed it for this operator. */
  function flashOf(c: Context<Env>) {
    const done = access.flashOf(c.var.operator, c.req.query("done"), c.req.query("seal"));
    return done === undefined ? undefined : flashNote("done", done);
  }

  /** The operation named by the URL, if the operator may see its tenant. */
  function visible(c: Context<Env>) {
    return find(c.var.operator, c.req.param("tenant") ?? "", c.req.param("id") ?? "");
  }

  /** An operation of a tenant the operator may see, or undefined (another tenant's is "not found" too). */
  async function find(operator: Operator, tenant: string, id: string) {
    if (!allows(operator, tenant)) return undefined;
    return ledger.get({ tenant, id }).catch((e: unknown) => {
      if (e instanceof OperationNotFoundError || (e instanceof IdemError && e.code === "INVALID_VALUE"))
        return undefined;
      throw e;
    });
  }

  /**
   * One decision on one operation, checked against the operation as its page showed it (`seen`);
   * a refusal is a message, not an exception. An operation that is not there is "not found".
   */
  async function decide(
    operator: Operator,
    ref: { tenant: string; id: string },
    decision: Decision,
    shown: unknown,
  ): Promise<Decided> {
    const seen = seenOf(shown);
    // Every decision is checked against the operation as the person saw it; a form without that view is refused.
    if (!seen) return { ok: false, status: 409, message: "Refused: reload the page and decide again." };
    const { outcome, reason, evidence, receipt } = decision;
    const common = { tenant: ref.tenant, id: ref.id, actor: operator.name, reason, seen };
    try {
      // A retry is no verdict: what the person checked is kept in its audit event, apart from the reason.
      if (outcome === "retry") await ledger.admin.retry({ ...common, ...(evidence !== undefined && { evidence }) });
      else
        await ledger.admin.resolve({
          ...common,
          outcome,
          ...(evidence !== undefined && { evidence }),
          // Checked by the ledger as the CLI's is: the action's receipt schema, maxResultBytes.
          ...(outcome === "succeeded" && receipt !== undefined && { receipt }),
        });
    } catch (error) {
      if (error instanceof OperationNotFoundError) return { ok: false, status: 404, message: "not found" };
      // A stale view (changed since shown, or another decision won the race): what changed, and
      // a reload, after which the person decides on what it is now.
      if (error instanceof ChangedSinceSeenError) {
        // The change since shown may be this very decision, sent again (a reload after its answer
        // was lost, the console restarting under it): told so, not "nothing was decided".
        const again = await ledger.get(ref).then(
          (now) => alreadyDecided(operator, now, seen, outcome),
          () => undefined,
        );
        if (again) return again;
        return {
          ok: false,
          status: 409,
          stale: true,
          message: `Refused: it changed since it was shown: ${changedNote(error.seen, error.now)}. Nothing was decided.`,
        };
      }
      if (error instanceof InvalidTransitionError) {
        // A move its status does not allow, on the operation as shown: why, and no "reload", which
        // would show the same and be refused the same. Its effect happened (core's
        // `refuseIfPerformed`): said so, with the one decision it takes. Read only on a refusal.
        const now = await ledger.get(ref).then(
          (x) => x.operation,
          () => undefined,
        );
        const proof = now && performedProof(now);
        if (proof && outcome !== "succeeded")
          return { ok: false, status: 409, message: `Refused. ${performedNote(proof)}` };
        // Core's `from` is the status, or the status and why (a retry that looks first, on a ledger not migrated for it).
        const why = now?.status === error.from ? notTakenNote(now, outcome) : `it is ${error.from}`;
        return { ok: false, status: 409, message: `Refused: ${why}.` };
      }
      // Bad input, or a ledger that must be migrated first (a retry that looks first): nothing was decided.
      if (error instanceof IdemError && (error.code === "INVALID_VALUE" || error.code === "LEDGER_CONFIG"))
        return { ok: false, status: 409, message: `Refused: ${error.message}` };
      if (error instanceof IdemError && error.code === "LEDGER_UNAVAILABLE")
        return afterOutage(operator, ref, decision, seen, error);
      throw error;
    }
    log.info({ operator: operator.name, tenant: ref.tenant, operationId: ref.id, outcome }, "console decision");
    return {
      ok: true,
      message: outcome === "retry" ? RETRIED : `Resolved as ${outcome}.`,
    };
  }

  /**
   * What became of a decision the ledger failed during: read back, when the ledger still answers
   * reads (a full or read-only disk), the operation tells (as shown: not decided; this person's
   * event since: decided; changed otherwise: not by this decision). Unread (the database gone), a
   * commit whose answer was lost may have landed: not known, never "not decided".
   */
  async function afterOutage(
    operator: Operator,
    ref: { tenant: string; id: string },
    decision: Decision,
    seen: Seen,
    error: IdemError,
  ): Promise<Decided> {
    // One line, no stack: an outage fails every request alike (as onError says it).
    log.warn(
      { operator: operator.name, tenant: ref.tenant, operationId: ref.id, outcome: decision.outcome },
      `console request failed: the ledger is unavailable: ${error.message}`,
    );
    const now = await ledger.get(ref).catch(() => undefined);
    if (!now)
      return {
        ok: false,
        status: 503,
        outage: "unknown",
        message: `not known whether it was decided: the ledger became unavailable during the decision (${error.message}); look at it again once the ledger is back`,
      };
    if (sameVersion(now.operation, seen))
      return {
        ok: false,
        status: 503,
        outage: "undecided",
        message: `not decided: the ledger takes no writes now (${error.message})`,
      };
    if (decidedAlready(operator, now.events, seen, decision.outcome))
      return { ok: true, message: decision.outcome === "retry" ? RETRIED : `Resolved as ${decision.outcome}.` };
    return {
      ok: false,
      status: 503,
      outage: "undecided",
      message: `not decided: it changed meanwhile (it is ${now.operation.status} now), and the ledger takes no writes now (${error.message})`,
    };
  }

  return app;
}

/**
 * This person's decision, found recorded on the operation as they were shown it (`seen`): what a
 * decision sent again says (on its page, and as a bulk decision's row), or undefined when it was not.
 */
function alreadyDecided(
  operator: Operator,
  now: { operation: Operation; events: readonly OperationEvent[] },
  seen: Seen,
  outcome: Outcome,
): Extract<Decided, { ok: true }> | undefined {
  if (!decidedAlready(operator, now.events, seen, outcome)) return undefined;
  return {
    ok: true,
    already: true,
    message: `Already decided: ${alreadyNote(outcome, "it")} It is ${now.operation.status} now.`,
  };
}

/** A decision sent again after it was recorded, in a few words (`which`: the operations it was on). */
function alreadyNote(outcome: Outcome, which: "it" | "them"): string {
  return `your decision on ${which} as shown (${OUTCOME_LABELS[outcome]}) was recorded; sent again, it decided nothing.`;
}

/** A bulk decision's rows decided already by its earlier send, counted (never named: see `bulkNote`). */
function alreadyBulkNote(outcome: Outcome, already: number, selected: number): string[] {
  if (already === 0) return [];
  return [
    `Already decided: ${already} of ${selected} selected: ${alreadyNote(outcome, already === 1 ? "it" : "them")}`,
  ];
}

/**
 * Whether this person's `outcome` was recorded on the operation as they were shown it (`seen`):
 * its transition from the state shown, made by them since (a retry's goes back to pending).
 */
function decidedAlready(operator: Operator, events: readonly OperationEvent[], seen: Seen, outcome: Outcome): boolean {
  const to = outcome === "retry" ? "pending" : outcome;
  return events.some(
    (e) => e.actor === operator.name && e.from === seen.status && e.to === to && e.at >= seen.updatedAt,
  );
}

/**
 * A bulk decision cut by a ledger outage, said on its own page (not carried in a URL): every
 * selected row by what became of it, decided, not known (a commit whose answer was lost) or not.
 */
function outageBulkNote(outcome: Outcome, results: readonly (Decided & { id: string })[]): string {
  const decided = results.filter((r) => r.ok && !r.already);
  const already = results.filter((r) => r.ok && r.already);
  const unknown = results.filter((r) => "outage" in r && r.outage === "unknown");
  const left = results.filter((r) => !r.ok && !unknown.includes(r));
  const untried = left.filter((r) => "outage" in r && r.outage === "untried");
  const said = left.filter((r) => !untried.includes(r));
  return [
    `The ledger became unavailable during this decision: ${decided.length} of ${results.length} selected ${decided.length === 1 ? "was" : "were"} decided${decided[0] ? ` (${decided[0].message})` : ""}${decided.length ? `: ${decided.map((r) => r.id).join(", ")}` : "."}`,
    ...alreadyBulkNote(outcome, already.length, results.length),
    ...unknown.map((r) => `${r.id}: ${r.message}`),
    ...said.map((r) => `${r.id}: ${r.message}`),
    ...(untried.length ? [`not decided, not tried: ${untried.map((r) => r.id).join(", ")}`] : []),
    "Decide what is left once the ledger is back.",
  ].join(" · ");
}

/**
 * The decision a form asks for, or what it lacks or gets wrong (said to the person). `receipt`:
 * the form has a receipt field (an operation's page; a bulk decision has none, and one sent is not read).
 */
function decisionOf(form: Record<string, unknown>, fields: { receipt?: boolean } = {}): Decision | string {
  const outcome = form.outcome;
  const reason = typeof form.reason === "string" ? form.reason.trim() : "";
  const evidence = typeof form.evidence === "string" && form.evidence.trim() ? form.evidence.trim() : undefined;
  const receiptText = fields.receipt && typeof form.receipt === "string" ? form.receipt.trim() : "";
  if (outcome !== "succeeded" && outcome !== "failed" && outcome !== "retry") return "Choose a decision.";
  if (!reason) return "A decision needs a reason.";
  if (!receiptText) return { outcome, reason, evidence };
  // As `idem resolve --receipt` with --failed: a receipt says it happened, the other decisions that it did not.
  if (outcome !== "succeeded")
    return `Refused: a receipt goes with ${OUTCOME_LABELS.succeeded} only; nothing was decided.`;
  try {
    return { outcome, reason, evidence, receipt: parseReceipt(receiptText) };
  } catch (error) {
    if (error instanceof InvalidValueError) return `Refused: ${error.message}`;
    throw error;
  }
}

/**
 * What a bulk decision did, in a few lines whatever the number selected: how many were decided
 * and how (one decision for all, so one message), then the first `BULK_NOTE_NAMES` left
 * undecided with why, and how many more. It is carried in a redirect's URL, which a server
 * refuses past a few kilobytes (Node: 16 KB of headers, 431), so it must not grow with the selection.
 */
function bulkNote(outcome: Outcome, results: readonly (Decided & { id: string })[]): string {
  const decided = results.filter((r) => r.ok && !r.already);
  const already = results.filter((r) => r.ok && r.already);
  const left = results.filter((r) => !r.ok);
  // All decided by an earlier send of it: said as that alone, not as "0 of 2 were decided".
  const head =
    decided.length === 0 && already.length > 0
      ? []
      : [
          `${decided.length} of ${results.length} selected ${decided.length === 1 ? "was" : "were"} decided${
            decided[0] ? `: ${decided[0].message}` : "."
          }`,
        ];
  const named = left.slice(0, BULK_NOTE_NAMES).map((r) => `${r.id}: ${r.message}`);
  const more = left.length > BULK_NOTE_NAMES ? [`and ${left.length - BULK_NOTE_NAMES} more not decided`] : [];
  // Changed since the queue showed them (another person, the daemon, while this ran): the queue
  // as it is now shows what they take. Refused as shown, a reload is no answer, and none is offered.
  const advice = left.some((r) => "stale" in r) ? ["Reload the queue and decide again on what is left."] : [];
  return [...head, ...alreadyBulkNote(outcome, already.length, results.length), ...named, ...more, ...advice].join(
    " · ",
  );
}

/**
 * A bulk decision refused whole (some selected operations changed since the queue showed them, or
 * as shown do not take it): how many of each, told apart (a changed one may take it, and a reload
 * shows what it takes now; one that does not take it as shown is to be deselected), and which,
 * the first `BULK_NOTE_NAMES` named with why, as short as `bulkNote` whatever the number.
 */
function untakenBulkNote(
  outcome: Outcome,
  untaken: readonly { id: string; message: string; changed?: true }[],
  already: number,
  selected: number,
) {
  const changed = untaken.filter((u) => u.changed).length;
  const refused = untaken.length - changed;
  const it = (n: number) => (n === 1 ? "it" : "them");
  const changedWords = `changed since the queue showed ${it(changed)}`;
  const refusedWords = (n: number) => `${n === 1 ? "does" : "do"} not take ${OUTCOME_NAMES[outcome]}`;
  const head = `Nothing was decided: ${untaken.length} of ${selected} selected ${
    refused === 0
      ? changedWords
      : changed === 0
        ? `${refusedWords(refused)} as shown`
        : `cannot be decided as shown: ${changed} ${changedWords}, ${refused} ${refusedWords(refused)}`
  }`;
  const named = untaken.slice(0, BULK_NOTE_NAMES).map((u) => `${u.id}: ${u.message}`);
  const more = untaken.length > BULK_NOTE_NAMES ? [`and ${untaken.length - BULK_NOTE_NAMES} more`] : [];
  const advice =
    refused === 0
      ? "Reload the queue and decide again."
      : changed === 0
        ? `Deselect ${it(refused)} and decide the rest again.`
        : "Reload the queue and decide again, without those that do not take it.";
  return [head, ...named, ...more, ...alreadyBulkNote(outcome, already, selected), advice].join(" · ");
}

/**
 * A bulk decision refused whole because some of its selections are no operation the queue showed
 * this operator (not found, unreadable, without their view): which, as short as `bulkNote`.
 */
function unshownBulkNote(unshown: readonly { id: string; message: string }[], selected: number) {
  const one = unshown.length === 1;
  const head = `Nothing was decided: ${unshown.length} of ${selected} selected ${one ? "is" : "are"} not ${one ? "an operation" : "operations"} the queue showed you`;
  const named = unshown.slice(0, BULK_NOTE_NAMES).map((u) => `${u.id}: ${u.message}`);
  const more = unshown.length > BULK_NOTE_NAMES ? [`and ${unshown.length - BULK_NOTE_NAMES} more`] : [];
  return [head, ...named, ...more, "Reload the queue and decide again."].join(" · ");
}

/** Whether an operation is as a page showed it (core's `Verdict.seen` check, read before deciding). */
function sameVersion(o: Operation, seen: Seen): boolean {
  return (
    o.status === seen.status && o.attempt === seen.attempt && o.checks === seen.checks && o.updatedAt === seen.updatedAt
  );
}

/** The operation as a page showed it: JSON in a hidden field (or a queue checkbox), checked before use. */
function seenOf(value: unknown): Seen | undefined {
  let s: Partial<Record<keyof Seen, unknown>>;
  try {
    s = typeof value === "string" ? JSON.parse(value) : value;
  } catch {
    return undefined;
  }
  if (typeof s !== "object" || s === null || typeof s.status !== "string") return undefined;
  if (![s.attempt, s.checks, s.updatedAt].every(Number.isInteger)) return undefined;
  return {
    status: s.status as Seen["status"],
    attempt: s.attempt as number,
    checks: s.checks as number,
    updatedAt: s.updatedAt as number,
  };
}

/** A queue checkbox's value: the operation and how the queue showed it. */
function pickedOf(value: string): { tenant?: string; id?: string; seen?: unknown } {
  try {
    const v = JSON.parse(value) as { tenant?: unknown; id?: unknown; seen?: unknown };
    return typeof v.tenant === "string" && typeof v.id === "string" ? { tenant: v.tenant, id: v.id, seen: v.seen } : {};
  } catch {
    return {};
  }
}

/** What needs a person, for this operator's tenants: needs_review, unknown outcomes already checked, stuck runs. */
async function queue(
  ledger: Ledger,
  config: IdemConfig,
  operator: Operator,
  f: {
    tenant?: string | undefined;
    action?: string | undefined;
    status?: string | undefined;
    olderThanMs?: number | undefined;
  },
): Promise<QueueRow[]> {
  if (f.tenant !== undefined && !allows(operator, f.tenant)) return [];
  const scope =
    f.tenant !== undefined
      ? { tenant: f.tenant }
      : operator.tenants === "*"
        ? { allTenants: true as const }
        : { tenant: operator.tenants };
  const filters = {
    ...(f.action && { action: f.action }),
    ...(f.olderThanMs !== undefined && { olderThanMs: f.olderThanMs }),
    limit: QUEUE_PER_STATUS,
  };
  const wants = (status: string) => !f.status || f.status === status;
  const t = config.thresholds;
  // Scoped in the query, so the limit applies to the operator's rows: another tenant's many
  // stuck runs must not hide these.
  const tenants = f.tenant !== undefined ? [f.tenant] : operator.tenants === "*" ? undefined : [...operator.tenants];
  // One statement for the whole page (one snapshot): read status by status, an operation that
  // changed status between the reads (an unknown outcome escalated to needs_review) was shown twice,
  // or not at all. Each read keeps its own index and limit.
  const read = await ledger.admin.readAtOnce({
    lists: [
      ...(wants("needs_review") ? [{ ...scope, ...filters, status: "needs_review" as const }] : []),
      // Past its checks: at least one lookup or replay could not settle it. Asked of the ledger, before
      // its limit: newer outcomes not checked yet (an outage) must not hide these.
      ...(wants("unknown") ? [{ ...scope, ...filters, status: "unknown" as const, checked: true }] : []),
    ],
    // Each threshold read apart (stuck.ts): another action's many runs within their own must not hide these either.
    stuck: wants("running")
      ? stuckReads(t, { limit: QUEUE_STUCK, ...(tenants && { tenants }), ...(f.action && { action: f.action }) })
      : [],
  });
  const rows: QueueRow[] = [];
  for (const o of read.lists.flat())
    rows.push({
      ...o,
      why:
        o.status === "needs_review"
          ? (o.reason ?? "a person must decide")
          : `outcome unknown after ${o.checks} check${o.checks === 1 ? "" : "s"}`,
    });
  // At most QUEUE_STUCK in all (a read a threshold), the longest running first.
  for (const o of read.stuck
    .flat()
    .sort((a, b) => b.runningForMs - a.runningForMs)
    .slice(0, QUEUE_STUCK)) {
    if (!allows(operator, o.tenant)) continue;
    // "Older than", as for the other rows: by the operation's age.
    if (f.olderThanMs !== undefined && o.runningForMs + (o.updatedAt - o.createdAt) < f.olderThanMs) continue;
    rows.push({ ...o, why: `running for ${ms(o.runningForMs)}` });
  }
  return rows.sort((a, b) => (a.id < b.id ? 1 : -1));
}
