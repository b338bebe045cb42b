/**
 * `guard`: a tool's execute function that performs an idem action once per business identity,
 * for any agent framework. The framework adapters (`/ai`, `/openai`, `/mcp`, `/langchain`) only
 * translate their call arguments into a `ToolCall` and the `Outcome` into their result type.
 *
 * The identity comes from `key(input, call)`: the business identity of the work (the invoice, the
 * recipient and the purpose), never the framework's tool-call id, which changes each time a
 * model retries. The tenant comes from the run context the application set, never from the
 * model's input.
 */
import type { StandardSchemaV1 } from "@standard-schema/spec";
import { z } from "zod";
import {
  canonicalJson,
  InvalidValueError,
  operationKey,
  parseArgs,
  requireName,
  type Action,
  type KeyPart,
  type Ledger,
  type RunResult,
} from "@idem/core";
import {
  isOutcome,
  outcomeOf,
  outcomeOfError,
  pastDeadline,
  safeSummary,
  stoppedBeforeLedger,
  type Outcome,
} from "./outcome.js";
import { definitionOf, type ToolDefinition } from "./tool.js";

/** What a framework hands a tool besides its input, in one shape. */
export interface ToolCall<C = unknown> {
  /** The application's run context (AI SDK `experimental_context`, OpenAI Agents `context`, an MCP `extra` mapped by the server). */
  readonly context: C;
  /** The framework's id of this tool call: changes when a model retries, so never part of a key. For logs and actors. */
  readonly callId?: string | undefined;
  /**
   * Aborted when the caller wants the request under way cut too (`run`'s `signal`): its outcome
   * is then unknown until a lookup or a person settles it. No adapter sets it.
   */
  readonly signal?: AbortSignal | undefined;
  /**
   * Aborted when the framework stops waiting for the call (a run aborted, a sibling tool failing,
   * a connection closing: every adapter's abort): the request under way ends and is recorded,
   * nothing more is sent, and the outcome is the operation's state then (`run`'s `stop`).
   */
  readonly stop?: AbortSignal | undefined;
  /**
   * The input is already the output of the tool's schema (the definition's `input`, else the
   * action's): guard does not apply it again, and the key and the args are made of the input as
   * given. No adapter sets it (guard applies the schema in each); an application that calls `guard`
   * from a framework that applies the schema itself may. A schema is applied once: one that
   * transforms (euros to cents, a day to a timestamp) must not be applied to its own output. Set it
   * only for that output: nothing checks the input then, not the ledger either when the schema is
   * the action's, and a key part no key can hold reads as the tool's setup, not as input to fix.
   */
  readonly inputParsed?: boolean;
}

export interface GuardOptions<I, R, C> {
  /** The tenant, or how to read it from the run context. */
  readonly tenant: string | ((call: ToolCall<C>) => string);
  /** The business identity of the work, from the input (and the context). Required unless the tool definition suggests one. */
  readonly key?: (input: I, call: ToolCall<C>) => readonly KeyPart[];
  /** Who acts, recorded in the audit trail (default, also when given as undefined: the framework's call id; MCP's: "mcp"). */
  readonly actor?: string | ((call: ToolCall<C>) => string) | undefined;
  /** What the model sees of a receipt (default: the tool definition's summary, else nothing but the operation id). */
  readonly summarize?: (receipt: R) => unknown;
  /**
   * Rewrites the outcome before the model reads it (default: the outcome as it is): its words, not
   * what happened. It may answer later (a promise: a read of a database, a translation), by the
   * call's deadline (`deadlineMs`). When it throws, rejects, answers something that is not an
   * `Outcome` (nothing, a string, an unknown status, what cannot be sent as JSON), changes the
   * status, the operation id or a pending operation's state, or has not answered by the deadline,
   * the model reads the outcome as it was.
   */
  readonly describe?: (outcome: Outcome) => Outcome | PromiseLike<Outcome>;
  /**
   * How long a second call for the same identity waits for the first to finish before answering
   * "pending verification": a model often calls the same tool twice in one step. Default 10 s.
   */
  readonly waitMs?: number;
  /**
   * The longest a call takes to answer, whatever the ledger or the provider does meanwhile (a
   * database that stopped answering, a provider slow to answer): then the model reads
   * `unconfirmed` ("no answer within …": it may or may not have happened, and the same input later
   * is safe and says what happened), not its host's timeout error. A second before it (half of it,
   * when shorter than 2 s) the call is stopped as a framework stops it (`ToolCall.stop`): nothing
   * more is sent, a wait or a pause ends and the ledger answers with the operation's state when it
   * can; a request already sent is not cut, but ends and is recorded. Default 45 s: below an MCP
   * client's usual 60 s request timeout, above the ledger's default retry budget (30 s). A whole
   * number of ms from 1 to 2147483647. `describe` answers by it too: a rewording still under way
   * then is dropped, and the model reads the outcome as it was.
   */
  readonly deadlineMs?: number;
}

/** A guarded call's default deadline (`GuardOptions.deadlineMs`): below an MCP client's usual 60 s request timeout. */
export const DEADLINE_MS = 45_000;

/**
 * How long before its deadline a call is stopped, at most: time for the ledger's own answer (a
 * duplicate's wait or a retry's pause ended: pending, with its operation) to come first.
 */
const STOP_AHEAD_MS = 1_000;

/** A deadline a timer can keep (Node's timers hold at most 2^31 - 1 ms). */
const DEADLINE = z
  .number()
  .int()
  .min(1)
  .max(2 ** 31 - 1);

/** `deadlineMs` as given, checked (a setting of the application's: refused when the tool is made), or the default. */
function deadlineOf(tool: string, deadlineMs: unknown): number {
  const checked = DEADLINE.optional().safeParse(deadlineMs);
  if (!checked.success)
    throw new TypeError(
      `guard(${tool}): deadlineMs must be a whole number of ms from 1 to ${2 ** 31 - 1} (got ${String(deadlineMs)})`,
    );
  return checked.data ?? DEADLINE_MS;
}

/**
 * Whether a rewording keeps what happened: the status, the operation and, while it is pending,
 * its state. Its words are the application's; a "done" for a lost answer would be the model's
 * reason to tell the user it happened.
 */
function sameFacts(described: Outcome, o: Outcome): boolean {
  const fact = (x: Outcome) => [
    x.status,
    "operationId" in x ? x.operationId : undefined,
    "state" in x ? x.state : undefined,
  ];
  return fact(described).every((v, i) => v === fact(o)[i]);
}

/** A setting given as a value, or read from the call (its run context). */
export function fromCall<T, C>(setting: T | ((call: ToolCall<C>) => T), call: ToolCall<C>): T {
  return typeof setting === "function" ? (setting as (call: ToolCall<C>) => T)(call) : setting;
}

/** A guarded tool: the framework calls it with the model's input and the call. */
export type Guarded<I, C> = (input: I, call: ToolCall<C>) => Promise<Outcome>;

/** Guards an action (whose `input` schema, if any, checks the model's input) or a provider's tool definition. */
export function guard<A, R, I, C = unknown>(
  ledger: Ledger,
  target: Action<A, R, I> | ToolDefinition<I, A, R>,
  options: GuardOptions<I, R, C>,
): Guarded<I, C> {
  const def = definitionOf(target);
  const identify = options.key ?? def.key;
  if (!identify)
    throw new TypeError(`guard(${def.name}): give a key: the business identity of the work (see "choosing the key")`);
  const shown = safeSummary(options.summarize ?? def.summarize);
  /**
   * The application's rewording, or the outcome as it is when the rewording fails (throws, rejects
   * when it is async, or answers no outcome): the tool never throws, nor answers what no model can read.
   */
  const describe = async (o: Outcome): Promise<Outcome> => {
    if (!options.describe) return o;
    try {
      const described: unknown = await options.describe(o);
      return isOutcome(described) && sameFacts(described, o) ? described : o;
    } catch {
      return o;
    }
  };
  const waitMs = options.waitMs ?? 10_000;
  const deadlineMs = deadlineOf(def.name, options.deadlineMs);
  // The schema the model fills in (the definition's, else the action's), applied once: here, or by
  // the framework. When it is the action's, its output is the args (or what `args` maps to the
  // args), so the ledger must not apply it again: it runs the action as one without an input
  // schema (the same type, execute, lookup). Applied again to mapped args, 12.50 euros went out as
  // 125,000 cents.
  const schema = (def.input ?? def.action.input) as StandardSchemaV1<unknown, I> | undefined;
  const action = def.action.input && (schema as unknown) === def.action.input ? withoutInput(def.action) : def.action;
  /**
   * The call's outcome as the ledger (or the tool's setup) gives it. `deadline`: aborted shortly
   * before the call's deadline; the ledger then stops the call as it stops a framework's.
   */
  const perform = async (input: I, call: ToolCall<C>, deadline: AbortSignal): Promise<Outcome> => {
    let identity = "this work";
    let started = false;
    let result: RunResult<R>;
    let tenant: string;
    let actor: string | undefined;
    try {
      tenant = fromCall(options.tenant, call);
      // The checked input is what the key and the args are made of.
      const given = schema && !call.inputParsed ? await parseArgs(schema, input) : input;
      const key = keyOf(tenant, def.action.type, () => identify(given, call), call.inputParsed ? undefined : input);
      identity = `this work (${readable(key.label)})`;
      actor = options.actor === undefined ? actorOf(call.callId) : fromCall(options.actor, call);
      const args = def.args ? def.args(given) : (given as unknown as I);
      // Given up before the ledger had it: this call sent nothing, but the ledger was not read, so
      // what an earlier call did is not known.
      if (call.signal?.aborted || call.stop?.aborted) return stoppedBeforeLedger();
      // Out of time before the ledger had it (a schema slow to check): this call did nothing, but
      // the ledger was not read either, so what an earlier call did is not known.
      if (deadline.aborted) return pastDeadline(deadlineMs);
      started = true;
      result = await ledger.run(action, {
        tenant,
        key,
        args,
        waitMs,
        ...(actor !== undefined && { actor }),
        ...(call.signal && { signal: call.signal }),
        stop: call.stop ? AbortSignal.any([call.stop, deadline]) : deadline,
      });
    } catch (error) {
      return outcomeOfError(error, {
        identity,
        action: def.name,
        summarize: shown as ((r: never) => unknown) | undefined,
        foundEarlier: def.foundEarlier,
        started,
      });
    }
    // Past this point the ledger has answered: a failing summary must not turn "done" into an error's answer.
    const outcome = outcomeOf(result, shown, def.foundEarlier);
    // The actor is the call id only when the application named none: then it says which call did it.
    if (options.actor !== undefined || actor === undefined || call.callId === undefined) return outcome;
    return sameCallReplay(ledger, { tenant, actor, callId: call.callId }, result, outcome, deadline);
  };
  return async (input, call) => {
    // A database that stops answering (a frozen server, a held SQLite lock, a network dropping
    // packets) fails a statement only at its client's timeout, which the application may set long:
    // a call answered 20 to 45 s later with the defaults, past an MCP client's 60 s with longer
    // ones, and the model read its host's timeout error. The call left running is stopped, not
    // cut: what it has sent ends and is recorded, nothing more is sent, and its answer is dropped.
    const started = performance.now();
    const deadline = new AbortController();
    const stopAt = deadlineMs - Math.min(STOP_AHEAD_MS, deadlineMs / 2);
    const stopTimer = setTimeout(() => deadline.abort(), stopAt);
    let lateTimer: NodeJS.Timeout | undefined;
    const late = new Promise<Outcome>((resolve) => {
      lateTimer = setTimeout(() => resolve(pastDeadline(deadlineMs)), deadlineMs);
    });
    let cutTimer: NodeJS.Timeout | undefined;
    try {
      const outcome = await Promise.race([perform(input, call, deadline.signal), late]);
      // The application's rewording answers by the deadline too (one reading a database that
      // stopped answering hung the call past an MCP client's timeout); past it, the model reads
      // the outcome as it was, which is known. On a timer even when the deadline has passed, so a
      // rewording that answers at once still rewords "no answer within …".
      const left = Math.max(0, deadlineMs - (performance.now() - started));
      const cut = new Promise<Outcome>((resolve) => {
        cutTimer = setTimeout(() => resolve(outcome), left);
      });
      return await Promise.race([describe(outcome), cut]);
    } finally {
      clearTimeout(stopTimer);
      clearTimeout(lateTimer);
      clearTimeout(cutTimer);
    }
  };
}

/**
 * The framework's call id as the audit actor, when it can be one: cut to the ledger's 200
 * characters, none when empty or unprintable (some providers send `""`). It is not the model's
 * input: a refusal of it would tell the model to fix what it did not write.
 */
function actorOf(callId: string | undefined): string | undefined {
  // Cut before a pair's first half, not inside the pair (half of one is no text).
  const cut = callId?.slice(0, /[\uD800-\uDBFF]/.test(callId.charAt(199)) ? 199 : 200);
  try {
    requireName(cut, "actor");
    return cut;
  } catch {
    return undefined;
  }
}

/**
 * The operation key of the parts the key function makes. A part no key can be made of (a Date,
 * NaN, no parts at all, a `sensitive()` value that cannot be hashed) is the tool's own fault, its
 * key function's or a schema's that let the value through: refused as the key ("key[1]: …"), which
 * outcomeOfError tells as the tool's setup, not as input to fix. Unless the model sent it: `sent` (what
 * the model sent, as the framework parsed its JSON) holding a value no key can hold (a string cut
 * inside a character) is refused as its input, naming its field.
 */
function keyOf(tenant: string, action: string, parts: () => readonly KeyPart[], sent: unknown) {
  try {
    return operationKey({ tenant, action, parts: parts() });
  } catch (error) {
    // The tenant is the application's setting, told as such already.
    if (!(error instanceof InvalidValueError) || error.path === "tenant") throw error;
    if (sent !== undefined) canonicalJson(sent, "args");
    if (/^key\b/.test(error.path)) throw error;
    throw new InvalidValueError("key", `${error.path}: ${error.reason}`);
  }
}

/**
 * A replay of work this very tool call did (its id the actor that completed the operation): a
 * framework that runs a call again with its id (a LangGraph graph resumed after an interrupt
 * re-runs the whole node) reads that the same call did it, not another. The audit trail says so:
 * a result holds no actor. Read only for a replayed success, answered by the call's deadline;
 * the outcome as it was when it cannot be read (the ledger's answer is known, this is its wording).
 */
async function sameCallReplay(
  ledger: Ledger,
  call: { readonly tenant: string; readonly actor: string; readonly callId: string },
  result: RunResult<unknown>,
  outcome: Outcome,
  deadline: AbortSignal,
): Promise<Outcome> {
  if (result.status !== "succeeded" || !result.replayed || outcome.status !== "already_done") return outcome;
  if (result.resolution || deadline.aborted) return outcome; // a person's verdict is theirs, not a call's
  let onDeadline: (() => void) | undefined;
  const late = new Promise<false>((resolve) => {
    onDeadline = () => resolve(false);
    deadline.addEventListener("abort", onDeadline, { once: true });
  });
  try {
    const read = ledger
      .get({ tenant: call.tenant, id: result.operationId })
      // The transition to succeeded that carries the receipt replayed: the attempt that did the work.
      .then(({ events }) =>
        events.some((e) => e.to === "succeeded" && e.attempt === result.attempt && e.actor === call.actor),
      )
      .catch(() => false);
    if (!(await Promise.race([read, late]))) return outcome;
  } finally {
    if (onDeadline) deadline.removeEventListener("abort", onDeadline);
  }
  return {
    ...outcome,
    message: `Already done earlier by this same tool call (${call.callId}), before it was run again; not repeated (operation ${result.operationId}).`,
  };
}

/** The action without its input schema, whose output its args already are. */
function withoutInput<A, R>(action: Action<A, R, any>): Action<A, R> {
  const { input: _applied, ...rest } = action;
  return rest;
}

/** The key's label for a sentence: its parts, hashed (sensitive) ones as "…". */
function readable(label: string): string {
  const parts = JSON.parse(label) as unknown[];
  return parts
    .map((p) => (typeof p === "string" ? (/^sha256:[0-9a-f]{64}$/.test(p) ? "…" : p) : JSON.stringify(p)))
    .join(" ");
}
