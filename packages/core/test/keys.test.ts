import { describe, expect, it } from "vitest";
import { InvalidValueError, canonicalJson, operationKey, sensitive } from "@idem/core";

describe("operationKey", () => {
  // Pinned vectors: these hashes must never change across releases (an independent check:
  // sha256 of Python's json.dumps(["idem.key.v1", tenant, action, parts], separators=(",", ":"))).
  it.each([
    [
      { tenant: "acme", action: "email.send", parts: ["weekly-report", "client-42", "2026-W48"] },
      "aeb8d23c5c2461b75513b6e94e32281f4c538bd1c139200ee7b90a93b0a39bda",
      '["weekly-report","client-42","2026-W48"]',
    ],
    [
      {
        tenant: "acme",
        action: "stripe.paymentIntents.create",
        parts: [{ order: "o_1", b: 2, a: [1, "x", null, true] }],
      },
      "ceeeb82baec5788830fba1e6dbd76931b01558f772a87b4666a54f8c1b6d564d",
      '[{"a":[1,"x",null,true],"b":2,"order":"o_1"}]',
    ],
    [
      { tenant: "acme", action: "hubspot.contacts.create", parts: ["lead", sensitive("ada@example.com")] },
      "5aded8b29c7808d29a0aaeb4d74c80ccba0de17e5010e1aec9461b451a641dd6",
      '["lead","sha256:c525d356ee379bcf0bc280eab6d3a94fb85f7905b5b8e6419f7549379eb64413"]',
    ],
  ])("pins vector %#", (input, hash, label) => {
    expect(operationKey(input)).toEqual({ hash, label, tenant: input.tenant, action: input.action });
  });

  it("sorts object keys, so field order does not change the key", () => {
    const a = operationKey({ tenant: "t", action: "x", parts: [{ a: 1, b: { c: 2, d: 3 } }] });
    const b = operationKey({ tenant: "t", action: "x", parts: [{ b: { d: 3, c: 2 }, a: 1 }] });
    expect(a).toEqual(b);
  });

  it("separates tenants, actions, revisions and weeks", () => {
    const base = { tenant: "t", action: "email.send", parts: ["weekly-report", "c1", "2026-W48"] };
    const hashes = new Set([
      operationKey(base).hash,
      operationKey({ ...base, tenant: "u" }).hash,
      operationKey({ ...base, action: "email.other" }).hash,
      operationKey({ ...base, parts: ["weekly-report", "c1", "2026-W49"] }).hash,
      operationKey({ ...base, parts: ["weekly-report", "c1", "2026-W48", { revision: 2 }] }).hash,
    ]);
    expect(hashes.size).toBe(5);
  });

  it("treats -0 and 0 as one value", () => {
    expect(operationKey({ tenant: "t", action: "x", parts: [-0] })).toEqual(
      operationKey({ tenant: "t", action: "x", parts: [0] }),
    );
  });

  it("never stores a sensitive value, at any depth", () => {
    const k = operationKey({ tenant: "t", action: "x", parts: [{ who: sensitive("ada@example.com") }] });
    expect(k.label).not.toContain("ada@");
    expect(k.label).toMatch(/sha256:[0-9a-f]{64}/);
  });

  const cycle: Record<string, unknown> = {};
  cycle.self = cycle;
  it.each([
    ["a Date", new Date(0), /Date instance/],
    ["undefined", undefined, /undefined/],
    ["NaN", Number.NaN, /NaN is not a JSON number/],
    ["Infinity", Infinity, /Infinity/],
    ["a function", () => 1, /function/],
    ["a symbol", Symbol("s"), /symbol/],
    ["a BigInt", 10n, /BigInt/],
    ["a cycle", cycle, /cycle/],
    ["a Map", new Map(), /Map instance/],
    ["undefined in an array", { a: [1, undefined] }, /key\[0\]\.a\[1\]: undefined/],
  ])("refuses %s with an error naming where", (_what, value, message) => {
    const call = () => operationKey({ tenant: "t", action: "x", parts: [value] });
    expect(call).toThrow(InvalidValueError);
    expect(call).toThrow(message);
  });

  it("refuses an empty identity, tenant or action", () => {
    expect(() => operationKey({ tenant: "t", action: "x", parts: [] })).toThrow(/at least one part/);
    expect(() => operationKey({ tenant: "", action: "x", parts: ["a"] })).toThrow(InvalidValueError);
    expect(() => operationKey({ tenant: "t", action: "", parts: ["a"] })).toThrow(InvalidValueError);
  });
});

describe("canonicalJson", () => {
  it("is stable text with sorted keys and no whitespace", () => {
    expect(canonicalJson({ z: 1, a: [true, null, "é"], m: { y: 1.5, b: -2 } })).toBe(
      '{"a":[true,null,"é"],"m":{"b":-2,"y":1.5},"z":1}',
    );
  });
  it("leaves out fields whose value is undefined (an unset optional field), as JSON.stringify does", () => {
    expect(canonicalJson({ to: "a", note: undefined, nested: { x: undefined, y: 1 } })).toBe(
      canonicalJson({ to: "a", nested: { y: 1 } }),
    );
    expect(canonicalJson({ a: [{ b: undefined }] })).toBe('{"a":[{}]}');
  });
  it("allows the same object twice when it is not a cycle", () => {
    const shared = { x: 1 };
    expect(canonicalJson([shared, shared])).toBe('[{"x":1},{"x":1}]');
  });
});
