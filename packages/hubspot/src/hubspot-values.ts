/**
 * Whether a record read back holds the values a write of these args would have left, as far as a
 * read can tell. Used on a record in the recycling bin with our key, made while our requests could
 * have run: one whose values differ was not made by this operation (an earlier operation with the
 * key, pruned from the ledger since, made it with other args), or was edited before it was deleted.
 *
 * Conservative, since a difference sends the operation to a person: only the properties the args
 * give are compared; one the read did not return (HubSpot leaves out a property it does not have,
 * or the token may not read) tells nothing; a difference HubSpot's own normalisation explains is
 * none (see `sameValue`). Not covered: rich text (HubSpot may rewrite HTML), phone numbers HubSpot
 * reformats, a value a workflow changed after the write: those read as differing.
 */

/**
 * The names of the properties `given` sets (the args) whose values `read` shows otherwise, sorted.
 * A property absent from `read` is not compared; one read as null is empty.
 */
export function differingProperties(
  given: Readonly<Record<string, string | null>>,
  read: Readonly<Record<string, string | null | undefined>>,
): string[] {
  const differ: string[] = [];
  for (const [name, value] of Object.entries(given)) {
    const held = read[name];
    if (held === undefined) continue; // not returned: nothing to compare
    if (!sameValue(value, held)) differ.push(name);
  }
  return differ.sort();
}

/**
 * Whether HubSpot, sent `given`, could read back `held`. `given` may be null though the args are
 * typed as text (a model's JSON): HubSpot stores no value for it, never the text "null".
 */
export function sameValue(given: string | null, held: string | null): boolean {
  // Values as text: HubSpot trims them, and lowercases a contact's email (a change of case alone is
  // not worth a person's time whatever the property). A value of only spaces is stored empty, and
  // an empty one reads as null. A number or boolean a JavaScript caller passed is sent as its text.
  const a = text(given === null || given === undefined ? "" : String(given));
  const b = text(held ?? "");
  if (a === b) return true;
  if (a === "" || b === "") return false;
  // A multiple checkboxes property (options joined by ";") reads back in HubSpot's order.
  if (a.includes(";") || b.includes(";")) return options(a) === options(b);
  // Numbers are stored as strings in HubSpot's form: "1200.00" reads back "1200".
  const x = number(a);
  const y = number(b);
  if (x !== undefined && y !== undefined) return x === y;
  // A date or datetime may be sent as epoch ms and reads back as ISO 8601 ("2024-01-15", or with
  // its time), or sent with an offset and read back in UTC.
  const s = time(a);
  const t = time(b);
  return s !== undefined && s === t;
}

function text(v: string): string {
  return v.trim().replace(/\s+/g, " ").toLowerCase();
}

function options(v: string): string {
  return v
    .split(";")
    .map((o) => o.trim())
    .filter((o) => o !== "")
    .sort()
    .join(";");
}

function number(v: string): number | undefined {
  if (!/^[+-]?(\d+\.?\d*|\.\d+)(e[+-]?\d+)?$/.test(v)) return undefined;
  const n = Number(v);
  return Number.isFinite(n) ? n : undefined;
}

/** Epoch ms for a value that is one, or an ISO 8601 date or datetime; undefined otherwise. */
function time(v: string): number | undefined {
  const ms = /^\d+$/.test(v) ? Number(v) : /^\d{4}-\d{2}-\d{2}/.test(v) ? Date.parse(v.toUpperCase()) : Number.NaN;
  return Number.isFinite(ms) ? ms : undefined;
}
