/**
 * Which Stripe endpoint a request names, and its answer from the objects the sandbox keeps:
 * `POST /v1/<resource>` creates, `POST /v1/<resource>/<id>` updates, `GET /v1/<resource>` lists,
 * `GET /v1/<resource>/search` searches (only where Stripe has Search) and `GET /v1/<resource>/<id>`
 * retrieves. Parameters are checked before anything runs (stripe-params.ts). An object that is not
 * there, to a retrieve or an update, is Stripe's 404 `resource_missing` (`param: "id"`, "No such
 * customer: 'cus_…'"), a refusal before execution: nothing saved under the key.
 *
 * Search exists for charges, customers, invoices, payment intents, prices, products and
 * subscriptions (docs.stripe.com/search), not for refunds: there `search` is an id like any
 * other, and no refund has it.
 */
import { PAGE_PARAMS, page, searchCursor, searchPage } from "./stripe-list.js";
import { StripeFailure, type StripeObjects } from "./stripe-objects.js";
import { refuseUnknownParams } from "./stripe-params.js";

/** The resources Stripe's Search API serves. */
const SEARCHABLE: ReadonlySet<string> = new Set([
  "charges",
  "customers",
  "invoices",
  "payment_intents",
  "prices",
  "products",
  "subscriptions",
]);

/** Runs the request against `objects`: its answer's body, or a `StripeFailure` thrown. */
export function routeStripe(
  objects: StripeObjects,
  method: string,
  path: string,
  params: Record<string, unknown>,
): unknown {
  const parts = path.split("/").filter(Boolean); // ["v1", resource, id?]
  if (parts[0] !== "v1" || !parts[1]) throw unrecognized(method, path);
  const resource = parts[1];
  const id = parts[2];
  const kind =
    method === "POST"
      ? id
        ? "update"
        : "create"
      : !id
        ? "list"
        : id === "search" && SEARCHABLE.has(resource)
          ? "search"
          : "retrieve";
  // Tokens are made and retrieved, nothing else (docs.stripe.com/api/tokens).
  if (resource === "tokens" && (parts.length > 3 || (kind !== "create" && kind !== "retrieve")))
    throw unrecognized(method, path);
  if (parts.length <= 3) refuseUnknownParams(resource, kind, params);
  if (method === "POST" && !id) return objects.create(resource, params);
  if (method === "POST" && parts.length === 3) return objects.update(resource, id!, params) ?? missing(resource, id!);
  if (method === "GET" && kind === "search") {
    const hits = objects.search(resource, String(params.query ?? ""), searchCursor(params));
    return { object: "search_result", url: path, ...searchPage(hits, params) };
  }
  if (method === "GET" && id) return objects.get(resource, id) ?? missing(resource, id);
  if (method === "GET") {
    const filter = Object.fromEntries(Object.entries(params).filter(([k]) => !PAGE_PARAMS.has(k)));
    return { object: "list", url: path, ...page(objects.list(resource, filter), params, resource.replace(/s$/, "")) };
  }
  throw unrecognized(method, path);
}

/** Stripe's answer to an object that is not there. */
function missing(resource: string, id: string): never {
  throw new StripeFailure(
    404,
    {
      type: "invalid_request_error",
      code: "resource_missing",
      param: "id",
      message: `No such ${resource.replace(/s$/, "")}: '${id}'`,
    },
    true,
  );
}

function unrecognized(method: string, path: string): StripeFailure {
  return new StripeFailure(
    404,
    { type: "invalid_request_error", message: `Unrecognized request URL (${method}: ${path}).` },
    true,
  );
}
