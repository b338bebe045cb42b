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
 * No customer is there to authenticate a card (3D Secure) when a model charges it: a card that
 * asks for it fails the call (Stripe's 402 `authentication_required`, read as a decline), never
 * "requires_action" read as done. With a customer, the confirmation is off-session, which Stripe
 * fails so by itself; without one, `error_on_requires_action` asks it to, and Stripe takes that
 * only with a list of payment method types: cards (`allowed_payment_method_types`, API version
 * 2026-07-29.dahlia or later, stripe 23's default; older versions refuse the parameter with a 400
 * and nothing is charged). Either way the confirmation needs no `return_url`
 * (docs.stripe.com/changelog/2023-08-16/automatic-payment-methods).
 */
import { z } from "zod";
import type Stripe from "stripe";
import type { StripeActions } from "./stripe-actions.js";
import type { StripeReceipt } from "./stripe-receipt.js";

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
      "The customer's saved payment method (pm_…), to charge it now; without it, the payment waits for the customer to pay it",
    ),
});
export type StripeChargeInput = z.output<typeof chargeInput>;

/** What a model needs of a payment intent: its id and state, not Stripe's request ids. */
const summary = (r: StripeReceipt) => ({ id: r.id, status: r.status });

export function stripeTools(actions: StripeActions) {
  return {
    charge: {
      name: "charge_invoice",
      description:
        "Charge a customer for one invoice (a Stripe PaymentIntent). With paymentMethod, the card is charged now (a decline, or a card that needs the customer to authenticate, fails the call); without it, the payment is created and waits for the customer to pay it (its status says requires_payment_method). Asked again for the same invoice while the ledger keeps the operation (30 days by default), it is never charged twice.",
      action: actions.paymentIntentsCreate,
      input: chargeInput,
      // Without a payment method nothing is charged: the intent waits for one (its status tells
      // the model so). With one, it is confirmed now, failing rather than waiting for an
      // authentication nobody will give (see the module comment): off-session when it is a
      // customer's saved one, else a card with `error_on_requires_action`.
      args: (i: StripeChargeInput): Stripe.PaymentIntentCreateParams => ({
        amount: i.amount,
        currency: i.currency.toLowerCase(),
        metadata: { invoice_id: i.invoiceId },
        ...(i.customer && { customer: i.customer }),
        ...(i.paymentMethod && {
          payment_method: i.paymentMethod,
          confirm: true,
          ...(i.customer
            ? { off_session: true }
            : { allowed_payment_method_types: ["card"], error_on_requires_action: true }),
        }),
      }),
      key: (i: StripeChargeInput) => ["charge", i.invoiceId],
      summarize: summary,
    },
  } as const;
}
