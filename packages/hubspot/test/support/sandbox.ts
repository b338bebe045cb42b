/**
 * The HubSpot sandbox as the adapter's tests start it, the adapter's actions pointed at it, and the
 * small fixtures its suites share. Each suite starts a sandbox of its own on a free port (its
 * records, faults and requests are its own) and closes it after its tests.
 */
import { HubSpotSandbox, type PropertyDef } from "@idem/sandbox";
import { hubspotActions, type HubSpotActions, type HubSpotConfig } from "@idem/hubspot";

/** Where a started sandbox listens, and the token it takes. */
export interface SandboxServer {
  readonly basePath: string;
  readonly accessToken: string;
}

/**
 * Starts a sandbox with the key property (`idem_external_id`, unique-value) on `objectTypes`,
 * made by the adapter's own ensureSchema; the caller closes it (`sandbox.close()`).
 */
export async function startSandbox(
  objectTypes: readonly string[] = [],
): Promise<{ sandbox: HubSpotSandbox; server: SandboxServer }> {
  const sandbox = new HubSpotSandbox();
  const server = await sandbox.start();
  if (objectTypes.length > 0) await actionsOn(server).ensureSchema(objectTypes);
  return { sandbox, server };
}

/** The adapter's actions on `server`, with `extra` over the defaults. */
export function actionsOn(server: SandboxServer, extra: Partial<HubSpotConfig> = {}): HubSpotActions {
  return hubspotActions({ accessToken: server.accessToken, basePath: server.basePath, ...extra });
}

/** Tenant names, a new one per call: `prefix`, a count, and a random part (ledgers outlive a run). */
export function tenants(prefix: string): () => string {
  let n = 0;
  return () => `${prefix}${++n}-${Math.random().toString(36).slice(2, 7)}`;
}

/**
 * A property made in the sandbox where it has none of the name: a text property, not
 * unique-value, unless `definition` says otherwise.
 */
export function property(
  sandbox: HubSpotSandbox,
  objectType: string,
  name: string,
  definition: Partial<PropertyDef> = {},
): void {
  if (!sandbox.crm.getProperty(objectType, name))
    sandbox.crm.createProperty(objectType, {
      name,
      label: name,
      type: "string",
      fieldType: "text",
      groupName: `${objectType}information`,
      hasUniqueValue: false,
      ...definition,
    });
}

/** A text property that is not unique-value (as an operator might configure a key's by mistake). */
export function plainProperty(sandbox: HubSpotSandbox, objectType: string, name: string): void {
  property(sandbox, objectType, name);
}
