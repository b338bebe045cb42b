export { FaultPlan } from "./faults.js";
export type { Fault, FaultMatch } from "./faults.js";
export { StripeSandbox } from "./stripe/stripe-server.js";
export type { StripeFaultKind, StripeRequestRecord, StripeSandboxOptions } from "./stripe/stripe-server.js";
export type { StripeObject } from "./stripe/stripe-objects.js";
