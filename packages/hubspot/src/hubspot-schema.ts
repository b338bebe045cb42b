/**
 * Creates the unique-value property that carries operation keys on the object types in use, when
 * it is missing; safe to run again and by several processes at once (a 409 means another created it).
 */
import { HUBSPOT_CALL_OPTIONS, type createHubSpotClient } from "./hubspot-client.js";

type Api = ReturnType<typeof createHubSpotClient>;

export async function ensureUniqueProperty(
  api: Api,
  objectType: string,
  name: string,
  groupName: string,
): Promise<"created" | "present"> {
  const existing = await getProperty(api, objectType, name);
  if (existing) {
    if (!existing.hasUniqueValue)
      throw new Error(`${objectType}.${name} exists but is not a unique-value property; idem needs one`);
    return "present";
  }
  try {
    await api.properties.coreApi.create(
      objectType,
      {
        name,
        label: "idem external id",
        description: "Operation key written by idem; makes creates idempotent",
        type: "string" as never,
        fieldType: "text" as never,
        groupName,
        hasUniqueValue: true,
      },
      HUBSPOT_CALL_OPTIONS,
    );
    return "created";
  } catch (e) {
    if ((e as { code?: unknown }).code === 409) return "present"; // created concurrently
    throw e;
  }
}

async function getProperty(api: Api, objectType: string, name: string) {
  try {
    return await api.properties.coreApi.getByName(objectType, name, undefined, undefined, HUBSPOT_CALL_OPTIONS);
  } catch (e) {
    if ((e as { code?: unknown }).code === 404) return undefined;
    throw e;
  }
}
