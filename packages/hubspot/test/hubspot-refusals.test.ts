/**
 * What HubSpot refuses, and what the adapter must not take for success or for proof: a key
 * property that is not unique-value (create mode and the lookup rest on HubSpot refusing a second
 * record; upsert mode's refusal of it alike), an upsert refused for the caller's data while our
 * record exists, a lookup refused (429, 401, 403), and a server certificate we do not trust. The
 * real @hubspot/api-client over HTTP to the HubSpot sandbox, on SQLite and Postgres.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { openLedger, operationKey, type Ledger, type LedgerOptions } from "@idem/core";
import type { HubSpotSandbox } from "@idem/sandbox";
import { DIALECTS, ledgersFor } from "@idem/testkit";
import {
  HUBSPOT_CALL_OPTIONS,
  HubSpotSchemaError,
  classifyHubSpotError,
  createHubSpotClient,
  hubspotActions,
  type HubSpotConfig,
} from "@idem/hubspot";
import { holdingProxy } from "./support/holding-proxy.js";
import { untrustedServer, type UntrustedServer } from "@idem/testkit";
import { actionsOn, plainProperty, property, type SandboxServer, startSandbox, tenants } from "./support/sandbox.js";

let sandbox: HubSpotSandbox;
let server: SandboxServer;
let untrusted: UntrustedServer;
beforeAll(async () => {
  ({ sandbox, server } = await startSandbox(["contacts", "companies", "deals"]));
  untrusted = await untrustedServer();
});
afterAll(async () => {
  await untrusted.close();
  await sandbox.close();
});

const crm = (extra: Partial<HubSpotConfig> = {}) => actionsOn(server, extra);
const tenant = tenants("r");

describe("ensureSchema", () => {
  it("a property of the name that is not unique-value: a HubSpotSchemaError naming it, with HubSpot's definition of it, alerted", async () => {
    plainProperty(sandbox, "deals", "crm_ref");
    const error = await crm({ uniqueProperty: "crm_ref" })
      .ensureSchema(["deals"])
      .catch((e: unknown) => e);
    // Before: a plain Error "deals.crm_ref exists but is not a unique-value property; idem needs one".
    expect(error).toMatchObject({
      name: "HubSpotSchemaError",
      objectType: "deals",
      property: "crm_ref",
      problem: "not_unique",
      definition: { name: "crm_ref", type: "string", fieldType: "text", hasUniqueValue: false },
      message: expect.stringMatching(
        /^deals\.crm_ref exists but is not a unique-value property \(.*hasUniqueValue: false/,
      ),
    });
    expect(error).toBeInstanceOf(HubSpotSchemaError);
    expect(classifyHubSpotError(error)).toMatchObject({ kind: "permanent", alert: true });
  });
});

for (const dialect of DIALECTS) {
  describe(`HubSpot refusals on ${dialect}`, () => {
    const db = ledgersFor(dialect, openLedger, { defaults: { poolSize: 2 } as LedgerOptions });
    const ledger = (o: LedgerOptions = {}) => db.open({ ...o });
    const keyOf = async (l: Ledger, t: string, id: string) => (await l.get({ tenant: t, id })).operation.key;
    const sentSince = (from: number, method: string, path: string) =>
      sandbox.requests.slice(from).filter((r) => r.method === method && r.path.startsWith(path));

    describe("create mode: the key's property must be unique-value", () => {
      it("a property that is not: failed with an alert naming it and the fix, before any create (a create committed late made two records)", async () => {
        plainProperty(sandbox, "deals", "erp_ref");
        // The first create reaches HubSpot only after the client timed out; the lookup (a 404 read
        // as absence) then let the create go again: two deals carried the key.
        const p = await holdingProxy(server.basePath, { method: "POST", path: "/crm/v3/objects/deals" });
        try {
          const l = await ledger({ budget: { attempts: 3, baseDelayMs: 10 } });
          const t = tenant();
          const sent = sandbox.requests.length;
          const action = crm({ basePath: p.basePath, mode: "create", uniqueProperty: "erp_ref", timeoutMs: 300 });
          const out = await l.run(action.create("deals"), {
            tenant: t,
            key: ["late"],
            args: { properties: { dealname: "Late" } },
          });
          await p.drained();
          expect(out).toMatchObject({ status: "failed", error: { kind: "permanent", alert: true } });
          expect(out.status === "failed" && out.error.reason).toMatch(
            /^deals\.erp_ref exists but is not a unique-value property .*uniqueProperty to a new name/,
          );
          const key = await keyOf(l, t, out.operationId);
          expect(sandbox.crm.all("deals").filter((r) => r.properties.erp_ref === key)).toHaveLength(0);
          expect(sentSince(sent, "POST", "/crm/v3/objects/deals")).toEqual([]);
        } finally {
          await p.close();
        }
      });

      it("control: the same late commit with the unique-value property leaves one record", async () => {
        const p = await holdingProxy(server.basePath, { method: "POST", path: "/crm/v3/objects/deals" });
        try {
          const l = await ledger({ budget: { attempts: 3, baseDelayMs: 10 } });
          const t = tenant();
          const action = crm({ basePath: p.basePath, mode: "create", timeoutMs: 300 }).create("deals");
          const out = await l.run(action, { tenant: t, key: ["late-unique"], args: { properties: { dealname: "L" } } });
          await p.drained();
          const key = await keyOf(l, t, out.operationId);
          expect(sandbox.crm.all("deals").filter((r) => r.properties.idem_external_id === key)).toHaveLength(1);
        } finally {
          await p.close();
        }
      });

      it("the property's definition is read once per process, not per call", async () => {
        const l = await ledger();
        const t = tenant();
        const action = crm({ mode: "create" }).create("deals");
        const sent = sandbox.requests.length;
        for (const k of ["once-1", "once-2", "once-3"])
          expect(await l.run(action, { tenant: t, key: [k], args: { properties: { dealname: k } } })).toMatchObject({
            status: "succeeded",
            receipt: { new: true },
          });
        expect(sentSince(sent, "GET", "/crm/v3/properties/deals/idem_external_id")).toHaveLength(1);
      });

      it("the property deleted since its check was kept: HubSpot's 400 (no such property) fails with an alert naming it, and the next call reads the definition again", async () => {
        const name = `ref_gone_${dialect}`;
        sandbox.crm.createProperty("companies", {
          name,
          label: name,
          type: "string",
          fieldType: "text",
          groupName: "companyinformation",
          hasUniqueValue: true,
        });
        const l = await ledger({ budget: { attempts: 1 } });
        const t = tenant();
        const action = crm({ mode: "create", uniqueProperty: name }).create("companies");
        expect(await l.run(action, { tenant: t, key: ["one"], args: { properties: { name: "One" } } })).toMatchObject({
          status: "succeeded",
        });
        // An admin deletes the property in HubSpot; this process keeps its verdict "unique-value".
        await createHubSpotClient(server).properties.coreApi.archive("companies", name, HUBSPOT_CALL_OPTIONS);
        const before = sandbox.count("companies");
        const out = await l.run(action, { tenant: t, key: ["two"], args: { properties: { name: "Two" } } });
        // Before: unknown (the read back by the missing property was refused 400: "may be ours"), then a person.
        expect(out).toMatchObject({ status: "failed", error: { kind: "permanent", alert: true } });
        expect(out.status === "failed" && out.error.reason).toMatch(
          new RegExp(`^companies\\.${name} does not exist: .*ensureSchema\\(\\["companies"\\]\\)`),
        );
        expect(sandbox.count("companies")).toBe(before);
        const { events } = await l.get({ tenant: t, id: out.operationId });
        expect(events.map((e) => `${e.from}->${e.to}`)).toEqual(["null->running", "running->failed"]);
        // The verdict was dropped: the next call reads the definition again, and sends nothing.
        const sent = sandbox.requests.length;
        expect(
          await l.run(action, { tenant: t, key: ["three"], args: { properties: { name: "Three" } } }),
        ).toMatchObject({ status: "failed", error: { kind: "permanent", alert: true } });
        expect(sentSince(sent, "GET", `/crm/v3/properties/companies/${name}`)).toHaveLength(1);
        expect(sentSince(sent, "POST", "/crm/v3/objects/companies")).toEqual([]);
      });

      it("the definition's read failing (502): nothing sent, pending, then created once", async () => {
        const l = await ledger({ budget: { attempts: 2, baseDelayMs: 10 } });
        const t = tenant();
        sandbox.faults.add({ kind: "bad_gateway", match: { method: "GET", path: "/crm/v3/properties/deals/" } });
        const out = await l
          .run(crm({ mode: "create" }).create("deals"), {
            tenant: t,
            key: ["schema-502"],
            args: { properties: { dealname: "Schema read failed" } },
          })
          .finally(() => sandbox.faults.clear());
        expect(out).toMatchObject({ status: "succeeded", receipt: { new: true } });
        const { events } = await l.get({ tenant: t, id: out.operationId });
        // Transient, not unknown: the read is a GET, and no create had been sent.
        expect(events.map((e) => `${e.from}->${e.to}`)).toEqual([
          "null->running",
          "running->pending",
          "pending->running",
          "running->succeeded",
        ]);
        expect(events[1]!.reason).toMatch(
          /^transient: not sent: reading the definition of deals\.idem_external_id failed: 502 SERVICE_UNAVAILABLE/,
        );
        const key = await keyOf(l, t, out.operationId);
        expect(sandbox.crm.all("deals").filter((r) => r.properties.idem_external_id === key)).toHaveLength(1);
      });

      it("an unknown create whose property is no longer unique-value: to a person, not 'proven absent'", async () => {
        const name = `ref_${dialect}`;
        sandbox.crm.createProperty("deals", {
          name,
          label: name,
          type: "string",
          fieldType: "text",
          groupName: "dealinformation",
          hasUniqueValue: true,
        });
        const l = await ledger({ budget: { attempts: 1 } });
        const t = tenant();
        sandbox.faults.add({ kind: "drop_after_commit", match: { method: "POST", path: "/crm/v3/objects/deals" } });
        sandbox.faults.add({
          kind: "bad_gateway",
          match: { method: "GET", path: "/crm/v3/objects/deals/" },
          times: 100,
        });
        const out = await l
          .run(crm({ mode: "create", uniqueProperty: name }).create("deals"), {
            tenant: t,
            key: ["no-longer-unique"],
            args: { properties: { dealname: "Unknown" } },
          })
          .finally(() => sandbox.faults.clear());
        expect(out).toMatchObject({ status: "pending_verification", state: "unknown" });
        // The property made again since as a plain one: HubSpot refuses reads by it, and a
        // second record could carry the key. No read by it proves the record absent.
        sandbox.crm.getProperty("deals", name)!.hasUniqueValue = false;
        const daemon = await ledger({ actions: [crm({ mode: "create", uniqueProperty: name }).create("deals")] });
        expect(await daemon.daemon.settle({ tenant: t, id: out.operationId })).toMatchObject({
          state: "needs_review",
        });
        const { operation } = await l.get({ tenant: t, id: out.operationId });
        expect(operation.reason).toMatch(
          new RegExp(`deals\\.${name} exists but is not a unique-value property .*cannot prove a record absent`),
        );
      });
    });

    // Our record there before the operation is found by the upsert's read by the key, and nothing
    // is sent (hubspot.test.ts). When that read fails, the upsert is sent as before:
    describe("upsert: a refusal of the caller's data is not our record's success", () => {
      /** The upsert's read by the key before it is sent fails (502): it proves nothing, and the upsert goes. */
      const readBeforeFails = () =>
        sandbox.faults.add({ kind: "bad_gateway", match: { method: "GET", path: "/crm/v3/objects/contacts/" } });

      it("our record exists, another contact holds the email (409 naming it): failed with HubSpot's message", async () => {
        const l = await ledger();
        const t = tenant();
        const key = operationKey({ tenant: t, action: "hubspot.contacts.create", parts: ["taken"] }).hash;
        // Our record (an earlier run's, its email changed since in the CRM), and another contact that holds the email now.
        const ours = sandbox.crm.create("contacts", { email: `old-${t}@example.test`, idem_external_id: key });
        const other = sandbox.crm.create("contacts", { email: `new-${t}@example.test`, firstname: "Grace" });
        readBeforeFails();
        const out = await l
          .run(crm({ mode: "upsert" }).create("contacts"), {
            tenant: t,
            key: ["taken"],
            args: { properties: { email: `new-${t}@example.test`, firstname: "Ada" } },
          })
          .finally(() => sandbox.faults.clear());
        // Before: succeeded with our record, whose email is not the one asked for (HubSpot wrote nothing).
        expect(out).toMatchObject({ status: "failed", error: { kind: "permanent" } });
        expect(out.status === "failed" && out.error.reason).toBe(
          `409 OBJECT_ALREADY_EXISTS: Contact already exists. Existing ID: ${other.id}`,
        );
        expect(sandbox.crm.get("contacts", ours.id)!.properties.email).toBe(`old-${t}@example.test`);
        expect(sandbox.crm.get("contacts", other.id)!.properties.firstname).toBe("Grace");
      });

      it("our record exists, the values are invalid (207 VALIDATION_ERROR): failed, not read back", async () => {
        const l = await ledger();
        const t = tenant();
        const key = operationKey({ tenant: t, action: "hubspot.contacts.create", parts: ["b207"] }).hash;
        const ours = sandbox.crm.create("contacts", { email: `b207-${t}@example.test`, idem_external_id: key });
        readBeforeFails();
        const sent = sandbox.requests.length;
        const out = await l
          .run(crm({ mode: "upsert" }).create("contacts"), {
            tenant: t,
            key: ["b207"],
            args: { properties: { email: `not-an-address-${t}`, firstname: "Ada" } },
          })
          .finally(() => sandbox.faults.clear());
        expect(out).toMatchObject({ status: "failed", error: { kind: "permanent" } });
        expect(out.status === "failed" && out.error.reason).toMatch(
          new RegExp(`^207 VALIDATION_ERROR: .*Email address not-an-address-${t} is invalid`),
        );
        // The read that failed, the upsert, and no read back.
        expect(sandbox.requests.slice(sent).map((r) => `${r.method} ${r.status}`)).toEqual(["GET 502", "POST 207"]);
        expect(sandbox.crm.get("contacts", ours.id)!.properties.email).toBe(`b207-${t}@example.test`);
      });
    });

    // HubSpot refuses a value not among an enumeration's options (400 VALIDATION_ERROR, INVALID_OPTION;
    // a batch answers it per input, 207), as the sandbox now does: the caller's data, nothing written.
    for (const [mode, status] of [
      ["upsert", "207"],
      ["create", "400"],
    ] as const)
      it(`${mode}: a value not among an enumeration's options: failed with HubSpot's words, nothing written`, async () => {
        property(sandbox, "deals", "deal_tier", {
          type: "enumeration",
          fieldType: "select",
          options: ["gold", "silver"].map((value) => ({ label: value, value })),
        });
        const l = await ledger();
        const t = tenant();
        const out = await l.run(crm({ mode }).create("deals"), {
          tenant: t,
          key: ["tier"],
          args: { properties: { dealname: "Tin deal", deal_tier: "tin" } },
        });
        expect(out).toMatchObject({ status: "failed", error: { kind: "permanent" } });
        expect(out.status === "failed" && out.error.reason).toMatch(
          new RegExp(`^${status} VALIDATION_ERROR: .*tin was not one of the allowed options: \\[gold, silver\\]`),
        );
        const key = await keyOf(l, t, out.operationId);
        expect(sandbox.crm.all("deals").filter((r) => r.properties.idem_external_id === key)).toEqual([]);
      });

    describe("upsert mode: the key's property must be unique-value, as in create mode", () => {
      for (const [what, property, problem, definition] of [
        ["not unique-value", "plain_ref", "exists but is not a unique-value property", "GET 200"],
        ["missing (ensureSchema never run for it)", "erp_missing", "does not exist", "GET 404"],
      ] as const)
        it(`a property ${what}: HubSpot's 400 fails with an alert naming it and the fix, HubSpot's refusal kept as the cause`, async () => {
          plainProperty(sandbox, "companies", "plain_ref");
          const l = await ledger();
          const t = tenant();
          const sent = sandbox.requests.length;
          const out = await l.run(crm({ mode: "upsert", uniqueProperty: property }).create("companies"), {
            tenant: t,
            key: ["plain"],
            args: { properties: { name: "Plain Ltd" } },
          });
          // Before: failed permanent with HubSpot's message alone, no alert: every call of every key
          // failed alike, and no one heard of it.
          expect(out).toMatchObject({ status: "failed", error: { kind: "permanent", alert: true } });
          expect(out.status === "failed" && out.error.reason).toMatch(
            new RegExp(`^companies\\.${property} ${problem}[ :].*ensureSchema\\(\\["companies"\\]\\)`),
          );
          // The read by the key is refused alike (it proves nothing, the upsert goes); the upsert's
          // refusal names the property (HubSpot's words), and its definition, read then, says why.
          const requests = sandbox.requests.slice(sent);
          expect(requests.map((r) => `${r.method} ${r.status}`)).toEqual(["GET 400", "POST 400", definition]);
          expect(requests[2]!.path).toBe(`/crm/v3/properties/companies/${property}`);
        });

      it("a validation refusal that does not name the key's property reads no definition: the caller's data", async () => {
        const l = await ledger();
        const t = tenant();
        const sent = sandbox.requests.length;
        const out = await l.run(crm({ mode: "upsert" }).create("companies"), {
          tenant: t,
          key: ["unknown-prop"],
          args: { properties: { name: "Acme", no_such_property: "x" } },
        });
        expect(out).toMatchObject({ status: "failed", error: { kind: "permanent" } });
        expect(out).not.toMatchObject({ error: { alert: true } });
        expect(sandbox.requests.slice(sent).map((r) => r.method)).toEqual(["GET", "POST"]);
      });
    });

    describe("a refused create whose read-back fails: unknown, as HubSpot's read answered", () => {
      /** A create of a deal whose record (an earlier attempt's) exists, the read-back answered with `fault`. */
      async function refusedThenRead(fault: "rate_limit" | "missing_scopes", key: string) {
        const l = await ledger({ budget: { attempts: 1 } });
        const t = tenant();
        const hash = operationKey({ tenant: t, action: "hubspot.deals.create", parts: [key] }).hash;
        sandbox.crm.create("deals", { dealname: "Earlier attempt", idem_external_id: hash });
        sandbox.faults.add({ kind: fault, match: { method: "GET", path: "/crm/v3/objects/deals/" }, times: 100 });
        const out = await l
          .run(crm({ mode: "create" }).create("deals"), {
            tenant: t,
            key: [key],
            args: { properties: { dealname: "D" } },
          })
          .finally(() => sandbox.faults.clear());
        expect(out).toMatchObject({ status: "pending_verification", state: "unknown" });
        return { l, t, out, operation: (await l.get({ tenant: t, id: out.operationId })).operation };
      }

      it("a 429: its first check waits HubSpot's window", async () => {
        const { operation } = await refusedThenRead("rate_limit", "rl-readback");
        expect(operation.reason).toMatch(/the read back by idem_external_id failed \(429 RATE_LIMITS/);
        // Before: checked again in milliseconds, into the same limit.
        const waitMs = operation.nextCheckAt! - operation.updatedAt;
        expect(waitMs).toBeGreaterThanOrEqual(10_000);
        expect(waitMs).toBeLessThanOrEqual(11_000);
      });

      it("a 403 (the token lacks the read scope): a person is alerted now, not once the checks run out", async () => {
        const { l, out, operation } = await refusedThenRead("missing_scopes", "scope-readback");
        expect(operation.reason).toMatch(/the read back by idem_external_id failed \(403/);
        // Before: no alert until the daemon's escalation (20 checks or 24 h), each check failing alike.
        expect((await l.daemon.alertsDue({ limit: 1_000 })).map((o) => o.id)).toContain(out.operationId);
      });
    });

    it("a 429 on the lookup: the next check waits HubSpot's ten-secondly window, as a 429 on the write does", async () => {
      const l = await ledger({ budget: { attempts: 1 } });
      const t = tenant();
      sandbox.faults.add({ kind: "drop_after_commit", match: { method: "POST", path: "/crm/v3/objects/deals" } });
      sandbox.faults.add({ kind: "bad_gateway", match: { method: "GET", path: "/crm/v3/objects/deals/" }, times: 100 });
      const out = await l
        .run(crm().create("deals"), { tenant: t, key: ["rl"], args: { properties: { dealname: "Rate limited read" } } })
        .finally(() => sandbox.faults.clear());
      expect(out).toMatchObject({ status: "pending_verification", state: "unknown" });
      sandbox.faults.add({ kind: "rate_limit", match: { method: "GET", path: "/crm/v3/objects/deals/" }, times: 100 });
      try {
        const daemon = await ledger({ actions: [crm().create("deals")] });
        expect(await daemon.daemon.settle({ tenant: t, id: out.operationId })).toMatchObject({ state: "unknown" });
      } finally {
        sandbox.faults.clear();
      }
      const { operation } = await l.get({ tenant: t, id: out.operationId });
      expect(operation.reason).toMatch(
        /^inconclusive: HubSpot read by idem_external_id failed: 429 RATE_LIMITS: .*\(policy TEN_SECONDLY_ROLLING\)/,
      );
      // Before: thrown, the check was due again in milliseconds, into the same limit.
      const waitMs = operation.nextCheckAt! - operation.updatedAt;
      expect(waitMs).toBeGreaterThanOrEqual(10_000);
      expect(waitMs).toBeLessThanOrEqual(11_000);
    });

    /** A create of a deal whose answer was lost and whose read-back failed (502): unknown. */
    async function unknownCreate(l: Ledger, t: string, key: string) {
      sandbox.faults.add({ kind: "drop_after_commit", match: { method: "POST", path: "/crm/v3/objects/deals" } });
      sandbox.faults.add({ kind: "bad_gateway", match: { method: "GET", path: "/crm/v3/objects/deals/" }, times: 100 });
      const out = await l
        .run(crm().create("deals"), { tenant: t, key: [key], args: { properties: { dealname: key } } })
        .finally(() => sandbox.faults.clear());
      expect(out).toMatchObject({ status: "pending_verification", state: "unknown" });
      return out.operationId;
    }

    describe("a lookup refused for good: alerted at once, still unknown", () => {
      it("its read by the key refused 403 (no read scope)", async () => {
        const l = await ledger({ budget: { attempts: 1 } });
        const t = tenant();
        const id = await unknownCreate(l, t, "scope");
        expect((await l.daemon.alertsDue({ limit: 1_000 })).map((o) => o.id)).not.toContain(id);
        sandbox.faults.add({
          kind: "missing_scopes",
          match: { method: "GET", path: "/crm/v3/objects/deals/" },
          times: 100,
        });
        try {
          const daemon = await ledger({ actions: [crm().create("deals")] });
          expect(await daemon.daemon.settle({ tenant: t, id })).toMatchObject({ state: "unknown" });
        } finally {
          sandbox.faults.clear();
        }
        expect((await l.get({ tenant: t, id })).operation.reason).toMatch(
          /^inconclusive: lookup failed: HubSpotLookupError: HubSpot read by idem_external_id failed: 403/,
        );
        // Before: thrown as a plain Error, classified ambiguous: no alert until the daemon's escalation.
        expect((await l.daemon.alertsDue({ limit: 1_000 })).map((o) => o.id)).toContain(id);
      });

      it("its definition's read refused 401 (the token revoked since)", async () => {
        const l = await ledger({ budget: { attempts: 1 } });
        const t = tenant();
        const id = await unknownCreate(l, t, "revoked");
        // A new process: the key property's definition is read first, and refused.
        const daemon = await ledger({ actions: [crm({ accessToken: "pat-revoked" }).create("deals")] });
        expect(await daemon.daemon.settle({ tenant: t, id })).toMatchObject({ state: "unknown" });
        expect((await l.get({ tenant: t, id })).operation.reason).toMatch(
          /^inconclusive: lookup failed: HubSpotLookupError: HubSpot read of the definition of deals\.idem_external_id failed: 401/,
        );
        expect((await l.daemon.alertsDue({ limit: 1_000 })).map((o) => o.id)).toContain(id);
      });
    });

    describe("a server certificate not trusted (a TLS-inspecting proxy, a private endpoint): nothing sent", () => {
      for (const mode of ["upsert", "create"] as const)
        it(`${mode}: failed, not sent, alerted: not "unknown", not retried`, async () => {
          const l = await ledger({ budget: { attempts: 3, baseDelayMs: 10 } });
          const t = tenant();
          const before = untrusted.requests();
          const out = await l.run(
            hubspotActions({ accessToken: "pat-x", basePath: untrusted.basePath, mode }).create("deals"),
            { tenant: t, key: ["tls"], args: { properties: { dealname: "T" } } },
          );
          expect(untrusted.requests()).toBe(before); // the handshake failed: no request reached the server
          // Before: upsert mode went unknown ("no answer from HubSpot", looked up for ever); create
          // mode's property check read "transient: not sent" and was retried; no alert either way.
          expect(out).toMatchObject({ status: "failed", attempt: 1, error: { kind: "permanent", alert: true } });
          expect(out.status === "failed" && out.error.reason).toMatch(
            /not sent: HubSpot's certificate is not trusted \(DEPTH_ZERO_SELF_SIGNED_CERT: /,
          );
        });

      it("the lookup meets it: alerted at once, still unknown", async () => {
        const l = await ledger({ budget: { attempts: 1 } });
        const t = tenant();
        const id = await unknownCreate(l, t, "tls-lookup");
        const daemon = await ledger({
          actions: [hubspotActions({ accessToken: server.accessToken, basePath: untrusted.basePath }).create("deals")],
        });
        expect(await daemon.daemon.settle({ tenant: t, id })).toMatchObject({ state: "unknown" });
        expect((await l.get({ tenant: t, id })).operation.reason).toMatch(/certificate is not trusted/);
        expect((await l.daemon.alertsDue({ limit: 1_000 })).map((o) => o.id)).toContain(id);
      });

      it("the refusal names HubSpot's host only: not the request's path or query (a read's path holds the operation key)", async () => {
        const l = await ledger({ budget: { attempts: 1 } });
        const t = tenant();
        const id = await unknownCreate(l, t, "tls-host");
        const key = await keyOf(l, t, id);
        const daemon = await ledger({
          actions: [hubspotActions({ accessToken: server.accessToken, basePath: untrusted.basePath }).create("deals")],
        });
        await daemon.daemon.settle({ tenant: t, id });
        const failed = await l.run(
          hubspotActions({ accessToken: "pat-x", basePath: untrusted.basePath }).create("deals"),
          {
            tenant: t,
            key: ["tls-host-create"],
            args: { properties: { dealname: "T" } },
          },
        );
        const host = new URL(untrusted.basePath).host;
        for (const reason of [
          (await l.get({ tenant: t, id })).operation.reason,
          failed.status === "failed" && failed.error.reason,
        ]) {
          // Before: "request to https://127.0.0.1:…/crm/v3/objects/deals/<key>?idProperty=… failed, reason: …"
          expect(reason).toMatch(/certificate is not trusted/);
          expect(reason).toContain(host);
          expect(reason).not.toMatch(/\/crm\/|\?|idProperty/);
          expect(reason).not.toContain(key);
        }
      });
    });
  });
}
