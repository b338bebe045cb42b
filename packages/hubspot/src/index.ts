export { hubspotActions } from "./hubspot-actions.js";
export type { HubSpotActions, HubSpotCreateArgs } from "./hubspot-actions.js";
export { classifyHubSpotError } from "./hubspot-classify.js";
export {
  HubSpotBatchInputError,
  HubSpotLookupError,
  HubSpotReadBackError,
  HubSpotResentError,
  HubSpotSchemaCreateError,
  HubSpotSchemaError,
  HubSpotSchemaReadError,
} from "./hubspot-errors.js";
export type { HubSpotBatchError, HubSpotPropertyDefinition } from "./hubspot-errors.js";
export type { HubSpotRequestEvidence } from "./hubspot-evidence.js";
export { HUBSPOT_CALL_OPTIONS, HUBSPOT_DEADLINE_MS, HUBSPOT_SETTLE_MS, createHubSpotClient } from "./hubspot-client.js";
export type { HubSpotConfig } from "./hubspot-client.js";
export { hubspotReceiptSchema } from "./hubspot-receipt.js";
export type { HubSpotReceipt } from "./hubspot-receipt.js";
export { hubspotTools } from "./hubspot-tools.js";
export type { HubSpotContactInput } from "./hubspot-tools.js";
