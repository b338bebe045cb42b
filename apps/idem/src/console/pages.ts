/**
 * The console's pages, rendered on the server with hono/html (every interpolation escaped; no
 * front-end build). Plain forms and links, so every action works from the keyboard; a few lines
 * of script (assets.ts, served as a file: the Content-Security-Policy allows no inline script)
 * only for live updates and "select all".
 */
import {
  performedProof,
  type Operation,
  type OperationEvent,
  type Seen,
  type Status,
  type StoredError,
} from "@idem/core";
import { html } from "hono/html";
import type { HtmlEscapedString } from "hono/utils/html";
import { decisionsFor, type Outcome, performedByWords } from "../decisions.js";
import { lookFirstWords, redactArgs } from "../output.js";
import { ASSETS } from "./assets.js";
import type { Operator } from "./auth.js";
import { providerLink } from "./links.js";

type Html = HtmlEscapedString | Promise<HtmlEscapedString>;

export function layout(title: string, operator: Operator | undefined, formToken: string | undefined, body: Html): Html {
  return html`<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>${title} · idem console</title><link rel="stylesheet" href="${ASSETS.css}"><script src="${ASSETS.js}" defer></script></head>
<body><a class="skip" href="#main">Skip to content</a>
<header><strong>idem</strong>${
    operator
      ? html`<nav aria-label="Pages"><a href="/">Queue</a><a href="/stats">Stats</a></nav>
<span class="who">Signed in as <strong data-testid="operator">${operator.name}</strong></span>
<form method="post" action="/logout"><input type="hidden" name="csrf" value="${formToken ?? ""}"><button>Sign out</button></form>`
      : ""
  }</header>
<main id="main">${body}</main></body></html>`;
}

export function loginPage(error?: string): Html {
  return html`<h1>Sign in</h1>
${error ? html`<p class="note error" role="alert">${error}</p>` : ""}
<form method="post" action="/login" class="decide">
<label for="token">Operator token</label><input id="token" name="token" type="password" autocomplete="current-password" required autofocus>
<button>Sign in</button></form>`;
}

export interface QueueFilters {
  readonly tenant?: string | undefined;
  readonly action?: string | undefined;
  readonly status?: string | undefined;
  readonly olderThan?: string | undefined;
}

/** The queue's filters, as its URL names them (a bulk decision carries them back to it). */
export const FILTERS = ["tenant", "action", "status", "olderThan"] as const satisfies readonly (keyof QueueFilters)[];

export interface QueueRow extends Operation {
  /** Why it is in the queue, in a few words. */
  readonly why: string;
}

export function queuePage(
  rows: readonly QueueRow[],
  f: QueueFilters,
  formToken: string,
  now: number,
  flash?: Html,
): Html {
  return html`<h1>Needs a person</h1>
<p>Operations a person must decide (needs_review), unknown outcomes the checks have not settled, and operations running past the stuck threshold.</p>
${flash ?? ""}
<form class="filters" method="get" action="/" aria-label="Filter the queue">
<div><label for="f-tenant">Tenant</label><input id="f-tenant" name="tenant" value="${f.tenant ?? ""}"></div>
<div><label for="f-action">Action</label><input id="f-action" name="action" value="${f.action ?? ""}"></div>
<div><label for="f-status">Status</label><select id="f-status" name="status">
${["", "needs_review", "unknown", "running"].map((s) => html`<option value="${s}" ${s === (f.status ?? "") ? "selected" : ""}>${s || "any"}</option>`)}
</select></div>
<div><label for="f-age">Older than</label><input id="f-age" name="olderThan" placeholder="10m, 2h" size="8" value="${f.olderThan ?? ""}"></div>
<button>Filter</button></form>
${
  rows.length === 0
    ? html`<p data-testid="empty">Nothing needs a person.</p>`
    : html`<form method="post" action="/bulk" aria-label="Decide the selected operations">
<input type="hidden" name="csrf" value="${formToken}">
${FILTERS.filter((k) => f[k]).map((k) => html`<input type="hidden" name="filter.${k}" value="${f[k]}">`)}
<table data-testid="queue"><thead><tr><th><input type="checkbox" aria-label="Select all" id="all"></th><th>Tenant</th><th>Operation</th><th>Status</th><th>Action</th><th>Age</th><th>Why</th></tr></thead><tbody>
${rows.map((o) => {
  // A row is selectable for the decisions core takes on it (none: no selection); the page's script
  // offers a selection only the decisions every selected row takes, and the console refuses the others.
  const takes = decisionsFor(o);
  return html`<tr data-operation="${o.id}">
<td>${takes.length ? html`<input type="checkbox" name="ops" value="${JSON.stringify({ tenant: o.tenant, id: o.id, seen: seenOf(o) })}" data-outcomes="${takes.join(" ")}" aria-label="Select ${o.id}">` : ""}</td>
<td>${o.tenant}</td><td><a href="/op/${encodeURIComponent(o.tenant)}/${o.id}">${o.id}</a><br><small>${o.keyLabel ?? "(hashed key)"}</small></td>
<td class="status status-${o.status}">${o.status}</td><td>${o.action}</td><td>${age(now - o.createdAt)}</td><td>${o.why}${takes.length < 3 ? html`<br><small>${takesNote(o, takes)}</small>` : ""}</td></tr>`;
})}
</tbody></table>
<p class="note" id="bulk-limits" data-testid="bulk-limits" hidden role="status"></p>
${decideFields("bulk")}
</form>`
}`;
}

/** Each decision as its radio button says it. */
const LABELS: Readonly<Record<Outcome, string>> = {
  succeeded: "It happened: resolve as succeeded",
  failed: "It did not happen and must not be tried again: resolve as failed",
  retry: "It did not happen: run it again with the same key",
};

/** A decision as the console's notes quote its button. */
export const OUTCOME_LABELS: Readonly<Record<Outcome, string>> = {
  succeeded: `“${LABELS.succeeded}”`,
  failed: `“${LABELS.failed}”`,
  retry: `“${LABELS.retry}”`,
};

/**
 * The decision fields: outcome, the required reason, evidence, and, on an operation's page that
 * takes "succeeded", the receipt found at the provider (as `idem resolve --receipt`: JSON, checked
 * by the action's receipt schema; a bulk decision has none, one receipt being one operation's). No
 * outcome is chosen beforehand: the person chooses one (the browser asks, and the console refuses
 * a form without one), so a reason typed for a whole selection never decides it by a default.
 */
function decideFields(
  id: string,
  allowed: readonly Outcome[] = ["succeeded", "failed", "retry"],
  fields: { receipt?: boolean } = {},
): Html {
  return html`<fieldset class="decide"><legend>Decision</legend>
${allowed.map(
  (o) =>
    html`<div><input type="radio" id="${id}-${o}" name="outcome" value="${o}" required> <label class="inline" for="${id}-${o}">${LABELS[o]}</label></div>`,
)}
<label for="${id}-reason">Reason (recorded with your name)</label><textarea id="${id}-reason" name="reason" rows="2" required></textarea>
<label for="${id}-evidence">Evidence (what you checked: the provider's id or link)</label><input id="${id}-evidence" name="evidence" maxlength="1000">
${
  fields.receipt && allowed.includes("succeeded")
    ? html`<label for="${id}-receipt">Receipt you found at the provider, when it happened (optional: its object as JSON; checked by the action's receipt schema, then replayed to every later caller)</label><textarea id="${id}-receipt" name="receipt" rows="3" spellcheck="false"></textarea>`
    : ""
}
<button>Record the decision</button></fieldset>`;
}

/** A decision as the console's notes name it. */
export const OUTCOME_NAMES: Readonly<Record<Outcome, string>> = {
  succeeded: "“succeeded”",
  failed: "“failed”",
  retry: "a retry",
};

/** What a queue row takes, when not every decision (`decisionsFor`): said under its Why. */
function takesNote(o: Operation, takes: readonly Outcome[]): string {
  if (takes.length === 0)
    return o.status === "running" ? "Nothing can be decided on it while it runs." : "Nothing to decide.";
  return `Takes only ${takes.map((t) => OUTCOME_NAMES[t]).join(" or ")}${performedProof(o) ? ": its effect happened" : ""}.`;
}

/**
 * Why an operation, as it is, does not take a decision (`decisionsFor`), in a few words: a bulk
 * decision that includes it is refused whole, and this names it.
 */
export function untakenNote(o: Operation): string {
  const proof = performedProof(o);
  if (proof)
    return `its effect happened${performedByWords(proof)}, but its receipt could not be stored: it takes only “succeeded”`;
  const takes = decisionsFor(o);
  return `it is ${o.status}: ${
    takes.length
      ? `it takes only ${takes.map((t) => OUTCOME_NAMES[t]).join(" or ")}`
      : o.status === "running"
        ? "nothing can be decided on it while it runs"
        : "nothing is left to decide"
  }`;
}

/**
 * A decision the operation, as shown and as it still is, does not take (core's
 * `INVALID_TRANSITION`): why, without "reload", which would show the same status and the same refusal.
 */
export function notTakenNote(o: Operation, outcome: Outcome): string {
  return `${untakenNote(o)}; ${OUTCOME_NAMES[outcome]} is not allowed from ${o.status}, so nothing was decided`;
}

/**
 * What changed between the operation as a person was shown it (`seen`) and as it is (`now`), in
 * their words: its status and attempt; when neither moved, its checks, or else its last change
 * (a late answer, a lookup's result), to the millisecond since the two may share a second.
 */
export function changedNote(seen: Seen, now: Seen): string {
  if (seen.status !== now.status || seen.attempt !== now.attempt)
    return `it was ${seen.status} at attempt ${seen.attempt}, it is ${now.status} at attempt ${now.attempt} now`;
  const still = `it is still ${now.status} at attempt ${now.attempt}`;
  if (seen.checks !== now.checks) return `${still}, but was checked again (${now.checks} checks, ${seen.checks} shown)`;
  return `${still}, but was updated at ${new Date(now.updatedAt).toISOString()} (shown as it was at ${new Date(seen.updatedAt).toISOString()})`;
}

/** Why an operation known performed takes only "succeeded" (`performedProof`), as the console says it. */
export function performedNote(proof: StoredError): string {
  const by = performedByWords(proof);
  return `Its effect happened${by}, but its receipt could not be stored (${proof.reason.slice(0, 200)}): only ${OUTCOME_LABELS.succeeded}, with the receipt you find at the provider (the Receipt field of its page) or your evidence, is accepted. “Failed” and a retry would say it did not happen (a retry would do it again).`;
}

export function operationPage(
  x: { operation: Operation; events: OperationEvent[]; args: unknown },
  formToken: string,
  flash?: Html,
): Html {
  const o = x.operation;
  const link = providerLink(o);
  const performed = performedProof(o);
  const decidable = decisionsFor(o);
  return html`<h1>Operation <code>${o.id}</code></h1>
${flash ?? ""}
${performed ? html`<p class="note" data-testid="performed">${performedNote(performed)}</p>` : ""}
<p class="note" id="changed" hidden role="status">This operation changed while you were looking: <a href="">reload it</a> before deciding.</p>
<p class="note" id="live-stopped" hidden role="status">Live updates stopped (too many pages open, signed out, or the operation is gone): <a href="">reload this page</a> before deciding.</p>
<p class="note" id="live-lost" hidden role="status">Disconnected from the console: the status shown may be old. It is updated once the console answers again.<span id="not-sent" hidden> Not sent: nothing was decided. Decide once the console is back.</span></p>
<p class="note" id="live-unavailable" hidden role="status">The ledger is unavailable: the status shown may be old. It is updated once the ledger answers again.</p>
<dl data-testid="operation">
<dt>Status</dt><dd><span class="status status-${o.status}" id="status" data-updated="${o.updatedAt}">${o.status}</span> (attempt ${o.attempt})</dd>
${o.lookFirst ? html`<dt>Looks first</dt><dd data-testid="looks-first">${lookFirstWords(x.args !== null)}</dd>` : ""}
<dt>Tenant</dt><dd>${o.tenant}</dd><dt>Action</dt><dd>${o.action}</dd>
<dt>Identity</dt><dd>${o.keyLabel ?? "(hashed only)"}</dd>
<dt>Why</dt><dd>${o.reason ?? "-"}</dd>
<dt>Args</dt><dd><pre data-testid="args">${x.args === null ? "(not stored)" : JSON.stringify(redactArgs(x.args), null, 2)}</pre></dd>
<dt>Receipt</dt><dd><pre>${o.result === null ? "-" : JSON.stringify(redactArgs(o.result), null, 2)}</pre></dd>
<dt>Provider reference</dt><dd><code>${o.providerReference ?? "-"}</code>${link ? html` · <a href="${link.url}" rel="noreferrer">${link.label}</a>` : ""}</dd>
<dt>Error</dt><dd data-testid="error">${o.error ? errorOf(o.error) : "-"}</dd>
<dt>Verdict</dt><dd data-testid="verdict">${
    o.resolution
      ? html`${o.resolution.outcome} by <strong>${o.resolution.actor}</strong>: ${o.resolution.reason}${o.resolution.evidence ? html` (evidence: ${o.resolution.evidence})` : ""}`
      : "-"
  }</dd>
<dt>Created</dt><dd>${when(o.createdAt)}</dd><dt>First sent</dt><dd data-testid="first-sent">${o.firstSentAt === null ? "-" : when(o.firstSentAt)}</dd><dt>Updated</dt><dd>${when(o.updatedAt)}</dd>
</dl>
${
  decidable.length
    ? html`<form method="post" action="/op/${encodeURIComponent(o.tenant)}/${o.id}/decide" id="decide">
<input type="hidden" name="csrf" value="${formToken}"><input type="hidden" name="seen" value="${JSON.stringify(seenOf(o))}">
${decideFields("one", decidable, { receipt: true })}</form>`
    : ""
}
<h2>History</h2>
<ol class="timeline" data-testid="history">${x.events.map(
    (e) =>
      html`<li><time>${when(e.at)}</time> · <span class="status status-${e.to}">${e.from ?? "new"} → ${e.to}</span> · attempt ${e.attempt} · <strong>${e.actor ?? "-"}</strong><br><small>${e.reason ?? ""}</small>${e.evidence === undefined ? "" : html`<br><small data-testid="event-evidence">evidence: ${e.evidence}</small>`}</li>`,
  )}</ol>`;
}

/**
 * A stored failure as a person checks it at the provider: its class and reason, then what names
 * it there as fields (the provider's request id, the evidence the action gave: the object it made,
 * its codes), not left for them to find in the reason's words.
 */
function errorOf(e: StoredError): Html {
  const fields: [string, string][] = [
    ...(e.providerRequestId ? [["provider request id", e.providerRequestId] as [string, string]] : []),
    // Redacted as idem show redacts it: an action names its evidence as it likes (a token among the codes).
    ...Object.entries(redactArgs(e.evidence ?? {}) as Record<string, string>),
  ];
  const dropped = e.evidenceDropped
    ? html`<br><small>${e.evidenceDropped} more ${e.evidenceDropped === 1 ? "entry" : "entries"} of evidence not kept (past the bounds)</small>`
    : "";
  return html`${e.kind}: ${e.reason}${
    fields.length
      ? html`<dl class="fields" data-testid="error-fields">${fields.map(([k, v]) => html`<dt>${k}</dt><dd><code>${v}</code></dd>`)}</dl>`
      : ""
  }${dropped}`;
}

export interface StatsRow {
  readonly tenant: string;
  readonly action: string;
  readonly status: Status;
  readonly count: number;
}

export function statsPage(
  rows: readonly StatsRow[],
  activity: readonly { at: number; status: Status; count: number }[],
  now: number,
  tenant?: string,
): Html {
  return html`<h1>Operations${tenant ? html` of ${tenant}` : ""}</h1>
<form class="filters" method="get" action="/stats" aria-label="Filter the stats">
<div><label for="s-tenant">Tenant</label><input id="s-tenant" name="tenant" value="${tenant ?? ""}"></div><button>Show</button></form>
<h2>Created per hour, last 24 hours</h2>
${chart(activity, now)}
<h2>Not settled yet, by tenant and action</h2>
<p>Running, unknown, pending and needs_review operations, counted now. Settled ones are in the chart above.</p>
<table data-testid="stats"><thead><tr><th>Tenant</th><th>Action</th><th>Status</th><th>Count</th></tr></thead><tbody>
${rows.map((r) => html`<tr><td>${r.tenant}</td><td>${r.action}</td><td class="status status-${r.status}">${r.status}</td><td>${r.count}</td></tr>`)}
</tbody></table>`;
}

/** A small SVG bar chart: one bar per hour, the part that needs a person (or failed) drawn apart. */
function chart(activity: readonly { at: number; status: Status; count: number }[], now: number): Html {
  const hour = 3_600_000;
  const first = Math.floor(now / hour) * hour - 23 * hour;
  const bars = Array.from({ length: 24 }, (_, i) => ({ at: first + i * hour, settled: 0, open: 0 }));
  for (const a of activity) {
    const bar = bars[Math.floor((a.at - first) / hour)];
    if (!bar) continue;
    if (a.status === "succeeded") bar.settled += a.count;
    else bar.open += a.count;
  }
  const max = Math.max(1, ...bars.map((b) => b.settled + b.open));
  const w = 20;
  const h = 120;
  const total = bars.reduce((n, b) => n + b.settled + b.open, 0);
  return html`<figure><svg role="img" aria-label="${total} operations created in the last 24 hours" width="${24 * w}" height="${h + 20}" viewBox="0 0 ${24 * w} ${h + 20}">
${bars.map((b, i) => {
  const hs = (b.settled / max) * h;
  const ho = (b.open / max) * h;
  return html`<g><title>${new Date(b.at).toISOString().slice(11, 16)}Z: ${b.settled} succeeded, ${b.open} other</title>
<rect x="${i * w + 2}" y="${h - hs}" width="${w - 4}" height="${hs}" fill="#15803d"></rect>
<rect x="${i * w + 2}" y="${h - hs - ho}" width="${w - 4}" height="${ho}" fill="#b45309"></rect></g>`;
})}
<text x="0" y="${h + 15}" font-size="11" fill="currentColor">24 h ago</text><text x="${24 * w}" y="${h + 15}" font-size="11" text-anchor="end" fill="currentColor">now</text>
</svg><figcaption>Green: succeeded. Amber: failed, waiting or needing a person.</figcaption></figure>`;
}

/** The operation as this page shows it, sent back with a decision (see `Verdict.seen`). */
function seenOf(o: Operation) {
  return { status: o.status, attempt: o.attempt, checks: o.checks, updatedAt: o.updatedAt };
}

/** A note at the top of a page; `link`: where to go from it (a page to reload, as it is now). */
export function flashNote(kind: "done" | "error", text: string, link?: { href: string; label: string }): Html {
  return html`<p class="note ${kind}" role="${kind === "error" ? "alert" : "status"}" data-testid="flash">${text}${
    link ? html` <a href="${link.href}">${link.label}</a>` : ""
  }</p>`;
}

function when(ms: number): string {
  return new Date(ms)
    .toISOString()
    .replace("T", " ")
    .replace(/\.\d+Z$/, "Z");
}

function age(ms: number): string {
  const m = Math.max(0, Math.round(ms / 60_000));
  return m < 60 ? `${m} min` : m < 2_880 ? `${Math.round(m / 60)} h` : `${Math.round(m / 1_440)} d`;
}
