/**
 * The console's style and script, served as files: its Content-Security-Policy (app.ts) allows
 * scripts and styles from the console itself only, so an injected inline script or handler would
 * not run even if some text escaped the pages' escaping. Their names carry a hash of their content,
 * so a browser may keep them and still gets a new one after an upgrade.
 */
import { createHash } from "node:crypto";

const STYLE = `
:root { color-scheme: light dark; --muted: #667; --line: #ccd; --warn: #b45309; --bad: #b91c1c; --ok: #15803d; }
body { font: 15px/1.45 system-ui, sans-serif; margin: 0; }
header { display: flex; gap: 1.5rem; align-items: center; padding: .6rem 1.5rem; border-bottom: 1px solid var(--line); }
header nav a { margin-right: 1rem; }
header .who { margin-left: auto; color: var(--muted); }
main { max-width: 78rem; padding: 1rem 1.5rem 3rem; }
a:focus, button:focus, input:focus, select:focus, textarea:focus { outline: 3px solid #2563eb; outline-offset: 2px; }
table { border-collapse: collapse; width: 100%; }
th, td { text-align: left; padding: .35rem .6rem; border-bottom: 1px solid var(--line); vertical-align: top; }
th { font-weight: 600; }
code, pre { font: 13px/1.4 ui-monospace, monospace; }
pre { white-space: pre-wrap; word-break: break-all; margin: 0; }
dl { display: grid; grid-template-columns: 11rem 1fr; gap: .3rem 1rem; }
dt { color: var(--muted); }
dd { margin: 0; }
dl.fields { grid-template-columns: max-content 1fr; margin: .3rem 0 0; font-size: .9em; }
.status { font-weight: 600; }
.status-needs_review, .status-unknown { color: var(--warn); }
.status-failed { color: var(--bad); }
.status-succeeded { color: var(--ok); }
.note { padding: .6rem .9rem; border-left: 4px solid var(--warn); background: color-mix(in srgb, var(--warn) 10%, transparent); margin: 1rem 0; }
.error { border-color: var(--bad); }
.done { border-color: var(--ok); }
form.filters { display: flex; gap: .8rem; flex-wrap: wrap; align-items: end; margin-bottom: 1rem; }
label { display: block; font-size: 13px; color: var(--muted); }
fieldset { border: 1px solid var(--line); margin: 1rem 0; }
textarea { width: 100%; max-width: 40rem; }
.decide { display: grid; gap: .6rem; max-width: 42rem; }
ol.timeline { list-style: none; padding: 0; border-left: 2px solid var(--line); }
ol.timeline li { padding: .2rem 0 .6rem 1rem; }
.skip { position: absolute; left: -999px; } .skip:focus { left: 1rem; top: .5rem; background: Canvas; }
label.inline { display: inline; }
`;

/**
 * "Select all" on the queue, and its decisions offered only as every selected row takes them
 * (each row's data-outcomes, from decisionsFor; the console refuses the others whole anyway); on an
 * operation's page, live updates: a change disables the decision, an end of them is shown, and so
 * is a dropped stream (a decision is not sent until it is back).
 */
const SCRIPT = `
const all = document.getElementById("all");
const limits = document.getElementById("bulk-limits");
const names = { succeeded: "\u201csucceeded\u201d", failed: "\u201cfailed\u201d", retry: "a retry" };
const offer = () => {
  const picked = [...document.querySelectorAll('input[name="ops"]:checked')];
  const radios = [...document.querySelectorAll('form[action="/bulk"] input[name="outcome"]')];
  const refused = radios.filter((r) => picked.some((c) => !c.dataset.outcomes.split(" ").includes(r.value)));
  for (const r of radios) {
    r.disabled = refused.includes(r);
    if (r.disabled) r.checked = false;
  }
  for (const b of document.querySelectorAll('form[action="/bulk"] button')) b.disabled = refused.length === radios.length;
  if (!limits) return;
  limits.hidden = refused.length === 0;
  if (limits.hidden) return;
  const list = refused.map((r) => names[r.value]);
  const which = list.length > 1 ? list.slice(0, -1).join(", ") + " and " + list.at(-1) : list[0];
  const rows = picked.filter((c) => refused.some((r) => !c.dataset.outcomes.split(" ").includes(r.value))).length;
  const them = list.length > 1 ? "them" : "it";
  limits.textContent = which + (list.length > 1 ? " are" : " is") + " not offered for this selection: " + rows +
    (rows === 1 ? " selected operation does not take " + them + " (its Why says so). Deselect it" :
      " selected operations do not take " + them + " (their Why says so). Deselect them") + " to choose " + them + ".";
};
if (all) all.addEventListener("change", (e) => {
  for (const c of document.querySelectorAll('input[name="ops"]')) c.checked = e.target.checked;
  offer();
});
for (const c of document.querySelectorAll('input[name="ops"]')) c.addEventListener("change", offer);
if (all) offer(); // a selection the browser kept (back, reload)
const status = document.getElementById("status");
if (status) {
  const live = new EventSource(location.pathname + "/live");
  const unavailable = document.getElementById("live-unavailable");
  // The ledger cannot be read: the status shown may be old until a state comes again.
  live.addEventListener("unavailable", () => { unavailable.hidden = false; });
  live.onmessage = (m) => {
    unavailable.hidden = true;
    const now = JSON.parse(m.data);
    if (String(now.updatedAt) === status.dataset.updated) return;
    status.textContent = now.status; status.className = "status status-" + now.status;
    document.getElementById("changed").hidden = false;
    const form = document.getElementById("decide");
    if (form) for (const b of form.querySelectorAll("button")) b.disabled = true;
  };
  const lost = document.getElementById("live-lost");
  const notSent = document.getElementById("not-sent");
  live.onopen = () => { lost.hidden = true; notSent.hidden = true; };
  // Refused (too many live pages, a session that ended) or not a stream: the browser gives up
  // for good. Dropped (the console restarted, the network): it reconnects by itself, and the
  // state it then sends shows what changed meanwhile. Either way the status shown may be old: said.
  live.onerror = () => {
    const closed = live.readyState === EventSource.CLOSED;
    document.getElementById("live-stopped").hidden = !closed;
    lost.hidden = closed;
  };
  // A decision while the console cannot be reached is not sent: the browser's error page it would
  // lead to tells nobody whether anything was decided. The form stays as filled in for later.
  const decide = document.getElementById("decide");
  if (decide) decide.addEventListener("submit", (e) => {
    if (lost.hidden) return;
    e.preventDefault();
    notSent.hidden = false;
  });
}
`;

const named = (text: string, ext: string) =>
  `/assets/console-${createHash("sha256").update(text).digest("hex").slice(0, 12)}.${ext}`;

/** Where the pages link them, and what is served there. */
export const ASSETS = { css: named(STYLE, "css"), js: named(SCRIPT, "js") } as const;
export const ASSET_FILES: ReadonlyMap<string, { type: string; body: string }> = new Map([
  [ASSETS.css, { type: "text/css; charset=utf-8", body: STYLE }],
  [ASSETS.js, { type: "text/javascript; charset=utf-8", body: SCRIPT }],
]);
