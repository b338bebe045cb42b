/**
 * The parameters Stripe takes on the endpoints the sandbox implements: a request with any other
 * is refused as Stripe refuses it, 400 `invalid_request_error` `parameter_unknown` naming it
 * ("Received unknown parameter: <name>", a nested one by its path: `shipping[address][town]`),
 * before it executes (nothing saved under its key). The lists are stripe-node 23.1's
 * `…CreateParams`, `…UpdateParams`, `…ListParams` (with its pagination), `…SearchParams` and
 * `…RetrieveParams` for customers, payment intents, refunds, charges and tokens, plus
 * `payment_method_types`, which older API versions take on a payment intent. Inside a parameter,
 * the names of those whose shape is given here (NESTED: an address, a shipping, a `created` range,
 * `automatic_payment_methods` …) are checked too; `metadata` takes any name.
 *
 * Not modelled: the names inside other nested parameters (`payment_method_options[…]` is taken);
 * a value of the wrong type (a string where Stripe wants a hash); a parameter taken under some API
 * versions only (each is taken under every version); the endpoints the sandbox keeps as given (any
 * other POSTed resource, `/confirm` and the like), which take anything.
 */
import { StripeFailure } from "./stripe-objects.js";

const PAGE = ["limit", "starting_after", "ending_before", "expand"];
const SEARCH = ["query", "limit", "page", "expand"];
const RETRIEVE = ["expand"];

const CUSTOMER_WRITE = [
  ...["address", "balance", "business_name", "cash_balance", "description", "email", "expand", "individual_name"],
  ...["invoice_prefix", "invoice_settings", "metadata", "name", "next_invoice_sequence", "phone"],
  ...["preferred_locales", "shipping", "source", "tax", "tax_exempt", "validate"],
];
const PAYMENT_INTENT_UPDATE = [
  ...["allowed_payment_method_types", "amount", "amount_details", "application_fee_amount", "capture_method"],
  ...["currency", "customer", "customer_account", "description", "excluded_payment_method_types", "expand"],
  ...["hooks", "metadata", "payment_details", "payment_method", "payment_method_configuration"],
  ...["payment_method_data", "payment_method_options", "payment_method_types", "receipt_email"],
  ...["setup_future_usage", "shipping", "statement_descriptor", "statement_descriptor_suffix"],
  ...["transfer_data", "transfer_group"],
];

/** The names inside a nested parameter: each taken as a value, or with the names inside it. */
type Shape = { readonly [name: string]: Shape | true };

const names = (...list: string[]): Shape => Object.fromEntries(list.map((n) => [n, true]));
const ADDRESS = names("city", "country", "line1", "line2", "postal_code", "state");
/** A list's `created` range (`created[gte]=…`); a single timestamp is a value, not checked here. */
const RANGE = names("gt", "gte", "lt", "lte");

/**
 * By resource, then parameter: the shapes Stripe documents (stripe-node 23.1's params) for the
 * nested parameters checked; one not named here takes any names inside it.
 */
const NESTED: Readonly<Record<string, Readonly<Record<string, Shape>>>> = {
  customers: {
    address: ADDRESS,
    shipping: { address: ADDRESS, name: true, phone: true },
    invoice_settings: names("custom_fields", "default_payment_method", "footer", "rendering_options"),
    tax: names("ip_address", "validate_location"),
    created: RANGE,
  },
  payment_intents: {
    automatic_payment_methods: names("enabled", "allow_redirects"),
    shipping: { address: ADDRESS, carrier: true, name: true, phone: true, tracking_number: true },
    transfer_data: names("amount", "destination"),
    created: RANGE,
  },
  refunds: { created: RANGE },
  tokens: {
    card: names(
      ...["address_city", "address_country", "address_line1", "address_line2", "address_state", "address_zip"],
      ...["currency", "cvc", "exp_month", "exp_year", "name", "networks", "number"],
    ),
  },
  charges: { created: RANGE },
};

/** By resource: what its create, update (POST to an object), list, search and retrieve take. */
const PARAMS: Readonly<Record<string, Readonly<Partial<Record<Kind, ReadonlySet<string>>>>>> = {
  customers: kinds({
    create: [...CUSTOMER_WRITE, "payment_method", "tax_id_data", "test_clock"],
    update: [...CUSTOMER_WRITE, "default_source"],
    list: [...PAGE, "created", "email", "test_clock"],
  }),
  payment_intents: kinds({
    create: [
      ...PAYMENT_INTENT_UPDATE,
      ...["automatic_payment_methods", "confirm", "confirmation_method", "confirmation_token"],
      ...["error_on_requires_action", "mandate", "mandate_data", "off_session", "on_behalf_of"],
      ...["radar_options", "return_url", "use_stripe_sdk"],
    ],
    update: PAYMENT_INTENT_UPDATE,
    list: [...PAGE, "created", "customer", "customer_account"],
    retrieve: [...RETRIEVE, "client_secret"],
  }),
  refunds: kinds({
    create: [
      ...["amount", "charge", "currency", "customer", "expand", "instructions_email", "metadata", "origin"],
      ...["payment_intent", "reason", "refund_application_fee", "reverse_transfer"],
    ],
    update: ["expand", "metadata"],
    list: [...PAGE, "charge", "created", "payment_intent"],
  }),
  tokens: kinds({
    create: ["account", "bank_account", "card", "customer", "cvc_update", "expand", "person", "pii"],
  }),
  // Made by confirming a payment intent; a POST to /v1/charges is kept as given, as any other.
  charges: kinds({
    update: ["customer", "description", "expand", "fraud_details", "metadata", "receipt_email", "shipping"],
    list: [...PAGE, "created", "customer", "payment_intent", "transfer_group"],
  }),
};

type Kind = "create" | "update" | "list" | "search" | "retrieve";

/**
 * Throws Stripe's 400 `parameter_unknown` (a validation failure: nothing executes, nothing is
 * saved under the key) when `params` hold a top-level name the endpoint does not take; an endpoint
 * the sandbox does not know the parameters of takes any.
 */
export function refuseUnknownParams(resource: string, kind: Kind, params: Record<string, unknown>): void {
  const known = PARAMS[resource]?.[kind];
  if (!known) return;
  const top = Object.keys(params).filter((name) => !known.has(name));
  const nested = NESTED[resource] ?? {};
  const unknown =
    top.length > 0
      ? top
      : Object.entries(params).flatMap(([name, value]) => (nested[name] ? unknownIn(name, value, nested[name]) : []));
  if (unknown.length === 0) return;
  throw new StripeFailure(
    400,
    {
      type: "invalid_request_error",
      code: "parameter_unknown",
      param: unknown[0]!,
      message: `Received unknown parameter${unknown.length > 1 ? "s" : ""}: ${unknown.join(", ")}`,
    },
    true,
  );
}

/** The paths of the names inside `value` that `shape` does not take (`shipping[address][town]`). */
function unknownIn(path: string, value: unknown, shape: Shape): string[] {
  if (value === null || typeof value !== "object" || Array.isArray(value)) return [];
  return Object.entries(value).flatMap(([name, inner]) => {
    const sub = shape[name];
    const at = `${path}[${name}]`;
    return sub === undefined ? [at] : sub === true ? [] : unknownIn(at, inner, sub);
  });
}

/** Each kind given, and Search and retrieve as most resources take them. */
function kinds(given: Partial<Record<Kind, readonly string[]>>): Partial<Record<Kind, ReadonlySet<string>>> {
  const all = { search: SEARCH, retrieve: RETRIEVE, ...given };
  return Object.fromEntries(Object.entries(all).map(([kind, names]) => [kind, new Set(names)]));
}
