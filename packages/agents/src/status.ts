/**
 * The status tool: lets the model (or the agent's code) learn what became of an operation it was
 * told is pending verification, by its id, optionally waiting a little for it to settle. Given
 * the tool definitions the model calls, a settled operation reads as the tool that made it would
 * have said it (its summary of the receipt: a payment that waits for the customer, not a bare
 * "Done").
 *
 * It reads its own input: the adapters show the frameworks its JSON Schema without the check, so
 * input it cannot read is answered with a refusal that says nothing was checked, never the
 * framework's validation error (nor a "not performed" a model could take for the operation's).
 */
import { z } from "zod";
import { InvalidValueError, OperationNotFoundError, type Ledger, type RunResult } from "@idem/core";
import { fromCall, type ToolCall } from "./guard.js";
import { isFoundEarlier, outcomeOf, safeSummary, type Outcome } from "./outcome.js";
import type { ToolDefinition } from "./tool.js";

export interface StatusInput {
  readonly operationId: string;
  /** Wait up to this long (at most 50 s) for the operation to settle. Default 0: answer now. */
  readonly waitMs?: number | null | undefined;
}

/** The longest wait a status check takes: below an MCP client's usual 60 s request timeout. */
export const MAX_WAIT_MS = 50_000;

/**
 * How long after its wait a status check answers at the latest, whatever the ledger's reads take:
 * "could not check now" then (a wait of 50 s is answered within 55 s).
 */
export const CHECK_MS = 5_000;

export const STATUS_TOOL = {
  name: "operation_status",
  description:
    "Check what became of an operation you were told is pending verification, by its operation id (op_…). " +
    "Optionally wait up to waitMs milliseconds (max 50000) for it to settle. Never repeat the original action instead.",
} as const;

export interface StatusToolOptions<C> {
  /** The tenant, or how to read it from the run context: another tenant's operation is "no operation here". */
  readonly tenant: string | ((call: ToolCall<C>) => string);
  /**
   * The tool definitions the model calls: a settled operation is summarized by the one whose
   * action type is the operation's (its `summarize`, its `foundEarlier`). Default: none.
   */
  readonly tools?: readonly ToolDefinition<any, any, any>[];
  /** What the model sees of a receipt no given tool summarizes (default: nothing but the operation id). */
  readonly summarize?: (receipt: unknown) => unknown;
}

/**
 * What the model reads when the status tool could not read its input (`why`: the field and what
 * it must be): nothing was checked, so it says nothing of the operation.
 */
export function refusedStatusInput(why: string): Outcome {
  return {
    status: "refused",
    message: `Refused: invalid input: ${why}. Nothing was checked, so this says nothing about the operation; fix the input and check again.`,
  };
}

/**
 * An operation id as the ledger makes them (`op_`, then lowercase letters and digits), with room
 * to spare. The model's id is repeated in the answer ("No operation "op_…" here"): anything else
 * (a page of text, words of its own) is refused without being repeated.
 */
const OPERATION_ID = /^op_[0-9a-z]{1,64}$/;

/** What the status tool reads. A wait outside 0 to 50 s is not refused: the nearest bound is used, and the answer is as true. */
const READABLE = z.object({
  operationId: z.string().regex(OPERATION_ID, "must be an operation id (op_…)"),
  waitMs: z.number().nullish(),
});

/**
 * The status tool's input as the frameworks list it to the model, the id's form included (a model
 * shown only "a string" sent words of its own). Listed, not checked: the tool reads its input
 * itself (READABLE) and refuses what it cannot read. `absentWait`: how the framework marks a wait
 * left out (OpenAI's strict mode asks for every field, null when absent).
 */
export function listedStatusInput(absentWait: "optional" | "nullable") {
  const waitMs = z.number().int().min(0).max(MAX_WAIT_MS);
  return z.object({
    operationId: z.string().regex(OPERATION_ID),
    waitMs: absentWait === "optional" ? waitMs.optional() : waitMs.nullable(),
  });
}

/** Why the status tool cannot read `input` (the field, and what it must be), or undefined when it can. */
function unreadable(input: unknown): string | undefined {
  const parsed = READABLE.safeParse(input);
  if (parsed.success) return undefined;
  const issue = parsed.error.issues[0]!;
  return `${issue.path.join(".") || "input"}: ${issue.message}`;
}

export function statusTool<C = unknown>(ledger: Ledger, options: StatusToolOptions<C>) {
  const fallback = safeSummary(options.summarize);
  const tools = options.tools ?? [];
  /** The definition of the tool that made the operation: read only for a receipt to summarize. */
  async function toolOf(tenant: string, result: RunResult<unknown>) {
    if (tools.length === 0 || result.status !== "succeeded" || result.receipt === null) return undefined;
    try {
      const { operation } = await ledger.get({ tenant, id: result.operationId });
      return tools.find((t) => t.action.type === operation.action);
    } catch {
      return undefined; // the outcome is known: a failed read only loses its summary
    }
  }
  /** What became of the operation, read within `waitMs` (and whatever the reads take); `given` ends the wait. */
  async function check(input: StatusInput, call: ToolCall<C>, waitMs: number, given: AbortSignal): Promise<Outcome> {
    try {
      const tenant = fromCall(options.tenant, call);
      // A wait only reads: either signal ends it (MCP's connection closing is a `stop`), and so
      // does this check giving up on the ledger.
      const until = AbortSignal.any([given, ...(call.signal ? [call.signal] : []), ...(call.stop ? [call.stop] : [])]);
      const result =
        waitMs > 0
          ? await ledger.wait({ tenant, id: input.operationId, timeoutMs: waitMs, signal: until })
          : await ledger.status({ tenant, id: input.operationId });
      const tool = await toolOf(tenant, result);
      const summarize = tool?.summarize ? safeSummary<unknown>(tool.summarize) : fallback;
      const outcome = outcomeOf(result, summarize, tool?.foundEarlier);
      // A status check does not act: a settled operation was done by the call that was told
      // "pending", unless its receipt shows the effect had been done before that operation began.
      // A person's word that it happened, without a receipt, is all there is to say of it.
      if (outcome.status !== "already_done" || isFoundEarlier(result, tool?.foundEarlier)) return outcome;
      const byPerson = result.status === "succeeded" && result.receipt === null && result.resolution;
      const confirmed = byPerson ? ", as a person confirmed" : "";
      return { ...outcome, status: "done", message: `Done${confirmed} (operation ${outcome.operationId}).` };
    } catch (error) {
      // A malformed id is none here; a malformed tenant is the application's setup, not the id.
      const badId = error instanceof InvalidValueError && error.path !== "tenant";
      if (error instanceof OperationNotFoundError || badId) {
        return {
          status: "refused",
          // Or pruned: an id the ledger gave once, whose operation settled long ago. Said so, the
          // model does not read "the id was wrong" into work that was done.
          message: `No operation ${JSON.stringify(input.operationId)} here: check the id (op_…). An operation is also removed once its retention ended, after it settled (done or failed), so an id given long ago may be gone for that reason.`,
        };
      }
      // A tenant the ledger refuses is the application's setup: checking again cannot help.
      if (error instanceof InvalidValueError)
        return {
          status: "unconfirmed",
          message: `Could not check operation ${JSON.stringify(input.operationId)}: the status tool is not set up right (${error.path}: ${error.reason}). Nothing was checked, so this says nothing about the operation, and checking again will not help until the setup is fixed. Tell the user; do not repeat the original action.`,
        };
      // The check failed (the ledger unreachable or closed, the call stopped): nothing is known
      // of the operation either way, and nothing was done by this check.
      return unchecked(input.operationId, error instanceof Error ? error.name : typeof error);
    }
  }
  return async (input: StatusInput, call: ToolCall<C>): Promise<Outcome> => {
    const why = unreadable(input);
    if (why !== undefined) return refusedStatusInput(why);
    const waitMs = Math.min(Math.max(input.waitMs ?? 0, 0), MAX_WAIT_MS);
    // A database that stops answering (a frozen server, a network dropping packets) fails a read
    // only at its client's read timeout (Postgres: the statement timeout and 5 s, 35 s by
    // default), after a wait of up to 50 s: past an MCP client's 60 s, whose model then read its
    // host's timeout error, not this answer. The read that hangs is left to fail on its own.
    const givenUp = new AbortController();
    let timer: NodeJS.Timeout | undefined;
    const late = new Promise<Outcome>((resolve) => {
      timer = setTimeout(() => {
        givenUp.abort();
        resolve(unchecked(input.operationId, `no answer from the ledger within ${(waitMs + CHECK_MS) / 1_000} s`));
      }, waitMs + CHECK_MS);
    });
    try {
      return await Promise.race([check(input, call, waitMs, givenUp.signal), late]);
    } finally {
      clearTimeout(timer);
    }
  };
}

/** What the model reads when the check itself failed (`why`): nothing is known of the operation, nothing was done. */
function unchecked(operationId: string, why: string): Outcome {
  return {
    status: "unconfirmed",
    message: `Could not check operation ${JSON.stringify(operationId)} now (${why}): it may or may not have happened. Check again later with this tool; do not repeat the original action.`,
  };
}
