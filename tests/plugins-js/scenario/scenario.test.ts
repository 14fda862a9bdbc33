// The protocol on Node, through the SDK's Harness (the operations that need hookd's limits,
// spin and grow, are left to the integration test).
import assert from "node:assert/strict";
import { test } from "node:test";

import { Event, Harness, Response } from "@hookd/plugin-sdk/testing";

import { handler } from "./scenario.ts";

const ev = (body: unknown, attempt = 1, stale = false) =>
  new Event({ source: "s", eventId: "e", eventType: "t", body: JSON.stringify(body), attempt, stale });

test("count adds one to a JSON number, from 0", () => {
  const hookd = new Harness();
  assert.deepEqual(hookd.handle(handler, ev({ do: "count", key: "k" })), { ok: true, output: '{"count":1}' });
  assert.deepEqual(hookd.handle(handler, ev({ do: "count", key: "k" })), { ok: true, output: '{"count":2}' });
  assert.equal(hookd.stateJson("k"), 2);
});

test("fail retries until the attempt reaches until", () => {
  const r = new Harness().handle(handler, ev({ do: "fail", until: 3 }, 2));
  assert.ok(!r.ok && r.error.kind === "retry" && r.error.reason === "attempt 2 fails" && r.error.afterMs === 1);
  assert.deepEqual(new Harness().handle(handler, ev({ do: "fail", until: 3 }, 3)), { ok: true, output: '{"attempt":3}' });
});

test("permanent, write-then-fail, unknown", () => {
  const p = new Harness().handle(handler, ev({ do: "permanent" }));
  assert.ok(!p.ok && p.error.kind === "permanent" && p.error.reason === "asked to fail for good");
  const hookd = new Harness();
  const w = hookd.handle(handler, ev({ do: "write-then-fail", key: "k" }));
  assert.ok(!w.ok && w.error.kind === "retry" && w.error.reason === "wrote then failed");
  assert.deepEqual(hookd.stateKeys(), []);
  const u = new Harness().handle(handler, ev({ do: "dance" }));
  assert.ok(!u.ok && u.error.kind === "permanent" && u.error.reason === "unknown op dance");
});

test("fetch posts the body; denied is permanent, 503 a retry", () => {
  const url = "http://127.0.0.1:9000/in";
  const body = { do: "fetch", url };
  const hookd = new Harness().respondTo("POST", url, 201);
  assert.deepEqual(hookd.handle(handler, ev(body)), { ok: true, output: '{"status":201}' });
  assert.deepEqual(hookd.requests()[0].json(), body);
  const denied = new Harness().handle(handler, ev({ do: "fetch", url: "http://localhost:9100/" }));
  assert.ok(!denied.ok && denied.error.kind === "permanent" && denied.error.reason.startsWith("denied: hookd refused"));
  const busy = new Harness().respondWith("POST", url, new Response(503).withHeader("retry-after", "2")).handle(handler, ev(body));
  assert.ok(!busy.ok && busy.error.kind === "retry" && busy.error.afterMs === 2000);
});

test("copy stores, copies and posts the body byte for byte", () => {
  // The harness hands the body (and state values) in as Uint8Arrays of another realm, as hookd
  // does: each of these once failed in hookd (a TypeError, or the bytes posted as JSON).
  const url = "http://127.0.0.1:9000/copy";
  const body = `{"do": "copy", "key": "b", "copy": "b2", "url": "${url}", "text": "é \\u00e9"}`;
  const bytes = new TextEncoder().encode(body);
  const hookd = new Harness().respondTo("POST", url, 200);
  const r = hookd.handle(handler, new Event({ source: "s", eventId: "e", eventType: "t", body }));
  assert.deepEqual(r, { ok: true, output: `{"status":200,"bytes":${bytes.length}}` });
  assert.deepEqual(hookd.state("b"), bytes);
  assert.deepEqual(hookd.state("b2"), bytes);
  assert.deepEqual(hookd.requests()[0].body, bytes);
  assert.deepEqual(hookd.requests()[0].headers, [], "sent as it is, not as JSON");
  // A failed post keeps neither key.
  const down = new Harness().respondTo("POST", url, 503);
  assert.ok(!down.handle(handler, new Event({ source: "s", eventId: "e", eventType: "t", body })).ok);
  assert.deepEqual(down.stateKeys(), []);
});

test("output, log, stale", () => {
  assert.deepEqual(new Harness().handle(handler, ev({ do: "output", bytes: 5 })), { ok: true, output: "xxxxx" });
  const hookd = new Harness();
  assert.deepEqual(hookd.handle(handler, ev({ do: "log", bytes: 3000 })), { ok: true, output: "logged" });
  assert.equal(hookd.logs().length, 3);
  assert.ok(hookd.logs().every((l) => l.message.length === 1024));
  assert.deepEqual(new Harness().handle(handler, ev({ do: "stale" }, 1, true)), { ok: true, output: '{"stale":true}' });
});
