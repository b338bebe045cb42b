/**
 * The TypeScript snippets of the user-facing docs (the READMEs and docs/) compile against the
 * packages' own types, as a user pastes them into a strict project. A snippet may leave names to
 * the reader (`mailer`, `orderId`, `model`): those, and only those, are declared `any`, found from
 * the compiler's own "cannot find name" answers; the imports, the option names, the shapes an
 * action returns and the values given to the packages' functions are checked as written.
 * Snippets in other languages (`js`, `json`, `sh`) are not checked here: the JavaScript ones are
 * whole programs a user runs, and `pnpm example` runs the smallest of them.
 */
import { existsSync, readdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import ts from "typescript";
import { expect, it } from "vitest";
import { scaled } from "@idem/testkit";

const REPO = fileURLToPath(new URL("../..", import.meta.url));
const DOCS = [
  "README.md",
  "apps/idem/README.md",
  ...readdirSync(join(REPO, "packages")).map((p) => `packages/${p}/README.md`),
  ...readdirSync(join(REPO, "docs"))
    .filter((f) => f.endsWith(".md"))
    .map((f) => `docs/${f}`),
].filter((f) => existsSync(join(REPO, f)));
/** "Cannot find name", its "did you mean" form, and a shorthand property with nothing in scope. */
const LEFT_TO_THE_READER = new Set([2304, 2552, 18004]);

interface Snippet {
  /** Where it is, for the failure message: the doc and the line its fence opens on. */
  readonly where: string;
  /** A virtual file beside the examples, whose node_modules hold every package and framework a snippet imports. */
  readonly file: string;
  readonly code: string;
  prelude: string;
}

function snippets(): Snippet[] {
  const found: Snippet[] = [];
  for (const doc of DOCS) {
    const text = readFileSync(join(REPO, doc), "utf8");
    for (const m of text.matchAll(/^```ts\n([\s\S]*?)^```/gm)) {
      const line = text.slice(0, m.index).split("\n").length;
      const file = join(REPO, "examples", `__doc_${doc.replace(/\W/g, "_")}_${line}.ts`);
      found.push({ where: `${doc}:${line}`, file, code: m[1]!, prelude: "" });
    }
  }
  return found;
}

/** The workspace's strict options (tsconfig.base.json), without emitting. */
function compilerOptions(): ts.CompilerOptions {
  const base = ts.readConfigFile(join(REPO, "tsconfig.base.json"), ts.sys.readFile);
  // The examples do not depend on @idem/hubspot (no example needs HubSpot): its snippets find its sources.
  const paths = { "@idem/hubspot": [join(REPO, "packages/hubspot/src/index.ts")] };
  const json = { ...base.config.compilerOptions, noEmit: true, declaration: false, types: ["node"], paths };
  return ts.convertCompilerOptionsFromJson(json, join(REPO, "examples")).options;
}

/** One program over every snippet: its errors per snippet, with the names left to the reader apart. */
function check(all: Snippet[], options: ts.CompilerOptions) {
  const text = new Map(all.map((s) => [s.file, `${s.prelude}${s.code}\nexport {};\n`]));
  const host = ts.createCompilerHost(options);
  const { fileExists, readFile, getSourceFile } = host;
  host.fileExists = (f) => text.has(f) || fileExists.call(host, f);
  host.readFile = (f) => text.get(f) ?? readFile.call(host, f);
  host.getSourceFile = (f, v, ...rest) => {
    const t = text.get(f);
    return t === undefined ? getSourceFile.call(host, f, v, ...rest) : ts.createSourceFile(f, t, v);
  };
  const program = ts.createProgram([...text.keys()], options, host);
  return all.map((s) => {
    const missing = new Set<string>();
    const errors: string[] = [];
    const offset = s.prelude.split("\n").length - 1;
    for (const d of ts.getPreEmitDiagnostics(program, program.getSourceFile(s.file))) {
      const message = ts.flattenDiagnosticMessageText(d.messageText, "\n");
      const name = /'(\w+)'/.exec(message)?.[1];
      // "Did you mean" one of the snippet's own imports is a typo of the API, not the reader's name.
      const meant = /Did you mean '(\w+)'/.exec(message)?.[1];
      const typo = meant !== undefined && new RegExp(`^import .*\\b${meant}\\b`, "m").test(s.code);
      if (LEFT_TO_THE_READER.has(d.code) && name && !typo) missing.add(name);
      else {
        const line = d.file && d.start !== undefined ? d.file.getLineAndCharacterOfPosition(d.start).line - offset : 0;
        errors.push(`${s.where} +${line}: TS${d.code} ${message}`);
      }
    }
    return { snippet: s, missing, errors };
  });
}

it(
  "every TypeScript snippet of the docs compiles as written, its reader's own names aside",
  () => {
    const all = snippets();
    expect(all.length).toBeGreaterThan(5);
    const options = compilerOptions();
    let results = check(all, options);
    // A name declared may reveal others (a shorthand property after a call): a few rounds settle it.
    for (let round = 0; round < 3 && results.some((r) => r.missing.size > 0); round++) {
      for (const r of results) r.snippet.prelude += [...r.missing].map((n) => `declare const ${n}: any;\n`).join("");
      results = check(all, options);
    }
    expect(
      results.flatMap((r) => [...r.errors, ...[...r.missing].map((n) => `${r.snippet.where}: ${n} undeclared`)]),
    ).toEqual([]);
  },
  scaled(2 * 60_000), // one compile of every snippet takes about 10 s on a quiet machine, up to four rounds
);
