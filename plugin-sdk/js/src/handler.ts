/**
 * Registering a handler: the component's `hookd:plugin/handler@0.3.0` export.
 *
 * ```ts
 * import { defineHandler, output, state } from "@hookd/plugin-sdk";
 *
 * export const handler = defineHandler((event) => {
 *   const count = (state.getJson<number>("count") ?? 0) + 1;
 *   state.setJson("count", count);
 *   return output.json({ count });
 * });
 * ```
 *
 * The entry module must export the result as `handler` (the WIT interface's name).
 */
import type { Event as WitEvent, HandleError as WitHandleError } from "hookd:plugin/types@0.3.0";

import { BodyError, HandleError } from "./error.js";
import { Event } from "./event.js";
import { HttpError } from "./http-core.js";
import { isError } from "./realm.js";

/** What a handler returns: the output stored on the delivery, or nothing. */
export type Output = string | undefined | null | void;

/** A handler: one event in, an output (or a thrown {@link HandleError}) out. */
export type HandlerFn = (event: Event) => Output | Promise<Output>;

/** The shape ComponentizeJS exports for the `handler` interface. */
export interface HandlerExport {
  handle(ev: WitEvent): string | undefined | Promise<string | undefined>;
}

/**
 * Wraps `fn` as the component's handler export. Thrown values become the WIT `handle-error`:
 * a {@link HandleError} as it is, an {@link HttpError} as the Rust SDK's `?` converts it, a
 * {@link BodyError} as permanent. Anything else is a bug, like a panic in Rust: its message
 * and stack go to the call's stderr and the attempt traps (retried with backoff, and the
 * message is in the attempt's error).
 */
export function defineHandler(fn: HandlerFn): HandlerExport {
  return {
    handle(ev: WitEvent) {
      let result: Output | Promise<Output>;
      try {
        result = fn(ev instanceof Event ? ev : new Event(ev));
      } catch (e) {
        throw toWitError(e);
      }
      if (isPromise(result)) {
        return result.then(checkOutput, (e: unknown) => {
          throw toWitError(e);
        });
      }
      return checkOutput(result);
    },
  };
}

/** The handler's verdict for a thrown value, as a {@link HandleError}; `undefined` for a bug. */
export function toHandleError(e: unknown): HandleError | undefined {
  if (e instanceof HandleError) return e;
  if (e instanceof HttpError) return e.toHandleError();
  if (e instanceof BodyError) return HandleError.permanent(e.message);
  return undefined;
}

function toWitError(e: unknown): WitHandleError {
  const verdict = toHandleError(e);
  if (verdict) return verdict.toWit();
  crash(e);
}

function checkOutput(value: Output): string | undefined {
  if (value === undefined || value === null) return undefined;
  if (typeof value === "string") return value;
  crash(
    new TypeError(
      `the handler returned ${typeof value === "object" ? "an object" : `a ${typeof value}`}; return a string (output.json(value) encodes one) or nothing`,
    ),
  );
}

/** What `defineHandler` throws to make the component trap. */
export const TRAP: unique symbol = Symbol("trap");

function isPromise(v: unknown): v is Promise<Output> {
  return v !== null && typeof v === "object" && typeof (v as { then?: unknown }).then === "function";
}

/**
 * An uncaught error: reported on stderr in the form hookd reads a panic from
 * (`panicked at LOCATION:\nMESSAGE`), then the call traps.
 */
function crash(e: unknown): never {
  // Of any realm: an error the engine's bindings throw may come from another one.
  const err = isError(e) ? e : undefined;
  const stack = err?.stack ?? "";
  const location = /([^\s@()]+:\d+:\d+)/.exec(stack)?.[1] ?? "the handler";
  const message = err ? `${err.name}: ${err.message}` : `uncaught ${describe(e)}`;
  // The handler's own frames; the engine's glue below them says nothing useful.
  const own = stack.split("\n").filter((l) => l.trim() && !l.includes("initializer.js")).slice(0, 8);
  const frames = own.length ? `\n${own.join("\n")}` : "";
  lastPanic = `panicked at ${location}: ${message}`;
  console.error(`panicked at ${location}:\n${message}${frames}`);
  trap();
}

function describe(v: unknown): string {
  try {
    return typeof v === "string" ? JSON.stringify(v) : String(v);
  } catch {
    return typeof v;
  }
}

/** The last uncaught error's report (for the testing harness, which has no trap to show). */
export let lastPanic: string | undefined;

/** Ends the call with a wasm trap. */
function trap(): never {
  // The WIT error variant has no case for this value, so lifting it fails: the component traps.
  throw TRAP;
}
