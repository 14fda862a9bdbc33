/**
 * Durable key-value state, private to the plugin instance.
 *
 * Reads see committed state plus this attempt's own writes. Writes are buffered and committed
 * atomically with the delivery's success: an attempt that fails, traps or times out leaves no
 * trace, so a read-modify-write here is safe to retry. If another delivery changed a key this
 * attempt read, the host re-runs the attempt, so concurrent updates are not lost.
 *
 * Writes are bounded by the instance's settings (`attempt_state_keys`, `attempt_state_kib`,
 * `state_max_keys`, `state_max_mib`); `set` and `delete` return nothing, so the host refuses a
 * write over a limit by stopping the attempt at that call, and none of its writes are kept.
 */
import { HandleError } from "./error.js";
import { host } from "./host.js";
import { errorMessage as message, isBytes, kindOf, localBytes } from "./realm.js";

const encoder = new TextEncoder();
const decoder = new TextDecoder("utf-8", { fatal: true });

/**
 * `text`, which names `what`, if it is UTF-8 text; else a permanent error. A string holding a
 * lone surrogate (a `"\\ud83d"` JSON escape makes one) is not: the bindings would write it as
 * U+FFFD, and two keys differing only there would be one.
 */
function utf8(text: string, what: () => string): string {
  // A loop, not a regex: the engine has no `\p{...}` in its regular expressions.
  for (let i = 0; i < text.length; i++) {
    const c = text.charCodeAt(i);
    if (c < 0xd800 || c > 0xdfff) continue;
    const next = i + 1 < text.length ? text.charCodeAt(i + 1) : 0;
    if (c <= 0xdbff && next >= 0xdc00 && next <= 0xdfff) {
      i++; // a pair: one character beyond the BMP
      continue;
    }
    const code = c.toString(16).toUpperCase();
    throw HandleError.permanent(`${what()} is not UTF-8 text: it holds a lone surrogate (U+${code}) at index ${i}`);
  }
  return text;
}

const keyed = (key: string) => () => `state key ${JSON.stringify(key).slice(0, 200)}`;

/** The bytes stored under `key`, if any (a `Uint8Array` of the handler's realm). */
export function get(key: string): Uint8Array | undefined {
  const value = host().stateGet(utf8(key, keyed(key)));
  // The WIT bindings (and the testing Harness, as they do) hand the bytes in as a Uint8Array of
  // another realm: copied into this one, so `instanceof Uint8Array` holds for what a handler gets.
  return value === undefined || value === null ? undefined : localBytes(value);
}

/**
 * Stores `value` under `key` (a string is stored as its UTF-8 bytes). A `Uint8Array` of any realm
 * is bytes: `state.set(k, event.body)` and `state.set(k, state.get(j)!)` store them as they are.
 */
export function set(key: string, value: Uint8Array | string): void {
  // Not `instanceof`: bytes from the WIT bindings are a Uint8Array of another realm.
  if (typeof value !== "string" && !isBytes(value)) {
    // Said as the Python SDK says it (a number here failed deep in the bindings, unexplained).
    throw new TypeError(
      `state.set takes a Uint8Array or a string, not ${kindOf(value)} (state.setJson stores any JSON value)`,
    );
  }
  utf8(key, keyed(key));
  const bytes =
    typeof value === "string" ? encoder.encode(utf8(value, () => `the value of ${keyed(key)()}`)) : localBytes(value);
  host().stateSet(key, bytes);
}

/** Removes `key`. */
function remove(key: string): void {
  host().stateDelete(utf8(key, keyed(key)));
}
export { remove as delete };

/** The value under `key` as UTF-8 text; bytes that are not UTF-8 are a permanent error. */
export function getText(key: string): string | undefined {
  const bytes = get(key);
  if (bytes === undefined) return undefined;
  try {
    return decoder.decode(bytes);
  } catch (e) {
    throw HandleError.permanent(`state key \`${key}\` is not valid UTF-8: ${message(e)}`);
  }
}

/**
 * The JSON value stored under `key`, if any. A value that does not parse is a permanent
 * error: retrying would read the same bytes.
 */
export function getJson<T = unknown>(key: string): T | undefined {
  const bytes = get(key);
  if (bytes === undefined) return undefined;
  try {
    return JSON.parse(decoder.decode(bytes)) as T;
  } catch (e) {
    throw HandleError.permanent(`state key \`${key}\` does not hold valid JSON: ${message(e)}`);
  }
}

/** Stores `value` as JSON under `key`. */
export function setJson(key: string, value: unknown): void {
  let text: string | undefined;
  try {
    text = JSON.stringify(value);
  } catch (e) {
    throw HandleError.permanent(`cannot encode state key \`${key}\` as JSON: ${message(e)}`);
  }
  if (text === undefined) {
    throw HandleError.permanent(`cannot encode state key \`${key}\` as JSON: ${typeof value}`);
  }
  set(key, text);
}
