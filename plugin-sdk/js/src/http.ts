/**
 * Outbound HTTP from a handler: a small blocking client over the standard
 * `wasi:http/outgoing-handler` interface, the TypeScript twin of the Rust SDK's
 * `plugin_sdk::http`.
 *
 * ```ts
 * const response = http.post(config.require("notify_url"))
 *   .json({ event: event.eventId })
 *   .send()              // transport failures retry; a refused host is permanent
 *   .errorForStatus();   // 5xx, 408 and 429 retry (honouring Retry-After); other non-2xx are permanent
 * ```
 *
 * An {@link HttpError} thrown out of a handler becomes the Rust SDK's verdict for it (see
 * {@link HttpError.toHandleError}), so most handlers need no `try`.
 *
 * The host enforces the outbound policy on every request (only `allow_hosts`, no internal
 * addresses, verified TLS, injected credentials, `Idempotency-Key`, 64 requests per attempt,
 * 8 MiB responses, no redirects followed): README "Outbound HTTP" and the Rust SDK's
 * `plugin_sdk::http` documentation are normative.
 */
import { host } from "./host.js";
import {
  HttpError,
  MAX_RESPONSE_BYTES,
  type Method,
  Response,
  type Url,
  checkHeaders,
  methodFromName,
  parseUrl,
} from "./http-core.js";
import { errorMessage, isBinary, isBytes, kindOf, localBytes } from "./realm.js";

export {
  HttpError,
  MAX_RESPONSE_BYTES,
  Response,
  parseRetryAfter,
  type Header,
  type HttpErrorKind,
  type Method,
} from "./http-core.js";

const encoder = new TextEncoder();

/** Starts a `GET` request to `url` (`https://host[:port]/path?query`, or `http://`). */
export function get(url: string): RequestBuilder {
  return request("GET", url);
}

/**
 * Starts a `POST` request to `url`. With a `body` (a string or a `Uint8Array`, sent as they are;
 * any other value is sent as JSON) and `headers`, it is ready to `.send()`. Other binary data (an
 * `ArrayBuffer`, a `DataView`, another typed array) is refused, not sent as JSON.
 */
export function post(url: string, body?: unknown, headers?: Record<string, string>): RequestBuilder {
  let builder = request("POST", url);
  for (const [name, value] of Object.entries(headers ?? {})) builder = builder.header(name, value);
  if (body === undefined) return builder;
  // Not `instanceof`: `event.body` and `state.get`'s bytes come from the WIT bindings, a
  // Uint8Array of another realm, and were once sent as `{"0":123,...}` with a JSON content type.
  if (typeof body === "string" || isBinary(body)) return builder.body(body as Uint8Array | string);
  return builder.json(body);
}

/** Starts a request with any {@link Method} (in any case). */
export function request(method: Method | string, url: string): RequestBuilder {
  return new RequestBuilder(method, url);
}

/** A request being built; {@link RequestBuilder.send} sends it and waits for the response. */
export class RequestBuilder {
  private readonly method: Method | undefined;
  private readonly methodName: string;
  private readonly url: Url | HttpError;
  private readonly headers: Array<[string, string]> = [];
  private payload: Uint8Array = new Uint8Array();
  private timeoutMs: number | undefined;
  private bodyLimit: number | undefined;
  /** The first problem met while building (e.g. a body that does not serialise). */
  private error: HttpError | undefined;

  constructor(method: Method | string, url: string) {
    this.methodName = String(method);
    this.method = methodFromName(this.methodName);
    try {
      this.url = parseUrl(url);
    } catch (e) {
      this.url = e as HttpError;
    }
  }

  /**
   * Adds a header. hookd replaces the ones it manages (`Idempotency-Key`, injected credentials);
   * {@link RequestBuilder.send} refuses, as an `invalid-request` error, a name that is not an
   * HTTP token, one hookd sets itself (`Host`, `Content-Length`, `Transfer-Encoding`,
   * `Connection`, `Keep-Alive`, `Upgrade`, `Proxy-*`, `HTTP2-Settings`) and a value holding a
   * control character, as hookd would.
   */
  header(name: string, value: string): this {
    this.headers.push([String(name), String(value)]);
    return this;
  }

  /** Adds `Authorization: Bearer <token>`. */
  bearerAuth(token: string): this {
    return this.header("authorization", `Bearer ${token}`);
  }

  /**
   * Sets the body, as is: a `Uint8Array` (of any realm), or a string as UTF-8. Anything else is an
   * `invalid-request` error when sent.
   */
  body(body: Uint8Array | string): this {
    const given: unknown = body;
    if (typeof given === "string") this.payload = encoder.encode(given);
    else if (isBytes(given)) this.payload = localBytes(given);
    else {
      const hint = isBinary(given) ? "wrap it in a Uint8Array to send its bytes" : ".json(value) sends a value as JSON";
      this.error ??= new HttpError("invalid-request", `the body must be a Uint8Array or a string, not ${kindOf(given)} (${hint})`);
    }
    return this;
  }

  /** Sets the body to `value` as JSON, with `Content-Type: application/json`. */
  json(value: unknown): this {
    let text: string | undefined;
    try {
      text = JSON.stringify(value);
    } catch (e) {
      this.error ??= new HttpError("invalid-request", `the JSON body does not serialise: ${errorMessage(e)}`);
      return this;
    }
    if (text === undefined) {
      this.error ??= new HttpError("invalid-request", `the JSON body does not serialise: ${typeof value}`);
      return this;
    }
    this.payload = encoder.encode(text);
    return this.header("content-type", "application/json");
  }

  /** Bounds connecting, waiting for the response head, and each wait between body chunks. */
  timeout(ms: number): this {
    this.timeoutMs = ms;
    return this;
  }

  /**
   * Reads at most `maxBytes` of the response's body (at most `MAX_RESPONSE_BYTES`) and drops
   * the rest unread, however long it is: a longer body is then no error, and the response's
   * `body` holds its first `maxBytes` (all of it, if shorter). For a call that needs the status and at most the start of the body, such as a relay
   * whose target may answer a success with a large document: without it, a body over the cap
   * is a `too-large` error, and the status is lost with it.
   */
  responseBodyLimit(maxBytes: number): this {
    if (typeof maxBytes !== "number" || !Number.isInteger(maxBytes) || maxBytes < 0) {
      this.error ??= new HttpError("invalid-request", `the response body limit must be a whole number of bytes, not ${String(maxBytes)}`);
      return this;
    }
    this.bodyLimit = Math.min(maxBytes, MAX_RESPONSE_BYTES);
    return this;
  }

  /**
   * Sends the request and reads the whole response (up to `MAX_RESPONSE_BYTES`, or the
   * {@link RequestBuilder.responseBodyLimit}). Any status
   * is a `Response`, including 3xx, 4xx and 5xx: see {@link Response.errorForStatus}.
   * Throws an {@link HttpError}.
   */
  send(): Response {
    if (this.error) throw this.error;
    if (this.url instanceof HttpError) throw this.url;
    if (this.method === undefined) {
      throw new HttpError("unsupported", `the method ${JSON.stringify(this.methodName)}`);
    }
    if ((this.method === "GET" || this.method === "HEAD") && this.payload.length > 0) {
      throw new HttpError("invalid-request", "a GET or HEAD request has no body");
    }
    // Here, not in each host: a component and the testing harness refuse the same headers.
    checkHeaders(this.headers);
    return host().send({
      method: this.method,
      url: this.url,
      headers: this.headers,
      body: this.payload,
      timeoutMs: this.timeoutMs,
      bodyLimit: this.bodyLimit,
    });
  }
}
