/**
 * Unit tests of a handler on Node, without hookd: a {@link Harness} stands in for the host
 * while a call runs, with hookd's rules (the Rust SDK's `plugin_sdk::testing::Harness`).
 *
 * ```ts
 * const hookd = new Harness().withConfig("url", url).withStateJson("sent", 41).respondTo("POST", url, 503);
 * const result = hookd.handle(handler, new Event({ source: "s", eventId: "e1", eventType: "t", body: "{}" }));
 * assert.equal(result.ok, false);                   // a 503 is a retry...
 * assert.equal(hookd.stateJson("sent"), 41);        // ...that leaves no trace
 * ```
 *
 * - State: reads see committed state plus the call's own writes; the writes are committed only
 *   when the handler succeeds. `withState`/`withStateJson` commit a starting value.
 * - HTTP: `respondTo`/`respondWith`/`failWith` answer every request to that method and URL
 *   (normalised as a request's is: `https://host` is `https://host/`, no fragment; the latest
 *   stub wins); any other URL is refused like a host missing from `allow_hosts`, and so is a
 *   stubbed request once the call has sent 64 (`MAX_REQUESTS`); as in hookd, a refused
 *   request does not count toward those 64. A stubbed body is read as hookd reads one: over
 *   `MAX_RESPONSE_BYTES` (8 MiB) it is a `too-large` error, unless the request asked for a
 *   response body limit, which keeps its start. A header hookd refuses is refused before the
 *   request reaches the harness, as in hookd (the SDK checks it, the same check in both).
 * - A state call hookd refuses (an empty key to `state.set`, a key holding a NUL character or
 *   over {@link MAX_KEY_BYTES} of UTF-8, a value over {@link MAX_VALUE_BYTES}) throws
 *   {@link StateRefused} there, and `handle` throws it even if the handler caught it: hookd
 *   stops the attempt at that call (`permanent`, error kind `state_limit`).
 * - Bytes: as hookd's bindings do, it hands the event's body to the handler's export, and state
 *   values to `state.get`, as Uint8Arrays of another realm (made with `node:vm`), for which
 *   `instanceof Uint8Array` is false; the SDK copies them into the handler's realm. A handler
 *   that imports the WIT modules itself, bypassing the SDK, meets them as they are.
 * - It does not model hookd's other caps, time limits or re-runs; the built component meets
 *   those in hookd.
 *
 * Tests import the SDK from their bundle (see `scripts/test.mjs`), where the WIT imports are
 * stubs that refuse to run outside a harness call.
 */
/// <reference path="./node-vm.d.ts" />
import { runInNewContext } from "node:vm";

import type { Event as WitEvent } from "hookd:plugin/types@0.3.0";

import { HandleError } from "./error.js";
import { Event, type EventInit } from "./event.js";
import { type HandlerExport, TRAP, lastPanic, toHandleError } from "./handler.js";
import { type Host, type OutgoingRequest, swapHost } from "./host.js";
import { HttpError, type Method, Response, limitBody, parseUrl, urlToString } from "./http-core.js";
import { copyBytes, errorMessage, isBytes, kindOf } from "./realm.js";

const encoder = new TextEncoder();
const decoder = new TextDecoder();

/** The longest state key hookd stores, in UTF-8 bytes. */
export const MAX_KEY_BYTES = 1024;
/** The largest value hookd stores under one state key, in bytes. */
export const MAX_VALUE_BYTES = 1024 * 1024;
/** Requests one call may send, as hookd counts them (more are refused). */
export const MAX_REQUESTS = 64;

/**
 * A state call hookd refuses: in hookd it stops the attempt there, recorded `permanent` with
 * error kind `state_limit`, and none of the attempt's writes are kept.
 */
export class StateRefused extends Error {
  override name = "StateRefused";
}

/** Why hookd refuses a state call on `key` (with `value`, for a set), if it does. */
function refusal(key: string, value?: Uint8Array): string | undefined {
  if (key.includes("\0")) {
    return `state key ${JSON.stringify(key)} holds a NUL character (U+0000), which hookd's databases do not store`;
  }
  const size = encoder.encode(key).length;
  if (size > MAX_KEY_BYTES) return `state key of ${size} bytes exceeds the ${MAX_KEY_BYTES}-byte cap on a key`;
  if (value !== undefined && key === "") {
    return 'state key "" is empty: a key an operator could not name in the admin API, so hookd does not store one';
  }
  if (value !== undefined && value.length > MAX_VALUE_BYTES) {
    return `state value of ${value.length} bytes for key ${JSON.stringify(key)} exceeds the ${MAX_VALUE_BYTES}-byte cap on a value`;
  }
  return undefined;
}

let otherRealm: ((length: number) => Uint8Array) | undefined;

/**
 * A copy of `bytes` in a Uint8Array of another realm, as hookd's WIT bindings hand bytes to a
 * component's JavaScript (`x instanceof Uint8Array` is false for it, its `Object.prototype.toString`
 * is `[object Uint8Array]`).
 */
function inOtherRealm(bytes: Uint8Array): Uint8Array {
  otherRealm ??= runInNewContext("(length) => new Uint8Array(length)") as (length: number) => Uint8Array;
  const copy = otherRealm(bytes.length);
  copy.set(bytes);
  return copy;
}

/** `event` as the WIT bindings hand it to the export: a plain record, its body of another realm. */
function witEvent(event: Event): WitEvent {
  return {
    source: event.source,
    eventId: event.eventId,
    eventType: event.eventType,
    orderingKey: event.orderingKey,
    sequence: event.sequence,
    attempt: event.attempt,
    receivedAtMs: event.receivedAtMs,
    headers: event.headers.map((h) => ({ name: h.name, value: h.value })),
    body: inOtherRealm(event.body),
    stale: event.stale,
  };
}

function isThenable(v: unknown): v is PromiseLike<unknown> {
  return v !== null && typeof v === "object" && typeof (v as { then?: unknown }).then === "function";
}

/** What one call returned: `ok` with the output, or the handler's error. */
export type Outcome = { ok: true; output: string | undefined } | { ok: false; error: HandleError };

/** A request the handler sent (the plugin's own headers: hookd adds its own after). */
export interface SentRequest {
  method: Method;
  url: string;
  headers: Array<[string, string]>;
  body: Uint8Array;
  text(): string;
  json<T = unknown>(): T;
}

type Stub = Response | HttpError;

export class Harness {
  private readonly config = new Map<string, string>();
  private readonly committed = new Map<string, Uint8Array>();
  private readonly stubs = new Map<string, Stub>();
  private readonly sent: SentRequest[] = [];
  private readonly lines: Array<{ level: string; message: string }> = [];

  withConfig(key: string, value: string): this {
    this.config.set(key, value);
    return this;
  }

  withState(key: string, value: Uint8Array | string): this {
    const given: unknown = value;
    if (typeof given === "string") this.committed.set(key, encoder.encode(given));
    else if (isBytes(given)) this.committed.set(key, copyBytes(given));
    else throw new TypeError(`withState takes a Uint8Array or a string, not ${kindOf(given)}`);
    return this;
  }

  withStateJson(key: string, value: unknown): this {
    return this.withState(key, JSON.stringify(value));
  }

  respondTo(method: string, url: string, status: number): this {
    return this.respondWith(method, url, new Response(status));
  }

  respondWith(method: string, url: string, response: Response): this {
    this.stubs.set(stubKey(method, url), response);
    return this;
  }

  failWith(method: string, url: string, error: HttpError): this {
    this.stubs.set(stubKey(method, url), error);
    return this;
  }

  /** Committed state under `key`. */
  state(key: string): Uint8Array | undefined {
    return this.committed.get(key);
  }

  stateJson<T = unknown>(key: string): T | undefined {
    const v = this.committed.get(key);
    return v === undefined ? undefined : (JSON.parse(decoder.decode(v)) as T);
  }

  stateKeys(): string[] {
    return [...this.committed.keys()].sort();
  }

  logs(): Array<{ level: string; message: string }> {
    return [...this.lines];
  }

  requests(): SentRequest[] {
    return [...this.sent];
  }

  /** Runs one attempt of a synchronous handler. */
  handle(handler: HandlerExport, event: Event | EventInit): Outcome {
    const call = this.begin();
    try {
      const result = handler.handle(witEvent(event instanceof Event ? event : new Event(event)));
      if (isThenable(result)) {
        throw new TypeError("the handler is async: use handleAsync");
      }
      return call.finish({ ok: true, output: result });
    } catch (e) {
      call.stopped();
      return call.finish(outcomeOf(e));
    } finally {
      call.end();
    }
  }

  /** Runs one attempt of a handler that may return a promise. */
  async handleAsync(handler: HandlerExport, event: Event | EventInit): Promise<Outcome> {
    const call = this.begin();
    try {
      const output = await handler.handle(witEvent(event instanceof Event ? event : new Event(event)));
      return call.finish({ ok: true, output });
    } catch (e) {
      call.stopped();
      return call.finish(outcomeOf(e));
    } finally {
      call.end();
    }
  }

  private begin() {
    const writes = new Map<string, Uint8Array | undefined>();
    let requests = 0;
    // The first state call hookd would have stopped the attempt at.
    let refused: string | undefined;
    const refuse = (why: string | undefined) => {
      if (why === undefined) return;
      refused ??= why;
      throw new StateRefused(why);
    };
    const harness = this;
    const host: Host = {
      log: (level, message) => harness.lines.push({ level, message }),
      configGet: (key) => harness.config.get(key),
      stateGet: (key) => {
        refuse(refusal(key));
        const value = writes.has(key) ? writes.get(key) : harness.committed.get(key);
        // A copy, of another realm: as hookd's bindings hand it in.
        return value === undefined ? undefined : inOtherRealm(value);
      },
      stateSet: (key, value) => {
        refuse(refusal(key, value));
        writes.set(key, copyBytes(value));
      },
      stateDelete: (key) => {
        refuse(refusal(key));
        writes.set(key, undefined);
      },
      send(request: OutgoingRequest): Response {
        const url = urlToString(request.url);
        harness.sent.push({
          method: request.method,
          url,
          headers: request.headers,
          body: request.body,
          text: () => decoder.decode(request.body),
          json: () => JSON.parse(decoder.decode(request.body)),
        });
        // hookd's order: a target not allowed (here: no stub) is refused without using up
        // the call's share; an allowed one past the cap is refused; else it counts and is sent.
        const target = withPort(request.url.authority, request.url.https);
        const stub = harness.stubs.get(`${request.method} ${url}`);
        if (stub === undefined) {
          throw new HttpError("denied", `hookd refused the request to ${request.url.authority}: ${target} is not in allow_hosts`);
        }
        if (requests >= MAX_REQUESTS) {
          throw new HttpError(
            "denied",
            `hookd refused the request to ${request.url.authority}: more than ${MAX_REQUESTS} requests in one call`,
          );
        }
        requests += 1;
        if (stub instanceof HttpError) throw stub;
        // The cap and a response body limit, as the host reads a body.
        const body = limitBody(stub.body, request.url.authority, request.bodyLimit);
        return body === stub.body ? stub : new Response(stub.status, body, stub.headers);
      },
    };
    const previous = swapHost(host);
    return {
      /** Throws the refusal hookd would have stopped the attempt at, if there was one. */
      stopped() {
        if (refused !== undefined) throw new StateRefused(refused);
      },
      finish(outcome: Outcome): Outcome {
        // Caught by the handler, it went on; hookd had stopped the attempt there.
        this.stopped();
        if (outcome.ok) {
          for (const [key, value] of writes) {
            if (value === undefined) harness.committed.delete(key);
            else harness.committed.set(key, value);
          }
        }
        return outcome;
      },
      end() {
        swapHost(previous);
      },
    };
  }
}

/**
 * A stub's key: the method and the URL as a request's is looked up (`https://host` is
 * `https://host/`, no fragment). A URL no request could be sent to is a mistake in the test.
 */
function stubKey(method: string, url: string): string {
  let parsed;
  try {
    parsed = parseUrl(url);
  } catch (e) {
    throw new TypeError(`Harness stub: ${errorMessage(e)}`);
  }
  return `${method.toUpperCase()} ${urlToString(parsed)}`;
}

function withPort(authority: string, https: boolean): string {
  return /:\d+$/.test(authority) ? authority : `${authority}:${https ? 443 : 80}`;
}

/** A thrown WIT error back to a `HandleError`; a trap (a bug in the handler) is rethrown as one. */
function outcomeOf(e: unknown): Outcome {
  if (e === TRAP) throw new Error(`the handler trapped: ${lastPanic}`);
  const verdict = toHandleError(e);
  if (verdict) return { ok: false, error: verdict };
  const wit = e as { tag?: string; val?: unknown };
  if (wit?.tag === "permanent") return { ok: false, error: HandleError.permanent(String(wit.val)) };
  if (wit?.tag === "retry") {
    const v = wit.val as { reason: string; afterMs?: bigint };
    return { ok: false, error: HandleError.retry(v.reason, v.afterMs === undefined ? undefined : Number(v.afterMs)) };
  }
  throw e;
}

export { Event, HandleError, HttpError, Response };
