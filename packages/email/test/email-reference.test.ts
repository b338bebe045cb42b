/** The provider reference of an email operation: its format, read by operators and older rows. */
import { describe, expect, it } from "vitest";
import { parseEmailReference } from "@idem/email";
import type { CopyConfig } from "@idem/email";
import { mailboxPath } from "../src/email-mailbox.js";
import { copyTerms, formatReference, recordedMode, recordedPlace, sameAccountMailbox } from "../src/email-reference.js";

const MID = "<idem.0123456789abcdef0123456789abcdef01234567@idem.test>";
const imap = {
  host: "IMAP.Example.com",
  port: 993,
  secure: true,
  auth: { user: "journal@example.com", pass: "s3cret pass" },
};

describe("the email provider reference", () => {
  const sender = { ...imap, auth: { user: "reports@example.com", pass: "s3cret pass" } };
  const sent = "in=imap://reports%40example.com@imap.example.com:993";
  const config = (copy: CopyConfig, sentMailbox?: string) => ({
    copy,
    imap: sender,
    ...(sentMailbox && { sentMailbox }),
  });

  it("starts with the Message-ID, then how the copy is made and where", () => {
    expect(formatReference(MID, config({ mode: "provider-saves" }))).toBe(`${MID} copy=provider-saves ${sent}/%5CSent`);
    expect(formatReference(MID, config({ mode: "append" }, "Sent Items"))).toBe(
      `${MID} copy=append ${sent}/Sent%20Items`,
    );
    expect(formatReference(MID, config({ mode: "journal", address: "Journal@Example.com", imap }))).toBe(
      `${MID} copy=journal bcc=journal@example.com in=imap://journal%40example.com@imap.example.com:993/INBOX`,
    );
    expect(recordedPlace(`copy=append ${sent}/Sent%20Items`)).toBe(`${sent.slice(3)}/Sent%20Items`);
    expect(recordedPlace("copy=provider-saves")).toBeUndefined(); // written before the Sent folder was recorded
  });

  it("never holds a password, and each term stays one token", () => {
    const terms = copyTerms(
      config({
        mode: "journal",
        address: "journal@example.com",
        imap: { ...imap, host: "::1", auth: { user: "ops team", pass: "s3cret pass" } },
        mailbox: "Archive/Sent Items",
      }),
    );
    expect(terms).toBe("copy=journal bcc=journal@example.com in=imap://ops%20team@[::1]:993/Archive/Sent%20Items");
    expect(terms).not.toMatch(/s3cret/);
    expect(parseEmailReference(`${MID} ${terms}`)).toEqual({ messageId: MID, copy: terms });
  });

  it("the same journal config gives the same terms (they are compared as text)", () => {
    const a = copyTerms(config({ mode: "journal", address: "journal@example.com", imap, mailbox: "INBOX" }));
    const b = copyTerms(config({ mode: "journal", address: "JOURNAL@example.com", imap: { ...imap, secure: false } }));
    expect(a).toBe(b);
  });

  it("a bare Message-ID (written before the copy was recorded) has no copy terms", () => {
    expect(parseEmailReference(MID)).toEqual({ messageId: MID, copy: undefined });
  });

  it("reads the recorded mode, and knows when it does not know it", () => {
    expect(recordedMode("copy=append")).toBe("append");
    expect(recordedMode("copy=journal bcc=a@b in=imap://a%40b@h:143/INBOX")).toBe("journal");
    expect(recordedMode("copy=provider-saves")).toBe("provider-saves");
    expect(recordedMode("copy=carrier-pigeon")).toBeUndefined();
    expect(recordedMode("mode=append")).toBeUndefined();
  });
});

describe("the same Sent folder named otherwise", () => {
  const account = "imap://reports%40example.com@imap.example.com:993";

  it("is asked about only within one account, and only when spelled otherwise", () => {
    expect(sameAccountMailbox(`${account}/%5CSent`, `${account}/Sent`)).toBe("\\Sent");
    expect(sameAccountMailbox(`${account}/Sent%20Items`, `${account}/%5CSent`)).toBe("Sent Items");
    expect(sameAccountMailbox(`${account}/Archive/Sent`, `${account}/%5CSent`)).toBe("Archive/Sent");
    expect(sameAccountMailbox(`${account}/Sent`, `${account}/Sent`)).toBeUndefined(); // the same text: no question
    expect(
      sameAccountMailbox(`${account}/Sent`, "imap://reports%40example.com@imap.example.com:143/Sent"),
    ).toBeUndefined();
    expect(
      sameAccountMailbox(`${account}/Sent`, "imap://other%40example.com@imap.example.com:993/Sent"),
    ).toBeUndefined();
    expect(sameAccountMailbox(`${account}/%E0%A4%A`, `${account}/Sent`)).toBeUndefined(); // not one we wrote
  });

  it("resolves on the server's LIST: \\Sent by SPECIAL-USE, paths as spelled but INBOX", () => {
    const box = (path: string, specialUse?: string, flags: string[] = []) => ({
      path,
      name: path.split("/").pop()!,
      specialUse,
      flags: new Set(flags),
    });
    const boxes = [
      box("INBOX", "\\Inbox"),
      box("Sent Items", "\\Sent"),
      box("Sent"),
      box("Gone", undefined, ["\\NonExistent"]),
    ];
    expect(mailboxPath("\\Sent", boxes)).toBe("Sent Items"); // the special-use folder, not the one named Sent
    expect(mailboxPath("\\Sent", [box("INBOX"), box("sent")])).toBe("sent"); // no SPECIAL-USE: by name
    expect(mailboxPath("\\Sent", [box("INBOX")])).toBeUndefined();
    expect(mailboxPath("Sent", boxes)).toBe("Sent");
    expect(mailboxPath("sent items", boxes)).toBeUndefined(); // names are case-sensitive
    expect(mailboxPath("inbox", boxes)).toBe("INBOX"); // but INBOX
    expect(mailboxPath("Gone", boxes)).toBeUndefined();
    // Under a personal namespace prefix, as imapflow opens a path without it.
    const prefixed = [box("INBOX"), box("INBOX.Sent", "\\Sent")];
    expect(mailboxPath("Sent", prefixed, "INBOX.")).toBe("INBOX.Sent");
    expect(mailboxPath("INBOX.Sent", prefixed, "INBOX.")).toBe("INBOX.Sent");
  });

  it("counts only mailboxes that can be opened: never one listed \\NonExistent or \\Noselect", () => {
    const box = (path: string, specialUse?: string, flags: string[] = []) => ({
      path,
      name: path.split("/").pop()!,
      specialUse,
      flags: new Set(flags),
    });
    // imapflow gives the special use to the phantom (sorted first); the real one keeps the attribute.
    const phantom = box("Old Sent", "\\Sent", ["\\NonExistent", "\\HasChildren", "\\Noselect", "\\Sent"]);
    expect(mailboxPath("\\Sent", [phantom, box("Sent Items", undefined, ["\\Sent"]), box("Sent")])).toBe("Sent Items");
    expect(mailboxPath("\\Sent", [phantom, box("sent", undefined, ["\\Noselect"])])).toBeUndefined();
    expect(mailboxPath("\\Sent", [phantom, box("Sent")])).toBe("Sent"); // by name, as without SPECIAL-USE
    expect(mailboxPath("Archive", [box("Archive", undefined, ["\\Noselect", "\\HasChildren"])])).toBeUndefined();
    expect(mailboxPath("Archive", [box("Archive", undefined, ["\\NONEXISTENT"])])).toBeUndefined(); // any case
    expect(mailboxPath("Archive/2024", [box("Archive/2024", undefined, ["\\HasNoChildren"])])).toBe("Archive/2024");
  });
});
