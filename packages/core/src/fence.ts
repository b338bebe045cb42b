/**
 * `fenced`: what an attempt does once a write of its own matched no row, because a newer attempt
 * or a person changed the row meanwhile (the fence). The refused write is recorded as evidence on
 * the row, a receipt we hold still settles a row not yet proven, a second effect is alerted, and
 * an ambiguous end reopens a row settled without it. It writes through the durable writes only.
 */
import { canonicalJson } from "./canonical.js";
import type { Call, Step } from "./call.js";
import type { DurableWrites } from "./durable-writes.js";
import { alertedBefore, attentionOf, dedupedOntoFirst, firstSentOf, namesEach, withAttention } from "./effects.js";
import { CompletionNotRecordedError, LedgerUnavailableError } from "./errors.js";
import {
  CALLER_TOLD_FAILED,
  FAILURE_OVERRULED,
  isFailureOverruled,
  isVerdictOverruled,
  POSSIBLY_TWO,
  SETTLED_BEFORE_RETRY,
  twoEffectsTold,
  VERDICT_OVERRULED,
} from "./reasons.js";
import {
  knownPerformed,
  pending,
  RESOLVED_BY_PERSON,
  replayOf,
  resolutionOf,
  rowPerformedProof,
  succeeded,
} from "./row-results.js";
import type { RunResult } from "./result.js";
import type { Row } from "./store.js";

/**
 * Whose "failed" a receipt arriving now would overrule: the row's own (a person's, resolved so,
 * or the provider's, replayed to every caller since), or one an ambiguous end reopened for a
 * person, not decided since (`reopenedFailed`), whether or not that alert was delivered: it said
 * the operation may have committed, and the receipt proves it did, so whoever acted on "failed"
 * hears it was wrong. Undefined when the row holds no "failed" to overrule. One answer for
 * `fenced` and for `DurableWrites.unstorable`, so a receipt stored or not says the same of the
 * callers told.
 */
export function failedOverruled(now: Row): "person" | "provider" | undefined {
  if (now.status === "failed") return now.resolution_json !== null ? "person" : "provider";
  return reopenedFailed(now);
}

/**
 * Our write matched no row. Either a newer attempt or a person changed the row (the fence: our
 * write is refused and recorded as evidence), or the row is not where we left it, which is not a
 * fence but a ledger failure and is thrown as one. A receipt we hold proves the effect: it
 * settles a row that is not yet proven (unknown, pending, needs_review), and is never answered
 * as anything but an effect. `performed`: the receipt is our own request's (execute answered),
 * not a lookup's finding, so one that differs from the recorded receipt is a second effect,
 * unless the provider's ids say it is the same one (`effectId`: a lookup's finding says less).
 * `several`: the receipt tells of two effects (`complete`'s reason for it): alerted whatever the
 * row became meanwhile, unless the receipt recorded already names each of them. `attention`: what
 * the action says a person must hear of our receipt (not done in full): alerted with it when it is
 * the receipt recorded here. `foundOnRetry`: the receipt is what a person's retry's lookup found
 * (runner.ts `isFoundOnRetry`, its reason): said and alerted so while the row is still that
 * retry's, not run since (`look_first`), as `complete` would have recorded it.
 */
export async function fenced<A, R>(
  writes: DurableWrites,
  call: Call<A, R>,
  mine: Row,
  wanted: string,
  detail: string,
  {
    receipt,
    sent = true,
    performed = false,
    several,
    attention,
    foundOnRetry,
  }: {
    receipt?: R;
    sent?: boolean;
    performed?: boolean;
    several?: string | undefined;
    attention?: string | undefined;
    foundOnRetry?: string | undefined;
  } = {},
): Promise<Step<R>> {
  // A receipt we hold reaches the caller whatever the database does meanwhile: it proves the effect.
  const unrecorded = (cause: unknown) =>
    receipt === undefined ? cause : new CompletionNotRecordedError(mine.id, mine.attempt, receipt, { cause });
  // An ended execution (a receipt, or an end that may have committed) says our request was out
  // until now: what others decided meanwhile may not know it. Each write below is conditioned on
  // the row as read; one that finds the row changed reads it again and decides anew.
  const ended = receipt !== undefined || (wanted === "unknown" && sent);
  for (let look = 1; ; look++) {
    // Retried through a brief outage, as the moves below are: read once, an outage here left an
    // ambiguous end unnoted, and the row pending (run again) while our request may have committed.
    const now = await writes
      .durably(call, () => writes.store.findById(call.tenant, mine.id))
      .catch((error: unknown) => {
        throw unrecorded(error);
      });
    if (!now || (now.status === "running" && now.attempt === mine.attempt)) {
      const cause = new LedgerUnavailableError(
        `attempt ${mine.attempt}'s write of ${wanted} matched no row, yet no other attempt holds the operation`,
        mine.id,
      );
      throw unrecorded(cause);
    }
    const lastLook = look >= 5;
    // Evidence of the refused write; a receipt must not be lost to it, so with one it is best effort.
    // It also moves last_execution_at: a lookup another attempt is making, or its own end saying
    // nothing was done, proves nothing of our request (reconcile and perform condition on it).
    const noted = await writes.store
      .recordEvent(now, {
        attempt: mine.attempt,
        actor: call.actor,
        to: now.status,
        reason: `fenced: attempt ${mine.attempt} tried to write ${wanted} (${detail.slice(0, 300)}); the operation is at attempt ${now.attempt}, ${now.status}`,
        executionEnded: ended,
        ...(ended && { firstSentAt: firstSentOf(mine) }),
        unchanged: ended && !lastLook,
      })
      .catch((error: unknown) => {
        if (receipt === undefined) throw error;
        return { updatedAt: now.updated_at }; // not noted: the row as read
      });
    if (!noted) continue; // changed since read: decide on the row as it is now
    // A receipt we hold proves the effect. It settles a row not yet proven (a later attempt's
    // included: looking it up, or sending too, which no write of ours can stop now), and outranks
    // a verdict given without it: "failed" (a later attempt refused, say "already exists" as ours
    // had committed; a person who found nothing yet) is replaced, and a person's "succeeded"
    // with no receipt to give gets this one.
    const unproven =
      now.status === "unknown" || now.status === "pending" || now.status === "needs_review" || now.status === "running";
    const verdictWithout = now.status === "failed" || (now.resolution_json !== null && now.result_json === null);
    if (receipt !== undefined && (unproven || verdictWithout)) {
      // A "failed" reopened for a person by an ambiguous end (`reopenedFailed`): its alert said it
      // may have committed after all (told or still due), and our receipt proves it did. Overruled
      // as the "failed" itself is: settled as a question the receipt answers, its alert was cleared
      // (or, delivered, none followed), and no one heard that the callers told "failed", or the
      // person who said it, were told wrong.
      const whose = failedOverruled(now);
      const overruled = whose !== undefined;
      // A person's "failed": they may have acted on it (told the customer, redone the work by
      // hand, a second effect of their own), so they hear that the receipt contradicts it.
      // Also one reopened with a proof of the effect (its receipt not stored) after it: said so then.
      const personOverruled =
        whose === "person" || (now.status === "needs_review" && isVerdictOverruled(now.reason ?? ""));
      // The provider's "failed" (a later attempt refused, say, before our request landed): every
      // caller since was told so, and a person hears that it took effect after all. Also one
      // reopened with a proof of the effect after it (durable-writes.ts `unstorable`).
      const failureOverruled =
        (overruled && !personOverruled) || (now.status === "needs_review" && isFailureOverruled(now.reason ?? ""));
      const after = overruled
        ? personOverruled
          ? ", after a person resolved it as failed"
          : `, after attempt ${now.attempt} failed`
        : unproven
          ? now.status === "running"
            ? `, while attempt ${now.attempt} held it`
            : ""
          : ", after a person resolved it as succeeded without one";
      // An effect already proven without its receipt (too large to store) by another attempt's
      // own request: ours is another one. A lookup's finding (no attempt named) may be this very
      // effect: not proven two, so the receipt is recorded and the proof kept in its history.
      const proof = rowPerformedProof(now);
      const by = proof?.performedBy ?? [];
      const second = performed && by.some((a) => a !== mine.attempt) && !dedupedOntoFirst(call.action, mine, now);
      const twice = second || several !== undefined;
      const before = by.length ? `attempt ${by.join(" and ")}'s request` : "a lookup's finding";
      // A person's retry found done, the row still theirs (look_first: every run since would have
      // cleared it; a later look proved nothing yet, or is looking): the retry did not run, and the
      // person hears it as they would have without the fence (the daemon reads the reason's start).
      const retryNotRun = foundOnRetry !== undefined && now.look_first === 1;
      // A person's retry not run yet (look_first: still to look first, looking, or its look refused
      // or inconclusive), settled by an earlier attempt's answer: they asked for it to run, and it
      // will not; heard as if their retry's own lookup had found it (before: settled in silence, a
      // check_refused alert still due cleared with it).
      const retryOvertaken = foundOnRetry === undefined && now.look_first === 1;
      // Run again since our request went out, from a proof that it was not done (a lookup that
      // read the provider before our effect landed, or a person's word), and the provider did not
      // dedupe that run onto ours: its request may have taken effect too, whatever became of it
      // (its answer lost, or still out). Our receipt proves one effect, not that that run made
      // none: a person hears of two, perhaps. A row that is pending again counts too: the lookup
      // that proved that run's absence may have read the provider too early, as ours was read.
      // Not one that failed by the provider's word (that run was refused: no effect of its own), nor
      // one that ended known not done at its own attempt (refused for now, never sent, given back),
      // also when an earlier attempt's end since made that unknown (`ranNothing`). Such a run puts
      // back the mark it replaced as it ends (runner.ts, `TransitionPatch.rerunBefore`), so a later
      // attempt's settlement does not make it one that ran, and an earlier run's mark is kept.
      const rerun =
        !twice && !proof && !(now.status === "failed" && now.resolution_json === null) && !ranNothing(now)
          ? rerunAfter(call.action, mine, now)
          : undefined;
      // A second effect, proven or possible, told on the row to no one yet (its alert still due):
      // our receipt settles the row but undoes no effect, so those words stay first (the daemon's
      // alert kind) and it stays alerted. Recorded as one effect, its alert was cleared unheard.
      // Its words are taken from where they start: after the overruled "failed" and the attempt
      // `unstorable` puts before them, said again after them by this receipt's own reason.
      const stillTold = !twice && rerun === undefined ? twoTold(now) : undefined;
      // Two effects are said first (the daemon's alert kind); a "failed" they overrule too, a
      // person's or the one replayed to callers.
      const verdictToo = personOverruled
        ? `; ${VERDICT_OVERRULED}a person must check whether anything was done on that verdict`
        : failureOverruled
          ? `; ${FAILURE_OVERRULED}${CALLER_TOLD_FAILED}`
          : "";
      // What the reasons below say of our receipt or finding, after any alert's own words.
      const proves = `attempt ${mine.attempt}'s ${performed ? "receipt" : "lookup's finding"} proves the effect happened`;
      const told =
        several !== undefined
          ? `${several}${after && ` (recorded${after})`}${second ? `; so did attempt ${by.join(" and ")}'s request, whose receipt could not be stored` : ""}${verdictToo}`
          : second
            ? `two effects: attempt ${mine.attempt}'s request took effect, and so did attempt ${by.join(" and ")}'s, whose receipt could not be stored; a person must check the provider${verdictToo}`
            : proof
              ? `${personOverruled ? VERDICT_OVERRULED : failureOverruled ? FAILURE_OVERRULED : ""}attempt ${mine.attempt}'s receipt proves the effect happened; the effect known before without its receipt (${before}: ${proof.reason.slice(0, 200)}) is taken to be this one`
              : rerun !== undefined
                ? `${POSSIBLY_TWO}${proves}${after}, and attempt ${rerun} ran the operation again since, from a proof that it was not done (${now.status} now): its request may have taken effect too; a person must check the provider${verdictToo}`
                : retryNotRun
                  ? `${foundOnRetry}; found by attempt ${mine.attempt}'s lookup, recorded after attempt ${now.attempt} took the operation over to look too (${now.status} now); nothing ran it again`
                  : retryOvertaken
                    ? `${SETTLED_BEFORE_RETRY}${proves}${after}`
                    : personOverruled
                      ? `${VERDICT_OVERRULED}${proves}; a person must check whether anything was done on that verdict`
                      : failureOverruled
                        ? `${FAILURE_OVERRULED}${proves}${after}; ${CALLER_TOLD_FAILED}: a person must check the provider`
                        : `${proves}${after}`;
      // Not done in full (the action's `attention`): alerted too, as `complete` records it. The
      // words go after a reason the daemon tells its alert by (two effects, or a verdict overruled).
      const overruledSaid = told.startsWith(VERDICT_OVERRULED) || told.startsWith(FAILURE_OVERRULED);
      const said =
        stillTold === undefined
          ? withAttention(told, attention, twice || rerun !== undefined || overruledSaid)
          : withAttention(`${stillTold.slice(0, 500)}; ${told}`, attention, true);
      const alert =
        twice ||
        rerun !== undefined ||
        attention !== undefined ||
        retryNotRun ||
        retryOvertaken ||
        personOverruled ||
        failureOverruled ||
        stillTold !== undefined;
      const proven = await writes.recordReceipt(
        call,
        now,
        canonicalJson(receipt, "result"),
        receipt,
        said,
        // A person's "it happened" agrees with the receipt; any other verdict is void now. Their
        // row keeps its status, so the write is on the row as read and noted: a retry after it
        // committed unseen matches nothing (moveDurably knows its own write), and another late
        // receipt written meanwhile is read again, and found to be a second effect if it differs.
        now.status === "succeeded"
          ? { keepVerdict: true, alert, unchangedSince: { updatedAt: noted.updatedAt, checks: now.checks } }
          : { alert },
      );
      // Our own request's receipt names our attempt, as when its answer wins; a finding, the row's.
      // A person's "it happened" without a receipt is kept (`keepVerdict`), and told with it.
      if (proven) return { done: withVerdict(succeeded(performed ? mine : proven, receipt, false), now) };
      if (!lastLook) continue;
    }
    if (
      several !== undefined &&
      receipt !== undefined &&
      now.status === "succeeded" &&
      now.result_json !== null &&
      !alertedBefore(call.action, now, several, receipt)
    ) {
      // Settled by another receipt meanwhile, and ours tells of two effects: a person hears of
      // them, whatever that receipt says (it is replayed to every other caller all the same).
      const alerted = await writes
        .moveDurably(call, now, "succeeded", {
          actor: call.actor,
          reason: `${several}; attempt ${mine.attempt} found this after the operation was settled by another receipt`,
          alert: true,
          ...asNoted(noted, now, lastLook),
        })
        .catch((error: unknown) => {
          throw unrecorded(error);
        });
      if (alerted || lastLook) return { done: performed ? succeeded(mine, receipt, false) : replayOf<R>(now) };
      continue;
    }
    if (receipt !== undefined && now.status === "succeeded" && now.result_json !== null) {
      // Settled by another attempt's receipt, and ours differs: our request took effect too,
      // unless the provider deduped it onto the first (then it is the same effect, told again,
      // however its answer differs). Our caller gets its own receipt, not "already done
      // earlier", and a person hears of the second effect (the row keeps the receipt it
      // replays to every other caller). A lookup's finding that differs names an effect the
      // recorded receipt may not be: unless the provider's ids say it is, a person looks (a
      // doubt is said as two effects); its caller gets what every caller gets.
      const ours = canonicalJson(receipt, "result");
      // One effect told twice: the provider's id for it is the recorded receipt's (a lookup's
      // finding says less than the request's answer). Our caller gets its own request's answer.
      const same = ours === now.result_json || namesEach(call.action, now.result_json, receipt);
      // A person's "it happened" goes with it only when it is of this same effect: not with a
      // second effect's receipt, which their verdict never saw.
      const own = succeeded(mine, receipt, false);
      const answered = performed
        ? same || dedupedOntoFirst(call.action, mine, now)
          ? withVerdict(own, now)
          : own
        : replayOf<R>(now);
      // The effect recorded is ours, recorded before us (a lookup found it), but the row was run
      // again meanwhile and that run did not settle it (its answer lost): as in the rule above,
      // its request may have taken effect too. Not when its own receipt settled the row and the
      // provider's ids say it answered with this same effect (`effectId`); receipts alike that
      // name no effect (a webhook's "HTTP 200") are two requests answered alike, not one effect.
      const again =
        same && (now.attempt !== now.rerun_attempt || !namesEach(call.action, now.result_json, receipt))
          ? rerunAfter(call.action, mine, now)
          : undefined;
      if (again !== undefined && !twoSaid(now)) {
        const alerted = await writes
          .moveDurably(call, now, "succeeded", {
            actor: call.actor,
            reason: withAttention(
              `${POSSIBLY_TWO}attempt ${mine.attempt}'s ${performed ? "receipt" : "lookup's finding"} names the effect recorded, and attempt ${again} ran the operation again before it was recorded, from a proof that it was not done: its request may have taken effect too; a person must check the provider`,
              attentionOf(call.action, now.result_json, { stored: true }),
              true,
            ),
            alert: true,
            ...asNoted(noted, now, lastLook),
          })
          .catch((error: unknown) => {
            throw unrecorded(error);
          });
        if (alerted || lastLook) return { done: answered };
        continue;
      }
      if (ours !== now.result_json && namesEach(call.action, now.result_json, receipt)) return { done: answered };
      if (ours !== now.result_json && !(performed && dedupedOntoFirst(call.action, mine, now))) {
        const alerted = await writes
          .moveDurably(call, now, "succeeded", {
            actor: call.actor,
            reason: performed
              ? `two effects: attempt ${mine.attempt}'s request took effect too, and its receipt differs from the one recorded; a person must check the provider`
              : `two effects: attempt ${mine.attempt}'s lookup found an effect that differs from the one recorded; a person must check the provider`,
            alert: true,
            ...asNoted(noted, now, lastLook),
          })
          .catch((error: unknown) => {
            throw unrecorded(error);
          });
        if (alerted || lastLook) return { done: answered };
        continue;
      }
      // One effect, recorded by another attempt first (a lookup that found it, a replay the
      // provider deduped onto it): a call whose own request made or reached it is told "done", not
      // "already done earlier" (`replayed` says nothing was executed), as if its answer had won.
      return { done: answered };
    }
    // Still unrecorded after every look (the row kept changing under us): the effect happened,
    // and the caller holds its receipt, whatever the row says now.
    if (receipt !== undefined && now.status !== "succeeded")
      throw unrecorded(
        new LedgerUnavailableError(
          `attempt ${mine.attempt}'s receipt could not be recorded: the operation kept changing (${now.status} at attempt ${now.attempt})`,
          mine.id,
        ),
      );
    if (wanted === "unknown" && sent && (now.status === "pending" || now.status === "failed")) {
      // Absence was proven, or the operation failed (a later attempt refused, a person found
      // nothing), while this attempt was still in flight: its ambiguous end voids that. Unknown
      // again, looked up; after a failure, a person decides (the refusal may be our effect's
      // "already exists"), and the operation is no longer settled.
      // Retried through a brief outage (`moveDurably`): left pending, the row would be run
      // again while our request may have committed; left failed, replayed as no effect.
      const reopened =
        now.status === "pending"
          ? await writes.moveDurably(call, now, "unknown", {
              actor: call.actor,
              reason: `attempt ${mine.attempt}, still in flight when absence was proven, may have committed: ${detail.slice(0, 200)}`,
              checkAfterMs: call.settings.budget.baseDelayMs,
              // Known not done until now, its checks were tries refused: this outcome has had none.
              checks: 0,
              executionEnded: true,
              firstSentAt: firstSentOf(mine),
            })
          : await writes.moveDurably(call, now, "needs_review", {
              actor: call.actor,
              reason: `attempt ${mine.attempt}${FAILED_REOPENED}${detail.slice(0, 200)}; a person decides`,
              alert: true,
              reopened: true,
            });
      if (reopened) {
        const what =
          reopened.status === "unknown"
            ? `outcome unknown: attempt ${mine.attempt} may have committed`
            : `attempt ${mine.attempt} may have committed after the operation failed; a person decides`;
        return { done: pending(reopened, what) };
      }
      if (!lastLook) continue;
    }
    if (
      wanted === "unknown" &&
      sent &&
      receipt === undefined &&
      now.status === "succeeded" &&
      !twoSaid(now) &&
      rerunAfter(call.action, mine, now) !== undefined
    ) {
      // Settled by a later run from known not done (a proof of absence read while our request was
      // out), and our request ended without an answer: it may have taken effect too, which the
      // receipt recorded cannot say. A person hears of two, perhaps; every caller gets that receipt.
      const alerted = await writes.moveDurably(call, now, "succeeded", {
        actor: call.actor,
        reason: withAttention(
          `${POSSIBLY_TWO}attempt ${mine.attempt}'s request, out when attempt ${now.rerun_attempt} ran the operation again, ended without an answer (${detail.slice(0, 200)}): it may have taken effect too; a person must check the provider`,
          now.result_json === null ? undefined : attentionOf(call.action, now.result_json, { stored: true }),
          true,
        ),
        alert: true,
        ...asNoted(noted, now, lastLook),
      });
      if (alerted || lastLook) return { done: replayOf<R>(now) };
      continue;
    }
    // Settled by another attempt or a person: what every caller gets (a verdict may have no receipt).
    if (now.status === "succeeded" || now.status === "failed") return { done: replayOf<R>(now) };
    // At our own attempt nothing took the lease from us: a person, the daemon, or an earlier
    // attempt's proof (its effect happened, its receipt too large to store) moved the row.
    const performedBefore = knownPerformed(now);
    const why = performedBefore
      ? `an earlier attempt's effect happened (its receipt could not be stored) while attempt ${mine.attempt} held the operation; a person records it`
      : now.attempt === mine.attempt
        ? `attempt ${mine.attempt} was moved meanwhile (by a person or the daemon); the operation is ${now.status}`
        : `lease lost to attempt ${now.attempt}; the operation is ${now.status}`;
    return { done: pending(now, why, performedBefore) };
  }
}

/**
 * The later attempt that ran the operation again from `pending` (`rerun_attempt`, 0013) after
 * `mine` sent, unless the provider deduped that run onto ours (its key retention): its request
 * may be a second effect. Undefined when none did, or on a ledger read before 0013.
 */
function rerunAfter(
  action: Parameters<typeof dedupedOntoFirst>[0],
  mine: Row,
  now: Row & { rerun_attempt: number | null },
): number | undefined {
  if (now.rerun_attempt === null || now.rerun_attempt <= mine.attempt) return undefined;
  return dedupedOntoFirst(action, mine, now) ? undefined : now.rerun_attempt;
}

/**
 * Whether the run again from `pending` holding the row's attempt ended known not done (refused for
 * now, never sent, given back): pending at its own attempt, or unknown at it with its own end's
 * error transient or rate limited (an earlier attempt's end came during it: runner `lateEndDuring`,
 * or the "still in flight when absence was proven" move below). Its request made no effect. A run
 * that ends so puts back the mark it replaced (`TransitionPatch.rerunBefore`), as does one given
 * back after an outage (`Store.giveBack`): this still tells one whose end did not (ended by a
 * process of an earlier release).
 */
function ranNothing(now: Row & { rerun_attempt: number | null }): boolean {
  if (now.attempt !== now.rerun_attempt) return false;
  if (now.status === "pending") return true;
  if (now.status !== "unknown" || now.error_json === null) return false;
  const kind = (JSON.parse(now.error_json) as { kind?: unknown }).kind;
  return kind === "transient" || kind === "rate_limited";
}

/** What follows the attempt in the reason of a "failed" reopened for a person by an ambiguous end (`fenced`). */
const FAILED_REOPENED = ", still in flight when the operation failed, may have committed: ";

/**
 * Whose "failed" the row held when an ambiguous end reopened it for a person, still waiting for
 * them: a person's (`admin.resolve`, its error says so) or the provider's. Undefined for any other
 * row. Its alert delivered or not: "may have committed" is not "it did", and those who acted on
 * "failed" hear the receipt that proves it (alerted once more then; while that alert is still due,
 * the receipt's reason replaces its words, one alert). The reopen voids the verdict
 * (`resolution_json`); a person's decision since moves the row, and is what a receipt meets then.
 */
function reopenedFailed(now: Row): "person" | "provider" | undefined {
  if (now.status !== "needs_review" || now.reason === null) return undefined;
  // Its own words right after the attempt, not the same words anywhere (an error's detail quoted).
  const attempt = /^attempt \d+/.exec(now.reason);
  if (!attempt || !now.reason.startsWith(FAILED_REOPENED, attempt[0].length)) return undefined;
  // The ledger's own JSON, parsed unguarded as every other reader of error_json here does.
  const said = now.error_json === null ? undefined : (JSON.parse(now.error_json) as { reason?: unknown }).reason;
  return typeof said === "string" && said.startsWith(RESOLVED_BY_PERSON) ? "person" : "provider";
}

/**
 * The words of two effects, proven or possible, that the row's alert still due tells a person
 * (`twoEffectsTold`). Undefined when it tells none (or was delivered).
 */
function twoTold(now: Row): string | undefined {
  if (now.alert_pending !== 1 || now.reason === null) return undefined;
  return twoEffectsTold(now.reason);
}

/** Whether the row's alert still due already tells a person of two effects, proven or possible. */
function twoSaid(now: Row): boolean {
  return twoTold(now) !== undefined;
}

/**
 * A fenced attempt's alert of a second effect is written on the row as read and noted: a retry
 * after it committed unseen must not write it twice. On the last look (the row kept changing
 * under us, other late answers noting themselves on it) it is written on the row as it is, its
 * status and attempt: a person may hear of it twice then, never not at all.
 */
function asNoted(noted: { updatedAt: number }, now: Row, lastLook: boolean) {
  return lastLook ? {} : { unchangedSince: { updatedAt: noted.updatedAt, checks: now.checks } };
}

/**
 * A caller's own answer on a row a person settled as "it happened" (their verdict kept, agreeing
 * with the receipt): the verdict goes with it, as every later caller is replayed it.
 */
function withVerdict<R>(answer: RunResult<R>, row: Row): RunResult<R> {
  const resolution = row.status === "succeeded" ? resolutionOf(row) : undefined;
  return resolution === undefined || answer.status !== "succeeded" ? answer : { ...answer, resolution };
}
