import assert from "node:assert/strict";
import { test } from "node:test";

import { HandleError, config, defineHandler, http, log, output, state } from "@hookd/plugin-sdk";
import { Event, Harness, HttpError, MAX_KEY_BYTES, MAX_VALUE_BYTES, Response, StateRefused } from "@hookd/plugin-sdk/testing";

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
