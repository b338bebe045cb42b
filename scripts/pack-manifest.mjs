#!/usr/bin/env node
// The package.json a published package is packed with carries no devDependencies. They are this
// repository's own (the test helpers @idem/testkit and @idem/sandbox are private workspace packages,
// never published), and nobody who installs the package from a registry installs them.
//
// pnpm writes the packed manifest from package.json as it is on disk after `prepack`, and has no
// setting to leave a field out: `publishConfig` overrides entry points only (bin, main, exports,
// types…), and the `beforePacking` hook needs a .pnpmfile.cjs, which pnpm also loads at every
// install. So each published package's `prepack` ends with `strip` and its `postpack` runs
// `restore`, from the package's directory:
//
//   node ../../scripts/pack-manifest.mjs strip     keeps package.json as package.json.prepack and
//                                                   writes package.json without devDependencies
//   node ../../scripts/pack-manifest.mjs restore   puts package.json.prepack back
//
// Both replace package.json by a rename, so a process reading it meanwhile (another package's pack
// resolving `workspace:` ranges) sees one whole manifest or the other. A pack that failed between
// the two leaves package.json.prepack behind (and package.json stripped): `strip` then stops and
// says so rather than guess which of the two holds later edits; `restore` puts it back.
// `strip` also refuses a manifest whose remaining dependencies name a private workspace package, and
// drops the export subpaths that exist only under the workspace's `idem-source` condition (test
// internals such as `@idem/core/testing`): a registry's user could not resolve them.
import { copyFileSync, existsSync, readFileSync, renameSync, writeFileSync } from "node:fs";

const MANIFEST = "package.json";
const KEPT = "package.json.prepack";
const RUNTIME_FIELDS = ["dependencies", "optionalDependencies", "peerDependencies"];

function restore() {
  if (existsSync(KEPT)) renameSync(KEPT, MANIFEST);
}

function strip() {
  if (existsSync(KEPT)) {
    throw new Error(
      `${KEPT} is left from a pack that failed after its prepack, and ${MANIFEST} may be the stripped copy: ` +
        `run "node ../../scripts/pack-manifest.mjs restore" here (or keep whichever file has your edits), then pack again`,
    );
  }
  const manifest = JSON.parse(readFileSync(MANIFEST, "utf8"));
  for (const field of RUNTIME_FIELDS) {
    for (const [name, spec] of Object.entries(manifest[field] ?? {})) {
      if (!String(spec).startsWith("workspace:")) continue;
      // pnpm links every workspace dependency into the package's node_modules.
      const linked = `node_modules/${name}/package.json`;
      if (!existsSync(linked))
        throw new Error(
          `${manifest.name}: ${field}.${name} is a workspace package not linked in node_modules; run pnpm install`,
        );
      if (JSON.parse(readFileSync(linked, "utf8")).private === true) {
        throw new Error(
          `${manifest.name}: ${field}.${name} is a private workspace package, never published; a registry's user could not install it`,
        );
      }
    }
  }
  delete manifest.devDependencies;
  if (manifest.exports && typeof manifest.exports === "object") {
    for (const [sub, conditions] of Object.entries(manifest.exports)) {
      if (conditions && typeof conditions === "object" && Object.keys(conditions).every((c) => c === "idem-source")) {
        delete manifest.exports[sub];
      }
    }
  }
  copyFileSync(MANIFEST, KEPT);
  writeFileSync(`${MANIFEST}.tmp`, `${JSON.stringify(manifest, null, 2)}\n`);
  renameSync(`${MANIFEST}.tmp`, MANIFEST);
}

const command = process.argv[2];
if (command !== "strip" && command !== "restore") {
  console.error(
    "usage: node pack-manifest.mjs strip|restore (from a package's directory, in its prepack and postpack)",
  );
  process.exit(2);
}
try {
  if (command === "strip") strip();
  else restore();
} catch (e) {
  console.error(`pack-manifest ${command}: ${e instanceof Error ? e.message : e}`);
  process.exit(1);
}
