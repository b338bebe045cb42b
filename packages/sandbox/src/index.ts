export { FaultPlan } from "./faults.js";
export type { Fault, FaultMatch } from "./faults.js";
export { StripeSandbox } from "./stripe/stripe-server.js";
export type { StripeFaultKind, StripeRequestRecord, StripeSandboxOptions } from "./stripe/stripe-server.js";
export type { StripeObject } from "./stripe/stripe-objects.js";
export { Dovecot } from "./mail/dovecot.js";
export type { MailUser } from "./mail/dovecot.js";
export { JOURNAL, MailSandbox, SENDER } from "./mail/mail-server.js";
export type { CopyMode, MailFaultKind, MailSandboxOptions, ReceivedMessage } from "./mail/mail-server.js";
