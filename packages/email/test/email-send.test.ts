/**
 * The email action called directly with an explicit operation (no ledger), against the real
 * smtp-server and Dovecot of the mail sandbox: cancellation on op.signal, what a lost connection
 * means by whether the body left, the envelope nodemailer parses, the journal gate, and the
 * settle window measured on op.now.
 */
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import { connect, createServer, type AddressInfo, type Socket } from "node:net";
import type { OperationContext } from "@idem/core";
import { JOURNAL, MailSandbox, SENDER } from "@idem/sandbox";
import {
  CopyChangedError,
  EnvelopeRefusedError,
  InvalidMessageError,
  InvalidSenderError,
  MailboxUnavailableError,
  SendAbortedError,
  classifyEmailError,
  emailActions,
  emailReceiptSchema,
  messageIdFor,
  recipientHash,
  type CopyConfig,
  type EmailActions,
  type EmailArgs,
  type EmailConfig,
} from "@idem/email";
import { captureSockets } from "./sockets.js";
import { fresh, op } from "./operation.js";

let sandbox: MailSandbox;
let ports: { smtp: number; imap: number };
beforeAll(async () => {
  sandbox = new MailSandbox({ mode: "journal" });
  const s = await sandbox.start();
  ports = { smtp: s.smtp.port, imap: s.imap.port };
}, 30_000);
afterAll(() => sandbox?.close());
afterEach(() => sandbox.faults.clear()); // a fault the test did not reach must not leak into the next

// The sandbox offers no TLS (no STARTTLS, Dovecot without ssl): every config here says
// `requireTLS: false`, as one for such a server must (signing in requires TLS by default).
const withCopy = (copy: CopyConfig, sent: Partial<Pick<EmailConfig, "imap" | "sentMailbox">> = {}) =>
  emailActions({
    smtp: { host: "127.0.0.1", port: ports.smtp, auth: SENDER, timeoutMs: 2_500, requireTLS: false },
    imap: { host: "127.0.0.1", port: ports.imap, auth: SENDER, requireTLS: false },
    from: SENDER.user,
    settleMs: 60_000,
    copy,
    ...sent,
  });
const journalCopy = (): Extract<CopyConfig, { mode: "journal" }> => ({
  mode: "journal",
  address: JOURNAL.user,
  imap: { host: "127.0.0.1", port: ports.imap, auth: JOURNAL, requireTLS: false },
});
const journal = () => withCopy(journalCopy());
const report = { to: "client@example.test", subject: "Weekly report", text: "Numbers." };

const messageIdOf = (o: OperationContext) => messageIdFor(o.key, "idem.test");
/** The operation as later attempts and lookups get it: with the reference its first attempt recorded under `first`. */
const recordedBy = (first: EmailActions, o: OperationContext): OperationContext => ({
  ...o,
  providerReference: first.send.providerReference!(report, o),
});
const pastTheWindow = () => op({ lastAttemptAt: Date.now(), now: Date.now() + 3_600_000 });

describe("the journal gate", () => {
  it("journal mode needs the IMAP account the journal address delivers to (else every copy is missing)", () => {
    const without = {
      smtp: { host: "127.0.0.1", port: ports.smtp },
      imap: { host: "127.0.0.1", port: ports.imap, auth: SENDER, requireTLS: false },
      from: SENDER.user,
      copy: { mode: "journal", address: JOURNAL.user },
    };
    expect(() => emailActions(without as unknown as Parameters<typeof emailActions>[0])).toThrow(
      /copy.imap is required in journal mode/,
    );
  });

  it("a refused journal address holds the body back: nothing is sent, failed and alerted", async () => {
    const o = fresh();
    sandbox.faults.add({ kind: "reject_rcpt", match: { path: JOURNAL.user } });
    const error = await journal()
      .send.execute(report, o)
      .catch((e: unknown) => e);
    expect(error).toBeInstanceOf(EnvelopeRefusedError);
    expect(error).toMatchObject({ responseCode: 550, journalRefused: true });
    expect(classifyEmailError(error)).toMatchObject({ kind: "permanent", alert: true });
    expect(sandbox.count(messageIdOf(o))).toBe(0);
  });

  it("every other recipient refused: not sent to the journal alone", async () => {
    const o = fresh();
    sandbox.faults.add({ kind: "reject_rcpt", match: { path: "client@example.test" } });
    const error = await journal()
      .send.execute(report, o)
      .catch((e: unknown) => e);
    expect(error).toMatchObject({ name: "EnvelopeRefusedError", journalRefused: false });
    expect(classifyEmailError(error)).toMatchObject({ kind: "permanent" });
    expect(sandbox.count(messageIdOf(o))).toBe(0);
  });

  it("one refused recipient among others does not stop the send", async () => {
    const o = fresh();
    sandbox.faults.add({ kind: "reject_rcpt", match: { path: "gone@example.test" } });
    const receipt = await journal().send.execute({ ...report, to: ["client@example.test", "gone@example.test"] }, o);
    expect(receipt).toMatchObject({
      sent: true,
      rejected: [recipientHash("gone@example.test")],
      accepted: expect.arrayContaining([recipientHash("client@example.test"), recipientHash(JOURNAL.user)]),
    });
    expect(sandbox.count(messageIdOf(o))).toBe(1);
  });
});

describe("cancellation on op.signal", () => {
  it("an abort while the server holds its reply closes the connection at once: may have been sent", async () => {
    const abort = new AbortController();
    const o = fresh(abort.signal);
    sandbox.faults.add({ kind: "hold_reply", delayMs: 6_000 });
    sandbox.events.once("accepted", () => abort.abort(new Error("lease lost")));
    const started = Date.now();
    const error = await journal()
      .send.execute(report, o)
      .catch((e: unknown) => e);
    expect(Date.now() - started).toBeLessThan(2_000); // not the 2.5 s socket timeout
    expect(error).toBeInstanceOf(SendAbortedError);
    expect(error).toMatchObject({ bodySent: true });
    expect(classifyEmailError(error)).toMatchObject({ kind: "ambiguous" });
    expect(sandbox.count(messageIdOf(o))).toBe(1);
  });

  it("already aborted: nothing is sent", async () => {
    const abort = new AbortController();
    abort.abort(new Error("caller gave up"));
    const o = fresh(abort.signal);
    const before = sandbox.count();
    const error = await journal()
      .send.execute(report, o)
      .catch((e: unknown) => e);
    expect(error).toMatchObject({ name: "SendAbortedError", bodySent: false });
    expect(classifyEmailError(error)).toMatchObject({ kind: "transient" });
    expect(sandbox.count()).toBe(before);
  });
});

describe("a connection lost without a reply: whether the body left decides", () => {
  // Before: a drop before any body was "may have been sent" (unknown; needs_review in append mode).
  for (const [stage, match] of [
    ["AUTH", { method: "AUTH" }],
    ["MAIL FROM", { method: "MAIL" }],
    ["RCPT TO (the second recipient)", { method: "RCPT", path: "other@example.test" }],
    ["DATA (before the 354)", { method: "DATA" }],
  ] as const) {
    it(`the server closes at ${stage}: nothing sent (bodySent false), transient`, async () => {
      const o = fresh();
      sandbox.faults.add({ kind: "drop_at", match });
      const error = await journal()
        .send.execute({ ...report, to: ["client@example.test", "other@example.test"] }, o)
        .catch((e: unknown) => e);
      expect(error).toMatchObject({ bodySent: false });
      expect(classifyEmailError(error)).toMatchObject({ kind: "transient" });
      expect(sandbox.count(messageIdOf(o))).toBe(0);
    });
  }

  it("a socket error coded EHOSTUNREACH after the server took the body: may have been sent (bodySent true), ambiguous", async () => {
    // Before: read as "not connected" (NOT_SENT_CODES), so sent again. The kernel reports an ICMP
    // unreachable on an ESTABLISHED connection as the socket's error: EHOSTUNREACH/ENETUNREACH
    // can come after the body left, not only at connect.
    const o = fresh();
    sandbox.faults.add({ kind: "hold_reply", delayMs: 6_000 });
    const sockets = captureSockets();
    const unreachable = () => {
      const socket = sockets.list.find((s) => s.remotePort === ports.smtp && !s.destroyed);
      const error = Object.assign(new Error("read EHOSTUNREACH"), { code: "EHOSTUNREACH", syscall: "read" });
      socket?.destroy(error);
    };
    sandbox.events.once("accepted", unreachable);
    try {
      const error = await journal()
        .send.execute(report, o)
        .catch((e: unknown) => e);
      expect(error).toMatchObject({ originalCode: "EHOSTUNREACH", bodySent: true });
      expect(classifyEmailError(error)).toMatchObject({ kind: "ambiguous" });
      expect(sandbox.count(messageIdOf(o))).toBe(1);
    } finally {
      sockets.restore();
      sandbox.events.off("accepted", unreachable);
    }
  });
});

describe("the envelope is the one nodemailer parses", () => {
  // Before: the raw strings went to MAIL FROM and RCPT TO, and nodemailer refused a display name
  // (EENVELOPE) on every send.
  const named = (copy: CopyConfig, from = `Agent <${SENDER.user}>`) =>
    emailActions({
      smtp: { host: "127.0.0.1", port: ports.smtp, auth: SENDER, timeoutMs: 2_500, requireTLS: false },
      imap: { host: "127.0.0.1", port: ports.imap, auth: SENDER, requireTLS: false },
      from,
      settleMs: 60_000,
      copy,
    });

  it("a from, recipients, a Bcc and a journal address with display names: sent once, bare addresses in the envelope, the journal copy found", async () => {
    const o = fresh();
    const mail = named({ ...journalCopy(), address: `Journal <${JOURNAL.user}>` });
    const args = {
      ...report,
      to: "Client <client@example.test>",
      cc: ["Boss <boss@example.test>"],
      bcc: "Audit <audit@example.test>",
    };
    expect(await mail.send.execute(args, o)).toMatchObject({ sent: true });
    const got = sandbox.received.find((m) => m.messageId === messageIdOf(o))!;
    expect(got.from).toBe(SENDER.user);
    expect([...got.to].sort()).toEqual([
      "audit@example.test",
      "boss@example.test",
      "client@example.test",
      JOURNAL.user,
    ]);
    expect(got.raw.toString()).toMatch(/^From: Agent <agent@idem\.test>/m);
    // The journal gate found the parsed journal address among the RCPT answers; its copy is there.
    expect(await mail.send.execute(args, o)).toMatchObject({ sent: false, foundIn: "INBOX" });
    expect(sandbox.count(messageIdOf(o))).toBe(1);
  });

  it("a configured from with no address: nothing sent, failed with an alert", async () => {
    const o = fresh();
    const mail = emailActions({
      smtp: { host: "127.0.0.1", port: ports.smtp, auth: SENDER, timeoutMs: 2_500, requireTLS: false },
      imap: { host: "127.0.0.1", port: ports.imap, auth: SENDER, requireTLS: false },
      from: "Agent",
      messageIdDomain: "idem.test",
      copy: journalCopy(),
    });
    const error = await mail.send.execute(report, o).catch((e: unknown) => e);
    expect(error).toBeInstanceOf(InvalidSenderError);
    expect(mail.send.classify(error, o)).toMatchObject({ kind: "permanent", alert: true });
    expect(sandbox.count(messageIdOf(o))).toBe(0);
  });

  it("a journal address with no address in it is refused at configuration", () => {
    expect(() => named({ ...journalCopy(), address: "Journal" })).toThrow(/journal address/);
  });

  it("an internationalised Message-ID domain: the copy of the first send is found by the check before a second", async () => {
    const mail = emailActions({
      smtp: { host: "127.0.0.1", port: ports.smtp, auth: SENDER, timeoutMs: 2_500, requireTLS: false },
      imap: { host: "127.0.0.1", port: ports.imap, auth: SENDER, requireTLS: false },
      from: SENDER.user,
      messageIdDomain: "bücher.example",
      copy: journalCopy(),
    });
    const o = fresh();
    expect(await mail.send.execute(report, o)).toMatchObject({ sent: true });
    expect(await mail.send.execute(report, o)).toMatchObject({ sent: false });
    expect(sandbox.received.filter((m) => m.raw.toString("latin1").includes(o.key.slice(0, 40)))).toHaveLength(1);
  });
});

describe("the settle window uses op.now", () => {
  it("inside the window by the database clock: inconclusive, however late the process clock says it is", async () => {
    const long = Date.now() - 3_600_000;
    expect(await journal().send.reconcile!(report, op({ lastAttemptAt: long, now: long + 1_000 }))).toMatchObject({
      found: false,
      proof: "inconclusive",
    });
  });

  it("past the window by the database clock: absent, however early the process clock says it is", async () => {
    const now = Date.now();
    expect(await journal().send.reconcile!(report, op({ lastAttemptAt: now, now: now + 3_600_000 }))).toMatchObject({
      found: false,
      proof: "absent",
    });
  });

  it("journal mode without a settleMs waits far longer than Sent: the server's queue delivers its copy", async () => {
    // Before: 60 s for both. A 250 to RCPT TO does not mean the copy is filed (RFC 5321 §6.1:
    // the server took responsibility to deliver it), and a queued local delivery can take minutes:
    // "absent" after 60 s sent the email again.
    const byDefault = (copy: CopyConfig) =>
      emailActions({
        smtp: { host: "127.0.0.1", port: ports.smtp, auth: SENDER, timeoutMs: 2_500, requireTLS: false },
        imap: { host: "127.0.0.1", port: ports.imap, auth: SENDER, requireTLS: false },
        from: SENDER.user,
        copy,
      });
    const now = Date.now();
    const minutesLater = (m: number) => op({ lastAttemptAt: now, now: now + m * 60_000 });
    expect(await byDefault(journalCopy()).send.reconcile!(report, minutesLater(2))).toMatchObject({
      found: false,
      proof: "inconclusive",
    });
    expect(await byDefault(journalCopy()).send.reconcile!(report, minutesLater(60))).toMatchObject({
      found: false,
      proof: "absent",
    });
  });

  it("provider-saves without a settleMs waits out the server's 10 minutes after the final dot", async () => {
    // Before: 60 s. The provider files its Sent copy as it commits the message, which RFC 5321
    // §4.5.3.2.6 lets a server do up to 10 minutes after the final "." (a content filter, a virus
    // scan of a large message), while our client gives up after `timeoutMs`: a commit 90 s after
    // the dot read absent and the email went out again, the operation succeeded, no alert
    // (RFC 1047's duplicate; helper-115).
    const byDefault = emailActions({
      smtp: { host: "127.0.0.1", port: ports.smtp, auth: SENDER, timeoutMs: 2_500, requireTLS: false },
      imap: { host: "127.0.0.1", port: ports.imap, auth: SENDER, requireTLS: false },
      from: SENDER.user,
      copy: { mode: "provider-saves" },
    });
    const now = Date.now();
    const minutesLater = (m: number) => op({ lastAttemptAt: now, now: now + m * 60_000 });
    expect(await byDefault.send.reconcile!(report, minutesLater(2))).toMatchObject({
      found: false,
      proof: "inconclusive",
    });
    expect(await byDefault.send.reconcile!(report, minutesLater(11))).toMatchObject({
      found: false,
      proof: "absent",
    });
  });

  it("without a database time it proves nothing", async () => {
    const o = { ...fresh(), now: undefined as unknown as number };
    expect(await journal().send.reconcile!(report, o)).toMatchObject({ found: false, proof: "inconclusive" });
  });
});

describe("attachments are content only", () => {
  const fromFile = { filename: "x.txt", path: "/etc/hostname" };
  const fromUrl = { filename: "x.txt", href: "http://127.0.0.1:9/x.txt" };
  const withAttachment = (a: object) => ({ ...report, attachments: [a] }) as unknown as EmailArgs;

  it("an attachment naming a file or a URL is refused before anything is claimed: nothing is read", () => {
    for (const a of [fromFile, fromUrl, { ...fromFile, content: "" }])
      expect(() => journal().send.validate!(withAttachment(a)), JSON.stringify(a)).toThrow(
        /attachments\[0\].*(path|href).*content only/,
      );
    expect(() => journal().send.validate!(withAttachment({ filename: "x.txt", content: "hello" }))).not.toThrow();
  });

  it("headers that would name another send (X-Idem-Key, X-Idem-Attempt, however nodemailer would write the name) are refused before anything is claimed", () => {
    // nodemailer trims a name, writes its line breaks as spaces and drops a trailing colon: each
    // of these would be a second X-Idem-Attempt line, read before the action's own.
    const names = [
      "X-Idem-Attempt",
      "x-idem-attempt",
      "X-IDEM-KEY",
      " x-idem-attempt",
      "X-Idem-Attempt ",
      "X-Idem-Attempt\n",
      "X-Idem-Attempt:",
    ];
    for (const name of names)
      expect(
        () => journal().send.validate!({ ...report, headers: { [name]: "op_1/1" } }),
        JSON.stringify(name),
      ).toThrow(/headers may not set ".*": X-Idem-(Attempt|Key), the action writes it on each send/);
    expect(() => journal().send.validate!({ ...report, headers: { "X-Campaign": "weekly" } })).not.toThrow();
  });

  it("a message that cannot be built (execute called past validation): nothing left the process, rejected", async () => {
    // Before: nodemailer's EFILEACCESS from the render, before any connection, was read as "no
    // answer from the SMTP server" (ambiguous): a person was asked about an email never sent.
    const o = fresh();
    const before = sandbox.count();
    const error = await journal()
      .send.execute(withAttachment(fromFile), o)
      .catch((e: unknown) => e);
    expect(error).toBeInstanceOf(InvalidMessageError);
    expect(error).toMatchObject({ bodySent: false, cause: { code: "EFILEACCESS" } });
    expect(classifyEmailError(error)).toMatchObject({ kind: "rejected" });
    expect(sandbox.count()).toBe(before);
  });
});

describe("a receipt from a found copy", () => {
  it("says the recipients are not known (null), not that the server accepted nobody", async () => {
    const o = fresh();
    const mail = journal();
    const sent = await mail.send.execute(report, o);
    expect(sent).toMatchObject({
      sent: true,
      accepted: expect.arrayContaining([recipientHash(JOURNAL.user)]),
      send: `${o.id}/1`,
    });
    // Another attempt finds the copy before sending; a lookup settling an unknown outcome finds it
    // too. The copy names the send it is (its X-Idem-Attempt header: the operation and attempt).
    const found = {
      messageId: messageIdOf(o),
      foundIn: "INBOX",
      response: null,
      accepted: null,
      rejected: null,
      sends: [`${o.id}/1`],
    };
    const before = await mail.send.execute(report, { ...o, attempt: 2 });
    expect(before).toEqual({ ...found, ref: expect.any(String), sent: false });
    const lookup = await mail.send.reconcile!(report, { ...o, attempt: 2 });
    expect(lookup).toEqual({ found: true, receipt: { ...found, ref: expect.any(String), sent: true } });
    expect(sandbox.count(messageIdOf(o))).toBe(1);
    // So each is the one send's (effectId): a late answer of attempt 1 after either is one effect.
    const send = mail.send.effectId!;
    expect([send(before), lookup.found && send(lookup.receipt)]).toEqual([send(sent), send(sent)]);
    expect(send(sent)).toBe(`${messageIdOf(o)} ${o.id}/1`);
  });

  it("says which send it is only when it can: not for copies of two sends, nor for a receipt without them", () => {
    const mail = journal();
    const base = { messageId: "<idem.a@idem.test>", ref: "ABCDEFGH", foundIn: "Sent", response: null } as const;
    const found = { ...base, sent: true, accepted: null, rejected: null } as const;
    const send = mail.send.effectId!;
    expect(send({ ...found, sends: ["op_1/2"] })).toBe("<idem.a@idem.test> op_1/2");
    // Copies of two sends (two messages went out, alerted by the lookup): each one's.
    expect(send({ ...found, sends: ["op_1/1", "op_1/2"] })).toEqual([
      "<idem.a@idem.test> op_1/1",
      "<idem.a@idem.test> op_1/2",
    ]);
    // Stored by an earlier version (or recorded by a person without them): not known.
    expect(send(found)).toBeUndefined();
    const answered = {
      messageId: base.messageId,
      ref: base.ref,
      sent: true,
      response: "250 ok",
      accepted: [],
      rejected: [],
    } as const;
    expect(send(answered)).toBeUndefined();
    expect(send({ ...answered, send: "op_1/3" })).toBe("<idem.a@idem.test> op_1/3");
    // What a person records is read as the action stores it, the sends included, in their form.
    const recorded = { messageId: base.messageId, ref: base.ref, foundIn: "Sent" };
    expect(emailReceiptSchema.parse({ ...recorded, sends: ["op_1/1"] })).toEqual({ ...found, sends: ["op_1/1"] });
    for (const sends of [[1], ["op_1"], ["op_1/0"], []])
      expect(emailReceiptSchema.safeParse({ ...recorded, sends }).success, JSON.stringify(sends)).toBe(false);
  });
});

describe("the copy recorded at the first send decides, not today's config", () => {
  it("a journal today's config does not have (another mailbox or account, or none): never proven absent, the reason names both", async () => {
    const o = recordedBy(journal(), pastTheWindow());
    for (const today of [
      withCopy({ ...journalCopy(), mailbox: "Journal" }),
      withCopy({ ...journalCopy(), imap: { host: "127.0.0.1", port: ports.imap, auth: SENDER, requireTLS: false } }),
      withCopy({ ...journalCopy(), address: "audit@idem.test" }),
      withCopy({ mode: "provider-saves" }),
      withCopy({ mode: "append" }),
    ]) {
      expect(await today.send.reconcile!(report, o)).toEqual({
        found: false,
        proof: "never",
        reason: expect.stringContaining(
          `with copy=journal bcc=journal@idem.test in=imap://journal%40idem.test@127.0.0.1:${ports.imap}/INBOX, and the config now says copy=`,
        ),
      });
    }
    // The same journal: searched, and absent past the window, as before.
    expect(await journal().send.reconcile!(report, o)).toMatchObject({ found: false, proof: "absent" });
  });

  it("recorded append, the config now journal: not found in Sent proves nothing", async () => {
    const o = recordedBy(withCopy({ mode: "append" }), pastTheWindow());
    expect(await journal().send.reconcile!(report, o)).toMatchObject({
      found: false,
      proof: "never",
      reason: expect.stringMatching(
        /appended by the client.*copy=append in=imap:\S+; the config now says copy=journal/,
      ),
    });
  });

  it("recorded provider-saves, the config now journal: looked for in Sent, where the provider filed it", async () => {
    const saves = withCopy({ mode: "provider-saves" });
    const o = recordedBy(saves, fresh());
    sandbox.mode = "provider-saves";
    try {
      expect(await saves.send.execute(report, o)).toMatchObject({ sent: true });
    } finally {
      sandbox.mode = "journal";
    }
    expect(await journal().send.reconcile!(report, o)).toMatchObject({ found: true, receipt: { foundIn: "Sent" } });
    const absent = recordedBy(saves, pastTheWindow());
    expect(await journal().send.reconcile!(report, absent)).toMatchObject({ found: false, proof: "absent" });
  });

  it("recorded provider-saves, the config now searching another Sent (folder or account): found there counts, not found proves nothing", async () => {
    // Before: the Sent folder was not recorded, so a daemon whose config searched another folder
    // (INBOX here, or another account's Sent) proved the send absent and it was sent again.
    const saves = withCopy({ mode: "provider-saves" });
    const elsewhere = [
      withCopy({ mode: "provider-saves" }, { sentMailbox: "INBOX" }),
      withCopy(
        { mode: "provider-saves" },
        { imap: { host: "127.0.0.1", port: ports.imap, auth: JOURNAL, requireTLS: false } },
      ),
    ];
    const o = recordedBy(saves, pastTheWindow());
    expect(o.providerReference).toBe(
      `${messageIdOf(o)} copy=provider-saves in=imap://${encodeURIComponent(SENDER.user)}@127.0.0.1:${ports.imap}/%5CSent`,
    );
    for (const today of elsewhere)
      expect(await today.send.reconcile!(report, o)).toEqual({
        found: false,
        proof: "never",
        reason: expect.stringContaining(
          `(copy recorded at its first send: copy=provider-saves in=imap://${encodeURIComponent(SENDER.user)}@127.0.0.1:${ports.imap}/%5CSent; the config now says`,
        ),
      });
    // The same Sent: absent past the window, as before.
    expect(await saves.send.reconcile!(report, o)).toMatchObject({ found: false, proof: "absent" });
    // A reference written before the Sent folder was recorded (`copy=provider-saves` alone) is read
    // with today's Sent, as that version did.
    const older = { ...o, providerReference: `${messageIdOf(o)} copy=provider-saves` };
    expect(await elsewhere[0]!.send.reconcile!(report, older)).toMatchObject({ found: false, proof: "absent" });
  });

  describe("a Sent folder of the same account, named otherwise than the record names it", () => {
    // The sandbox's Dovecot has Sent (SPECIAL-USE \Sent), Journal and INBOX for every user.
    const named = (sentMailbox?: string) =>
      withCopy({ mode: "provider-saves" }, sentMailbox === undefined ? {} : { sentMailbox });
    /** The sender's mailbox as a reference records it. */
    const place = (mailbox: string) => `imap://${encodeURIComponent(SENDER.user)}@127.0.0.1:${ports.imap}/${mailbox}`;

    it('one folder on the server (the unset \\Sent and "Sent", either way round; INBOX in any case): absent past the window, nothing sent', async () => {
      // Before: compared as spelled, two places, so not found proved nothing: a person decided.
      for (const [first, today, recorded] of [
        [undefined, "Sent", "%5CSent"],
        ["Sent", undefined, "Sent"],
        ["INBOX", "inbox", "INBOX"],
      ] as const) {
        const o = recordedBy(named(first), pastTheWindow());
        expect(o.providerReference).toBe(`${messageIdOf(o)} copy=provider-saves in=${place(recorded)}`);
        expect(await named(today).send.reconcile!(report, o)).toEqual({
          found: false,
          proof: "absent",
          reason: expect.stringMatching(
            /after the settle window, nor in the account's \d+ other mailboxes \(copy recorded at its first send: .*; the config now says /,
          ),
        });
        expect(sandbox.count(messageIdOf(o))).toBe(0);
      }
    });

    it('recorded \\Sent, the copy found by a config naming "Sent": it counts; one message at the server, none sent by the lookup', async () => {
      const o = recordedBy(named(), fresh());
      sandbox.mode = "provider-saves";
      try {
        expect(await named().send.execute(report, o)).toMatchObject({ sent: true });
      } finally {
        sandbox.mode = "journal";
      }
      expect(await named("Sent").send.reconcile!(report, o)).toMatchObject({
        found: true,
        receipt: { foundIn: "Sent" },
      });
      expect(sandbox.count(messageIdOf(o))).toBe(1);
    });

    it("genuinely different folders (Sent and Journal, either way round; a mailbox the server does not have): proves nothing", async () => {
      for (const [first, today, why] of [
        [undefined, "Journal", "on the server, Sent, not Journal"],
        ["Journal", undefined, "on the server, Journal, not Sent"],
        ["Sent", "Journal", "on the server, Sent, not Journal"],
        ["sent", "Sent", "the server has no mailbox sent"], // names are case-sensitive but INBOX
      ] as const) {
        const o = recordedBy(named(first), pastTheWindow());
        const settled = await named(today).send.reconcile!(report, o);
        expect(settled).toMatchObject({
          found: false,
          proof: "never",
          reason: expect.stringContaining(`which is not where the config now looks (${place(today ?? "%5CSent")})`),
        });
        expect(settled).toMatchObject({ reason: expect.stringContaining(why) });
        expect(sandbox.count(messageIdOf(o))).toBe(0);
      }
    });

    it("the server cannot list its mailboxes: never proven absent (the lookup fails, tried later); a copy found still counts", async () => {
      const proxy = await listRefusingProxy(ports.imap);
      try {
        const via = (sentMailbox?: string) =>
          withCopy(
            { mode: "provider-saves" },
            {
              imap: { host: "127.0.0.1", port: proxy.port, auth: SENDER, requireTLS: false },
              ...(sentMailbox !== undefined && { sentMailbox }),
            },
          );
        const o = recordedBy(via(), pastTheWindow());
        const converse = recordedBy(via("Sent"), pastTheWindow());
        expect(await via("Sent").send.reconcile!(report, o)).toMatchObject({ proof: "absent" }); // the proxy passes LIST on
        // Every LIST refused: imapflow lists a mailbox before it opens it, so nothing can be
        // searched, either way round. The lookup fails: the runner tries later.
        proxy.refuse = "every LIST";
        for (const [today, recorded] of [
          [via("Sent"), o],
          [via(), converse],
        ] as const)
          await expect(today.send.reconcile!(report, recorded)).rejects.toBeInstanceOf(MailboxUnavailableError);
        // Only the full listing refused (a server that times out on it, or one with more mailboxes
        // than imapflow collects): Sent can be searched, but whether \Sent is Sent cannot be told
        // now: the lookup fails and is tried later (not absent, and not a person's question).
        proxy.refuse = "the full listing";
        await expect(via("Sent").send.reconcile!(report, o)).rejects.toThrow(/IMAP LIST failed/);
        await expect(via().send.reconcile!(report, converse)).rejects.toBeInstanceOf(MailboxUnavailableError);
        await fileInSent(messageIdOf(o));
        expect(await via("Sent").send.reconcile!(report, o)).toMatchObject({
          found: true,
          receipt: { foundIn: "Sent" },
        });
        expect(proxy.refused).toBeGreaterThanOrEqual(5);
        expect(sandbox.count(messageIdOf(o))).toBe(0);
      } finally {
        await proxy.close();
      }
    });
  });

  it("a later attempt under another copy mode than the recorded one sends nothing: refused, alerted", async () => {
    const o = recordedBy(withCopy({ mode: "append" }), fresh());
    const before = sandbox.count();
    const error = await journal()
      .send.execute(report, o)
      .catch((e: unknown) => e);
    expect(error).toBeInstanceOf(CopyChangedError);
    expect(error).toMatchObject({
      messageId: messageIdOf(o),
      recorded: `copy=append in=imap://${encodeURIComponent(SENDER.user)}@127.0.0.1:${ports.imap}/%5CSent`,
    });
    expect((error as CopyChangedError).configured).toMatch(/^copy=journal bcc=journal@idem\.test in=imap:/);
    expect(classifyEmailError(error)).toMatchObject({ kind: "permanent", alert: true });
    expect(sandbox.count()).toBe(before);
  });

  it("a copy mode this version does not know: never proven absent, and not sent", async () => {
    const o = pastTheWindow();
    const unknown = { ...o, providerReference: `${messageIdOf(o)} copy=carrier-pigeon` };
    expect(await journal().send.reconcile!(report, unknown)).toMatchObject({ found: false, proof: "never" });
    const error = await journal()
      .send.execute(report, unknown)
      .catch((e: unknown) => e);
    expect(error).toMatchObject({ name: "CopyChangedError", recorded: "copy=carrier-pigeon" });
    expect(sandbox.count(messageIdOf(o))).toBe(0);
  });

  it("a reference from before the copy was recorded (a bare Message-ID) is read with today's config, as before", async () => {
    const old = (o: OperationContext) => ({ ...o, providerReference: messageIdOf(o) });
    expect(await journal().send.reconcile!(report, old(pastTheWindow()))).toMatchObject({
      found: false,
      proof: "absent",
    });
    expect(await withCopy({ mode: "append" }).send.reconcile!(report, old(pastTheWindow()))).toMatchObject({
      found: false,
      proof: "never",
    });
    const o = old(fresh());
    expect(await journal().send.execute(report, o)).toMatchObject({ sent: true, messageId: messageIdOf(o) });
    expect(await journal().send.reconcile!(report, o)).toMatchObject({ found: true, receipt: { foundIn: "INBOX" } });
    expect(sandbox.count(messageIdOf(o))).toBe(1);
  });
});

/** Files a copy of a message with this Message-ID in the sender's Sent, as a provider does. */
async function fileInSent(messageId: string): Promise<void> {
  const client = sandbox.imap(SENDER);
  await client.connect();
  try {
    await client.append("Sent", Buffer.from(`Message-ID: ${messageId}\r\nSubject: filed\r\n\r\nfiled\r\n`));
  } finally {
    await client.logout();
  }
}

/**
 * A pass-through to the sandbox's IMAP port that answers LIST (XLIST, LSUB) with NO, as a server
 * whose mailbox list is unavailable does; Dovecot cannot be made to. `refuse`: every LIST, or only
 * the full listing (`LIST "" "*"`, imapflow's `list()`; its SELECT lists the one mailbox first).
 * imapflow writes each command whole, so a command is recognised at the start of a chunk.
 */
async function listRefusingProxy(target: number) {
  const sockets = new Set<Socket>();
  const server = createServer((client) => {
    const upstream = connect(target, "127.0.0.1");
    for (const s of [client, upstream]) {
      sockets.add(s);
      const end = () => {
        client.destroy();
        upstream.destroy();
        sockets.delete(client);
        sockets.delete(upstream);
      };
      s.on("close", end);
      s.on("error", end);
    }
    client.on("data", (chunk: Buffer) => {
      const command = /^(\S+) (?:X?LIST|LSUB) ("" "\*")?/i.exec(chunk.toString("latin1", 0, 64));
      if (command && (proxy.refuse === "every LIST" || (proxy.refuse === "the full listing" && command[2]))) {
        proxy.refused++;
        client.write(`${command[1]} NO [UNAVAILABLE] mailbox list temporarily unavailable\r\n`);
      } else upstream.write(chunk);
    });
    upstream.pipe(client);
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const proxy = {
    port: (server.address() as AddressInfo).port,
    refuse: undefined as "every LIST" | "the full listing" | undefined,
    refused: 0,
    close: () =>
      new Promise<void>((resolve) => {
        for (const s of sockets) s.destroy();
        server.close(() => resolve());
      }),
  };
  return proxy;
}
