/**
 * What tells a deleted record with our key from ours (hubspot-values.ts): the args' values against
 * the record's, a difference HubSpot's own normalisation explains being none.
 */
import { afterEach, describe, expect, it } from "vitest";
import { differingProperties, sameValue } from "../src/hubspot-values.js";

describe("sameValue", () => {
  it.each([
    ["the same text", "Q1 renewal", "Q1 renewal"],
    ["whitespace HubSpot trimmed", "  Ada Lovelace ", "Ada Lovelace"],
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

describe("sameValue by the property's type (its definition in HubSpot)", () => {
  const text = { type: "string", fieldType: "text" };
  const number = { type: "number", fieldType: "number" };
  const date = { type: "date", fieldType: "date" };
  const datetime = { type: "datetime", fieldType: "date" };
  const bool = { type: "bool", fieldType: "booleancheckbox" };
  const select = { type: "enumeration", fieldType: "select" };
  const checkboxes = { type: "enumeration", fieldType: "checkbox" };

  it.each([
    ["a number, in HubSpot's form", number, "1200.00", "1200"],
    ["a number with a sign or exponent", number, "+1.2e3", "1200"],
    ["a date sent as epoch ms (midnight UTC)", date, "1705276800000", "2024-01-15"],
    ["a datetime sent as epoch ms", datetime, "1705312800000", "2024-01-15T10:00:00.000Z"],
    ["a datetime sent with an offset", datetime, "2024-01-15T12:00:00+02:00", "2024-01-15T10:00:00Z"],
    ["a boolean in another case", bool, "True", "true"],
    ["multiple checkboxes in HubSpot's order", checkboxes, "b;a", "a;b"],
    ["text trimmed", text, "  Q1 renewal ", "Q1 renewal"],
  ])("%s: the same", (_, shape, given, held) => {
    expect(sameValue(given, held, shape)).toBe(true);
  });

  it.each([
    // Before: both read as the number 123, and a record holding another code was taken as ours.
    ["text that looks like a number", text, "0123", "123"],
    ["text that looks like a number, in other notation", text, "1e3", "1000"],
    ["text that looks like epoch ms against a date", text, "1705276800000", "2024-01-15"],
    ["text with semicolons in another order", text, "b;a", "a;b"],
    ["text in another case", text, "Q1 Renewal", "q1 renewal"],
    ["text with other inner spaces", text, "Ada  Lovelace", "Ada Lovelace"],
    ["a dropdown option in another case", select, "Hot", "hot"],
    ["a property of unknown type: exact", undefined, "0123", "123"],
    ["multiple checkboxes, an option in another case", checkboxes, "A;b", "a;b"],
    ["another number", number, "1200", "1300"],
    ["a number against text", number, "twelve", "12"],
    ["another datetime", datetime, "2024-01-15T10:00:01Z", "2024-01-15T10:00:00Z"],
    ["another date", date, "2024-01-16", "2024-01-15"],
    ["other checkboxes", checkboxes, "a;b", "a;c"],
    ["another boolean", bool, "false", "true"],
  ])("%s: differs", (_, shape, given, held) => {
    expect(sameValue(given, held, shape)).toBe(false);
  });

  it("a contact's email, which HubSpot lowercases, in another case: the same", () => {
    expect(sameValue("Ada@Example.org", "ada@example.org", { ...text, caseless: true })).toBe(true);
  });

  describe("a datetime without a zone is UTC, as HubSpot reads it, whatever the host's zone", () => {
    const host = process.env.TZ;
    afterEach(() => {
      if (host === undefined) delete process.env.TZ;
      else process.env.TZ = host;
    });

    it.each(["Asia/Tokyo", "America/Los_Angeles", "UTC"])("host in %s", (zone) => {
      process.env.TZ = zone;
      // Before (host in Tokyo): 10:00 read as 01:00 UTC, so our own record went to a person; and
      // 19:00 read as 10:00 UTC, so a record holding another time was taken as ours.
      expect(sameValue("2024-01-15T10:00:00", "2024-01-15T10:00:00.000Z", datetime)).toBe(true);
      expect(sameValue("2024-01-15T10:00", "2024-01-15T10:00:00Z", datetime)).toBe(true);
      expect(sameValue("2024-01-15T19:00:00", "2024-01-15T10:00:00.000Z", datetime)).toBe(false);
      expect(sameValue("2024-01-15T02:00:00", "2024-01-15T10:00:00.000Z", datetime)).toBe(false);
    });
  });
});

describe("differingProperties", () => {
  it("compares only the properties the args give, and only those the read returned", () => {
    const read = { dealname: "Q1", amount: "1200", hs_object_id: "7", pipeline: "default" };
    const shapes = { amount: { type: "number" }, closedate: { type: "datetime" } };
    expect(differingProperties({ dealname: "Q2", amount: "1200.0", closedate: "2024-01-15" }, read, shapes)).toEqual([
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
