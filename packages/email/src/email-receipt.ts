/** What the ledger keeps of a send: the identifiers and the server's answer, not the content. */
export interface EmailReceipt {
  readonly messageId: string;
  /** The short reference in the subject. */
  readonly ref: string;
  /** False when the pre-send check found the copy of an earlier attempt and nothing was sent now. */
  readonly sent: boolean;
  /** The server's final reply (with its queue id), when this attempt sent. */
  readonly response: string | null;
  readonly accepted: readonly string[];
  readonly rejected: readonly string[];
  /** The mailbox where the copy was found, when the receipt comes from a lookup. */
  readonly foundIn?: string;
}
