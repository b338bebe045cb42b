/**
 * What tells a deleted record with our key from ours (hubspot-values.ts): the args' values against
 * the record's, a difference HubSpot's own normalisation explains being none.
 */
import { describe, expect, it } from "vitest";
import { differingProperties, sameValue } from "../src/hubspot-values.js";

describe("sameValue", () => {
  it.each([
    ["the same text", "Q1 renewal", "Q1 renewal"],
    ["an email HubSpot lowercased", "Ada@Example.org", "ada@example.org"],
    ["whitespace HubSpot trimmed", "  Ada  Lovelace ", "Ada Lovelace"],
    ["a number in HubSpot's form", "1200.00", "1200"],
    ["a number with a sign or exponent", "+1.2e3", "1200"],
    ["a date sent as epoch ms", "1705276800000", "2024-01-15"],
    ["a datetime sent as epoch ms", "1705312800000", "2024-01-15T10:00:00.000Z"],
    ["a datetime sent with an offset", "2024-01-15T12:00:00+02:00", "2024-01-15T10:00:00Z"],
    ["multiple checkboxes in HubSpot's order", "b;a", "a;b"],
    ["a boolean in another case", "True", "true"],
    ["an empty value, read as null", "", null],
    ["only spaces, stored empty", "   ", null],
    ["a null (untyped JSON args), read as null", null, null],
    ["a null, read as empty", null, ""],
  ])("%s: the same", (_, given, held) => {
    expect(sameValue(given, held)).toBe(true);
  });

  it.each([
    ["other text", "Q2", "Q1"],
    ["another number", "1200", "1300"],
    ["another date", "2024-01-16", "2024-01-15"],
    ["a value where the record holds none", "Ada", null],
    ["none where the record holds one", "", "Ada"],
    ["other checkboxes", "a;b", "a;c"],
    ["a number against a date", "1200", "2024-01-15"],
    ["a null where the record holds one", null, "null"],
  ])("%s: differs", (_, given, held) => {
    expect(sameValue(given, held)).toBe(false);
  });
});

describe("differingProperties", () => {
  it("compares only the properties the args give, and only those the read returned", () => {
    const read = { dealname: "Q1", amount: "1200", hs_object_id: "7", pipeline: "default" };
    expect(differingProperties({ dealname: "Q2", amount: "1200.0", closedate: "2024-01-15" }, read)).toEqual([
      "dealname",
    ]);
  });

  it("names every property that differs, sorted", () => {
    expect(differingProperties({ b: "1", a: "2", c: "3" }, { a: "x", b: "y", c: "3" })).toEqual(["a", "b"]);
  });

  it("none for matching values", () => {
    expect(
      differingProperties(
        { email: "ada@example.org", firstname: "Ada" },
        { email: "ada@example.org", firstname: "Ada" },
      ),
    ).toEqual([]);
  });
});
