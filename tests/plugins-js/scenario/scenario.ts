// The contract-test handler: one operation per event, chosen by the JSON body's "do". Its
// twins in Rust and Python implement the same protocol, and one test runs it against all three,
// so hookd treats a handler the same whatever language it was written in.
//
// | do                | fields  | result                                                          |
// |-------------------|---------|-----------------------------------------------------------------|
// | `count`           | `key`   | state `key` (a JSON number, default 0) + 1, stored; `{"count": n}` |
// | `fail`            | `until` | attempt < until: retry "attempt <a> fails" after 1 ms; else `{"attempt": a}` |
// | `permanent`       |         | permanent "asked to fail for good"                              |
// | `write-then-fail` | `key`   | stores `"written"` (JSON) under `key`, then retry "wrote then failed" |
// | `fetch`           | `url`   | POSTs the event body to `url`; 2xx: `{"status": s}`; else the SDK's verdict |
// | `copy`            | `key`, `copy`, `url` | stores the body under `key`, stores `state.get(key)` under `copy`, `http.post(url, body)`; 2xx: `{"status": s, "bytes": n}` (n: the bytes read back) |
// | `peek`            | `url`, `bytes` | GETs `url` reading at most `bytes` of the body; `{"status": s, "bytes": n}` |
// | `spin`            |         | loops forever (the timeout stops it)                            |
// | `grow`            |         | allocates without bound (the memory limit stops it)             |
// | `output`          | `bytes` | outputs that many `x`                                           |
// | `log`             | `bytes` | logs 1 KiB lines until that many bytes were logged; outputs `logged` |
// | `stale`           |         | `{"stale": <event.stale>}`                                      |
// | anything else     |         | permanent "unknown op <op>"                                     |
//
// `fetch` maps failures as the SDK does (the Rust SDK's `?`): a refused host, TLS failure or
// a non-2xx other than 408/429/5xx is permanent; a transport error, timeout, 5xx, 408 or 429
// is a retry (429/503 honour Retry-After).
//
// Build: node plugin-sdk/js/build.mjs tests/plugins-js/scenario/scenario.ts scenario.wasm
import { HandleError, defineHandler, http, log, output, state } from "@hookd/plugin-sdk";

interface Op {
  do?: string;
  key?: string;
  copy?: string;
  until?: number;
  url?: string;
  bytes?: number;
}

export const handler = defineHandler((event) => {
  const op = event.json<Op>();
  switch (op.do) {
    case "count": {
      const key = field(op, "key", "string");
      const count = (state.getJson<number>(key) ?? 0) + 1;
      state.setJson(key, count);
      return output.json({ count });
    }
    case "fail": {
      const until = field(op, "until", "number");
      if (event.attempt < until) throw HandleError.retry(`attempt ${event.attempt} fails`, 1);
      return output.json({ attempt: event.attempt });
    }
    case "permanent":
      throw HandleError.permanent("asked to fail for good");
    case "write-then-fail":
      state.setJson(field(op, "key", "string"), "written");
      throw HandleError.retry("wrote then failed");
    case "fetch": {
      const response = http.post(field(op, "url", "string")).body(event.body).send().errorForStatus();
      return output.json({ status: response.status });
    }
    case "copy": {
      // The bytes the engine's bindings hand in (the body, a state value) are Uint8Arrays of
      // another realm: each call below once took them for an object (a TypeError, or JSON).
      const key = field(op, "key", "string");
      state.set(key, event.body);
      const stored = state.get(key)!;
      state.set(field(op, "copy", "string"), stored);
      const response = http.post(field(op, "url", "string"), event.body).send().errorForStatus();
      return output.json({ status: response.status, bytes: stored.length });
    }
    case "peek": {
      const response = http.get(field(op, "url", "string")).responseBodyLimit(field(op, "bytes", "number")).send();
      return output.json({ status: response.status, bytes: response.body.length });
    }
    case "spin":
      for (;;) {
        // The host's epoch deadline ends the attempt as a timeout.
      }
    case "grow": {
      const hoard: Uint8Array[] = [];
      for (;;) hoard.push(new Uint8Array(1 << 20).fill(hoard.length & 0xff));
    }
    case "output":
      return "x".repeat(field(op, "bytes", "number"));
    case "log": {
      const bytes = field(op, "bytes", "number");
      const line = "x".repeat(1024);
      for (let logged = 0; logged < bytes; logged += line.length) log.info(line);
      return "logged";
    }
    case "stale":
      return output.json({ stale: event.stale });
    default:
      throw HandleError.permanent(`unknown op ${op.do}`);
  }
});

function field<T extends "string" | "number">(op: Op, name: keyof Op, type: T): T extends "string" ? string : number {
  const value = op[name];
  if (typeof value !== type) {
    throw HandleError.permanent(`"${op.do}" needs "${name}" (a ${type})`);
  }
  return value as T extends "string" ? string : number;
}
