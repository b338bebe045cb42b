/** Human and JSON renderings of operations for the CLI. */
import { performedProof, type Evidence, type Operation, type OperationEvent } from "@idem/core";
import { performedByWords } from "./decisions.js";

const time = (ms: number | null) =>
  ms === null
    ? "-"
    : new Date(ms)
        .toISOString()
        .replace("T", " ")
        .replace(/\.\d+Z$/, "Z");

/**
 * The version of an operation as it is shown: its status, attempt, checks and last change
 * (`<status>.<attempt>.<checks>.<updatedAt>`), the view a person's decision names (`idem retry`
 * and `idem resolve --seen`, the core's `Verdict.seen`). Any change to the operation changes it,
 * also one that keeps its attempt (a late answer, a check), which an attempt number cannot tell.
 */
export function operationVersion(o: Pick<Operation, "status" | "attempt" | "checks" | "updatedAt">): string {
  return `${o.status}.${o.attempt}.${o.checks}.${o.updatedAt}`;
}

/** A page of operations; a full page ends with the command for the next one. With `tenants`, a TENANT column. */
export function printOperations(ops: Operation[], json: boolean, page: { tenants: boolean; limit: number }): void {
  if (json)
    return void console.log(JSON.stringify(ops.map((o) => ({ ...shownOperation(o), version: operationVersion(o) }))));
  if (!ops.length) return void console.log("no operations");
  const rows = ops.map((o) => [
    ...(page.tenants ? [o.tenant] : []),
    o.id,
    o.status,
    o.action,
    String(o.attempt),
    time(o.createdAt),
    operationVersion(o),
    keyCell(o),
  ]);
  table([...(page.tenants ? ["TENANT"] : []), "ID", "STATUS", "ACTION", "ATTEMPT", "CREATED", "VERSION", "KEY"], rows);
  if (ops.length === page.limit) console.log(`\nmore may follow: add --before ${ops[ops.length - 1]!.id}`);
}

/**
 * The identity, short enough for a table. A label cut to fit ends with the start of the key's hash,
 * so two keys that share a long prefix never look the same.
 */
function keyCell(o: Operation): string {
  if (o.keyLabel === null) return o.key.slice(0, 16);
  return o.keyLabel.length <= 40 ? o.keyLabel : `${o.keyLabel.slice(0, 28)}… #${o.key.slice(0, 8)}`;
}

/**
 * Args (and receipts) as an operator needs them to decide a case (recipient, subject, amount, the
 * provider's ids), without what they must not see: fields named like secrets are replaced,
 * attachments shown by name and size, long texts (bodies) cut.
 */
export function redactArgs(value: unknown, key = ""): unknown {
  if (
    /pass(word)?|secret|token|authorization|api[-_]?key|card|cvc|cvv|iban|ssn|cookie|credential|private[-_]?key|signature|account[-_]?(number|no)|routing[-_]?(number|no)/i.test(
      key,
    )
  )
    return "[redacted]";
  if (typeof value === "string")
    return value.length > 200 ? `${value.slice(0, 200)}… (${value.length} characters)` : value;
  if (Array.isArray(value)) return value.map((v) => redactArgs(v, key));
  if (value === null || typeof value !== "object") return value;
  const o = value as Record<string, unknown>;
  if (/^attachments?$/i.test(key) || (typeof o.filename === "string" && "content" in o)) {
    return {
      filename: o.filename,
      contentType: o.contentType,
      size: typeof o.content === "string" ? o.content.length : undefined,
    };
  }
  return Object.fromEntries(Object.entries(o).map(([k, v]) => [k, redactArgs(v, k)]));
}

/**
 * An operation as it is printed: its receipt redacted as args are (an action's receipt may hold a
 * provider's secret, a PaymentIntent's client_secret, an access token); callers still replay it
 * whole. So is its failure's evidence, which an action names as it likes (a `token` among them).
 */
export function shownOperation(o: Operation): Operation {
  const result = o.result === null ? null : redactArgs(o.result);
  const error =
    o.error?.evidence === undefined ? o.error : { ...o.error, evidence: redactArgs(o.error.evidence) as Evidence };
  return { ...o, result, error };
}

export function printOperation(
  x: { operation: Operation; events: OperationEvent[]; args?: unknown },
  json: boolean,
): void {
  const args = x.args === undefined || x.args === null ? null : redactArgs(x.args);
  const version = operationVersion(x.operation);
  const o = shownOperation(x.operation);
  if (json) return void console.log(JSON.stringify({ ...x, operation: o, args, version }));
  const lines: [string, string][] = [
    ["id", o.id],
    ["tenant", o.tenant],
    ["action", o.action],
    ["status", o.status],
    ["attempt", String(o.attempt)],
    // What a decision names (--seen): a decision on it is refused if the operation changed since.
    ["version", version],
    ["key", o.key],
    ["identity", o.keyLabel ?? "(hashed only)"],
    ["args", args === null ? "(not stored)" : JSON.stringify(args)],
    ["reason", o.reason ?? "-"],
    ["provider ref", o.providerReference ?? "-"],
    ["receipt", o.result === null ? "-" : JSON.stringify(o.result)],
    ["error", o.error === null ? "-" : JSON.stringify(o.error)],
    [
      "verdict",
      o.resolution === null
        ? "-"
        : `${o.resolution.outcome} by ${o.resolution.actor} at ${time(o.resolution.at)}: ${o.resolution.reason}${o.resolution.evidence === null ? "" : ` (evidence: ${o.resolution.evidence})`}`,
    ],
    ["created", time(o.createdAt)],
    ["first sent", time(o.firstSentAt)],
    ["updated", time(o.updatedAt)],
    ["lease", o.leaseOwner ? `${o.leaseOwner} until ${time(o.leaseExpiresAt)}` : "-"],
    ...lookFirstLine(o, args !== null),
    ...performedLine(o),
  ];
  for (const [k, v] of lines) console.log(`${k.padEnd(13)} ${plain(v)}`);
  console.log("\nevents:");
  table(
    ["AT", "FROM", "TO", "ATTEMPT", "ACTOR", "REASON"],
    x.events.map((e) => [
      time(e.at),
      e.from ?? "-",
      e.to,
      String(e.attempt),
      e.actor ?? "-",
      // A retry's evidence (a verdict's is on the verdict line), said as the verdict line says it.
      `${e.reason ?? ""}${e.evidence === undefined ? "" : ` (evidence: ${e.evidence})`}`,
    ]),
  );
}

/**
 * For an operation a person retried while its last run may have done it (`lookFirst`): what its
 * next run does before sending, and who can make it, said where a person reads it (a reopened row
 * would otherwise read as plain pending work, known not done).
 */
function lookFirstLine(o: Operation, argsStored: boolean): [string, string][] {
  return o.lookFirst ? [["looks first", lookFirstWords(argsStored)]] : [];
}

/** What `lookFirst` means for an operation's next run, as `idem show` and the console's page say it. */
export function lookFirstWords(argsStored: boolean): string {
  const who = argsStored
    ? "whoever runs it next (a call, the daemon)"
    : "the next call that brings its args (they are not stored: the daemon cannot look)";
  return `its last run may have done it: ${who} checks the provider before sending again (found, it is done; an action that cannot check runs on the retry's word)`;
}

/**
 * For an operation whose effect is known performed (`performedProof`), the one decision core takes
 * on it, said where the person reads the operation before deciding (as the console's page does).
 */
function performedLine(o: Operation): [string, string][] {
  const proof = performedProof(o);
  if (!proof) return [];
  return [
    [
      "decide",
      `only resolve --succeeded: its effect happened${performedByWords(proof)}, but its receipt could not be stored; resolve --failed and retry are refused`,
    ],
  ];
}

export function printStats(
  rows: { tenant: string; action: string; status: string; count: number }[],
  json: boolean,
): void {
  if (json) return void console.log(JSON.stringify(rows));
  table(
    ["TENANT", "ACTION", "STATUS", "COUNT"],
    rows.map((r) => [r.tenant, r.action, r.status, String(r.count)]),
  );
}

function table(head: string[], raw: string[][]): void {
  const rows = raw.map((r) => r.map(plain));
  const widths = head.map((h, i) => Math.max(h.length, ...rows.map((r) => (r[i] ?? "").length)));
  for (const r of [head, ...rows])
    console.log(r.map((c, i) => (i === r.length - 1 ? c : c.padEnd(widths[i]!))).join("  "));
}

/**
 * A cell as one line of visible text: reasons, evidence and references come from providers and
 * models, and a line break or a terminal escape in one could print a forged "status succeeded"
 * line, or hide what follows. Control characters are shown escaped (`--json` escapes them too).
 */
function plain(text: string): string {
  // biome-ignore lint/suspicious/noControlCharactersInRegex: these are what it escapes
  return text.replace(/[\u0000-\u001f\u007f-\u009f]/g, (ch) =>
    ch === "\n"
      ? "\\n"
      : ch === "\r"
        ? "\\r"
        : ch === "\t"
          ? "\\t"
          : `\\u${ch.charCodeAt(0).toString(16).padStart(4, "0")}`,
  );
}
