import assert from "node:assert/strict";
import { test } from "node:test";

import { HandleError, HttpError, Response } from "@hookd/plugin-sdk";
import { errorFromBodyMessage, errorFromCode, parseHttpDate, parseRetryAfter, parseUrl, redactedUrl } from "../src/http-core.js";

test("URLs split into authority and path as the Rust SDK splits them", () => {
  const ok: Array<[string, string, string]> = [
    ["http://127.0.0.1:9000/v1/chat?x=1#top", "127.0.0.1:9000", "/v1/chat?x=1"],
    ["HTTP://example.com", "example.com", "/"],
    ["http://example.com?q", "example.com", "/?q"],
    ["http://[::1]:80/", "[::1]:80", "/"],
  ];
  for (const [url, authority, path] of ok) {
    const got = parseUrl(url);
    assert.deepEqual([got.authority, got.pathWithQuery], [authority, path], url);
  }
  assert.equal(parseUrl("https://example.com:8443/v1?x").https, true);
  assert.equal(parseUrl("http://example.com/").https, false);
  for (const bad of ["example.com/x", "ftp://x/", "http:///x", "http://u:p@x/", "http://a b/"]) {
    assert.throws(() => parseUrl(bad), (e) => e instanceof HttpError && e.kind === "invalid-request", bad);
  }
});

test("URL errors show no path, query or credentials, as in the Rust SDK", () => {
  const cases: Array<[string, string]> = [
    ["ftp://files.example/s3cret?k=v", "ftp://files.example/…"],
    ["discord.com/api/webhooks/1/s3cret", "discord.com/…"],
    ["http://user:s3cret@example.com/x", "http://…@example.com/…"],
    ["https://a b/s3cret", "https://a b/…"],
    ["http://a\tb?token=s3cret", "http://a\tb/…"],
    ["http://#s3cret", "http:///…"],
  ];
  for (const [url, shown] of cases) {
    assert.throws(
      () => parseUrl(url),
      (e) => e instanceof HttpError && !e.message.includes("s3cret") && e.message.includes(JSON.stringify(shown)),
      url,
    );
  }
  assert.equal(redactedUrl(parseUrl("https://hooks.example/T0/s3cret?x=1")), "https://hooks.example/…");
  assert.equal(redactedUrl(parseUrl("https://hooks.example")), "https://hooks.example/");
});

test("status errors keep Retry-After and a short body", () => {
  assert.equal(new Response(204).errorForStatus().status, 204);
  const r = new Response(429, "x".repeat(2000)).withHeader("Retry-After", "7");
  let err: HttpError | undefined;
  try {
    r.errorForStatus();
  } catch (e) {
    err = e as HttpError;
  }
  assert.ok(err instanceof HttpError);
  assert.equal(err.kind, "status");
  assert.equal(err.status, 429);
  assert.equal(err.retryAfterMs, 7000);
  assert.ok(err.message.length < 600);
  const verdict = err.toHandleError();
  assert.equal(verdict.kind, "retry");
  assert.equal(verdict.afterMs, 7000);
  assert.equal(verdict.reason, err.message);
});

test("Retry-After is seconds or an HTTP-date", () => {
  const now = Date.UTC(2015, 9, 21, 7, 28, 0);
  assert.equal(parseRetryAfter(" 120 ", now), 120_000);
  assert.equal(parseRetryAfter("Wed, 21 Oct 2015 07:29:30 GMT", now), 90_000);
  assert.equal(parseRetryAfter("Wednesday, 21-Oct-15 07:28:05 GMT", now), 5_000);
  assert.equal(parseRetryAfter("Wed Oct 21 07:28:10 2015", now), 10_000);
  assert.equal(parseRetryAfter("Wed, 21 Oct 2015 07:00:00 GMT", now), 0);
  assert.equal(parseRetryAfter("soon", now), undefined);
  assert.equal(parseRetryAfter("-5", now), undefined);
  assert.equal(parseHttpDate("Sun, 31 Feb 2015 07:00:00 GMT"), undefined);
});

test("Retry-After seconds are read as the Rust SDK's u64 parse reads them", () => {
  const now = Date.UTC(2015, 9, 21, 7, 28, 0);
  // A leading + is allowed (Rust's u64 parse, Python's SDK); a sign alone or doubled is not.
  assert.equal(parseRetryAfter("+30", now), 30_000);
  assert.equal(parseRetryAfter(" +0 ", now), 0);
  for (const bad of ["+", "++30", "+-30", "-0", "3 0", "30s"]) {
    assert.equal(parseRetryAfter(bad, now), undefined, bad);
  }
  // Up to u64::MAX a delay, however long: Rust saturates its milliseconds (at u64::MAX), here
  // at the largest safe integer, still a valid retry delay; hookd caps it at backoff_max_ms.
  const capped = Number.MAX_SAFE_INTEGER;
  for (const big of ["9007199254741", "9007199254740992", "+9007199254740993", "18446744073709551615"]) {
    assert.equal(parseRetryAfter(big, now), capped, big);
  }
  assert.equal(parseRetryAfter("9007199254740", now), 9_007_199_254_740_000);
  assert.equal(HandleError.retry("r", capped).afterMs, capped);
  // Over u64::MAX it is no number of seconds (Rust's parse fails) and no date: ignored.
  assert.equal(parseRetryAfter("18446744073709551616", now), undefined);
  assert.equal(parseRetryAfter("9".repeat(400), now), undefined);
  const err = (() => {
    try {
      new Response(503, "busy").withHeader("Retry-After", "+30").errorForStatus(now);
    } catch (e) {
      return e as HttpError;
    }
    throw new Error("no error");
  })();
  assert.equal(err.toHandleError().afterMs, 30_000);
});

test("handler errors retry only what may change", () => {
  const retry = (e: HttpError) => e.toHandleError().kind === "retry";
  assert.ok(retry(new HttpError("timeout", "t")));
  assert.ok(retry(new HttpError("transport", "t")));
  assert.ok(retry(new HttpError("body", "b")));
  assert.ok(retry(new HttpError("status", "", 503)));
  assert.ok(retry(new HttpError("status", "", 408)));
  assert.ok(!retry(new HttpError("status", "", 404)));
  assert.ok(!retry(new HttpError("denied", "d")));
  assert.ok(!retry(new HttpError("unsupported", "u")));
  assert.ok(!retry(new HttpError("tls", "certificate")));
  assert.ok(!retry(new HttpError("too-large", "big")));
  assert.ok(!retry(new HttpError("invalid-request", "i")));
});

test("wasi:http error codes map as in the Rust SDK; a refusal asks the host why", () => {
  const why = () => "localhost:9100 is not in allow_hosts";
  const denied = errorFromCode({ tag: "HTTP-request-denied" }, "localhost:9100", why);
  assert.equal(denied.kind, "denied");
  assert.equal(
    denied.message,
    "denied: hookd refused the request to localhost:9100: localhost:9100 is not in allow_hosts",
  );
  assert.equal(errorFromCode({ tag: "destination-IP-prohibited" }, "a:1", () => undefined).message,
    "denied: hookd refused the request to a:1: no reason given");
  assert.equal(errorFromCode({ tag: "connection-timeout" }, "a:1", why).kind, "timeout");
  assert.equal(errorFromCode({ tag: "TLS-certificate-error" }, "a:1", why).kind, "tls");
  assert.equal(errorFromCode({ tag: "HTTP-response-body-size", val: 9n }, "a:1", why).kind, "too-large");
  assert.equal(errorFromCode({ tag: "connection-refused" }, "a:1", why).kind, "transport");
  const tooLarge = errorFromBodyMessage("HTTP response body size exceeds limit: 8394752 bytes\nbacktrace", "a:1");
  assert.equal(tooLarge.kind, "too-large");
  assert.match(tooLarge.message, /a:1 sent more than 8388608 bytes/);
  assert.equal(errorFromBodyMessage("read timeout", "a:1").kind, "timeout");
});

test("HandleError says what the Rust SDK's Display says and lowers to the WIT shape", () => {
  assert.equal(HandleError.retry("r").message, "retry: r");
  assert.equal(HandleError.retry("r", 5).message, "retry after 5 ms: r");
  assert.equal(HandleError.permanent("p").message, "permanent failure: p");
  assert.deepEqual(HandleError.retry("r", 5).toWit(), { tag: "retry", val: { reason: "r", afterMs: 5n } });
  assert.deepEqual(HandleError.retry("r").toWit(), { tag: "retry", val: { reason: "r", afterMs: undefined } });
  assert.deepEqual(HandleError.permanent("p").toWit(), { tag: "permanent", val: "p" });
  assert.throws(() => HandleError.retry("r", -1), RangeError);
});
