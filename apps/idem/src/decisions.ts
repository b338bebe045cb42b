/**
 * What a person may decide on an operation, as core's `ledger.admin` allows it: the console's
 * forms, its bulk decision and the daemon's alerts read it here, so that none offers (or words) a
 * decision core refuses. Core checks every decision again when it is made; this only keeps what a
 * person is offered truthful.
 */
import { performedProof, type Operation, type StoredError } from "@idem/core";

/** A person's decision: `admin.resolve`'s outcomes, or `admin.retry`. */
export type Outcome = "succeeded" | "failed" | "retry";

/** Which attempts' requests took effect, as people are told it (empty when the proof names none). */
export function performedByWords(proof: StoredError): string {
  return proof.performedBy?.length ? ` (attempt ${proof.performedBy.map((a) => `${a}'s`).join(" and ")} request)` : "";
}

/**
 * The decisions core takes on this operation as it is: only "succeeded" on one known performed;
 * any on one waiting for a person (`resolve` needs `needs_review`); a retry on an unknown or failed
 * one (`retry`'s from-states); none on one running, pending or succeeded.
 */
export function decisionsFor(o: Pick<Operation, "status" | "error">): readonly Outcome[] {
  if (performedProof(o)) return ["succeeded"];
  if (o.status === "needs_review") return ["succeeded", "failed", "retry"];
  return o.status === "unknown" || o.status === "failed" ? ["retry"] : [];
}
