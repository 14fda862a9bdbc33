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

test("output, log, stale", () => {
  assert.deepEqual(new Harness().handle(handler, ev({ do: "output", bytes: 5 })), { ok: true, output: "xxxxx" });
  const hookd = new Harness();
  assert.deepEqual(hookd.handle(handler, ev({ do: "log", bytes: 3000 })), { ok: true, output: "logged" });
  assert.equal(hookd.logs().length, 3);
  assert.ok(hookd.logs().every((l) => l.message.length === 1024));
  assert.deepEqual(new Harness().handle(handler, ev({ do: "stale" }, 1, true)), { ok: true, output: '{"stale":true}' });
});
