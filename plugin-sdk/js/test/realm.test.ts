// Bytes from another realm. In a component, the Uint8Arrays the engine's WIT bindings hand in
// (an event's body, a state value) belong to another realm: `x instanceof Uint8Array` is false
// for them, though `Object.prototype.toString` says `[object Uint8Array]`. `vm.runInNewContext`
// makes exactly such values on Node. Every SDK call that takes bytes must take them, and every
// bytes value the SDK hands a handler must be an ordinary Uint8Array of the handler's realm.
import assert from "node:assert/strict";
import { test } from "node:test";
import { runInNewContext } from "node:vm";

import { defineHandler, http, state } from "@hookd/plugin-sdk";
import { Event, Harness, HttpError, Response } from "@hookd/plugin-sdk/testing";

/** `text`'s UTF-8 bytes, in a Uint8Array of a new realm. */
const foreign = (text: string): Uint8Array =>
  runInNewContext(`new Uint8Array(${JSON.stringify([...new TextEncoder().encode(text)])})`) as Uint8Array;

const local = (text: string) => new TextEncoder().encode(text);

/** Whether `v` is a Uint8Array of this realm holding exactly `bytes`. */
function sameBytes(v: unknown, bytes: Uint8Array): boolean {
  return v instanceof Uint8Array && v.length === bytes.length && v.every((b, i) => b === bytes[i]);
}

const url = "http://127.0.0.1:9000/in";
const event = new Event({ source: "s", eventId: "e1", eventType: "t", body: "{}" });

test("a Uint8Array of another realm is what hookd hands a handler (the premise)", () => {
  const b = foreign("x");
  assert.equal(b instanceof Uint8Array, false);
  assert.equal(Object.prototype.toString.call(b), "[object Uint8Array]");
  assert.equal(b.constructor.name, "Uint8Array");
});

test("http sends bytes of another realm as they are, never as JSON", () => {
  const body = foreign('{"a":1}');
  const h = defineHandler(() => {
    http.post(url, body).send();
    http.post(url).body(body).send();
    http.request("PUT", url).body(body).send();
    return undefined;
  });
  const hookd = new Harness().respondTo("POST", url, 200).respondTo("PUT", url, 200);
  assert.deepEqual(hookd.handle(h, event), { ok: true, output: undefined });
  const sent = hookd.requests();
  assert.equal(sent.length, 3);
  for (const r of sent) {
    assert.ok(sameBytes(r.body, local('{"a":1}')), `${r.method}: ${r.text()}`);
    assert.deepEqual(r.headers, [], "no content-type: the bytes are not JSON-encoded");
  }
});

test("state.set takes bytes of another realm; state.get gives bytes of this one", () => {
  const h = defineHandler(() => {
    state.set("b", foreign("\x00\xff bytes"));
    const got = state.get("b");
    assert.ok(got instanceof Uint8Array);
    state.set("copy", got);
    return undefined;
  });
  const hookd = new Harness();
  assert.deepEqual(hookd.handle(h, event), { ok: true, output: undefined });
  assert.ok(sameBytes(hookd.state("b"), local("\x00\xff bytes")));
  assert.ok(sameBytes(hookd.state("copy"), local("\x00\xff bytes")));
});

test("an event body of another realm: stored, copied and posted byte for byte", () => {
  const body = '{"do":"copy","é":"\\u00e9"}';
  const h = defineHandler((e) => {
    assert.ok(e.body instanceof Uint8Array, "event.body is a Uint8Array of the handler's realm");
    state.set("k", e.body);
    state.set("k2", state.get("k")!);
    http.post(url, e.body).send().errorForStatus();
    return e.text();
  });
  const hookd = new Harness().respondTo("POST", url, 204);
  const r = hookd.handle(h, new Event({ source: "s", eventId: "e2", eventType: "t", body: foreign(body) }));
  assert.deepEqual(r, { ok: true, output: body });
  assert.ok(sameBytes(hookd.state("k"), local(body)));
  assert.ok(sameBytes(hookd.state("k2"), local(body)));
  assert.ok(sameBytes(hookd.requests()[0].body, local(body)));
  assert.deepEqual(hookd.requests()[0].headers, []);
});

test("the harness hands the handler bytes of another realm, as hookd does", () => {
  // A raw export (no defineHandler) sees what the WIT bindings give: in hookd, and now in the
  // harness, an event body and state values of another realm.
  const seen: string[] = [];
  const raw = {
    handle(ev: { body: Uint8Array }) {
      seen.push(`body ${ev.body instanceof Uint8Array} ${Object.prototype.toString.call(ev.body)}`);
      return undefined;
    },
  };
  new Harness().handle(raw, event);
  assert.deepEqual(seen, ["body false [object Uint8Array]"]);
  // Through the SDK, they are this realm's: a handler's own `instanceof` (or a library's) holds.
  const h = defineHandler((e) => {
    const v = state.get("k");
    return `${e.body instanceof Uint8Array} ${v instanceof Uint8Array}`;
  });
  assert.deepEqual(new Harness().withState("k", "v").handle(h, event), { ok: true, output: "true true" });
});

test("an Event, a Response and a Harness's state take bytes of another realm", () => {
  assert.ok(sameBytes(new Event({ source: "s", eventId: "e", eventType: "t", body: foreign("ab") }).body, local("ab")));
  assert.ok(sameBytes(new Response(200, foreign("ab")).body, local("ab")));
  const h = defineHandler(() => state.getText("k"));
  assert.deepEqual(new Harness().withState("k", foreign("ab")).handle(h, event), { ok: true, output: "ab" });
});

test("an event body of another realm is made this realm's without a copy", () => {
  // A body may be much of the plugin's memory: holding it twice could exhaust it.
  const body = foreign("a large body");
  const e = new Event({ source: "s", eventId: "e", eventType: "t", body });
  assert.equal(e.body, body);
  assert.ok(sameBytes(e.body, local("a large body")));
  assert.equal(e.body.subarray(2, 7) instanceof Uint8Array, true);
});

test("other binary values are refused by name, not sent as JSON", () => {
  const cases: Array<[unknown, string]> = [
    [new Uint16Array([1]), "Uint16Array"],
    [new ArrayBuffer(2), "ArrayBuffer"],
    [runInNewContext("new ArrayBuffer(2)"), "ArrayBuffer"],
    [new DataView(new ArrayBuffer(2)), "DataView"],
  ];
  for (const [value, name] of cases) {
    assert.throws(
      () => http.post(url, value).send(),
      (e) => e instanceof HttpError && e.kind === "invalid-request" && e.message.includes(`not ${name}`),
      name,
    );
    assert.throws(
      () => http.post(url).body(value as Uint8Array).send(),
      (e) => e instanceof HttpError && e.kind === "invalid-request" && e.message.includes(`not ${name}`),
      name,
    );
    assert.throws(() => state.set("k", value as Uint8Array), new RegExp(`state.set takes a Uint8Array or a string, not ${name}`));
  }
  assert.throws(
    () => http.post(url).body(5 as unknown as string).send(),
    (e) => e instanceof HttpError && e.kind === "invalid-request" && e.message.includes("not number"),
  );
});

test("an error of another realm is still reported with its message and location", () => {
  const h = defineHandler(() => {
    throw runInNewContext('new TypeError("boom")');
  });
  const original = console.error;
  console.error = () => {};
  try {
    assert.throws(() => new Harness().handle(h, event), /the handler trapped: panicked at \S+:\d+:\d+: TypeError: boom/);
  } finally {
    console.error = original;
  }
});
