/**
 * `trickle_after_commit`, shared by the Stripe and HubSpot sandboxes: the write commits once, the
 * answer's head goes out, then its body a byte at a time, never ended, until the client goes or
 * the sandbox closes. Over HTTP as the SDKs send (theirs would wait for ever: each byte resets
 * their inactivity timeout; packages/stripe and packages/hubspot test their deadlines).
 */
import { describe, expect, it } from "vitest";
import { HubSpotSandbox, StripeSandbox } from "@idem/sandbox";
import { scaled } from "@idem/testkit";

interface Target {
  readonly sandbox: StripeSandbox | HubSpotSandbox;
  /** Sends the write the fault is armed on. */
  write(signal: AbortSignal): Promise<Response>;
  /** Writes committed at the target. */
  count(): number;
}

async function stripe(): Promise<Target> {
  const sandbox = new StripeSandbox();
  const { url, apiKey } = await sandbox.start();
  sandbox.faults.add({ kind: "trickle_after_commit", match: { method: "POST", path: "/v1/customers" } });
  return {
    sandbox,
    write: (signal) =>
      fetch(`${url}/v1/customers`, {
        method: "POST",
        headers: {
          authorization: `Bearer ${apiKey}`,
          "content-type": "application/x-www-form-urlencoded",
          "idempotency-key": "trickle-1",
        },
        body: "email=trickle%40example.com",
        signal,
      }),
    count: () => sandbox.count("customers"),
  };
}

async function hubspot(): Promise<Target> {
  const sandbox = new HubSpotSandbox();
  const { basePath, accessToken } = await sandbox.start();
  sandbox.faults.add({ kind: "trickle_after_commit", match: { method: "POST" } });
  return {
    sandbox,
    write: (signal) =>
      fetch(`${basePath}/crm/v3/objects/companies`, {
        method: "POST",
        headers: { authorization: `Bearer ${accessToken}`, "content-type": "application/json" },
        body: JSON.stringify({ properties: { name: "Trickle Ltd" } }),
        signal,
      }),
    count: () => sandbox.count("companies"),
  };
}

describe.each([
  ["Stripe", stripe, 200],
  ["HubSpot", hubspot, 201],
] as const)("%s sandbox, trickle_after_commit", (_name, open, status) => {
  it("commits once, sends the head and then spaces, until the client goes", async () => {
    const target = await open();
    try {
      const abort = new AbortController();
      const res = await target.write(abort.signal);
      const first = await res.body!.getReader().read();
      expect({ status: res.status, first: Buffer.from(first.value!).toString() }).toEqual({
        status,
        first: expect.stringMatching(/^ +$/),
      });
      expect(target.count()).toBe(1);
      expect(target.sandbox.trickling.count).toBe(1);
      abort.abort();
      expect(await target.sandbox.trickling.countAfter(scaled(5_000))).toBe(0);
    } finally {
      await target.sandbox.close();
    }
  });

  it("ends a trickling answer when the sandbox closes", async () => {
    const target = await open();
    try {
      const res = await target.write(AbortSignal.timeout(scaled(30_000)));
      const body = res.body!.getReader();
      await body.read();
      await target.sandbox.close();
      // The connection ended with the body unfinished: an error, never a complete answer.
      await expect(body.read()).rejects.toThrow();
      expect(target.sandbox.trickling.count).toBe(0);
      expect(target.count()).toBe(1);
    } finally {
      await target.sandbox.close();
    }
  });
});

it("HubSpot sandbox, trickle_after_commit on an answer with no body (204): it goes out whole", async () => {
  const sandbox = new HubSpotSandbox();
  const { basePath, accessToken } = await sandbox.start();
  const headers = { authorization: `Bearer ${accessToken}`, "content-type": "application/json" };
  try {
    const made = (await (
      await fetch(`${basePath}/crm/v3/objects/companies`, {
        method: "POST",
        headers,
        body: JSON.stringify({ properties: { name: "Archived Ltd" } }),
      })
    ).json()) as { id: string };
    sandbox.faults.add({ kind: "trickle_after_commit", match: { method: "DELETE" } });
    // Before the fix: nothing went out (a 204 takes no byte of body, and its head waited for one),
    // an answer that never came rather than one that never ended.
    const res = await fetch(`${basePath}/crm/v3/objects/companies/${made.id}`, {
      method: "DELETE",
      headers,
      signal: AbortSignal.timeout(scaled(10_000)),
    });
    expect(res.status).toBe(204);
    expect(sandbox.trickling.count).toBe(0);
  } finally {
    await sandbox.close();
  }
});
