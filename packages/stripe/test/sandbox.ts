/** The Stripe sandbox as the adapter's tests start it, and the adapter's actions pointed at it. */
import { StripeSandbox } from "@idem/sandbox";
import { stripeActions, type StripeActions } from "@idem/stripe";

/** Where a started sandbox listens, and the API key it takes. */
export interface SandboxServer {
  readonly port: number;
  readonly apiKey: string;
}

/** Starts a sandbox of its own on a free port; the caller closes it (`sandbox.close()`). */
export async function startSandbox(): Promise<{ sandbox: StripeSandbox; server: SandboxServer }> {
  const sandbox = new StripeSandbox();
  return { sandbox, server: await sandbox.start() };
}

/** The adapter's actions on `server`, over plain HTTP, each request given 5 s. */
export function actionsOn(server: SandboxServer): StripeActions {
  return stripeActions({
    apiKey: server.apiKey,
    host: "127.0.0.1",
    port: server.port,
    protocol: "http",
    timeoutMs: 5_000,
  });
}
