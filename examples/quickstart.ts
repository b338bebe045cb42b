/**
 * The smallest end-to-end use of idem: an "email" (a line in an outbox file) sent through the
 * ledger on a SQLite file, then the same job run again, as a retrying agent would. The second
 * call is answered from the ledger with the first receipt; the outbox still holds one message.
 *
 *   pnpm example
 */
import { appendFileSync, mkdirSync, readFileSync, rmSync } from "node:fs";
import { defineAction, describeResult, openLedger } from "@idem/core";

const dir = ".idem/quickstart";
rmSync(dir, { recursive: true, force: true });
mkdirSync(dir, { recursive: true });
const outbox = `${dir}/outbox.txt`;

// A mailer with no idempotency of its own: every call is another email.
const sendReport = defineAction<{ to: string; subject: string }, { messageId: string }>({
  type: "outbox.send",
  capabilities: {}, // it neither dedupes nor can be queried: an unknown outcome goes to a person
  async execute(args, op) {
    const messageId = `<${op.key.slice(0, 24)}@example.com>`;
    appendFileSync(outbox, `${messageId} to=${args.to} subject=${args.subject}\n`);
    return { messageId };
  },
});

const ledger = await openLedger(`sqlite:${dir}/idem.db`);
const job = {
  tenant: "acme",
  key: ["weekly-report", "client-42", "2026-W48"], // the business identity of the work
  args: { to: "ops@client-42.example", subject: "Weekly report, week 48" },
  actor: "report-agent",
};

const first = await ledger.run(sendReport, job);
console.log(`first run:  ${describeResult(first)}`);
const second = await ledger.run(sendReport, job); // the agent retries the whole job
console.log(`second run: ${describeResult(second)}`);

const sent = readFileSync(outbox, "utf8").trim().split("\n");
console.log(`emails in the outbox: ${sent.length}`);
await ledger.close();
if (sent.length !== 1 || second.status !== "succeeded" || !second.replayed) {
  console.error("expected one email and a replayed receipt");
  process.exit(1);
}
