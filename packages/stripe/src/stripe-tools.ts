/**
 * Ready tool definitions for agents (see @idem/agents): the input a model fills in, the business
 * identity suggested for the key, and what the model reads of a receipt. Shaped as @idem/agents'
 * `ToolDefinition`, without depending on it.
 *
 * The charge tool's identity is the invoice: one charge per invoice, whatever the model retries,
 * while the ledger keeps the operation (`retentionMs`): asked again after it was pruned and after
 * Stripe's 24 h key window, the invoice is charged again (no lookup before charging), and the
 * description says so rather than promise more.
 * A second charge for the same invoice with another amount is refused, not performed. It charges
 * only with a payment method; without one it creates the payment for the customer to pay, and
 * the model reads its status (requires_payment_method), not "charged".
 *
 * It confirms cards only (`allowed_payment_method_types: ["card"]`, API version 2026-07-29.dahlia
 * or later, stripe 23's default; older versions refuse the parameter with a 400 and nothing is
 * charged), with a customer's saved payment method too: a bank debit (us_bank_account,
 * sepa_debit) confirms as `processing`, nothing collected for days and a failure still possible
 * (docs.stripe.com/payments/payment-methods#payment-notification), which "charged now" is not.
 * A saved payment method of another type is refused by Stripe (400), nothing charged.
 *
 * No customer is there to authenticate a card (3D Secure) when a model charges it: a card that
 * asks for it fails the call (Stripe's 402 `authentication_required`, read as a decline), never
 * "requires_action" read as done. With a customer, the confirmation is off-session, which Stripe
 * fails so by itself; without one, `error_on_requires_action` asks it to (Stripe takes that only
 * with a list of payment method types). Either way the confirmation needs no `return_url`
 * (docs.stripe.com/changelog/2023-08-16/automatic-payment-methods).
 *
 * What the model reads of the payment intent is its id and status, and for any status but
 * `succeeded` a note that the invoice is not paid (yet): a receipt may hold any status, since an
 * intent created without a payment method is the customer's to pay, an intent found by a lookup
 * is read as it is now, and a person may record one.
 */
import { z } from "zod";
import type Stripe from "stripe";
import type { StripeActions } from "./stripe-actions.js";
import type { StripeReceipt } from "./stripe-receipt.js";
import { intentStatus } from "./stripe-reconcile.js";

const chargeInput = z.object({
  // Compared without surrounding spaces (a retry's " in_1" is "in_1"); case is kept: ids may differ by case.
  invoiceId: z
    .string()
    .trim()
    .regex(/^\S+$/, "must be the invoice's id, without spaces")
    .describe("The invoice this charge pays: one charge per invoice"),
  amount: z.number().int().positive().describe("Amount in the smallest currency unit (cents for EUR/USD)"),
  currency: z
    .string()
    .regex(/^[a-zA-Z]{3}$/)
    .describe("ISO currency code, e.g. eur"),
  customer: z.string().min(1).nullish().describe("Stripe customer id (cus_…), if known"),
  paymentMethod: z
    .string()
    .min(1)
    .nullish()
    .describe(
      "The card to charge now (a payment method id, pm_…: the customer's saved card when customer is given); without it, the payment waits for the customer to pay it",
    ),
});
export type StripeChargeInput = z.output<typeof chargeInput>;

/**
 * What a payment intent's status means for the invoice when it is not `succeeded` (paid): the
 * model reads "Done" for the call, and must not take it for a payment collected.
 */
const NOT_PAID: Readonly<Record<string, string>> = {
  requires_payment_method: "not charged: the payment waits for the customer to pay it",
  requires_confirmation: "not charged: the payment waits for its confirmation",
  requires_action: "not charged: the payment waits for the customer to authenticate it",
  processing:
    "not collected yet: the payment is processing and may still fail; the invoice is not paid until its status is succeeded",
  requires_capture: "authorized, not collected: the amount is held until the payment is captured",
  canceled: "not charged: the payment was canceled",
};

/** What a model needs of a payment intent: its id and state (with what it means unless paid), not Stripe's request ids. */
const summary = (r: StripeReceipt) =>
  r.status === "succeeded"
    ? { id: r.id, status: r.status }
    : {
        id: r.id,
        status: r.status,
        // By today's names: a client pinned before 2019-02-11 reads `requires_source` (intentStatus).
        note:
          NOT_PAID[intentStatus(r.status)] ??
          `not known to be paid: the payment's status is ${r.status ?? "not recorded"}`,
      };

export function stripeTools(actions: StripeActions) {
  return {
    charge: {
      name: "charge_invoice",
      description:
        "Charge a customer for one invoice (a Stripe PaymentIntent). With paymentMethod (a card), the card is charged now (a decline, a card that needs the customer to authenticate, or a payment method that is not a card fails the call); without it, the payment is created and waits for the customer to pay it. The result's status is succeeded when the invoice is paid; any other status comes with a note saying what is not done yet. Asked again for the same invoice while the ledger keeps the operation (30 days by default), it is never charged twice.",
      action: actions.paymentIntentsCreate,
      input: chargeInput,
      // Without a payment method nothing is charged: the intent waits for one (its status tells
      // the model so). With one, a card only, it is confirmed now, failing rather than waiting
      // for an authentication nobody will give (see the module comment): off-session when it is
      // a customer's saved one, else with `error_on_requires_action`.
      args: (i: StripeChargeInput): Stripe.PaymentIntentCreateParams => ({
        amount: i.amount,
        currency: i.currency.toLowerCase(),
        metadata: { invoice_id: i.invoiceId },
        ...(i.customer && { customer: i.customer }),
        ...(i.paymentMethod && {
          payment_method: i.paymentMethod,
          confirm: true,
          allowed_payment_method_types: ["card"],
          ...(i.customer ? { off_session: true } : { error_on_requires_action: true }),
        }),
      }),
      key: (i: StripeChargeInput) => ["charge", i.invoiceId],
      summarize: summary,
    },
  } as const;
}
