export { emailActions } from "./email-actions.js";
export type { EmailActions, EmailArgs } from "./email-actions.js";
export { classifyEmailError } from "./email-classify.js";
export type { CopyConfig, EmailConfig, ImapConfig, SmtpConfig } from "./email-config.js";
export { Mailbox, MailboxUnavailableError } from "./email-mailbox.js";
export { messageIdFor, referenceFor } from "./email-message.js";
export { EnvelopeRefusedError, SendAbortedError } from "./email-smtp.js";
export type { EmailReceipt } from "./email-receipt.js";
