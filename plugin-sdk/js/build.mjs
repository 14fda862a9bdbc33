#!/usr/bin/env node
// Builds a TypeScript or JavaScript handler into a hookd plugin component:
//
//     node plugin-sdk/js/build.mjs <entry.ts|entry.js> <out.wasm> [--wit DIR] [--world NAME] [--keep-js FILE]
//
// 1. esbuild bundles the entry and everything it imports (the SDK as `@hookd/plugin-sdk`
//    included) into one ES module, TypeScript types stripped; the WIT imports
//    (`hookd:plugin/...`, `wasi:...`) stay imports.
// 2. ComponentizeJS (StarlingMonkey, a SpiderMonkey build for WASI 0.2) snapshots the engine
//    with that module evaluated, against `wit/v0.3.0`, world `handler-plugin`: the result is a
//    component exporting `hookd:plugin/handler@0.3.0`.
//
// The entry module must export the handler as `handler` (`export const handler =
// defineHandler(...)`). Copy the output into hookd's `plugins_dir` as `<name>.wasm`.
import { mkdir, mkdtemp, readFile, rm, stat, writeFile } from "node:fs/promises";
import { builtinModules } from "node:module";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { parseArgs } from "node:util";

const sdk = dirname(fileURLToPath(import.meta.url));

/** hookd refuses larger plugin files (README "Reload and rollback"). */
const MAX_FILE_BYTES = 20 * 1024 * 1024;

const { values, positionals } = parseArgs({
  allowPositionals: true,
  options: {
    wit: { type: "string", default: resolve(sdk, "../../wit/v0.3.0") },
    world: { type: "string", default: "handler-plugin" },
    "keep-js": { type: "string" },
    help: { type: "boolean", short: "h" },
  },
});
if (values.help || positionals.length !== 2) {
  console.error("usage: node build.mjs <entry.ts|entry.js> <out.wasm> [--wit DIR] [--world NAME] [--keep-js FILE]");
  process.exit(values.help ? 0 : 2);
}
const [entry, out] = positionals.map((p) => resolve(p));

const started = performance.now();
/** Imports one of the build's tools, or says how to install them (not a stack trace). */
async function tool(name) {
  try {
    return await import(name);
  } catch (e) {
    if (e?.code !== "ERR_MODULE_NOT_FOUND") throw e;
    console.error(
      `${name} is not installed: the JS SDK's build tools come with \`npm ci --prefix ${sdk}\` ` +
        "(esbuild and ComponentizeJS, from npm)",
    );
    process.exit(1);
  }
}
const { build } = await tool("esbuild");
const { componentize } = await tool("@bytecodealliance/componentize-js");

/**
 * Node's built-in modules do not exist in a component: say so, not "bundle for node". A bare
 * name (`events`, `buffer`) a package in node_modules provides (a polyfill) is that package.
 */
const noNodeBuiltins = {
  name: "no-node-builtins",
  setup(b) {
    const names = builtinModules.map((m) => m.replace(/[.*+?^${}()|[\]\\/]/g, "\\$&")).join("|");
    b.onResolve({ filter: new RegExp(`^(node:.*|(${names})(/.*)?)$`) }, async (args) => {
      if (args.pluginData?.asIs) return undefined;
      if (!args.path.startsWith("node:")) {
        const found = await b.resolve(args.path, {
          kind: args.kind,
          importer: args.importer,
          resolveDir: args.resolveDir,
          pluginData: { asIs: true },
        });
        if (found.errors.length === 0) {
          const { path, namespace, external, sideEffects, suffix } = found;
          return { path, namespace, external, sideEffects, suffix };
        }
      }
      return {
        errors: [
          {
            text:
              `"${args.path}" is a Node.js built-in module, which does not exist in a hookd ` +
              "plugin (no files, sockets or process): use the SDK's http, state, config and log",
          },
        ],
      };
    });
  },
};

const work = await mkdtemp(join(tmpdir(), "hookd-js-build-"));
try {
  const bundle = join(work, "handler.js");
  const result = await build({
    entryPoints: [entry],
    bundle: true,
    format: "esm",
    platform: "neutral",
    target: "es2022",
    outfile: bundle,
    // The component's imports: ComponentizeJS binds them to the WIT world.
    external: ["hookd:*", "wasi:*"],
    alias: { "@hookd/plugin-sdk": join(sdk, "src/index.ts") },
    mainFields: ["module", "main"],
    logLevel: "warning",
    legalComments: "none",
    plugins: [noNodeBuiltins],
    metafile: true,
  }).catch(() => null); // esbuild has printed its errors: no stack trace on top
  if (result === null || result.errors.length > 0) process.exit(1);
  const exported = Object.values(result.metafile.outputs).flatMap((o) => o.exports ?? []);
  if (!exported.includes("handler")) {
    console.error(
      `${entry} does not export \`handler\` (it exports: ${exported.join(", ") || "nothing"}): ` +
        "write `export const handler = defineHandler((event) => ...)`",
    );
    process.exit(1);
  }
  if (values["keep-js"]) await writeFile(resolve(values["keep-js"]), await readFile(bundle));
  const bundled = performance.now();

  const { component } = await componentize({
    sourcePath: bundle,
    witPath: resolve(values.wit),
    worldName: values.world,
  });
  // `plugins/` of a fresh scaffold does not exist until something makes it.
  await mkdir(dirname(out), { recursive: true });
  await writeFile(out, component);
  const size = (await stat(out)).size;
  const done = performance.now();
  console.log(
    `${out}: ${size} bytes (${(size / 1048576).toFixed(1)} MiB); ` +
      `bundled in ${((bundled - started) / 1000).toFixed(1)} s, componentized in ${((done - bundled) / 1000).toFixed(1)} s`,
  );
  if (size > MAX_FILE_BYTES) {
    console.error(`warning: ${out} is over hookd's ${MAX_FILE_BYTES}-byte plugin file cap`);
  }
} finally {
  await rm(work, { recursive: true, force: true });
}
