/**
 * What makes a message findable and recognisable: a Message-ID and a short reference derived
 * from the operation key, the same for every attempt of the operation.
 */

const BASE32 = "ABCDEFGHJKMNPQRSTVWXYZ0123456789"; // no I, L, O, U: easy to read aloud

/** `<idem.{first 40 hex of the key}@{domain}>`: deterministic, unique per operation. */
export function messageIdFor(key: string, domain: string): string {
  return `<idem.${key.slice(0, 40)}@${domain}>`;
}

/** 8 characters a person can compare between two emails to spot a duplicate. */
export function referenceFor(key: string): string {
  let out = "";
  for (let i = 0; i < 8; i++) out += BASE32[parseInt(key.slice(i * 2, i * 2 + 2), 16) % 32];
  return out;
}

export function domainOf(address: string): string {
  const at = address.lastIndexOf("@");
  const domain = address
    .slice(at + 1)
    .replace(/>.*$/, "")
    .trim();
  if (at < 0 || !domain) throw new Error(`cannot take a Message-ID domain from "${address}"; set messageIdDomain`);
  return domain;
}
