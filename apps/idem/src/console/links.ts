/**
 * Where an operator can see the effect at the provider itself. Stripe: the dashboard's search
 * finds an object by id in either mode, or, without a receipt, by our key in its metadata. Email
 * and HubSpot have no page to link to: the provider reference (Message-ID, external id) is shown.
 */
import type { Operation } from "@idem/core";

export function providerLink(o: Operation): { url: string; label: string } | undefined {
  if (!o.action.startsWith("stripe.")) return undefined;
  const receipt = (o.result ?? {}) as { id?: unknown };
  const query = typeof receipt.id === "string" ? receipt.id : o.key;
  return {
    url: `https://dashboard.stripe.com/search?query=${encodeURIComponent(query)}`,
    label: "Find it in the Stripe dashboard",
  };
}
