// The handler on Node, with the SDK's Harness standing in for hookd.
import assert from "node:assert/strict";
import { test } from "node:test";

import { Event, Harness, Response } from "@hookd/plugin-sdk/testing";

import { handler } from "./src/chat.ts";

const url = "https://slack.com/api/chat.postMessage";
const event = (body: unknown, id = "evt_1") =>
  new Event({ source: "github", eventId: id, eventType: "release.published", body: JSON.stringify(body) });

test("posts to the event's channel, else the config's, and keeps no state", () => {
  const hookd = new Harness()
    .withConfig("url", url)
    .withConfig("channel", "#general")
    .respondWith("POST", url, new Response(200, '{"ok":true}'));
  assert.deepEqual(hookd.handle(handler, event({ text: "App crashes" })), {
    ok: true,
    output: '{"channel":"#general"}',
  });
  assert.deepEqual(hookd.handle(handler, event({ channel: "C42" }, "evt_2")), {
    ok: true,
    output: '{"channel":"C42"}',
  });
  const sent = hookd.requests()[0];
  assert.deepEqual(sent.json(), { channel: "#general", text: "release.published from github (evt_1): App crashes" });
  // No token in the plugin: hookd adds the credential header after the request leaves it.
  assert.ok(!sent.headers.some(([name]) => name.toLowerCase() === "authorization"));
  assert.deepEqual(hookd.stateKeys(), []);
});

test("a bot's own message, an edit or a deletion is passed over, not posted", () => {
  const hookd = new Harness().withConfig("url", url).respondWith("POST", url, new Response(200, '{"ok":true}'));
  for (const inner of [
    { channel: "C1", text: "release.published from github", bot_id: "B1" },
    { channel: "C1", subtype: "message_changed" },
  ]) {
    const done = hookd.handle(handler, event({ type: "event_callback", event: inner }));
    assert.ok(done.ok && done.output?.includes("skipped"), JSON.stringify(done));
  }
  assert.equal(hookd.requests().length, 0);
  // A person's message in that channel is posted, one sharing a file too.
  assert.ok(hookd.handle(handler, event({ event: { channel: "C1", text: "hi" } })).ok);
  assert.ok(hookd.handle(handler, event({ event: { channel: "C1", text: "see", subtype: "file_share" } })).ok);
  assert.equal(hookd.requests().length, 2);
});

test("mentions in an event's text are shown, not acted on, and a long text is cut", () => {
  const hookd = new Harness().withConfig("url", url).withConfig("channel", "#general").respondWith("POST", url, new Response(200, '{"ok":true}'));
  assert.ok(hookd.handle(handler, event({ text: "<!channel> & <@U1>" })).ok);
  assert.equal(
    (hookd.requests()[0].json() as { text: string }).text,
    "release.published from github (evt_1): &lt;!channel&gt; &amp; &lt;@U1&gt;",
  );
  // Cut once escaped, between two characters: never past the limit, never inside `&lt;`.
  assert.ok(hookd.handle(handler, event({ text: "<".repeat(3000) }, "evt_2")).ok);
  const long = (hookd.requests()[1].json() as { text: string }).text;
  assert.ok(Array.from(long).length <= 4000 && /&lt;…$/.test(long), long.slice(-20));
  const hook = "https://discord.com/api/webhooks/1/abc";
  const discord = new Harness().withConfig("url", hook).withConfig("format", "discord").withConfig("channel", "alerts").respondTo("POST", hook, 204);
  assert.ok(discord.handle(handler, event({ text: "@everyone " + "x".repeat(3000) })).ok);
  const sent = discord.requests()[0].json() as { content: string; allowed_mentions: unknown };
  assert.equal(Array.from(sent.content).length, 2000);
  assert.ok(sent.content.endsWith("…"));
  assert.deepEqual(sent.allowed_mentions, { parse: [] });
});

test("a plain-text 2xx is a success", () => {
  const hookd = new Harness().withConfig("url", url).withConfig("channel", "#general").respondWith("POST", url, new Response(200, "ok"));
  assert.deepEqual(hookd.handle(handler, event({})), { ok: true, output: '{"channel":"#general"}' });
});

test("Slack's own troubles are a retry", () => {
  const hookd = new Harness()
    .withConfig("url", url)
    .withConfig("channel", "#general")
    .respondWith("POST", url, new Response(200, '{"ok":false,"error":"service_unavailable"}'));
  const busy = hookd.handle(handler, event({}));
  assert.ok(!busy.ok && busy.error.kind === "retry", JSON.stringify(busy));
});

test("a refused post is permanent and a 503 a retry", () => {
  const hookd = new Harness()
    .withConfig("url", url)
    .withConfig("channel", "#general")
    .respondWith("POST", url, new Response(200, '{"ok":false,"error":"channel_not_found"}'));
  const refused = hookd.handle(handler, event({}));
  assert.ok(!refused.ok && refused.error.kind === "permanent" && refused.error.reason.includes("channel_not_found"));
  hookd.respondTo("POST", url, 503);
  const busy = hookd.handle(handler, event({}));
  assert.ok(!busy.ok && busy.error.kind === "retry");
});

test("discord format sends content; no channel anywhere is permanent", () => {
  const hook = "https://discord.com/api/webhooks/1/abc";
  const hookd = new Harness()
    .withConfig("url", hook)
    .withConfig("format", "discord")
    .withConfig("channel", "alerts")
    .respondTo("POST", hook, 204);
  assert.deepEqual(hookd.handle(handler, event({})), { ok: true, output: '{"channel":"alerts"}' });
  assert.deepEqual(Object.keys(hookd.requests()[0].json() as object), ["content", "allowed_mentions"]);
  const none = new Harness().withConfig("url", url).handle(handler, event({}));
  assert.ok(!none.ok && none.error.kind === "permanent" && none.error.reason.startsWith("no channel"));
});
