// The package.json a published package is packed with (`pnpm pack`, `pnpm publish`, so
// `changeset publish`) holds what a user of the registry needs and nothing of this workspace:
// - no devDependencies: they are this repository's own (the test helpers @idem/testkit and
//   @idem/sandbox are private workspace packages, never published);
// - no scripts: clean/build/prepack build the package here; a user never runs them, and a
//   lifecycle script among them would run at the user's install;
// - no `idem-source` export condition: it points the workspace's tools at src/*.ts, which ships
//   only as the sources of dist's maps; a user's bundler or `node --conditions=idem-source` would
//   load TypeScript in place of the build. A subpath that exists only under it (test internals
//   such as `@idem/core/testing`) is left out, as a registry's user could not resolve it.
// It also refuses a package whose runtime dependencies name a private workspace package.
//
// beforePacking rewrites only the packed manifest (package.json on disk stays as it is). pnpm
// loads this file at installs and runs too, and pnpm-lock.yaml records its checksum: after editing
// it, run `pnpm install` so that a frozen install (CI) accepts the lockfile.
const { existsSync, readFileSync } = require("node:fs");
const { join } = require("node:path");

const RUNTIME_FIELDS = ["dependencies", "optionalDependencies", "peerDependencies"];
const WORKSPACE_CONDITION = "idem-source";

/** Throws when a runtime dependency is a private workspace package (pkg has its ranges already resolved). */
function refusePrivateDependencies(dir) {
  const onDisk = JSON.parse(readFileSync(join(dir, "package.json"), "utf8"));
  for (const field of RUNTIME_FIELDS) {
    for (const [name, spec] of Object.entries(onDisk[field] ?? {})) {
      if (!String(spec).startsWith("workspace:")) continue;
      // pnpm links every workspace dependency into the package's node_modules.
      const linked = join(dir, "node_modules", name, "package.json");
      if (!existsSync(linked)) {
        throw new Error(
          `${onDisk.name}: ${field}.${name} is a workspace package not linked in node_modules; run pnpm install`,
        );
      }
      if (JSON.parse(readFileSync(linked, "utf8")).private === true) {
        throw new Error(
          `${onDisk.name}: ${field}.${name} is a private workspace package, never published; a registry's user could not install it`,
        );
      }
    }
  }
}

/** The exports map without the workspace's condition. */
function publishedExports(exports) {
  if (!exports || typeof exports !== "object") return exports;
  const out = {};
  for (const [sub, target] of Object.entries(exports)) {
    if (!target || typeof target !== "object") {
      out[sub] = target;
      continue;
    }
    const { [WORKSPACE_CONDITION]: _workspace, ...conditions } = target;
    if (Object.keys(conditions).length > 0) out[sub] = conditions;
  }
  return out;
}

function beforePacking(pkg, dir) {
  refusePrivateDependencies(dir);
  delete pkg.devDependencies;
  delete pkg.scripts;
  if (pkg.exports !== undefined) pkg.exports = publishedExports(pkg.exports);
  return pkg;
}

module.exports = { hooks: { beforePacking } };
