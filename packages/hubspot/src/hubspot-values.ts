/**
 * Whether a record read back holds the values a write of these args would have left, as far as a
 * read can tell. Used on a record in the recycling bin with our key, made while our requests could
 * have run: one whose values differ was not made by this operation (an earlier operation with the
 * key, pruned from the ledger since, made it with other args), or was edited before it was deleted.
 *
 * A value taken for the same wrongly settles the operation to a record that is not its effect,
 * while one taken for another sends it to a person: so values are compared as HubSpot keeps them
 * for the property's type (its definition, read from HubSpot; see `sameValue`), and exactly where
 * the type is text or not known. Only the properties the args give are compared; one the read did
 * not return (HubSpot leaves out a property the object type does not have, or the token may not
 * read) tells nothing. Not covered: rich text (HubSpot may rewrite HTML), phone numbers HubSpot
 * reformats, a value a workflow changed after the write: those read as differing.
 */

/**
 * What decides how HubSpot keeps a property's values: its definition's `type` (`string`,
 * `number`, `date`, `datetime`, `bool`, `enumeration`, `phone_number`…) and `fieldType`
 * (`checkbox` for multiple checkboxes); `caseless` for a value HubSpot lowercases (a contact's email).
 */
export interface PropertyShape {
  readonly type: string;
  readonly fieldType?: string | undefined;
  readonly caseless?: boolean | undefined;
}

/**
 * The names of the properties `given` sets (the args) whose values `read` shows otherwise, sorted.
 * A property absent from `read` is not compared; one read as null is empty. `shapes` holds the
 * properties' definitions; one without is compared as text, exactly.
 */
export function differingProperties(
  given: Readonly<Record<string, string | null>>,
  read: Readonly<Record<string, string | null | undefined>>,
  shapes: Readonly<Record<string, PropertyShape | undefined>> = {},
): string[] {
  const differ: string[] = [];
  for (const [name, value] of Object.entries(given)) {
    const held = read[name];
    if (held === undefined) continue; // not returned: nothing to compare
    if (!sameValue(value, held, shapes[name])) differ.push(name);
  }
  return differ.sort();
}

/**
 * Whether HubSpot, sent `given` for a property of this `shape`, could read back `held`. `given`
 * may be null though the args are typed as text (a model's JSON): HubSpot stores no value for it,
 * never the text "null". HubSpot returns every value as text (its properties guide,
 * developers.hubspot.com/docs/api/crm/properties, "Property type and fieldType values"):
 * - `number`: in its own form ("1200.00" reads back "1200"): compared as numbers.
 * - `date`: sent as "2024-01-15" or epoch ms at midnight UTC, read back "2024-01-15";
 *   `datetime`: sent as ISO 8601 or epoch ms, read back ISO 8601 in UTC. "Values must be
 *   represented in UTC time", so one sent without a zone is UTC, never the host's zone.
 * - `bool`: "true" / "false", compared case aside.
 * - `enumeration`: option values; multiple checkboxes (`fieldType: checkbox`) joined by ";",
 *   read back in HubSpot's order: compared as sets.
 * - text and any other type, or none known: exactly (`caseless`: case aside), so "0123" is not
 *   "123", nor "Q1" "q1".
 * Surrounding whitespace is aside for every type; a value of only spaces is stored empty, and an
 * empty one reads as null. A number or boolean a JavaScript caller passed is sent as its text.
 */
export function sameValue(given: string | null, held: string | null, shape?: PropertyShape): boolean {
  const a = (given === null || given === undefined ? "" : String(given)).trim();
  const b = (held ?? "").trim();
  if (a === b) return true;
  if (a === "" || b === "") return false;
  switch (shape?.type) {
    case "number": {
      const x = number(a);
      return x !== undefined && x === number(b);
    }
    case "date":
    case "datetime": {
      const s = time(a);
      return s !== undefined && s === time(b);
    }
    case "bool":
      return a.toLowerCase() === b.toLowerCase();
    case "enumeration":
      return shape.fieldType === "checkbox" && options(a) === options(b);
    default:
      return shape?.caseless === true && a.toLowerCase() === b.toLowerCase();
  }
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
  if (!/^[+-]?(\d+\.?\d*|\.\d+)(e[+-]?\d+)?$/i.test(v)) return undefined;
  const n = Number(v);
  return Number.isFinite(n) ? n : undefined;
}

/** An ISO 8601 date, or date and time with an optional zone (`Z`, `+02:00`, `+0200`). */
const ISO = /^(\d{4}-\d{2}-\d{2})(?:[T ](\d{2}:\d{2}(?::\d{2}(?:\.\d{1,9})?)?)(z|[+-]\d{2}(?::?\d{2})?)?)?$/i;

/**
 * Epoch ms for a value that is one, or an ISO 8601 date or datetime; undefined otherwise. A date
 * or time without a zone is UTC, as HubSpot reads it: never the host's zone (`Date.parse` reads a
 * date-time without one in the host's).
 */
function time(v: string): number | undefined {
  if (/^\d+$/.test(v)) return Number(v);
  const m = ISO.exec(v);
  if (!m) return undefined;
  const [, day, clock = "00:00", zone = "Z"] = m;
  const offset = /^[+-]\d{2}$/.test(zone) ? `${zone}:00` : zone.replace(/^([+-]\d{2})(\d{2})$/, "$1:$2");
  const ms = Date.parse(`${day}T${clock.slice(0, 12)}${offset.toUpperCase()}`);
  return Number.isFinite(ms) ? ms : undefined;
}
