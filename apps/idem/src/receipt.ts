/**
 * The receipt a person gives with a verdict that the effect happened (`idem resolve --receipt`, the
 * console's "It happened" form), read from the JSON text they wrote. Only read here: the ledger
 * checks it when the verdict is recorded (`admin.resolve`: the action's receipt schema, from the
 * actions the ledger was opened with, and its `maxResultBytes`), and refuses it with
 * `InvalidValueError` before anything is written. One reading for the CLI and the console, so
 * that both take and refuse the same receipts.
 */
import { InvalidValueError } from "@idem/core";
import { readJson } from "./json-text.js";

/** The receipt in `text`; `InvalidValueError` (path `receipt`) when it is not JSON, saying where without quoting it. */
export function parseReceipt(text: string): unknown {
  const read = readJson(text);
  if (read.ok) return read.value;
  throw new InvalidValueError(
    "receipt",
    `is not valid JSON${read.where} (the text there is not repeated: a receipt may hold a secret); give the provider's object as JSON`,
  );
}
