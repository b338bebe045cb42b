/** What the ledger keeps of a CRM write: ids only, never the record's properties. */
export interface HubSpotReceipt {
  readonly objectType: string;
  readonly id: string;
  /** True when this operation created the record; false when it found it (upsert, conflict, lookup). */
  readonly new: boolean;
  /** The operation key, stored in the unique-value property. */
  readonly externalId: string;
}
