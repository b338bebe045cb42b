/**
 * Stripe's list pagination, as documented (docs.stripe.com/api/pagination): newest first, `limit`
 * from 1 to 100 (default 10), a cursor in `starting_after` (the page after that object) or
 * `ending_before` (the page before it), never both, and `has_more` when objects remain beyond
 * the page in the direction of travel. A cursor that names no object of the list is a 400.
 *
 * Search pages the same `limit`, with an opaque cursor (docs.stripe.com/api/pagination/search):
 * a page answers `next_page` when `has_more`, and the next request gives it as `page`.
 */
import { StripeFailure, type StripeObject } from "./stripe-objects.js";

/** The parameters a list takes besides its filters. */
export const PAGE_PARAMS = new Set(["limit", "starting_after", "ending_before", "expand"]);

/** `newestFirst` is the filtered list, newest first. */
export function page(
  newestFirst: readonly StripeObject[],
  params: Record<string, unknown>,
  what: string,
): { data: StripeObject[]; has_more: boolean } {
  const limit = limitOf(params);
  const after = params.starting_after;
  const before = params.ending_before;
  if (after !== undefined && before !== undefined) {
    throw invalid(
      "starting_after",
      "Received both starting_after and ending_before parameters. Please pass in only one.",
    );
  }
  const at = (id: unknown, param: string) => {
    const i = newestFirst.findIndex((o) => o.id === id);
    if (i < 0)
      throw new StripeFailure(
        400,
        { type: "invalid_request_error", code: "resource_missing", param, message: `No such ${what}: '${String(id)}'` },
        true,
      );
    return i;
  };
  if (before !== undefined) {
    // The page just before the cursor (newer objects), still listed newest first.
    const newer = newestFirst.slice(0, at(before, "ending_before"));
    return { data: newer.slice(-limit), has_more: newer.length > limit };
  }
  const older = after === undefined ? newestFirst : newestFirst.slice(at(after, "starting_after") + 1);
  return { data: older.slice(0, limit), has_more: older.length > limit };
}

/** The object a Search's `page` cursor continues after (undefined on the first page); a cursor this sandbox did not make is a 400. */
export function searchCursor(params: Record<string, unknown>): string | undefined {
  if (params.page === undefined) return undefined;
  const cursor = typeof params.page === "string" && /^sp_[\w-]+$/.test(params.page) ? params.page : undefined;
  if (!cursor) throw invalid("page", `Invalid page: ${JSON.stringify(params.page)}.`);
  return Buffer.from(cursor.slice(3), "base64url").toString();
}

/** A page of Search's `hits` (those after the cursor, in Search's order). */
export function searchPage(
  hits: readonly StripeObject[],
  params: Record<string, unknown>,
): { data: StripeObject[]; has_more: boolean; next_page: string | null } {
  const data = hits.slice(0, limitOf(params));
  const more = hits.length > data.length;
  return { data, has_more: more, next_page: more ? `sp_${Buffer.from(data.at(-1)!.id).toString("base64url")}` : null };
}

function limitOf(params: Record<string, unknown>): number {
  const limit = params.limit === undefined ? 10 : Number(params.limit);
  if (!Number.isInteger(limit) || limit < 1 || limit > 100) {
    throw invalid("limit", `Invalid integer: ${String(params.limit)}; must be between 1 and 100.`);
  }
  return limit;
}

function invalid(param: string, message: string): StripeFailure {
  return new StripeFailure(400, { type: "invalid_request_error", code: "parameter_invalid", param, message }, true);
}
