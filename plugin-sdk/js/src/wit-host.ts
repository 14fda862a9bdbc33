/**
 * The host inside a component: the only module that touches the WIT imports (the Rust SDK's
 * `bindings.rs` and the `wasi` module of `http.rs`). ComponentizeJS resolves these module
 * names to the component's imports.
 */
import { log as witLog } from "hookd:plugin/log@0.3.0";
import { get as witConfigGet } from "hookd:plugin/config@0.3.0";
import * as witState from "hookd:plugin/state@0.3.0";
import { lastRefusal } from "hookd:plugin/network@0.3.0";
import { handle as outgoingHandle } from "wasi:http/outgoing-handler@0.2.12";
import {
  Fields,
  OutgoingBody,
  OutgoingRequest as WitRequest,
  RequestOptions,
  httpErrorCode,
  type IncomingBody,
  type Method as WitMethod,
} from "wasi:http/types@0.2.12";

import type { Host, OutgoingRequest } from "./host.js";
import {
  type ErrorCodeLike,
  HttpError,
  MAX_RESPONSE_BYTES,
  type Method,
  Response,
  errorFromBodyMessage,
  errorFromCode,
  redactedUrl,
  responseTooLarge,
} from "./http-core.js";

const encoder = new TextEncoder();

export const witHost: Host = {
  log: (level, message) => witLog(level, message),
  configGet: (key) => witConfigGet(key),
  stateGet: (key) => witState.get(key),
  stateSet: (key, value) => witState.set(key, value),
  stateDelete: (key) => witState.delete(key),
  send,
};

/** A thrown WIT `result` error arrives as the value itself or wrapped in `{ payload }`. */
function payload(e: unknown): unknown {
  if (e !== null && typeof e === "object" && "payload" in e) return (e as { payload: unknown }).payload;
  return e;
}

function isCode(v: unknown): v is ErrorCodeLike {
  return v !== null && typeof v === "object" && typeof (v as { tag?: unknown }).tag === "string";
}

/** How the generated bindings name a resource's destructor (`Symbol.dispose` where the engine has it). */
const symbolDispose: symbol = (Symbol as { dispose?: symbol }).dispose ?? Symbol.for("dispose");

/** Drops a WIT resource handle now (a child, such as a body's stream, before its parent). */
function dispose(resource: unknown): void {
  const d = (resource as Record<symbol, unknown> | undefined)?.[symbolDispose];
  if (typeof d === "function") d.call(resource);
}

function witMethod(method: Method): WitMethod {
  return { tag: method.toLowerCase() } as WitMethod;
}

function send(request: OutgoingRequest): Response {
  const { method, url, body } = request;
  const authority = url.authority;
  const code = (e: unknown, fallback: string): HttpError => {
    const p = payload(e);
    return isCode(p) ? errorFromCode(p, authority, lastRefusal) : new HttpError("transport", `${authority}: ${fallback}: ${String(p)}`);
  };

  const entries: Array<[string, Uint8Array]> = request.headers.map(([n, v]) => [n.toLowerCase(), encoder.encode(v)]);
  if (body.length > 0 || method === "POST" || method === "PUT") {
    entries.push(["content-length", encoder.encode(String(body.length))]);
  }
  let fields: Fields;
  try {
    fields = Fields.fromList(entries);
  } catch (e) {
    const why = payload(e);
    throw new HttpError("invalid-request", `a header is invalid or not allowed: ${isCode(why) ? why.tag : String(why)}`);
  }
  const req = new WitRequest(fields);
  const refuse = (what: string) => new HttpError("invalid-request", `${what} refused: ${redactedUrl(url)}`);
  const attempt = (what: string, f: () => void) => {
    try {
      f();
    } catch {
      throw refuse(what);
    }
  };
  attempt("method", () => req.setMethod(witMethod(method)));
  attempt("scheme", () => req.setScheme(url.https ? { tag: "HTTPS" } : { tag: "HTTP" }));
  attempt("host", () => req.setAuthority(url.authority));
  attempt("path", () => req.setPathWithQuery(url.pathWithQuery));
  let outgoingBody: OutgoingBody;
  try {
    outgoingBody = req.body();
  } catch {
    throw refuse("body");
  }
  let options: RequestOptions | undefined;
  if (request.timeoutMs !== undefined) {
    options = new RequestOptions();
    const nanos = BigInt(Math.max(0, Math.round(request.timeoutMs))) * 1_000_000n;
    for (const set of [options.setConnectTimeout, options.setFirstByteTimeout, options.setBetweenBytesTimeout]) {
      try {
        set.call(options, nanos);
      } catch {
        // The host keeps its own bound; a refused option is not an error.
      }
    }
  }

  // Send first, then stream the body: the host consumes it while the request is on the wire,
  // so a body larger than its buffer cannot block before sending starts.
  let pending;
  try {
    pending = outgoingHandle(req, options);
  } catch (e) {
    throw code(e, "sending");
  }
  // A server may answer before reading the whole body (e.g. 413): its answer wins.
  try {
    writeBody(outgoingBody, body);
  } catch {
    // ignored, as in the Rust SDK
  }
  const ready = pending.subscribe();
  ready.block();
  dispose(ready);
  const result = pending.get();
  dispose(pending);
  if (result === undefined || result.tag === "err") {
    throw new HttpError("transport", "the response was lost");
  }
  if (result.val.tag === "err") {
    throw errorFromCode(result.val.val as ErrorCodeLike, authority, lastRefusal);
  }
  const response = result.val.val;
  const status = response.status();
  const headerFields = response.headers();
  const headers = headerFields.entries().map(([name, value]) => ({
    name: name.toLowerCase(),
    value: new TextDecoder().decode(value),
  }));
  dispose(headerFields);
  let incoming: IncomingBody;
  try {
    incoming = response.consume();
  } catch {
    throw new HttpError("body", "the response body was already taken");
  }
  const read = readBody(incoming, authority, request.bodyLimit);
  dispose(incoming);
  dispose(response);
  return new Response(status, read, headers);
}

function writeBody(outgoing: OutgoingBody, body: Uint8Array): void {
  const stream = outgoing.write();
  try {
    for (let at = 0; at < body.length; at += 4096) {
      stream.blockingWriteAndFlush(body.subarray(at, Math.min(at + 4096, body.length)));
    }
  } finally {
    dispose(stream);
  }
  OutgoingBody.finish(outgoing, undefined);
}

/**
 * Reads the body to its end, or only its first `limit` bytes (the rest is then dropped unread).
 * A body over the cap is over any limit: with one, it ends the read with what arrived.
 */
function readBody(incoming: IncomingBody, authority: string, limit: number | undefined): Uint8Array {
  const stream = incoming.stream();
  const chunks: Uint8Array[] = [];
  let total = 0;
  try {
    while (limit === undefined || total < limit) {
      let chunk: Uint8Array;
      try {
        chunk = stream.blockingRead(64n * 1024n);
      } catch (e) {
        const err = payload(e) as { tag?: string; val?: { toDebugString(): string } };
        if (err?.tag === "closed") break;
        let failure: HttpError;
        if (err?.tag === "last-operation-failed" && err.val) {
          const c = httpErrorCode(err.val as never);
          failure =
            c !== undefined
              ? errorFromCode(c as ErrorCodeLike, authority, lastRefusal)
              : errorFromBodyMessage(err.val.toDebugString(), authority);
        } else {
          failure = new HttpError("body", `reading the response body from ${authority}: ${String(err)}`);
        }
        if (limit !== undefined && failure.kind === "too-large") break;
        throw failure;
      }
      total += chunk.length;
      chunks.push(chunk);
      if (limit !== undefined && total >= limit) break;
      if (total > MAX_RESPONSE_BYTES) {
        throw responseTooLarge(authority);
      }
    }
  } finally {
    dispose(stream);
  }
  if (limit !== undefined && total > limit) total = limit;
  const out = new Uint8Array(total);
  let at = 0;
  for (const c of chunks) {
    if (at >= total) break;
    const part = c.subarray(0, Math.min(c.length, total - at));
    out.set(part, at);
    at += part.length;
  }
  return out;
}
