/**
 * The status tool: lets the model (or the agent's code) learn what became of an operation it was
 * told is pending verification, by its id, optionally waiting a little for it to settle.
 */
import { InvalidValueError, OperationNotFoundError, type Ledger } from "@idem/core";
import { fromCall, type ToolCall } from "./guard.js";
import { outcomeOf, safeSummary, type Outcome } from "./outcome.js";

export interface StatusInput {
  readonly operationId: string;
  /** Wait up to this long (at most 50 s) for the operation to settle. Default 0: answer now. */
  readonly waitMs?: number | null | undefined;
}

/** The longest wait a status check takes: below an MCP client's usual 60 s request timeout. */
export const MAX_WAIT_MS = 50_000;

export const STATUS_TOOL = {
  name: "operation_status",
  description:
    "Check what became of an operation you were told is pending verification, by its operation id (op_…). " +
    "Optionally wait up to waitMs milliseconds (max 50000) for it to settle. Never repeat the original action instead.",
} as const;

export function statusTool<C = unknown>(
  ledger: Ledger,
  options: { tenant: string | ((call: ToolCall<C>) => string); summarize?: (receipt: unknown) => unknown },
) {
  const summarize = safeSummary(options.summarize);
  return async (input: StatusInput, call: ToolCall<C>): Promise<Outcome> => {
    try {
      const tenant = fromCall(options.tenant, call);
      const waitMs = Math.min(Math.max(input.waitMs ?? 0, 0), MAX_WAIT_MS);
      const result =
        waitMs > 0
          ? await ledger.wait({
              tenant,
              id: input.operationId,
              timeoutMs: waitMs,
              ...(call.signal && { signal: call.signal }),
            })
          : await ledger.status({ tenant, id: input.operationId });
      const outcome = outcomeOf(result, summarize);
      // A status check does not act: a settled operation was done by the call that was told "pending".
      return outcome.status === "already_done"
        ? { ...outcome, status: "done", message: `Done (operation ${outcome.operationId}).` }
        : outcome;
    } catch (error) {
      // A malformed id is none here; a malformed tenant is the application's setup, not the id.
      const badId = error instanceof InvalidValueError && error.path !== "tenant";
      if (error instanceof OperationNotFoundError || badId) {
        return {
          status: "refused",
          message: `No operation ${JSON.stringify(input.operationId)} here: check the id (op_…).`,
        };
      }
      // The check failed (the ledger unreachable or closed, the call stopped): nothing is known
      // of the operation either way, and nothing was done by this check.
      const name = error instanceof Error ? error.name : typeof error;
      return {
        status: "unconfirmed",
        message: `Could not check operation ${JSON.stringify(input.operationId)} now (${name}): it may or may not have happened. Check again later with this tool; do not repeat the original action.`,
      };
    }
  };
}
