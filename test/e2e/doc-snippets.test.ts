/**
 * The TypeScript snippets of the user-facing docs (the READMEs and docs/) compile against the
 * packages' own types, as a user pastes them into a strict project. A snippet may leave names to
 * the reader (`mailer`, `orderId`, `model`): those, and only those, are declared `any`, found from
 * the compiler's own "cannot find name" answers; the imports, the option names, the shapes an
 * action returns and the values given to the packages' functions are checked as written.
 * The JavaScript snippets are checked as a JavaScript project checks them (`checkJs`, not strict:
 * a value read from the environment may be undefined there, and an action's args are what the
 * caller gave), so a misspelt option, export or field still fails; `json` and `sh` are not checked.
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
/** What only a type annotation answers: JavaScript has none to give (a misspelt name is still an error). */
const UNTYPED_IN_JS = /is of type 'unknown'|on type 'unknown'/;

interface Snippet {
  /** Where it is, for the failure message: the doc and the line its fence opens on. */
  readonly where: string;
  /** A virtual file beside the examples, whose node_modules hold every package and framework a snippet imports. */
  readonly file: string;
  readonly code: string;
  readonly js: boolean;
  prelude: string;
}

function snippets(): Snippet[] {
  const found: Snippet[] = [];
  for (const doc of DOCS) {
    const text = readFileSync(join(REPO, doc), "utf8");
    for (const m of text.matchAll(/^```(ts|js)\n([\s\S]*?)^```/gm)) {
      const line = text.slice(0, m.index).split("\n").length;
      const file = join(REPO, "examples", `__doc_${doc.replace(/\W/g, "_")}_${line}.${m[1] === "js" ? "mjs" : "ts"}`);
      found.push({ where: `${doc}:${line}`, file, code: m[2]!, js: m[1] === "js", prelude: "" });
    }
  }
  return found;
}

/** The workspace's strict options (tsconfig.base.json), without emitting; a JavaScript project's for `js`. */
function compilerOptions(js: boolean): ts.CompilerOptions {
  const base = ts.readConfigFile(join(REPO, "tsconfig.base.json"), ts.sys.readFile);
  // The examples do not depend on @idem/hubspot (no example needs HubSpot): its snippets find its sources.
  const paths = { "@idem/hubspot": [join(REPO, "packages/hubspot/src/index.ts")] };
  const json = {
    ...base.config.compilerOptions,
    noEmit: true,
    declaration: false,
    types: ["node"],
    paths,
    ...(js && { allowJs: true, checkJs: true, strict: false, exactOptionalPropertyTypes: false }),
  };
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
      // A JavaScript program reads what it was given (an action's args, the run context) as it comes.
      else if (s.js && UNTYPED_IN_JS.test(message)) continue;
      else {
        const line = d.file && d.start !== undefined ? d.file.getLineAndCharacterOfPosition(d.start).line - offset : 0;
        errors.push(`${s.where} +${line}: TS${d.code} ${message}`);
      }
    }
    return { snippet: s, missing, errors };
  });
}

it(
  "every TypeScript and JavaScript snippet of the docs compiles as written, its reader's own names aside",
  () => {
    const found = snippets();
    expect(found.filter((s) => !s.js).length).toBeGreaterThan(5);
    expect(found.filter((s) => s.js).length).toBeGreaterThan(4);
    const groups = [false, true].map((js) => ({ all: found.filter((s) => s.js === js), options: compilerOptions(js) }));
    const checkAll = () => groups.flatMap((g) => check(g.all, g.options));
    let results = checkAll();
    // A name declared may reveal others (a shorthand property after a call): a few rounds settle it.
    for (let round = 0; round < 3 && results.some((r) => r.missing.size > 0); round++) {
      for (const r of results)
        r.snippet.prelude += [...r.missing]
          .map((n) => (r.snippet.js ? `/** @type {any} */ var ${n};\n` : `declare const ${n}: any;\n`))
          .join("");
      results = checkAll();
    }
    expect(
      results.flatMap((r) => [...r.errors, ...[...r.missing].map((n) => `${r.snippet.where}: ${n} undeclared`)]),
    ).toEqual([]);
  },
  scaled(2 * 60_000), // one compile of every snippet takes about 10 s on a quiet machine, up to four rounds
);
