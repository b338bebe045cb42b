/**
 * An agent process SIGKILLed in the middle of a tool call (Stripe committed the charge, the
 * answer had not arrived), then the agent run again: one PaymentIntent, and the second run's
 * model reads that the charge is done.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { fileURLToPath } from "node:url";
import { openLedger } from "@idem/core";
import { StripeSandbox } from "@idem/sandbox";
import { DIALECTS, freshDatabase, kill9, startChild, type Child } from "@idem/testkit";

const AGENT = fileURLToPath(new URL("./children/ai-agent.ts", import.meta.url));

let sandbox: StripeSandbox;
let server: { port: number; apiKey: string };
const children: Child[] = [];
beforeAll(async () => {
  sandbox = new StripeSandbox();
  server = await sandbox.start();
});
afterAll(async () => {
  for (const c of children) if (c.proc.exitCode === null && c.proc.signalCode === null) await kill9(c);
  await sandbox.close();
});

for (const dialect of DIALECTS) {
  describe(`an agent killed mid-tool-call on ${dialect}`, () => {
    it("re-run: one PaymentIntent, and the model reads done", async () => {
      const url = await freshDatabase(dialect);
      await (await openLedger(url)).close(); // migrated for the agents, which open without migrating
      const invoice = `inv-crash-${dialect}-${Math.random().toString(36).slice(2, 7)}`;
      const env = {
        LEDGER_URL: url,
        STRIPE_PORT: String(server.port),
        STRIPE_KEY: server.apiKey,
        TENANT: "acme",
        INVOICE: invoice,
        LEASE_MS: "2000",
      };
      const before = sandbox.count("payment_intents");

      // Stripe commits the charge and holds its answer: the agent is inside the tool call when it dies.
      sandbox.faults.add({ kind: "delay_after_commit", match: { path: "/v1/payment_intents" }, delayMs: 120_000 });
      const committed = new Promise<void>((resolve) => sandbox.events.once("commit", () => resolve()));
      const first = startChild(AGENT, [], env);
      children.push(first);
      await committed;
      await kill9(first);
      sandbox.faults.clear();
      expect(sandbox.count("payment_intents") - before).toBe(1);

      const again = startChild(AGENT, [], env);
      children.push(again);
      const line = await again.waitFor(/^outcome /, 120_000);
      const outcome = JSON.parse(line.slice("outcome ".length)) as { status: string; message: string };
      expect(["done", "already_done"]).toContain(outcome.status);
      expect((await again.exited).code).toBe(0);
      expect(sandbox.count("payment_intents") - before).toBe(1);
    });
  });
}
