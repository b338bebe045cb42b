/**
 * A ready tool definition for agents (see @idem/agents), shaped as its `ToolDefinition`.
 *
 * The identity of an email is the recipient and the business reference it is about (an order,
 * an invoice, a ticket): one email per reference and recipient, whatever the model retries or
 * rewords. The subject and text are what the model writes, so they are never part of the key;
 * the recipient is hashed in the key.
 *
 * The description promises one email only while the ledger keeps the operation (`retentionMs`):
 * after it was pruned, only the check before sending stands in the way, and it finds nothing once
 * the copy has left Sent or the journal (a mailbox's retention archives or deletes it).
 *
 * A copy the check before sending finds on the operation's first attempt was sent before the
 * operation began (by one pruned from the ledger since): the model reads "already done earlier".
 * Found on a later attempt, it is most likely this operation's own earlier send: "done".
 * A send that some recipients did not take (deferred or refused at RCPT TO) is summarized as
 * "partially sent", with how many and how.
 */
import { z } from "zod";
import { sensitive } from "@idem/core";
import type { EmailActions, EmailArgs } from "./email-actions.js";
import type { EmailReceipt, Rejection } from "./email-receipt.js";

const sendInput = z.object({
  to: z.string().email().describe("The recipient's address"),
  // An id, compared without surrounding spaces: a retry's " ord-42" is "ord-42". Free text ("the
  // order from Monday") is refused. Case is kept: folding it would change the keys of emails
  // already sent, and a retry across an upgrade would send again.
  reference: z
    .string()
    .trim()
    .regex(/^\S+$/, "must be the id of what the email is about (an order, invoice or ticket), without spaces")
    .describe("What this email is about (an order, invoice or ticket id): one email per reference and recipient"),
  subject: z.string().min(1),
  text: z.string().min(1),
});
export type EmailSendInput = z.output<typeof sendInput>;

export function emailTools(actions: EmailActions) {
  return {
    send: {
      name: "send_email",
      description:
        "Send one email about a reference (order, invoice, ticket) to a recipient. Asked again for the same reference and recipient while the ledger keeps the operation (30 days by default), it is never emailed twice.",
      action: actions.send,
      input: sendInput,
      args: (i: EmailSendInput): EmailArgs => ({ to: i.to.trim().toLowerCase(), subject: i.subject, text: i.text }),
      key: (i: EmailSendInput) => ["email", i.reference, sensitive(i.to.trim().toLowerCase())],
      summarize: (r: EmailReceipt) => {
        // Sent, but not to everyone: the model must not read it as delivered to all.
        if (!r.rejected?.length) return { messageId: r.messageId };
        return { messageId: r.messageId, delivery: partialDelivery(r.rejected.length, r.rejections) };
      },
      foundEarlier: (r: EmailReceipt, settled: { readonly attempt: number }) =>
        r.sent === false && settled.attempt === 1,
    },
  } as const;
}

/** What a model reads of a send some recipients did not take. */
function partialDelivery(count: number, rejections: readonly Rejection[] | undefined): string {
  const whom = `${count} recipient${count === 1 ? "" : "s"} did not take it`;
  // A receipt stored by an earlier version does not say which were deferred.
  if (!rejections) return `partially sent: ${whom}`;
  const deferred = rejections.filter((r) => r.kind === "deferred").length;
  return `partially sent: ${whom} (${deferred} deferred with a 4xx, ${count - deferred} refused with a 5xx); it is not sent to them again`;
}
