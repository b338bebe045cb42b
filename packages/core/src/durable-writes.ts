/**
 * Writes that outlast a brief outage of the ledger. What only this process knows (a receipt, "not
 * sent", a refusal, the args fixed before a send) is retried with backoff for up to a lease
 * (`durably`), and a retry recognises its own write whose answer was lost (`moveDurably`). Built
 * on them, the writes that end an attempt without deciding a call's next step: the receipt
 * (`recordReceipt`), a row given back when its claim or a write before its send was answered by
 * no one (`giveBack`), and an effect whose receipt cannot be stored, parked for a person
 * (`unstorable`). The Runner holds one (`runner.writes`); the daemon makes its own moves through it.
 */
import { performance } from "node:perf_hooks";
import pRetry from "p-retry";
import type { Call } from "./call.js";
import { alertedBefore, dedupedOntoFirst, firstSentOf, namesEach } from "./effects.js";
import { CompletionNotRecordedError, LedgerUnavailableError } from "./errors.js";
import { failedOverruled } from "./fence.js";
import { CALLER_TOLD_FAILED, FAILURE_OVERRULED, VERDICT_OVERRULED } from "./reasons.js";
import type { StoredError } from "./result.js";
import { rowPerformedProof } from "./row-results.js";
import type { Status } from "./schema.js";
import { storable, type Row, type Store, type TransitionPatch } from "./store.js";
import type { Tracing } from "./tracing.js";

/** A database failure that a retry through this ledger may pass (see `LedgerUnavailableError`). */
function passes(error: unknown): error is LedgerUnavailableError {
  return error instanceof LedgerUnavailableError && (!error.reopen || error.reopensItself) && !error.closed;
}

export class DurableWrites {
  /** `store` is read by fence.ts too, which writes through this class. */
  constructor(
    readonly store: Store,
    private readonly tracing: Tracing,
  ) {}

  /**
   * `write`, retried with backoff while the database fails (LedgerUnavailableError), for up to a
   * lease from now: what only this process knows (a receipt, "not sent", a refusal, the args
   * fixed before a send) must outlast a brief outage, and so must the read such a write is
   * decided on (a late end's, in `fenced` and `lateEndDuring`). Any other error (and one that
   * needs the ledger reopened), and the last failure, are thrown. Every write retried is
   * conditioned as it was (status, attempt), so a retry after another attempt took over matches
   * nothing. The first try runs outside p-retry: setting it up
   * (options, an abort signal) cost about 5 % of a call's CPU, for a write that nearly always
   * succeeds at once. `unanswered` is set once a try failed: it may have committed all the same.
   */
  durably<T>(
    call: Pick<Call<unknown, unknown>, "settings">,
    write: () => Promise<T>,
    unanswered?: { failed: boolean },
  ): Promise<T> {
    const started = performance.now();
    return write().catch((error: unknown) => {
      // A ledger whose SQLite file was replaced never writes again (`reopen`), nor one closed
      // meanwhile (`closed`): no retry passes. A connection a failed group commit closed is
      // opened again for the next statement (`reopensItself`), and nothing of that commit was
      // committed: an outage like any other.
      if (!passes(error)) throw error;
      if (unanswered) unanswered.failed = true;
      // p-retry's first attempt is the one that just failed: it waits before the second.
      let retrying = false;
      const again = () => {
        if (retrying) return write();
        retrying = true;
        throw error;
      };
      return pRetry(again, {
        retries: 8,
        minTimeout: 50,
        maxTimeout: 2_000,
        randomize: true, // workers that failed together do not retry together
        maxRetryTime: Math.max(0, call.settings.leaseMs - (performance.now() - started)),
        shouldRetry: ({ error }) => passes(error),
      });
    });
  }

  /**
   * `store.move`, retried through a brief outage (`durably`). A try whose answer was lost may have
   * committed, and then the retry matches nothing: the row is already where the move put it. The
   * row found in exactly that state (`to` at the attempt it was written on, with this reason and
   * actor) is the move's own answer, as if it had arrived: no other writer leaves that state. A
   * status at an attempt is written only by the call holding that attempt or by one that read the
   * row at it (each write conditioned on the row as read), each with a reason of its own (naming
   * its attempt, a person's verdict, a lookup's finding), and a takeover changes the attempt.
   * Without it a caller read its own end as another's ("moved meanwhile", "failed earlier, not
   * tried again") and stopped retrying. A move that keeps the status (a proof added, a second
   * effect alerted) is conditioned on the row as read (`unchangedSince`), so that a retry after
   * its commit matches nothing instead of writing it twice. Public for the daemon's own moves
   * (an operation no registered action can settle), which have a tenant and settings, no Call.
   */
  async moveDurably(
    call: Pick<Call<unknown, unknown>, "tenant" | "settings">,
    row: Row,
    to: Status,
    patch: TransitionPatch,
  ) {
    const unanswered = { failed: false };
    const moved = await this.durably(call, () => this.store.move(row, to, patch), unanswered);
    if (moved || !unanswered.failed) return moved;
    const now = await this.store.findById(call.tenant, row.id);
    const own =
      now !== undefined &&
      now.status === to &&
      now.attempt === row.attempt &&
      now.reason === storable(patch.reason) &&
      now.actor === patch.actor;
    return own ? { id: now.id, attempt: now.attempt, status: to } : undefined;
  }

  /**
   * Writes `succeeded` with the receipt, retrying a failing database for up to a lease. A receipt
   * settles the row on its own evidence: a person's verdict goes (a reopened row's "failed" must
   * not be read with the receipt), unless `keepVerdict` (their "it happened" given without one).
   * `alert`: a person must hear of it (`reason` says why). Without it an alert still due on the
   * row (not yet delivered) is cleared, on purpose: the daemon words an alert from the row's
   * reason as it is when it delivers it, and a receipt's reason needs no one, so kept due it would
   * be told as a false alert (on a success, "took effect twice"). The alerts a receipt answers are
   * those it clears: a person asked to decide whether it happened (needs_review), a lookup refused
   * while the outcome was unknown (check_refused, also on the row a caller took over to look
   * again). An alert whose subject a receipt does not answer is carried by the caller into the
   * reason and `alert`: a second effect told to no one yet (fence.ts, `twoSaid`), a "failed"
   * overruled. `unchangedSince`: only on the row as read, for a move that keeps the status (see
   * `moveDurably`).
   */
  async recordReceipt<A, R>(
    call: Call<A, R>,
    row: Row,
    json: string,
    receipt: R,
    reason: string,
    {
      keepVerdict = false,
      alert = false,
      unchangedSince,
      noExecutionSince,
    }: {
      keepVerdict?: boolean;
      alert?: boolean;
      unchangedSince?: TransitionPatch["unchangedSince"];
      /** Only if no execution ended since (`last_execution_at` as given; see runner.ts `complete`). */
      noExecutionSince?: number | null;
    } = {},
  ) {
    try {
      return await this.tracing.span(
        "idem.complete",
        { "idem.operation.id": row.id, "idem.attempt": row.attempt },
        () =>
          this.moveDurably(call, row, "succeeded", {
            actor: call.actor,
            reason,
            result_json: json,
            error_json: null,
            ...(!keepVerdict && { resolution_json: null }),
            // A person's "it happened" kept: it completed the row when they said it (the verdict's
            // time, `Resolution.at`), and its retention counts from then.
            completed: !keepVerdict,
            retentionMs: call.settings.retentionMs,
            alert,
            ...(unchangedSince && { unchangedSince }),
            ...(noExecutionSince !== undefined && { noExecutionSince }),
          }),
      );
    } catch (cause) {
      throw new CompletionNotRecordedError(row.id, row.attempt, receipt, { cause });
    }
  }

  /**
   * Our claim or takeover failed without an answer, so it may have committed: a row running under
   * this call's lease, marked as maybe sent, though nothing was (or a write before the send failed
   * for good, `beforeSend`). Put it back (known not done, or as found), trying a failing database
   * again for a moment. Without this the row waited out the lease and, for an action that cannot
   * look its effect up, went to a person with no effect anywhere. True when it was given back.
   */
  async giveBack<A, R>(
    call: Call<A, R>,
    owner: string,
    attempt: number,
    to: { status: "pending" | "unknown"; maybeCommitted: 0 | 1; executed: boolean; rerunBefore?: number | null },
    error: unknown,
    reason = `attempt ${attempt}'s ${attempt === 1 ? "claim" : "takeover"} was answered by no one; nothing was sent under it`,
  ): Promise<boolean> {
    if (!(error instanceof LedgerUnavailableError)) return false; // the database answered: nothing written
    if (!passes(error)) return false; // no write passes through this ledger again: its lease runs out
    return pRetry(
      () =>
        this.store.giveBack({ tenant: call.tenant, key: call.key.hash }, owner, attempt, {
          ...to,
          actor: call.actor,
          reason,
        }),
      { retries: 4, minTimeout: 50, maxTimeout: 500, randomize: true, maxRetryTime: 2_000 },
    ).catch(() => false); // still unreachable: the lease runs out, as before
  }

  /**
   * Parks an operation whose effect happened but whose receipt cannot be stored (too large, not
   * JSON) for a person, with the proof on the row (error kind `invalid_result`: `knownPerformed`,
   * and a person's retry or "failed" is refused). `performed`: the receipt is our own request's
   * (execute answered), not a lookup's finding; the proof names its attempt (`performedBy`). Our
   * row first; if another attempt or the daemon moved it meanwhile, the row as it is now, whatever
   * is not yet proven by a receipt:
   * - pending, unknown, or running under a later attempt (looking it up, or sending too): left as
   *   it was, it would run again; a holder is fenced off as a receipt fences it (`fenced`), so its
   *   later end cannot replace the proof;
   * - failed (a later attempt refused, say "already exists", or a person found nothing): reopened,
   *   its reason saying whose "failed" is overruled (a person's, or one replayed to callers); so
   *   too a "failed" an ambiguous end reopened for a person, not decided since, its alert
   *   delivered or not (fence.ts `failedOverruled`);
   * - needs_review (parked for a person): the proof added, alerted, and its version moved, so a
   *   decision taken on a view from before it is refused;
   * - needs_review with another attempt's proof of its own request's effect: ours is a second
   *   effect (unless the provider deduped it onto the first), said and alerted as one. A proof
   *   naming our attempt is ours already; a lookup's finding may be this very effect: our attempt
   *   is named on it, not alerted, so that a later receipt of another request counts as a second.
   * A row settled `succeeded` keeps its receipt (the one replayed to every other caller), and the
   * refused proof goes to its history; but our own request's answer, on a row another attempt
   * settled with a receipt, is a second effect (unless the provider deduped it onto the first, or
   * its ids say it is the recorded one: `effectId`), alerted as one, as `fenced` alerts a storable
   * receipt that differs (this one, unstorable, cannot be the receipt recorded). Each move is
   * retried through a brief outage (`moveDurably`).
   */
  async unstorable<A, R>(
    call: Call<A, R>,
    row: Row,
    why: string,
    performed: boolean,
    receipt: R,
    /** The receipt tells of two effects (`complete`'s reason for it): said and alerted wherever the row is. */
    several?: string,
  ): Promise<void> {
    const proof: StoredError = {
      kind: "invalid_result",
      reason: why,
      ...(performed && { performedBy: [row.attempt] }),
    };
    const unstorable = `the effect happened but its receipt cannot be stored: ${why}`;
    const patch = {
      actor: call.actor,
      reason: several === undefined ? unstorable : `${several}; ${unstorable}`,
      alert: true,
      error_json: JSON.stringify(proof),
      executionEnded: true,
      firstSentAt: firstSentOf(row),
    };
    const mine = await this.moveDurably(call, row, "needs_review", patch).catch(() => undefined);
    if (mine) return;
    for (let look = 1; look <= 5; look++) {
      const now = await this.store.findById(call.tenant, row.id).catch(() => undefined);
      if (!now) return this.noteUnstorable(call, row, now, why);
      // Written on the row as read: a change since (another proof, a person) is read again, and a
      // retry after a commit whose answer was lost matches nothing instead of writing it twice.
      const asRead = { unchangedSince: { updatedAt: now.updated_at, checks: now.checks } };
      if (now.status === "succeeded") {
        // A lookup's finding, a person's "it happened" without a receipt, or the row settled at our
        // own attempt (a person's verdict while we held it): not another request's effect.
        const another = performed && now.result_json !== null && now.attempt !== row.attempt;
        const second =
          another && !dedupedOntoFirst(call.action, row, now) && !namesEach(call.action, now.result_json!, receipt);
        const reason =
          several !== undefined && !alertedBefore(call.action, now, several, receipt)
            ? `${several}; its receipt not storable (${why.slice(0, 200)}), and the operation was settled by another receipt`
            : second
              ? `two effects: attempt ${row.attempt}'s request took effect too, its receipt not storable (${why.slice(0, 200)}), and the receipt recorded at attempt ${now.attempt} is another; a person must check the provider`
              : undefined;
        if (reason === undefined) return this.noteUnstorable(call, row, now, why);
        // Our own alert, committed on a try whose answer was lost (as moveDurably tells its own
        // write): written again, it would be a second event and a delivered alert due again.
        const ours = (r: Row | undefined) => r?.status === "succeeded" && r.reason === reason && r.actor === call.actor;
        if (ours(now)) return;
        const alerted = await this.moveDurably(call, now, "succeeded", {
          actor: call.actor,
          reason,
          alert: true,
          ...asRead,
        }).catch(
          () => null, // the ledger failed for a lease: its first try may have committed all the same
        );
        if (alerted) return;
        if (alerted === null) {
          const after = await this.store.findById(call.tenant, row.id).catch(() => undefined);
          return ours(after) ? undefined : this.noteUnstorable(call, row, after, why);
        }
        continue;
      }
      const earlier = rowPerformedProof(now);
      if (earlier) {
        const by = earlier.performedBy ?? [];
        if (performed && by.includes(row.attempt)) return; // our own proof
        // Ours tells of two effects not said on the row yet: said and alerted, whatever else is so.
        const saySeveral = several !== undefined && !alertedBefore(call.action, now, several, receipt);
        // A lookup's finding, or our request's answer deduped onto the proven effect: the same one.
        const same = !performed || (by.length > 0 && dedupedOntoFirst(call.action, row, now));
        if (same && !saySeveral) return this.noteUnstorable(call, row, now, why);
        const named = same ? earlier : ({ ...earlier, performedBy: [...by, row.attempt] } satisfies StoredError);
        // After a lookup's finding (no attempt named) ours is not proven a second effect, but it is
        // named on the proof: only noted, another attempt's own receipt later read the proof as the
        // lookup's alone and settled as one effect what were two. Its alert, if still due, stays.
        const { alert: _, ...quiet } = patch;
        const told =
          same || by.length > 0
            ? `two effects: attempt ${row.attempt}'s request took effect, and so did attempt ${by.join(" and ")}'s; neither receipt could be stored (${why.slice(0, 200)}); a person must check the provider`
            : `attempt ${row.attempt}'s request took effect, its receipt not storable either (${why.slice(0, 200)}); the effect a lookup found before is taken to be this one`;
        const added = await this.moveDurably(call, now, "needs_review", {
          ...(by.length > 0 || saySeveral ? patch : quiet),
          ...asRead,
          reason: same ? patch.reason : saySeveral ? `${several}; ${told}` : told,
          error_json: JSON.stringify(named),
        }).catch(() => undefined);
        if (added) return;
        continue;
      }
      // Still ours: the ledger failed for a lease (the caller's error names the operation).
      if (now.status === "running" && now.attempt === row.attempt) return;
      const held = now.status === "running" ? `, while attempt ${now.attempt} held it` : "";
      // A "failed" contradicted, said so (and kept so by a receipt that settles it later, fence.ts):
      // a person's, or one every caller since was replayed (a model may have sent the work again);
      // also one an ambiguous end reopened for a person (its alert delivered or not): this reason
      // replaces that one, and with it the only word that callers were told "failed".
      const whose = failedOverruled(now);
      const overruled = whose === "person" ? VERDICT_OVERRULED : whose === "provider" ? FAILURE_OVERRULED : "";
      const told = whose === "provider" ? `, after attempt ${now.attempt} failed; ${CALLER_TOLD_FAILED}` : "";
      const moved = await this.moveDurably(call, now, "needs_review", {
        ...patch,
        ...asRead,
        reason: `${overruled}attempt ${row.attempt}: ${patch.reason}${held}${told}`,
        ...(now.status === "failed" && { reopened: true }),
      }).catch(() => undefined);
      if (moved) return;
    }
    return this.noteUnstorable(call, row, await this.store.findById(call.tenant, row.id).catch(() => undefined), why);
  }

  /** The proof `unstorable` could not put on the row, kept in its history (best effort: the caller is told anyway). */
  private async noteUnstorable<A, R>(call: Call<A, R>, row: Row, now: Row | undefined, why: string): Promise<void> {
    if (!now) return;
    await this.store
      .recordEvent(now, {
        attempt: row.attempt,
        actor: call.actor,
        to: now.status,
        reason: `fenced: attempt ${row.attempt}'s effect happened but its receipt cannot be stored: ${why.slice(0, 300)}`,
        executionEnded: true,
        firstSentAt: firstSentOf(row),
      })
      .catch(() => undefined);
  }
}
