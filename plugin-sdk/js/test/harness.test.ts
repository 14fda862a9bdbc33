import assert from "node:assert/strict";
import { test } from "node:test";

import { HandleError, config, defineHandler, http, log, output, state } from "@hookd/plugin-sdk";
import { Event, Harness, HttpError, MAX_KEY_BYTES, MAX_REQUESTS, MAX_VALUE_BYTES, Response, StateRefused } from "@hookd/plugin-sdk/testing";

// The Rust SDK's README example, in TypeScript.
const notify = defineHandler((event) => {
  const sent = (state.getJson<number>("sent") ?? 0) + 1;
  state.setJson("sent", sent); // kept only if the POST below succeeds
  const url = config.require("notify_url");
  http.post(url).json(event.eventId).send().errorForStatus();
  log.info(`sent ${sent}`);
  return output.json(sent);
});

const event = new Event({ source: "orders", eventId: "evt_1", eventType: "order.paid", body: '{"id": 7}', attempt: 2 });

test("a 503 is a retry that leaves no trace", () => {
  const url = "https://hooks.example.com/in";
  const hookd = new Harness().withConfig("notify_url", url).withStateJson("sent", 41).respondTo("POST", url, 503);
  const result = hookd.handle(notify, event);
  assert.equal(result.ok, false);
  assert.equal(!result.ok && result.error.kind, "retry");
  assert.equal(hookd.stateJson("sent"), 41);

  hookd.respondTo("POST", url, 200);
  assert.deepEqual(hookd.handle(notify, event), { ok: true, output: "42" });
  assert.equal(hookd.stateJson("sent"), 42);
  assert.equal(hookd.requests()[1].json(), "evt_1");
  assert.deepEqual(hookd.requests()[1].headers, [["content-type", "application/json"]]);
  assert.deepEqual(hookd.logs(), [{ level: "info", message: "sent 42" }]);
});

test("an unlisted host is refused, a permanent error naming it", () => {
  const hookd = new Harness().withConfig("notify_url", "http://localhost:9100/x");
  const result = hookd.handle(notify, event);
  assert.ok(!result.ok);
  assert.equal(result.error.kind, "permanent");
  assert.equal(
    result.error.reason,
    "denied: hookd refused the request to localhost:9100: localhost:9100 is not in allow_hosts",
  );
});

test("a call sends 64 requests; a refused one does not count toward them, as in hookd", () => {
  const stubbed = "https://api.test/ok";
  const refusals: string[] = [];
  const tries = (unstubbed: number, stubbedTries: number) =>
    defineHandler(() => {
      for (let i = 0; i < unstubbed; i++) {
        try {
          http.get("https://elsewhere.test/x").send();
        } catch (e) {
          refusals.push(e instanceof HttpError ? `${e.kind} | ${e.message}` : String(e));
        }
      }
      for (let i = 0; i < stubbedTries; i++) http.get(stubbed).send();
      return "sent";
    });
  const hookd = new Harness().respondTo("GET", stubbed, 200);
  assert.equal(MAX_REQUESTS, 64);

  // 64 refused (no stub: an unlisted host), then one allowed: it is sent and answered.
  assert.deepEqual(hookd.handle(tries(64, 1), event), { ok: true, output: "sent" });
  assert.equal(refusals.length, 64);
  assert.ok(
    refusals.every((r) => r === "denied | denied: hookd refused the request to elsewhere.test: elsewhere.test:443 is not in allow_hosts"),
    refusals[0],
  );
  // Refused ones in between, then the full 64 allowed.
  assert.deepEqual(hookd.handle(tries(10, 64), event), { ok: true, output: "sent" });

  // 64 allowed, then a 65th allowed one is refused for the cap; an unlisted host past the cap
  // is still refused as unlisted (hookd checks allow_hosts first).
  const r = hookd.handle(tries(0, 65), event);
  assert.ok(!r.ok && r.error.kind === "permanent");
  assert.equal(!r.ok && r.error.reason, "denied: hookd refused the request to api.test: more than 64 requests in one call");
  refusals.length = 0;
  const after = defineHandler(() => {
    for (let i = 0; i < 64; i++) http.get(stubbed).send();
    try {
      http.get("https://elsewhere.test/x").send();
    } catch (e) {
      refusals.push(e instanceof HttpError ? e.message : String(e));
    }
    http.get(stubbed).send();
    return "sent";
  });
  const r2 = hookd.handle(after, event);
  assert.deepEqual(refusals, ["denied: hookd refused the request to elsewhere.test: elsewhere.test:443 is not in allow_hosts"]);
  assert.ok(!r2.ok && r2.error.reason.includes("more than 64 requests in one call"));
});

test("a missing config key is permanent; a transport failure is a retry", () => {
  const r1 = new Harness().handle(notify, event);
  // The Python SDK's text, word for word.
  assert.ok(!r1.ok && r1.error.kind === "permanent" && r1.error.reason === "config key `notify_url` is not set");
  const url = "https://down.example.com/";
  const r2 = new Harness()
    .withConfig("notify_url", url)
    .failWith("POST", url, new HttpError("transport", "down.example.com: connection-refused"))
    .handle(notify, event);
  assert.ok(!r2.ok && r2.error.kind === "retry");
});

test("a response body limit keeps the start of the body, as in the Rust SDK", () => {
  const peek = defineHandler(() => {
    const response = http.get("https://api.test/").responseBodyLimit(4).send();
    return `${response.status} ${response.text()}`;
  });
  const hookd = new Harness().respondWith("GET", "https://api.test/", new Response(200, "long answer"));
  assert.deepEqual(hookd.handle(peek, event), { ok: true, output: "200 long" });
  for (const bad of [-1, 1.5, Number.NaN]) {
    assert.throws(
      () => http.get("https://api.test/").responseBodyLimit(bad).send(),
      (e) => e instanceof HttpError && e.kind === "invalid-request",
      String(bad),
    );
  }
});

test("a state key or value that is not UTF-8 text is permanent, as in the Python SDK", () => {
  const title = JSON.parse('"Crash on \\ud83d"') as string;
  for (const use of [() => state.set(title, "v"), () => state.set("k", title), () => state.get(title), () => state.delete(title)]) {
    const result = new Harness().handle(
      defineHandler(() => {
        use();
        return undefined;
      }),
      event,
    );
    assert.ok(!result.ok && result.error.kind === "permanent", JSON.stringify(result));
    assert.ok(!result.ok && result.error.reason.includes("lone surrogate (U+D83D)"), result.ok ? "" : result.error.reason);
  }
});

test("Retry-After reaches the retry; a 404 is permanent", () => {
  const url = "https://api.example.com/x";
  const hookd = new Harness()
    .withConfig("notify_url", url)
    .respondWith("POST", url, new Response(429, "slow down").withHeader("retry-after", "30"));
  const r = hookd.handle(notify, event);
  assert.ok(!r.ok && r.error.kind === "retry" && r.error.afterMs === 30_000);
  hookd.respondTo("POST", url, 404);
  const r2 = hookd.handle(notify, event);
  assert.ok(!r2.ok && r2.error.kind === "permanent");
});

test("a body that is not JSON is permanent; a thrown HandleError passes as is", () => {
  const h = defineHandler((e) => output.json(e.json()));
  const r = new Harness().handle(h, new Event({ source: "s", eventId: "1", eventType: "t", body: "not json" }));
  assert.ok(!r.ok && r.error.kind === "permanent" && r.error.reason.startsWith("body is not valid JSON"));
  const h2 = defineHandler(() => {
    throw HandleError.retry("later", 1);
  });
  const r2 = new Harness().handle(h2, event);
  assert.ok(!r2.ok && r2.error.kind === "retry" && r2.error.afterMs === 1);
});

test("an uncaught error is a trap, reported like a panic", () => {
  const h = defineHandler(() => {
    throw new TypeError("boom");
  });
  const original = console.error;
  console.error = () => {};
  try {
    assert.throws(() => new Harness().handle(h, event), /the handler trapped: panicked at .*TypeError: boom/);
  } finally {
    console.error = original;
  }
});

test("state: get/set/delete and JSON, committed on success only", () => {
  const h = defineHandler((e) => {
    state.set("raw", "text");
    state.delete("gone");
    state.setJson("obj", { a: [1, 2] });
    assert.equal(state.getText("raw"), "text");
    assert.equal(state.get("gone"), undefined);
    if (e.eventType === "fail") throw HandleError.permanent("no");
    return undefined;
  });
  const hookd = new Harness().withState("gone", "x");
  assert.ok(!hookd.handle(h, new Event({ source: "s", eventId: "1", eventType: "fail" })).ok);
  assert.deepEqual(hookd.stateKeys(), ["gone"]);
  assert.deepEqual(hookd.handle(h, event), { ok: true, output: undefined });
  assert.deepEqual(hookd.stateKeys(), ["obj", "raw"]);
  assert.deepEqual(hookd.stateJson("obj"), { a: [1, 2] });
  const bad = new Harness().withState("n", "{");
  const r = bad.handle(defineHandler(() => output.json(state.getJson("n"))), event);
  assert.ok(!r.ok && r.error.reason.startsWith("state key `n` does not hold valid JSON"));
  // A value of another type is named, as the Python SDK names it.
  assert.throws(
    () => state.set("n", 5 as unknown as string),
    /state.set takes a Uint8Array or a string, not number \(state.setJson stores any JSON value\)/,
  );
});

test("a state call hookd refuses stops the attempt, even if the handler catches it", () => {
  const refused: Array<[() => unknown, RegExp]> = [
    [() => state.set("", "v"), /is empty/],
    [() => state.delete("a\0b"), /NUL character/],
    [() => state.get("k".repeat(MAX_KEY_BYTES + 1)), /1025 bytes exceeds the 1024-byte cap on a key/],
    [() => state.set("v", new Uint8Array(MAX_VALUE_BYTES + 1)), /1048577 bytes/],
  ];
  for (const [call, message] of refused) {
    for (const swallow of [false, true]) {
      const hookd = new Harness();
      const h = defineHandler(() => {
        state.set("kept", "1");
        try {
          call();
        } catch (e) {
          if (!swallow) throw e;
        }
        return "went on";
      });
      assert.throws(() => hookd.handle(h, event), (e: unknown) => e instanceof StateRefused && message.test(e.message));
      assert.deepEqual(hookd.stateKeys(), []);
    }
  }
  const hookd = new Harness();
  const caps = defineHandler(() => {
    state.set("k".repeat(MAX_KEY_BYTES), new Uint8Array(MAX_VALUE_BYTES));
    state.delete("");
    return undefined;
  });
  assert.deepEqual(hookd.handle(caps, event), { ok: true, output: undefined });
  assert.deepEqual(hookd.stateKeys(), ["k".repeat(MAX_KEY_BYTES)]);
});

test("async handlers work through handleAsync", async () => {
  const h = defineHandler(async (e) => {
    await Promise.resolve();
    if (e.attempt < 2) throw HandleError.retry("first");
    return "done";
  });
  const r = await new Harness().handleAsync(h, new Event({ source: "s", eventId: "1", eventType: "t" }));
  assert.ok(!r.ok && r.error.kind === "retry");
  assert.deepEqual(await new Harness().handleAsync(h, event), { ok: true, output: "done" });
});

test("a header hookd refuses is a permanent invalid request, sent nowhere, its value never shown", () => {
  const url = "https://api.test/in";
  const send = (name: string, value: string) =>
    defineHandler(() => {
      http.post(url, "{}").header(name, value).send();
      return "sent";
    });
  const refused: Array<[string, string, string]> = [
    ["bad name", "v", 'header name "bad name" is not a valid HTTP field name'],
    ["", "v", 'header name "" is not a valid HTTP field name'],
    ["x:y", "v", 'header name "x:y" is not a valid HTTP field name'],
    ["café", "v", 'header name "café" is not a valid HTTP field name'],
    ["X-Token\n", "v", 'header name "X-Token\\n" is not a valid HTTP field name'],
    ...["Connection", "keep-alive", "Proxy-Authenticate", "proxy-authorization", "Proxy-Connection",
      "Transfer-Encoding", "UPGRADE", "Host", "http2-settings", "Content-Length"].map(
      (name): [string, string, string] => [
        name,
        "v",
        `header "${name}" is hookd's to set (the framing and the connection): leave it out`,
      ],
    ),
    ...["s3cret\r\nX-Evil: 1", "s3cret\n", "s3cret\0", "s3cret\x7f", "s3cret\x1b"].map(
      (value): [string, string, string] => [
        "X-Api-Key",
        value,
        'the value of header "X-Api-Key" holds a control character (a newline?)',
      ],
    ),
  ];
  for (const [name, value, detail] of refused) {
    const hookd = new Harness().respondTo("POST", url, 200);
    const r = hookd.handle(send(name, value), event);
    assert.ok(!r.ok && r.error.kind === "permanent", JSON.stringify(name));
    assert.equal(r.error.reason, `invalid request: ${detail}`);
    assert.ok(!r.error.reason.includes("s3cret"));
    assert.deepEqual(hookd.requests(), [], "refused before it is sent");
  }
  // Outside a harness the same check comes first, before the WIT imports are touched.
  assert.throws(
    () => http.get(url).header("Host", "api.test").send(),
    (e) => e instanceof HttpError && e.kind === "invalid-request" && e.detail.startsWith('header "Host"'),
  );
  // Tokens of every tchar, a tab and text beyond ASCII in a value, are sent as they are.
  const fine = defineHandler(() => {
    http.post(url, "{}")
      .header("X-Custom_1!#$%&'*+-.^`|~", "a\tb")
      .header("x-name", "café ✓")
      .header("Authorization", "Bearer t")
      .send();
    return "sent";
  });
  const hookd = new Harness().respondTo("POST", url, 200);
  assert.deepEqual(hookd.handle(fine, event), { ok: true, output: "sent" });
  assert.deepEqual(hookd.requests()[0].headers, [
    ["X-Custom_1!#$%&'*+-.^`|~", "a\tb"],
    ["x-name", "café ✓"],
    ["Authorization", "Bearer t"],
  ]);
});

test("a stub's URL is normalised as the request's is", () => {
  const status = (url: string) =>
    defineHandler(() => String(http.post(url, "{}").send().status));
  const stubbed: Array<[string, string]> = [
    ["https://api.test", "https://api.test"],
    ["https://api.test", "https://api.test/"],
    ["https://api.test/", "https://api.test"],
    ["HTTPS://api.test/x#top", "https://api.test/x"],
    ["https://api.test?q=1", "https://api.test/?q=1"],
  ];
  for (const [stub, sent] of stubbed) {
    const hookd = new Harness().respondTo("post", stub, 201);
    assert.deepEqual(hookd.handle(status(sent), event), { ok: true, output: "201" }, `${stub} for ${sent}`);
  }
  const failing = new Harness().failWith("POST", "https://api.test", new HttpError("timeout", "api.test: slow"));
  const r = failing.handle(status("https://api.test/"), event);
  assert.ok(!r.ok && r.error.kind === "retry");
  assert.throws(() => new Harness().respondTo("POST", "api.test/x", 200), /Harness stub: invalid request: URL "api.test\/…"/);
});

test("a stubbed body over the 8 MiB cap is too large, as in hookd; a body limit keeps its start", () => {
  const url = "https://big.test:8443/file";
  const over = new Uint8Array(http.MAX_RESPONSE_BYTES + 1).fill(0x61);
  const kind = (limit?: number) =>
    defineHandler(() => {
      const request = http.get(url);
      if (limit !== undefined) request.responseBodyLimit(limit);
      try {
        return `${request.send().body.length}`;
      } catch (e) {
        return e instanceof HttpError ? `${e.kind}: ${e.message}` : `other: ${String(e)}`;
      }
    });
  const hookd = new Harness().respondWith("GET", url, new Response(200, over));
  assert.deepEqual(hookd.handle(kind(), event), {
    ok: true,
    output: "too-large: response too large: big.test:8443 sent more than 8388608 bytes",
  });
  const r = hookd.handle(defineHandler(() => String(http.get(url).send().status)), event);
  assert.ok(!r.ok && r.error.kind === "permanent");
  assert.equal(r.error.reason, "response too large: big.test:8443 sent more than 8388608 bytes");
  assert.deepEqual(hookd.handle(kind(10), event), { ok: true, output: "10" });
  assert.deepEqual(hookd.handle(kind(http.MAX_RESPONSE_BYTES), event), { ok: true, output: "8388608" });
  assert.deepEqual(hookd.handle(kind(http.MAX_RESPONSE_BYTES + 5), event), { ok: true, output: "8388608" });
  // The cap itself is not over it.
  hookd.respondWith("GET", url, new Response(200, over.subarray(0, http.MAX_RESPONSE_BYTES)));
  assert.deepEqual(hookd.handle(kind(), event), { ok: true, output: "8388608" });
});
