/**
 * JSON a person wrote (a config file, a receipt given with a verdict), read without repeating its
 * text when it is not JSON: Node's parser quotes the characters around the fault, and a ledger
 * URL's password, a token or a receipt's client secret may be there. Where the parser gives a
 * position, its line and column are said instead.
 */

/** The JSON value of `text`, or where its fault is (" at line L, column C", or "" when the parser gives no position). */
export function readJson(text: string): { ok: true; value: unknown } | { ok: false; where: string } {
  try {
    return { ok: true, value: JSON.parse(text) };
  } catch (cause) {
    const at = /at position (\d+)/.exec((cause as Error).message)?.[1];
    if (at === undefined) return { ok: false, where: "" };
    const before = text.slice(0, Number(at)).split("\n");
    return { ok: false, where: ` at line ${before.length}, column ${(before.at(-1)?.length ?? 0) + 1}` };
  }
}
