/**
 * The adapters of the crash matrix, built the same way in the test and in its worker processes,
 * from the sandboxes' ports (passed in the environment to the workers).
 */
import { defineAction, type Action, type ActionDefinition, type LookupContract } from "@idem/core";
import { emailActions } from "@idem/email";
import { hubspotActions } from "@idem/hubspot";
import { stripeActions } from "@idem/stripe";

export const ADAPTERS = ["stripe", "email-provider-saves", "email-journal", "email-append", "hubspot"] as const;
export type Adapter = (typeof ADAPTERS)[number];
export const POINTS = ["claim", "accepted", "response"] as const;
export type CrashPoint = (typeof POINTS)[number] | "none";

export interface Ports {
  stripePort: number;
  stripeKey: string;
  smtpPort: number;
  imapPort: number;
  hubspotBase: string;
  hubspotToken: string;
  mailUser: string;
  mailPass: string;
  journalUser: string;
  journalPass: string;
}

export function actionFor(adapter: Adapter, p: Ports, timeoutMs = 120_000): Action<any, any> {
  switch (adapter) {
    case "stripe":
      return stripeActions({ apiKey: p.stripeKey, host: "127.0.0.1", port: p.stripePort, protocol: "http", timeoutMs })
        .paymentIntentsCreate;
    case "hubspot":
      // A short settle window, as email's below: the sandbox applies a write before it answers.
      return hubspotActions({ accessToken: p.hubspotToken, basePath: p.hubspotBase, settleMs: 300 }).create("contacts");
    default: {
      const auth = { user: p.mailUser, pass: p.mailPass };
      const mode = adapter.slice("email-".length) as "provider-saves" | "journal" | "append";
      return emailActions({
        smtp: { host: "127.0.0.1", port: p.smtpPort, auth, timeoutMs, requireTLS: false }, // the sandbox has no TLS
        imap: { host: "127.0.0.1", port: p.imapPort, auth, requireTLS: false },
        from: auth.user,
        copy:
          mode === "journal"
            ? {
                mode,
                address: p.journalUser,
                imap: {
                  host: "127.0.0.1",
                  port: p.imapPort,
                  auth: { user: p.journalUser, pass: p.journalPass },
                  requireTLS: false,
                },
              }
            : { mode },
        settleMs: 300,
      }).send;
    }
  }
}

/** `tenant`: each cell's own, so that its contact's email (unique at HubSpot) is its own. */
export function argsFor(adapter: Adapter, tenant: string): unknown {
  if (adapter === "stripe")
    return {
      amount: 2500,
      currency: "usd",
      payment_method: "pm_card_visa",
      confirm: true,
      automatic_payment_methods: { enabled: true, allow_redirects: "never" },
    };
  if (adapter === "hubspot") return { properties: { email: `lead-${tenant}@example.test` } };
  return { to: "client@example.test", subject: "Crash matrix", text: "once" };
}

/**
 * The same action with a crash point in the worker: `onPoint` runs (and never returns) right after
 * the claim committed (before anything is sent), or after the provider's answer arrived (before
 * the completion commits). The "accepted" point is set at the server, which holds its answer.
 */
export function withCrashPoint<A, R>(
  action: Action<A, R>,
  point: CrashPoint,
  onPoint: () => Promise<never>,
): Action<A, R> {
  return defineAction<A, R>({
    ...action,
    async execute(args, op) {
      if (point === "claim") await onPoint();
      const receipt = await action.execute(args, op);
      if (point === "response") await onPoint();
      return receipt;
    },
    // The wrapped action kept its lookup contract; only its execute changes.
  } as ActionDefinition<A, R> & LookupContract<A, R>);
}
