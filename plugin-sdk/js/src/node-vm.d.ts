// The one Node module the testing Harness uses (the SDK is checked without Node's types: a
// handler runs in a component, where Node's modules do not exist). Only `testing.ts` imports it,
// and only tests, bundled for Node by `scripts/test.mjs`, import `testing.ts`.
declare module "node:vm" {
  /** Evaluates `code` in a new context (a new realm, with its own built-ins). */
  export function runInNewContext(code: string): unknown;
}
