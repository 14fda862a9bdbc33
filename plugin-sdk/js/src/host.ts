/**
 * What the SDK needs from hookd, in one place: inside a component it is the WIT imports
 * (`wit-host.ts`); in a unit test on Node it is a `Harness` (`testing.ts`) standing in for
 * hookd while a call runs.
 */
import type { HttpError, Method, Response, Url } from "./http-core.js";
import { witHost } from "./wit-host.js";

/** A request as the SDK hands it to the host. */
export interface OutgoingRequest {
  method: Method;
  url: Url;
  /** Names as given (the host lower-cases them). */
  headers: Array<[string, string]>;
  body: Uint8Array;
  /** Bounds connecting, the response head and each wait between body chunks. */
  timeoutMs: number | undefined;
  /** Read at most this many bytes of the response's body, dropping the rest. */
  bodyLimit: number | undefined;
}

export interface Host {
  log(level: "debug" | "info" | "warn" | "error", message: string): void;
  configGet(key: string): string | undefined;
  stateGet(key: string): Uint8Array | undefined;
  stateSet(key: string, value: Uint8Array): void;
  stateDelete(key: string): void;
  /** Sends `request` and reads the whole response; throws an {@link HttpError}. */
  send(request: OutgoingRequest): Response;
}

let current: Host | undefined;

/** The host the SDK talks to now. */
export function host(): Host {
  return current ?? witHost;
}

/** Replaces the host (the testing harness does, for the length of a call); returns the previous one. */
export function swapHost(next: Host | undefined): Host | undefined {
  const previous = current;
  current = next;
  return previous;
}
