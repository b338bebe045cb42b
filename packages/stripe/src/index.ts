export { stripeActions, STRIPE_KEY_RETENTION_MS } from "./stripe-actions.js";
export type { StripeActions, StripeParams } from "./stripe-actions.js";
export { classifyStripeError } from "./stripe-classify.js";
export { createStripeClient } from "./stripe-client.js";
export type { StripeConfig } from "./stripe-client.js";
export { METADATA_KEY, stripeReceiptSchema } from "./stripe-receipt.js";
export type { StripeReceipt } from "./stripe-receipt.js";
export { stripeTools } from "./stripe-tools.js";
export type { StripeChargeInput } from "./stripe-tools.js";
