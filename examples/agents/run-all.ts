/**
 * Runs the agent examples in sequence, each in its own process (so each must close its
 * ledger, sandbox and client to exit by itself), and exits non-zero if any failed.
 *
 *   pnpm example:agents
 */
import { spawnSync } from "node:child_process";
import { fileURLToPath } from "node:url";

const examples = [
  ["AI SDK", "ai-sdk.ts"],
  ["OpenAI Agents", "openai-agents.ts"],
  ["MCP", "mcp.ts"],
  ["LangGraph", "langgraph.ts"],
] as const;
const failed: string[] = [];
for (const [framework, file] of examples) {
  console.log(
    `\n${framework} (examples/agents/${file}): a model charges an invoice, retries, retries with another amount`,
  );
  // The same node flags as this process (--conditions=idem-source --import tsx); a hung example is killed after 60 s.
  const child = spawnSync(process.execPath, [...process.execArgv, fileURLToPath(new URL(file, import.meta.url))], {
    stdio: "inherit",
    timeout: 60_000,
  });
  if (child.status !== 0)
    failed.push(`${framework} (${child.signal ? `killed: ${child.signal}` : `exit ${child.status}`})`);
}
console.log(
  failed.length ? `\nFAILED: ${failed.join(", ")}` : "\nok: one PaymentIntent per invoice with every framework",
);
process.exit(failed.length ? 1 : 0);
