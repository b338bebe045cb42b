/**
 * OpenTelemetry traces, when the application has `@opentelemetry/api` (an optional peer): a span
 * per guarded call (`idem.run`) and per settlement (`idem.settle`), with child spans for the
 * claim, the provider call and the completion. Without the package, or without an SDK
 * registered, no span is made (the caller's context is the one `execute` runs in). Attributes
 * name the operation, never its args or receipt.
 */

/** Span attributes, as OpenTelemetry's `Attributes` (named here so our published types need no @opentelemetry/api). */
export type Attributes = Record<string, string | number | boolean>;

/** What we do with a span: OpenTelemetry's `Span`, the few methods used. */
export interface Span {
  setAttributes(attributes: Attributes): unknown;
}

interface OtelSpan extends Span {
  recordException(exception: Error | string): void;
  setStatus(status: { code: number; message?: string }): unknown;
  end(): void;
}

interface OtelTracer {
  startActiveSpan<T>(name: string, options: { attributes: Attributes }, fn: (span: OtelSpan) => T): T;
}

type Api = typeof import("@opentelemetry/api");

export interface Tracing {
  /** Runs `fn` in a span (the active one for spans opened inside it); an error ends the span as an error. */
  span<T>(name: string, attributes: Attributes, fn: (span: Span | undefined) => Promise<T>): Promise<T>;
  /** Whether a span made now would be recorded (an SDK is registered): else a call may skip them. */
  recording(): boolean;
}

const NAME = "@idem/core";
const NONE: Tracing = { span: (_name, _attributes, fn) => fn(undefined), recording: () => false };

let loaded: Promise<Tracing> | undefined;

/** The process's tracing, loaded once: `@opentelemetry/api` if installed, else no-ops. */
export function tracing(): Promise<Tracing> {
  // webpackIgnore: a bundler must not try to resolve an optional peer that may be absent.
  loaded ??= import(/* webpackIgnore: true */ "@opentelemetry/api").then(withApi, () => NONE);
  return loaded;
}

function withApi(api: Api): Tracing {
  const error = api.SpanStatusCode.ERROR;
  return {
    recording: () => activeTracer(api) !== undefined,
    span: (name, attributes, fn) => {
      const tracer = activeTracer(api);
      if (!tracer) return fn(undefined);
      return tracer.startActiveSpan(name, { attributes }, async (span) => {
        try {
          return await fn(span);
        } catch (e) {
          span.recordException(e instanceof Error ? e : String(e));
          span.setStatus({ code: error, message: e instanceof Error ? e.message : String(e) });
          throw e;
        } finally {
          span.end();
        }
      });
    },
  };
}

/**
 * The registered SDK's tracer, looked up at each span (an SDK may be registered, or replaced,
 * after the ledger opened), or none: without an SDK every span is a no-op, and making no-op spans
 * and their contexts cost 1-2 µs each, about a seventh of a replay.
 */
function activeTracer(api: Api): OtelTracer | undefined {
  const provider: { getTracer(name: string): OtelTracer; getDelegateTracer?(name: string): OtelTracer | undefined } =
    api.trace.getTracerProvider();
  // The API's proxy, whichever copy of the API (its CommonJS or ESM build) registered it.
  if (typeof provider.getDelegateTracer === "function") return provider.getDelegateTracer(NAME);
  return provider.getTracer(NAME);
}

/** What a result says about the call, as span attributes. */
export function resultAttributes(result: {
  status: string;
  operationId: string;
  attempt: number;
  replayed?: boolean;
  state?: string;
}): Attributes {
  return {
    "idem.operation.id": result.operationId,
    "idem.status": result.status === "pending_verification" ? `pending_verification:${result.state}` : result.status,
    "idem.attempt": result.attempt,
    "idem.replayed": result.replayed === true,
  };
}
