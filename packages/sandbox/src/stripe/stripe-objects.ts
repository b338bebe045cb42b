/**
 * The Stripe resources the sandbox keeps, with the validation and outcomes Stripe documents for
 * test mode: customers, payment intents (confirmed with one of Stripe's test payment methods, see
 * stripe-cards.ts, each use of whose name makes a new payment method, kept to be retrieved; any
 * other payment method succeeds), the charges those make,
 * refunds of a `payment_intent` or a `charge` (at most what was captured), card tokens
 * (stripe-tokens.ts: made, retrieved, each used once by a payment method), and any other POSTed
 * resource kept as given. Lists filter on fields (`?payment_intent=`, `?charge=`, `?created=` as
 * one timestamp or a range), newest first.
 * Search understands `metadata['k']:'v'` and `field:'v'` clauses joined by AND. Its index lags
 * "new or updated data" (docs.stripe.com/search#data-freshness): it sees each object as it was
 * `searchLagMs` ago, not at all before then, and an update only once that long has passed (a
 * change made by writing to an object of `all()` directly is not an update: it is seen at once).
 * Stripe documents no order for Search's results; the sandbox gives them oldest first, the order
 * in which a new object is behind older matches, past a first page they fill.
 *
 * An update takes the fields given and merges metadata key by key; on a payment intent it clears
 * `last_payment_error` ("cleared if the PaymentIntent is later updated for any reason"), and a new
 * `payment_method` on one not yet paid needs a confirmation again (`requires_confirmation`); a
 * test card's name given there is a new payment method too.
 *
 * A payment method is given by id (`payment_method`) or inline (`payment_method_data`), never
 * both: Stripe refuses the two together (400 `invalid_request_error` on `payment_method_data`)
 * rather than choosing one. The wording of its message is ours; the refusal is Stripe's.
 *
 * A confirmation is checked as Stripe checks it on API versions since 2023-08-16
 * (docs.stripe.com/changelog/2023-08-16/automatic-payment-methods), whatever `Stripe-Version` the
 * request names: an intent without a list of payment method types (`allowed_payment_method_types`,
 * or the older `payment_method_types`) takes the Dashboard's, some of which redirect, so confirming
 * it needs a `return_url` unless it is `off_session` or `automatic_payment_methods[allow_redirects]`
 * is `never`; and `error_on_requires_action` needs such a list. Not modelled: confirming an intent
 * later (`/confirm`), manual capture, customers' saved payment methods.
 */
import { randomBytes } from "node:crypto";
import {
  AUTHENTICATION_REQUIRED,
  type CardError,
  inlinePaymentMethod,
  isTestCardName,
  paymentMethodFields,
  testCard,
} from "./stripe-cards.js";
import { tokenFields } from "./stripe-tokens.js";

export type StripeObject = {
  id: string;
  object: string;
  created: number;
  metadata: Record<string, string>;
  [k: string]: unknown;
};

/** A Stripe error body and status. */
export class StripeFailure {
  constructor(
    readonly status: number,
    readonly error: {
      type: string;
      code?: string | undefined;
      message: string;
      param?: string;
      decline_code?: string;
      payment_intent?: unknown;
      payment_method?: unknown;
    },
    /** Validation failures happen before execution: Stripe saves no idempotent result for them. */
    readonly beforeExecution = false,
  ) {}
}

const PREFIX: Record<string, string> = {
  customers: "cus",
  payment_intents: "pi",
  charges: "ch",
  refunds: "re",
  payment_methods: "pm",
  tokens: "tok",
};

export class StripeObjects {
  private readonly byResource = new Map<string, StripeObject[]>();
  /**
   * Each object's changes, oldest first: when it was made or changed (sandbox clock, ms), and its
   * state just before (none for its creation). Search reads the state as of its lag from these.
   */
  private readonly changes = new Map<string, { at: number; before: StripeObject | undefined }[]>();

  constructor(
    private readonly now: () => number,
    private readonly searchLagMs: () => number,
  ) {}

  count(resource: string): number {
    return this.byResource.get(resource)?.length ?? 0;
  }

  all(resource: string): readonly StripeObject[] {
    return this.byResource.get(resource) ?? [];
  }

  create(resource: string, params: Record<string, unknown>): StripeObject {
    const base = { metadata: metadataOf(params), created: Math.floor(this.now() / 1000) };
    switch (resource) {
      case "customers":
        return this.store(resource, {
          ...base,
          object: "customer",
          email: params.email ?? null,
          name: params.name ?? null,
          description: params.description ?? null,
        });
      case "payment_intents":
        return this.paymentIntent(base, params);
      case "refunds":
        return this.refund(base, params);
      case "tokens":
        return this.store(
          resource,
          tokenFields(params, base.created, `card_${randomBytes(12).toString("hex")}`, invalid, cardError),
        );
      default:
        return this.store(resource, { ...params, ...base, object: resource.replace(/s$/, "") });
    }
  }

  get(resource: string, id: string): StripeObject | undefined {
    return this.all(resource).find((o) => o.id === id);
  }

  /** Stripe's update (POST to the object): see the module comment. */
  update(resource: string, id: string, params: Record<string, unknown>): StripeObject | undefined {
    const obj = this.get(resource, id);
    if (!obj) return undefined;
    const { metadata: _, ...fields } = params;
    // A test card's name given to an intent is a new payment method, as at its creation.
    if (resource === "payment_intents" && typeof fields.payment_method === "string")
      fields.payment_method = this.paymentMethodFor(fields.payment_method, testCardNamed(fields.payment_method))?.id;
    this.changing(obj);
    const waiting = ["requires_payment_method", "requires_confirmation", "requires_action"].includes(
      String(obj.status),
    );
    Object.assign(obj, fields, { metadata: { ...(obj.metadata as Record<string, string>), ...metadataOf(params) } });
    if (resource === "payment_intents") {
      obj.last_payment_error = null;
      if (typeof params.payment_method === "string" && waiting)
        Object.assign(obj, { status: "requires_confirmation", next_action: null });
    }
    return obj;
  }

  /** Objects whose fields equal every filter, newest first (paginate with `page`). */
  list(resource: string, filter: Record<string, unknown>): StripeObject[] {
    return this.all(resource)
      .filter((o) => Object.entries(filter).every(([k, v]) => matches(o[k], v)))
      .reverse();
  }

  /**
   * Search as Stripe's index sees it, each object as it was `searchLagMs` ago (absent when it did
   * not exist yet), oldest first; `after`: only those made after the object with that id (a page's cursor).
   */
  search(resource: string, query: string, after?: string): StripeObject[] {
    const clauses = parseQuery(query);
    const asOf = this.now() - this.searchLagMs();
    const all = this.all(resource);
    const at = after === undefined ? -1 : all.findIndex((o) => o.id === after);
    if (after !== undefined && at < 0)
      throw invalid("page", "parameter_invalid", "Invalid page: it is not a cursor of this search.");
    return all
      .slice(at + 1)
      .map((o) => this.indexed(o, asOf))
      .filter(
        (o): o is StripeObject =>
          o !== undefined && clauses.every((c) => (c.metadata ? o.metadata[c.field] : String(o[c.field])) === c.value),
      );
  }

  /** The state of `live` at `asOf` (ms): the live object once its last change is that old, else the state before the first change after. */
  private indexed(live: StripeObject, asOf: number): StripeObject | undefined {
    const changes = this.changes.get(live.id) ?? [];
    for (let i = changes.length - 1; i >= 0; i--) {
      if (changes[i]!.at <= asOf) return i === changes.length - 1 ? live : changes[i + 1]!.before;
    }
    return undefined;
  }

  /** Records the state of `obj` before a change, for Search's lagging view. */
  private changing(obj: StripeObject): void {
    this.changes.get(obj.id)?.push({ at: this.now(), before: structuredClone(obj) });
  }

  private paymentIntent(
    base: { metadata: Record<string, string>; created: number },
    p: Record<string, unknown>,
  ): StripeObject {
    const amount = Number(p.amount);
    if (!Number.isInteger(amount)) throw invalid("amount", "parameter_missing", "Missing required param: amount.");
    if (amount < 50) throw invalid("amount", "amount_too_small", "Amount must be at least 50 cents.");
    if (typeof p.currency !== "string" || !/^[a-z]{3}$/.test(p.currency))
      throw invalid("currency", "parameter_missing", "Missing required param: currency.");
    const confirm = flag(p.confirm);
    const named = typeof p.payment_method === "string" ? p.payment_method : null;
    const data = typeof p.payment_method_data === "object" ? p.payment_method_data : null;
    // One payment method per intent: Stripe refuses both (a 400, nothing made), never picks one.
    if (named && data)
      throw invalid(
        "payment_method_data",
        undefined,
        "You cannot provide both payment_method and payment_method_data: give one payment method, by id or inline.",
      );
    const inline = data
      ? inlinePaymentMethod(data as Record<string, unknown>, base.created, invalid, (id) => this.get("tokens", id))
      : undefined;
    const test = named ? testCardNamed(named) : inline?.test;
    if (confirm) checkConfirmation(p);
    const card = test?.outcome;
    const failFast = flag(p.error_on_requires_action) || offSession(p);
    // What the confirmation met: a decline, the customer's authentication (or its refusal), or a charge.
    const failure: CardError | undefined =
      !confirm || !card ? undefined : "decline" in card ? card.decline : failFast ? AUTHENTICATION_REQUIRED : undefined;
    // Made once the request is valid: the payment method of a test card's name is Stripe's own.
    const method = named
      ? this.paymentMethodFor(named, test)
      : inline
        ? this.store("payment_methods", inline.fields as Omit<StripeObject, "id">)
        : undefined;
    if (inline?.token) inline.token.used = true; // its one use: the payment method is made
    const pm = method?.id ?? null;
    const status = !pm
      ? "requires_payment_method"
      : !confirm
        ? "requires_confirmation"
        : failure
          ? "requires_payment_method"
          : card
            ? "requires_action"
            : "succeeded";
    const pi = this.store("payment_intents", {
      ...base,
      object: "payment_intent",
      amount,
      currency: p.currency,
      customer: p.customer ?? null,
      payment_method: failure ? null : pm,
      status,
      amount_received: status === "succeeded" ? amount : 0,
      amount_refunded: 0,
      description: p.description ?? null,
      latest_charge: null,
      // what the customer's client (Stripe.js) would do next: authenticate the card
      next_action: status === "requires_action" ? { type: "use_stripe_sdk", use_stripe_sdk: {} } : null,
      // as Stripe records a failed confirmation on the intent, with the card it was tried on
      // (the intent's own `payment_method` is cleared: it waits for another)
      last_payment_error: failure ? { ...failure, payment_method: structuredClone(method) } : null,
    });
    if (status === "succeeded") {
      const charge = this.store("charges", {
        metadata: {},
        created: base.created,
        object: "charge",
        amount,
        currency: p.currency,
        payment_intent: pi.id,
        status: "succeeded",
        amount_refunded: 0,
      });
      pi.latest_charge = charge.id;
    }
    if (failure) {
      // Stripe creates the intent and reports the failure with it; the result is saved under the key.
      throw new StripeFailure(402, { ...failure, payment_intent: pi, payment_method: structuredClone(method) });
    }
    return pi;
  }

  /** A refund names the payment intent or its charge; it is recorded with both, as Stripe does. */
  private refund(
    base: { metadata: Record<string, string>; created: number },
    p: Record<string, unknown>,
  ): StripeObject {
    if (p.charge === undefined && p.payment_intent === undefined)
      throw invalid("charge", "parameter_missing", "One of `charge` or `payment_intent` is required.");
    const charge = p.charge === undefined ? undefined : this.get("charges", String(p.charge));
    if (p.charge !== undefined && !charge)
      throw invalid("charge", "resource_missing", `No such charge: '${String(p.charge)}'`);
    const pi = this.get("payment_intents", String(charge ? charge.payment_intent : p.payment_intent));
    if (!pi)
      throw invalid("payment_intent", "resource_missing", `No such payment_intent: '${String(p.payment_intent)}'`);
    if (charge && p.payment_intent !== undefined && p.payment_intent !== pi.id) {
      throw invalid(
        "payment_intent",
        "parameter_invalid",
        `Charge ${charge.id} does not belong to payment_intent '${String(p.payment_intent)}'.`,
      );
    }
    if (pi.status !== "succeeded")
      throw invalid(
        "payment_intent",
        "charge_not_refundable",
        "This PaymentIntent has no successful charge to refund.",
      );
    const left = Number(pi.amount_received) - Number(pi.amount_refunded);
    const amount = p.amount === undefined ? left : Number(p.amount);
    if (!Number.isInteger(amount) || amount <= 0 || amount > left) {
      throw invalid(
        "amount",
        "amount_too_large",
        `Refund amount (${amount}) is greater than unrefunded amount on charge (${left}).`,
      );
    }
    const paid = this.get("charges", String(pi.latest_charge))!;
    this.changing(pi);
    this.changing(paid);
    pi.amount_refunded = Number(pi.amount_refunded) + amount;
    paid.amount_refunded = pi.amount_refunded;
    return this.store("refunds", {
      ...base,
      object: "refund",
      amount,
      currency: pi.currency,
      payment_intent: pi.id,
      charge: paid.id,
      status: "succeeded",
      reason: p.reason ?? null,
    });
  }

  /**
   * The payment method a request names: for a test card's name, a new one Stripe makes for this
   * use (stripe-cards.ts), kept to be retrieved; any other id as given (a payment method the
   * sandbox does not keep: its type only, as the error of a confirmation tried on it names it).
   */
  private paymentMethodFor(name: string, test: ReturnType<typeof testCard>): { id: string; [k: string]: unknown } {
    if (test) return this.store("payment_methods", paymentMethodFields(test, Math.floor(this.now() / 1000)));
    return { id: name, object: "payment_method", type: "card" };
  }

  private store(resource: string, fields: Omit<StripeObject, "id">): StripeObject {
    const obj = {
      id: `${PREFIX[resource] ?? resource.slice(0, 4)}_${randomBytes(12).toString("hex")}`,
      livemode: false,
      ...fields,
    } as unknown as StripeObject;
    const list = this.byResource.get(resource) ?? [];
    list.push(obj);
    this.byResource.set(resource, list);
    this.changes.set(obj.id, [{ at: this.now(), before: undefined }]);
    return obj;
  }
}

/**
 * The test card `name` names, if it is given as one (undefined: any other id, kept as given);
 * a test card's name Stripe does not have is refused as an unknown payment method.
 */
function testCardNamed(name: string): ReturnType<typeof testCard> {
  if (!isTestCardName(name)) return undefined;
  const card = testCard(name);
  if (!card) throw invalid("payment_method", "resource_missing", `No such PaymentMethod: '${name}'`);
  return card;
}

function invalid(param: string, code: string | undefined, message: string): StripeFailure {
  return new StripeFailure(400, { type: "invalid_request_error", code, param, message }, true);
}

/** A card error (402): Stripe ran the request and the card refused it. */
function cardError(param: string, code: string, message: string): StripeFailure {
  return new StripeFailure(402, { type: "card_error", code, param, message });
}

/** A form-encoded boolean, as Stripe reads one. */
function flag(v: unknown): boolean {
  return v === true || v === "true";
}

/** `off_session`: `true`, or its kind (`one_off`, `recurring`): the customer is not there to act. */
function offSession(p: Record<string, unknown>): boolean {
  return flag(p.off_session) || p.off_session === "one_off" || p.off_session === "recurring";
}

/**
 * What Stripe refuses in a confirmation (API versions since 2023-08-16): see the module comment.
 * The return_url message is Stripe's; Stripe documents the error_on_requires_action refusal but
 * not its wording.
 */
function checkConfirmation(p: Record<string, unknown>): void {
  const listed = [p.allowed_payment_method_types, p.payment_method_types].some((t) => Array.isArray(t) && t.length > 0);
  if (listed) return;
  if (flag(p.error_on_requires_action))
    throw invalid(
      "error_on_requires_action",
      "parameter_invalid",
      "error_on_requires_action cannot be used with automatic payment methods: give the payment method types the PaymentIntent accepts (allowed_payment_method_types).",
    );
  const apm = (p.automatic_payment_methods ?? {}) as Record<string, unknown>;
  if (apm.allow_redirects === "never" || offSession(p) || (typeof p.return_url === "string" && p.return_url !== ""))
    return;
  throw invalid(
    "return_url",
    undefined,
    "A `return_url` must be specified because this Payment Intent is configured to automatically accept the payment methods enabled in the Dashboard, some of which may require a full page redirect to succeed. If you do not want to accept redirect-based payment methods, set `automatic_payment_methods[enabled]` to `true` and `automatic_payment_methods[allow_redirects]` to `never` when creating Setup Intents and Payment Intents.",
  );
}

function metadataOf(p: Record<string, unknown>): Record<string, string> {
  const m = p.metadata;
  if (m === undefined || m === "") return {};
  if (typeof m !== "object" || m === null)
    throw invalid("metadata", "parameter_invalid_empty", "Invalid metadata: must be a hash.");
  return Object.fromEntries(Object.entries(m).map(([k, v]) => [k, String(v)]));
}

/** `metadata['k']:'v' AND status:'succeeded'`: the subset of Stripe's search language we serve. */
function parseQuery(query: string): { metadata: boolean; field: string; value: string }[] {
  return query.split(/\s+AND\s+/i).map((clause) => {
    const m = /^\s*(?:metadata\[['"]([^'"]+)['"]\]|(\w+)):['"]([^'"]*)['"]\s*$/.exec(clause);
    if (!m)
      throw new StripeFailure(
        400,
        {
          type: "invalid_request_error",
          code: "parameter_invalid",
          param: "query",
          message: `Unsupported search query: ${clause}`,
        },
        true,
      );
    return { metadata: m[1] !== undefined, field: (m[1] ?? m[2])!, value: m[3]! };
  });
}

/**
 * A list filter: a value, or a range as Stripe's `created[gte]=…` (gt, gte, lt, lte). A value
 * comes form-encoded, a string: `created=1767225600` is the number's exact value.
 */
function matches(value: unknown, want: unknown): boolean {
  if (want === null || typeof want !== "object")
    return value === want || (typeof value === "number" && typeof want === "string" && String(value) === want);
  const n = Number(value);
  const r = want as Record<string, unknown>;
  return (
    (r.gt === undefined || n > Number(r.gt)) &&
    (r.gte === undefined || n >= Number(r.gte)) &&
    (r.lt === undefined || n < Number(r.lt)) &&
    (r.lte === undefined || n <= Number(r.lte))
  );
}
