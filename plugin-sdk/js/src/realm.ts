/**
 * Type checks that hold whatever realm a value was made in, and the copy that brings bytes into
 * the handler's realm.
 *
 * Inside a component, the bytes the engine's WIT bindings hand in (an event's body, a state
 * value) are made in another realm than the handler's code: a `Uint8Array` for which
 * `x instanceof Uint8Array` is false (its prototype is the other realm's), though
 * `Object.prototype.toString` says `[object Uint8Array]`. So the SDK
 *
 * - makes such bytes a `Uint8Array` of the handler's realm where they enter (`Event`,
 *   `state.get`: given this realm's prototype, not copied, so a large body does not cost its
 *   size twice; a response body is assembled in a new array anyway), so that a handler's own
 *   `instanceof` checks, and any library's, hold for every bytes value the SDK hands out;
 * - and never uses `instanceof` to recognise bytes a handler hands in (`state.set`,
 *   `http.post`, `.body`, `Event`, `Response`): {@link isBytes} takes a `Uint8Array` of any realm.
 *
 * The testing `Harness` hands a handler bytes of another realm as hookd does (`node:vm`).
 */

// `%TypedArray%.prototype[Symbol.toStringTag]`: the name stored in a typed array's internal slot
// ("Uint8Array"), `undefined` for any other value. One realm's getter reads every realm's typed
// arrays, and no property of the value can fake it (as one can fake `Object.prototype.toString`).
const typedArrayName = Object.getOwnPropertyDescriptor(Object.getPrototypeOf(Uint8Array.prototype), Symbol.toStringTag)
  ?.get as ((this: unknown) => string | undefined) | undefined;

const toStringTag = (value: unknown): string => Object.prototype.toString.call(value).slice(8, -1);

/** Whether `value` is a `Uint8Array` (or a subclass, such as Node's `Buffer`) of any realm. */
export function isBytes(value: unknown): value is Uint8Array {
  if (value instanceof Uint8Array) return true;
  if (value === null || typeof value !== "object" || !ArrayBuffer.isView(value)) return false;
  try {
    return (typedArrayName ? typedArrayName.call(value) : toStringTag(value)) === "Uint8Array";
  } catch {
    return false;
  }
}

/** Whether `value` is binary data of any realm: an `ArrayBuffer`, a typed array or a `DataView`. */
export function isBinary(value: unknown): boolean {
  if (value === null || typeof value !== "object") return false;
  if (ArrayBuffer.isView(value)) return true;
  const tag = toStringTag(value);
  return tag === "ArrayBuffer" || tag === "SharedArrayBuffer";
}

/** A copy of `bytes` (of any realm) in a new `Uint8Array` of this realm. */
export function copyBytes(bytes: Uint8Array): Uint8Array {
  const copy = new Uint8Array(bytes.length);
  copy.set(bytes);
  return copy;
}

/**
 * `bytes` as a `Uint8Array` of this realm: itself, given this realm's prototype if it had
 * another's (an event's body may be much of the plugin's memory: not copied), else a copy.
 */
export function localBytes(bytes: Uint8Array): Uint8Array {
  // Typed as an object: to TypeScript every Uint8Array is this realm's.
  const value: object = bytes;
  if (value instanceof Uint8Array) return value;
  try {
    Object.setPrototypeOf(value, Uint8Array.prototype);
  } catch {
    // Frozen, or a wrapper that refuses: copied below.
  }
  return value instanceof Uint8Array ? value : copyBytes(bytes);
}

/** What `value` is, for an error message: `number`, `null`, `object`, or a built-in's name (`ArrayBuffer`, `Int16Array`, `Array`). */
export function kindOf(value: unknown): string {
  if (value === null) return "null";
  if (typeof value !== "object") return typeof value;
  const tag = toStringTag(value);
  return tag === "Object" ? "object" : tag;
}

/** Whether `e` is an `Error` of any realm. */
export function isError(e: unknown): e is Error {
  return e instanceof Error || (e !== null && typeof e === "object" && toStringTag(e) === "Error");
}

/** An error's message, or the thrown value as text. */
export function errorMessage(e: unknown): string {
  return isError(e) ? e.message : String(e);
}
