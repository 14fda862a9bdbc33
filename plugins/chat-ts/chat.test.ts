// The handler on Node, with the SDK's Harness standing in for hookd.
import assert from "node:assert/strict";
import { test } from "node:test";

import { Event, Harness, Response } from "@hookd/plugin-sdk/testing";

import { handler } from "./src/chat.ts";

const url = "https://slack.com/api/chat.postMessage";
const event = (body: unknown, id = "evt_1") =>
  new Event({ source: "github", eventId: id, eventType: "release.published", body: JSON.stringify(body) });

test("posts to the channel and counts per channel, committed on success", () => {
  const hookd = new Harness()
    .withConfig("url", url)
    .withConfig("channel", "#general")
    .respondWith("POST", url, new Response(200, '{"ok":true}'));
  assert.deepEqual(hookd.handle(handler, event({ text: "App crashes" })), {
    ok: true,
    output: '{"channel":"#general","count":1}',
  });
  assert.deepEqual(hookd.handle(handler, event({ channel: "C42" }, "evt_2")), {
    ok: true,
    output: '{"channel":"C42","count":1}',
  });
  assert.deepEqual(hookd.handle(handler, event({}, "evt_3")), { ok: true, output: '{"channel":"#general","count":2}' });
  const sent = hookd.requests()[0];
  assert.deepEqual(sent.json(), { channel: "#general", text: "release.published from github (evt_1), #1 here: App crashes" });
  // No token in the plugin: hookd adds the credential header after the request leaves it.
  assert.ok(!sent.headers.some(([name]) => name.toLowerCase() === "authorization"));
});

test("a plain-text 2xx is a success", () => {
  const hookd = new Harness().withConfig("url", url).withConfig("channel", "#general").respondWith("POST", url, new Response(200, "ok"));
  assert.deepEqual(hookd.handle(handler, event({})), { ok: true, output: '{"channel":"#general","count":1}' });
});

test("a refused post is permanent and a 503 a retry; neither counts", () => {
  const hookd = new Harness()
    .withConfig("url", url)
    .withConfig("channel", "#general")
    .respondWith("POST", url, new Response(200, '{"ok":false,"error":"channel_not_found"}'));
  const refused = hookd.handle(handler, event({}));
  assert.ok(!refused.ok && refused.error.kind === "permanent" && refused.error.reason.includes("channel_not_found"));
  hookd.respondTo("POST", url, 503);
  const busy = hookd.handle(handler, event({}));
  assert.ok(!busy.ok && busy.error.kind === "retry");
  assert.deepEqual(hookd.stateKeys(), []);
});

test("discord format sends content; no channel anywhere is permanent", () => {
  const hook = "https://discord.com/api/webhooks/1/abc";
  const hookd = new Harness()
    .withConfig("url", hook)
    .withConfig("format", "discord")
    .withConfig("channel", "alerts")
    .respondTo("POST", hook, 204);
  assert.deepEqual(hookd.handle(handler, event({})), { ok: true, output: '{"channel":"alerts","count":1}' });
  assert.deepEqual(Object.keys(hookd.requests()[0].json() as object), ["content"]);
  const none = new Harness().withConfig("url", url).handle(handler, event({}));
  assert.ok(!none.ok && none.error.kind === "permanent" && none.error.reason.startsWith("no channel"));
});
