/** The Stripe sandbox as its tests start it: on a free port, with the real stripe SDK pointed at it. */
import Stripe from "stripe";
import { StripeSandbox } from "@idem/sandbox";

export interface StartedStripeSandbox {
  readonly sandbox: StripeSandbox;
  /** stripe-node on the sandbox: no retries of its own (each request is one the test sees), 3 s timeout. */
  readonly client: Stripe;
  readonly port: number;
  readonly apiKey: string;
}

/** Starts a sandbox of its own; the caller closes it (`sandbox.close()`). */
export async function startStripeSandbox(): Promise<StartedStripeSandbox> {
  const sandbox = new StripeSandbox();
  const { port, apiKey } = await sandbox.start();
  const client = new Stripe(apiKey, {
    host: "127.0.0.1",
    port,
    protocol: "http",
    maxNetworkRetries: 0,
    timeout: 3_000,
  });
  return { sandbox, client, port, apiKey };
}
