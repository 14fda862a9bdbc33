/**
 * The parts of the HTTP client that do not talk to the host: URLs, responses, errors, and how
 * each error becomes a {@link HandleError}. They follow the Rust SDK's `plugin_sdk::http`
 * exactly, so a handler behaves the same in either language.
 */
import { HandleError } from "./error.js";
import { errorMessage as errorText, isBytes, kindOf, localBytes } from "./realm.js";

/** The most response body bytes the client reads (the host enforces the same cap). */
export const MAX_RESPONSE_BYTES = 8 * 1024 * 1024;

/** An HTTP method this client sends. */
export type Method = "GET" | "HEAD" | "POST" | "PUT" | "PATCH" | "DELETE" | "OPTIONS";

const METHODS: readonly Method[] = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"];

/** The method called `name`, in any case; `undefined` for a method this client does not send. */
export function methodFromName(name: string): Method | undefined {
  const upper = String(name).toUpperCase();
  return METHODS.find((m) => m === upper);
}

/** Why a request produced no usable response. */
export type HttpErrorKind =
  | "invalid-request"
  | "unsupported"
  | "tls"
  | "denied"
  | "timeout"
  | "too-large"
  | "transport"
  | "body"
  | "status";

const PREFIX: Record<Exclude<HttpErrorKind, "status">, string> = {
  "invalid-request": "invalid request",
  unsupported: "unsupported",
  tls: "TLS",
  denied: "denied",
  timeout: "timed out",
  "too-large": "response too large",
  transport: "transport error",
  body: "bad response body",
};

/**
 * Why a request produced no usable response (the Rust SDK's `HttpError`).
 *
 * - `invalid-request`: a malformed URL, a header the host refuses, a body that does not encode;
 * - `unsupported`: something the client does not do;
 * - `tls`: the handshake failed (untrusted, wrong-name or expired certificate, an alert);
 * - `denied`: hookd refused to send it (not in `allow_hosts`, a refused address range, too many
 *   requests in one call); the message carries the host's reason;
 * - `timeout`, `transport`, `body`, `too-large`: what the words say;
 * - `status`: a non-2xx answer, from {@link Response.errorForStatus}.
 */
export class HttpError extends Error {
  readonly kind: HttpErrorKind;
  /** The kind's own text, without the prefix. */
  readonly detail: string;
  /** For `status`: the status code. */
  readonly status: number | undefined;
  /** For `status`: the server's `Retry-After` in milliseconds, if it sent a valid one. */
  readonly retryAfterMs: number | undefined;

  constructor(
    kind: HttpErrorKind,
    detail: string,
    status?: number,
    retryAfterMs?: number,
  ) {
    super(kind === "status" ? `status ${status}: ${detail}` : `${PREFIX[kind]}: ${detail}`);
    this.name = "HttpError";
    this.kind = kind;
    this.detail = detail;
    this.status = status;
    this.retryAfterMs = retryAfterMs;
  }

  /**
   * What a handler makes of it (thrown out of a handler, it is converted this way): failures a
   * later attempt may not meet (transport, timeout, an unreadable body, 5xx, 408, 429) are
   * retries, honouring `Retry-After`; the rest (a refused host, a failed TLS handshake, an
   * unsupported or invalid request, another non-2xx status, a response over the cap) are
   * permanent, since retrying cannot change them.
   */
  toHandleError(): HandleError {
    switch (this.kind) {
      case "timeout":
      case "transport":
      case "body":
        return HandleError.retry(this.message);
      case "status": {
        const status = this.status ?? 0;
        if (status >= 500 || status === 408 || status === 429) {
          return HandleError.retry(this.message, this.retryAfterMs);
        }
        return HandleError.permanent(this.message);
      }
      default:
        return HandleError.permanent(this.message);
    }
  }
}

/**
 * Headers hookd sets itself (the framing and the connection): wasmtime-wasi-http refuses the
 * first nine, and hookd a second `content-length` (the SDK adds one from the body).
 */
const HOST_HEADERS = new Set([
  "connection",
  "keep-alive",
  "proxy-authenticate",
  "proxy-authorization",
  "proxy-connection",
  "transfer-encoding",
  "upgrade",
  "host",
  "http2-settings",
  "content-length",
]);

/** An RFC 9110 token (`tchar`s, at least one): what a field name must be. */
const TOKEN = /^[A-Za-z0-9!#$%&'*+\-.^_`|~]+$/;

/** A byte below 0x20 other than tab, or 0x7f: what a field value must not hold. */
const CONTROL = /[\x00-\x08\x0a-\x1f\x7f]/;

/**
 * Refuses, as an `invalid-request` error, the first of `headers` hookd would refuse (its
 * `Fields` does, and the plugin gets a permanent error): a name that is not a token, a header
 * hookd sets itself, a value holding a control character. Every request goes through it before
 * it is handed to the host, in a component and under the testing harness alike. The message
 * never shows a value: it may be a secret.
 */
export function checkHeaders(headers: ReadonlyArray<readonly [string, string]>): void {
  for (const [name, value] of headers) {
    if (!TOKEN.test(name)) {
      throw new HttpError("invalid-request", `header name ${JSON.stringify(name)} is not a valid HTTP field name`);
    }
    if (HOST_HEADERS.has(name.toLowerCase())) {
      throw new HttpError(
        "invalid-request",
        `header ${JSON.stringify(name)} is hookd's to set (the framing and the connection): leave it out`,
      );
    }
    if (CONTROL.test(value)) {
      throw new HttpError(
        "invalid-request",
        `the value of header ${JSON.stringify(name)} holds a control character (a newline?)`,
      );
    }
  }
}

/** The error for a response body over {@link MAX_RESPONSE_BYTES}, as the host reports it. */
export function responseTooLarge(authority: string): HttpError {
  return new HttpError("too-large", `${authority} sent more than ${MAX_RESPONSE_BYTES} bytes`);
}

/**
 * A whole response body as the client keeps it: with a `limit`, its first `limit` bytes (a
 * longer body, even one over the cap, is no error); without, the body itself, or a
 * {@link responseTooLarge} error if it is over {@link MAX_RESPONSE_BYTES}. (The testing
 * harness's reading; in a component `wit-host.ts` streams the body with the same rules.)
 */
export function limitBody(body: Uint8Array, authority: string, limit: number | undefined): Uint8Array {
  if (limit !== undefined) return body.length > limit ? body.slice(0, limit) : body;
  if (body.length > MAX_RESPONSE_BYTES) throw responseTooLarge(authority);
  return body;
}

/** One response header, name lower-cased. */
export interface Header {
  name: string;
  value: string;
}

const utf8 = new TextDecoder("utf-8", { fatal: true });
const lossy = new TextDecoder("utf-8");

/** A response, read in full. Any status, including 3xx, is a response. */
export class Response {
  /** The status code, e.g. 200. */
  readonly status: number;
  /** The response headers, names lower-cased, in the order received. */
  readonly headers: Header[];
  /** The body (a `Uint8Array` of the handler's realm). */
  readonly body: Uint8Array;

  constructor(status: number, body: Uint8Array | string = new Uint8Array(), headers: Header[] = []) {
    this.status = status;
    const given: unknown = body;
    if (typeof given === "string") this.body = new TextEncoder().encode(given);
    else if (isBytes(given)) this.body = localBytes(given);
    else throw new TypeError(`a response's body is a Uint8Array or a string, not ${kindOf(given)}`);
    this.headers = headers.map((h) => ({ name: h.name.toLowerCase(), value: h.value }));
  }

  /** A copy with one more header (e.g. for a test stub). */
  withHeader(name: string, value: string): Response {
    return new Response(this.status, this.body, [...this.headers, { name, value }]);
  }

  /** Whether the status is 2xx. */
  isSuccess(): boolean {
    return this.status >= 200 && this.status < 300;
  }

  /** The first value of header `name` (case-insensitive). */
  header(name: string): string | undefined {
    const lower = name.toLowerCase();
    return this.headers.find((h) => h.name === lower)?.value;
  }

  /** The body as UTF-8 text; else an `HttpError` of kind `body`. */
  text(): string {
    try {
      return utf8.decode(this.body);
    } catch (e) {
      throw new HttpError("body", `the response body is not UTF-8: ${errorText(e)}`);
    }
  }

  /** The body parsed as JSON; else an `HttpError` of kind `body`. */
  json<T = unknown>(): T {
    const text = this.text();
    try {
      return JSON.parse(text) as T;
    } catch (e) {
      throw new HttpError("body", `the response body is not the JSON expected: ${errorText(e)}`);
    }
  }

  /**
   * This response for a 2xx, else throws an `HttpError` of kind `status` with the server's
   * `Retry-After` (delay-seconds, or an HTTP-date counted from `now`) and the start of the body.
   */
  errorForStatus(now: number = Date.now()): Response {
    if (this.isSuccess()) return this;
    const retryAfter = this.header("retry-after");
    const after = retryAfter === undefined ? undefined : parseRetryAfter(retryAfter, now);
    let body = lossy.decode(this.body);
    if (utf8Length(body) > 512) body = cutUtf8(body, 512) + "…";
    throw new HttpError("status", body, this.status, after);
  }
}

function utf8Length(s: string): number {
  return new TextEncoder().encode(s).length;
}

/** The longest prefix of `s` whose UTF-8 encoding fits in `max` bytes. */
function cutUtf8(s: string, max: number): string {
  let bytes = 0;
  let end = 0;
  for (const ch of s) {
    const cp = ch.codePointAt(0) ?? 0;
    const len = cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4;
    if (bytes + len > max) break;
    bytes += len;
    end += ch.length;
  }
  return s.slice(0, end);
}

const U64_MAX = 18446744073709551615n;
const MONTHS = ["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"];
const DAYS = ["mon", "tue", "wed", "thu", "fri", "sat", "sun"];
const LONG_DAYS = ["monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday"];

/**
 * A `Retry-After` value (RFC 9110 §10.2.3) in milliseconds: `delay-seconds`, or an `HTTP-date`
 * (IMF-fixdate, RFC 850 or asctime) read as the time left from `now` (zero if it has passed).
 * Anything else is ignored, as if absent (`undefined`).
 */
export function parseRetryAfter(value: string, now: number): number | undefined {
  const v = value.trim();
  const digits = /^\+?([0-9]+)$/.exec(v);
  if (digits) {
    // As the Rust SDK reads it (a u64 parse): a leading `+` is allowed, and a value over
    // u64::MAX is no number of seconds, so ignored. Any other is a delay; Rust saturates its
    // milliseconds at u64::MAX, here at the largest safe integer (`HandleError.retry`'s
    // bound): hookd keeps either within the plugin's `backoff_max_ms`.
    if (BigInt(digits[1]) > U64_MAX) return undefined;
    const ms = Number(digits[1]) * 1000;
    return Number.isSafeInteger(ms) ? ms : Number.MAX_SAFE_INTEGER;
  }
  const at = parseHttpDate(v);
  if (at === undefined) return undefined;
  return Math.max(0, at - now);
}

/** An HTTP-date in one of the three forms RFC 9110 makes a recipient accept, in ms since the epoch. */
export function parseHttpDate(value: string): number | undefined {
  let m = /^([A-Za-z]{3}), (\d{2}) ([A-Za-z]{3}) (\d{4}) (\d{2}):(\d{2}):(\d{2}) GMT$/.exec(value);
  if (m && DAYS.includes(m[1].toLowerCase())) {
    return date(Number(m[4]), m[3], Number(m[2]), m[5], m[6], m[7]);
  }
  m = /^([A-Za-z]+), (\d{2})-([A-Za-z]{3})-(\d{2}) (\d{2}):(\d{2}):(\d{2}) GMT$/.exec(value);
  if (m && LONG_DAYS.includes(m[1].toLowerCase())) {
    const yy = Number(m[4]);
    return date(yy < 70 ? 2000 + yy : 1900 + yy, m[3], Number(m[2]), m[5], m[6], m[7]);
  }
  m = /^([A-Za-z]{3}) ([A-Za-z]{3}) ([ \d]\d) (\d{2}):(\d{2}):(\d{2}) (\d{4})$/.exec(value);
  if (m && DAYS.includes(m[1].toLowerCase())) {
    return date(Number(m[7]), m[2], Number(m[3].trim()), m[4], m[5], m[6]);
  }
  return undefined;
}

function date(year: number, month: string, day: number, h: string, min: string, s: string): number | undefined {
  const mon = MONTHS.indexOf(month.toLowerCase());
  const [hh, mm, ss] = [Number(h), Number(min), Number(s)];
  if (mon < 0 || day < 1 || day > 31 || hh > 23 || mm > 59 || ss > 60) return undefined;
  const t = Date.UTC(year, mon, day, hh, mm, Math.min(ss, 59));
  // Date.UTC rolls 31 Feb over into March: such a date is not a date.
  return new Date(t).getUTCDate() === day ? t : undefined;
}

/** An `http://` or `https://` URL split the way `wasi:http` wants it. */
export interface Url {
  https: boolean;
  /** `host[:port]`, as written. */
  authority: string;
  /** `/path?query`; `/` when the URL has none. The fragment is dropped. */
  pathWithQuery: string;
}

/** Splits `url` like the Rust SDK; a URL it cannot send is an `invalid-request` error. */
export function parseUrl(url: string): Url {
  const invalid = (why: string) => new HttpError("invalid-request", `URL ${JSON.stringify(shownUrl(url))}: ${why}`);
  const sep = url.indexOf("://");
  if (sep < 0) throw invalid("expected http(s)://host[:port]/path");
  const scheme = url.slice(0, sep).toLowerCase();
  const https = scheme === "https";
  if (!https && scheme !== "http") throw invalid("only http:// and https:// URLs are supported");
  const rest = url.slice(sep + 3).split("#")[0];
  const end = rest.search(/[/?]/);
  const authority = end < 0 ? rest : rest.slice(0, end);
  const path = end < 0 ? "" : rest.slice(end);
  if (authority === "") throw invalid("no host");
  if (authority.includes("@")) {
    throw invalid("credentials in the URL are not supported; send them in a header");
  }
  if (/[\s\x00-\x1f\x7f-\x9f]/.test(authority)) throw invalid("the host contains whitespace");
  const pathWithQuery = path === "" ? "/" : path.startsWith("?") ? `/${path}` : path;
  return { https, authority, pathWithQuery };
}

/**
 * `url` as an error message may show it: the scheme and the host, with any user information
 * and everything after the host cut to `…`. A webhook URL often carries its secret in the path
 * or the query, and error messages reach the log, the admin API and the dashboard.
 */
export function shownUrl(url: string): string {
  const sep = url.indexOf("://");
  let shown = sep < 0 ? "" : url.slice(0, sep + 3);
  const rest = sep < 0 ? url : url.slice(sep + 3);
  const end = rest.search(/[/?#]/);
  let authority = end < 0 ? rest : rest.slice(0, end);
  const at = authority.lastIndexOf("@");
  if (at >= 0) {
    shown += "…@";
    authority = authority.slice(at + 1);
  }
  return shown + authority + (end < 0 ? "" : "/…");
}

/** A parsed `url` as an error message may show it: see `shownUrl`. */
export function redactedUrl(url: Url): string {
  return `${url.https ? "https" : "http"}://${url.authority}${url.pathWithQuery === "/" ? "/" : "/…"}`;
}

/** `url` written back: `https://host:port/path?query`. */
export function urlToString(url: Url): string {
  return `${url.https ? "https" : "http"}://${url.authority}${url.pathWithQuery}`;
}

/** A `wasi:http` error code, as the generated types give it. */
export type ErrorCodeLike = { tag: string; val?: unknown };

/**
 * The `HttpError` for a `wasi:http` error code, as the Rust SDK maps it. A refusal's code
 * carries no text, so `lastRefusal` asks the host why (`network.last-refusal`).
 */
export function errorFromCode(
  code: ErrorCodeLike,
  authority: string,
  lastRefusal: () => string | undefined,
): HttpError {
  switch (code.tag) {
    case "HTTP-request-denied":
    case "destination-IP-prohibited":
    case "connection-limit-reached": {
      const why = lastRefusal() ?? "no reason given";
      return new HttpError("denied", `hookd refused the request to ${authority}: ${why}`);
    }
    case "DNS-timeout":
    case "connection-timeout":
    case "connection-read-timeout":
    case "connection-write-timeout":
    case "HTTP-response-timeout":
      return new HttpError("timeout", `${authority}: ${code.tag}`);
    case "HTTP-response-body-size": {
      const size = code.val;
      const sent = size === undefined || size === null ? "too many" : String(size);
      return new HttpError(
        "too-large",
        `${authority} sent ${sent} bytes, over the ${MAX_RESPONSE_BYTES}-byte cap`,
      );
    }
    case "TLS-certificate-error":
      return new HttpError(
        "tls",
        `${authority}: the server's certificate is not trusted, is for another name or has expired (TLS-certificate-error)`,
      );
    case "TLS-alert-received": {
      const alert = (code.val ?? {}) as { alertId?: number; alertMessage?: string };
      const id = alert.alertId === undefined ? "" : String(alert.alertId);
      const msg = alert.alertMessage === undefined ? "" : ` (${alert.alertMessage})`;
      return new HttpError("tls", `${authority}: the server sent TLS alert ${id}${msg}`);
    }
    case "TLS-protocol-error":
      return new HttpError("tls", `${authority}: the TLS handshake failed`);
    case "HTTP-request-URI-invalid":
    case "HTTP-request-method-invalid":
      return new HttpError("invalid-request", `${authority}: ${code.tag}`);
    default:
      return new HttpError("transport", `${authority}: ${describeCode(code)}`);
  }
}

function describeCode(code: ErrorCodeLike): string {
  if (code.val === undefined || code.val === null) return code.tag;
  try {
    return `${code.tag} ${JSON.stringify(code.val, (_k, v) => (typeof v === "bigint" ? String(v) : v))}`;
  } catch {
    return code.tag;
  }
}

/**
 * A body read error that carried no error code: its debug text's first line decides
 * (wasmtime-wasi-http reports some body errors as plain messages).
 */
export function errorFromBodyMessage(debug: string, authority: string): HttpError {
  const first = (debug.split("\n")[0] ?? "").trim();
  const what = `reading the response body from ${authority}: ${first}`;
  // Its number is what had arrived when the host stopped reading: the cap is what to say.
  if (what.includes("body size exceeds limit")) {
    return responseTooLarge(authority);
  }
  if (what.includes("timeout")) return new HttpError("timeout", what);
  return new HttpError("body", what);
}
