/** What the ledger keeps of a CRM write: ids only, never the record's properties. */
export interface HubSpotReceipt {
  readonly objectType: string;
  readonly id: string;
  /** True when this operation created the record; false when it found it (upsert, conflict, lookup). */
  readonly new: boolean;
  /** The operation key, stored in the unique-value property. */
  readonly externalId: string;
  /**
   * True when HubSpot showed the record already there on the operation's first request (its
   * first attempt, and the client sends each request once): an upsert answering `_new: false`, a
   * create refused for the key. Nothing of this operation had reached HubSpot yet, so the record
   * was made before it began (an operation with the same key pruned from the ledger since, an
   * import). Absent otherwise: on a create, and on a record found after a lost answer or on a
   * later attempt, most likely made by this operation's own earlier request (receipts stored by
   * earlier versions lack it too).
   */
  readonly existedBefore?: true;
}
