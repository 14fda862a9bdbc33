#!/usr/bin/env node
// Runs unit tests written in TypeScript (or JavaScript) with `node --test`:
//
//     node plugin-sdk/js/scripts/test.mjs [FILE_OR_DIR ...]     (default: ./test)
//
// Each `*.test.ts` / `*.test.js` is bundled by esbuild with the SDK (`@hookd/plugin-sdk`,
// `@hookd/plugin-sdk/testing`); the WIT imports are replaced by stubs that refuse to run, so
// everything a test exercises goes through a `Harness` (or is pure).
import { spawnSync } from "node:child_process";
import { mkdtemp, readdir, rm, stat } from "node:fs/promises";
import { tmpdir } from "node:os";
import { basename, dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

const sdk = resolve(dirname(fileURLToPath(import.meta.url)), "..");
const { build } = await import("esbuild");

async function collect(path) {
  const s = await stat(path);
  if (s.isFile()) return [path];
  const found = [];
  for (const entry of await readdir(path, { withFileTypes: true })) {
    const p = join(path, entry.name);
    if (entry.isDirectory() && entry.name !== "node_modules") found.push(...(await collect(p)));
    else if (/\.test\.[cm]?[jt]s$/.test(entry.name)) found.push(p);
  }
  return found;
}

const roots = process.argv.slice(2);
const files = (await Promise.all((roots.length ? roots : ["test"]).map((r) => collect(resolve(r))))).flat().sort();
if (files.length === 0) {
  console.error("no *.test.ts files found");
  process.exit(1);
}

// Every name the SDK imports from the WIT modules; calling any of them outside a harness call
// is a mistake in the test.
const STUB = `
const outside = (name) => () => { throw new Error(name + " needs hookd: run the handler through a Harness"); };
export const log = outside("log"), get = outside("config/state get"), set = outside("state.set"),
  lastRefusal = outside("network.lastRefusal"), handle = outside("wasi:http"), httpErrorCode = outside("wasi:http");
const _delete = outside("state.delete");
export { _delete as delete };
export class Fields {} export class OutgoingBody {} export class OutgoingRequest {} export class RequestOptions {}
`;
const witStub = {
  name: "wit-stub",
  setup(b) {
    b.onResolve({ filter: /^(hookd|wasi):/ }, (args) => ({ path: args.path, namespace: "wit-stub" }));
    b.onLoad({ filter: /.*/, namespace: "wit-stub" }, () => ({ contents: STUB, loader: "js" }));
  },
};

const out = await mkdtemp(join(tmpdir(), "hookd-js-test-"));
try {
  const outputs = [];
  for (const [i, file] of files.entries()) {
    const outfile = join(out, `${i}-${basename(file).replace(/\.[cm]?[jt]s$/, ".mjs")}`);
    await build({
      entryPoints: [file],
      bundle: true,
      format: "esm",
      platform: "node",
      target: "node20",
      outfile,
      sourcemap: "inline",
      alias: {
        "@hookd/plugin-sdk/testing": join(sdk, "src/testing.ts"),
        "@hookd/plugin-sdk": join(sdk, "src/index.ts"),
      },
      plugins: [witStub],
      logLevel: "warning",
    });
    outputs.push(outfile);
  }
  const run = spawnSync(process.execPath, ["--enable-source-maps", "--test", ...outputs], { stdio: "inherit" });
  process.exitCode = run.status ?? 1;
} finally {
  await rm(out, { recursive: true, force: true });
}
