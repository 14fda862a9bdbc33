"""The contract scenario plugin: one handler whose event body, `{"do": "<op>", ...}`, says
what to do, so a test can drive every path of the handler contract through one component.

| op                | with      | does                                                               |
|-------------------|-----------|--------------------------------------------------------------------|
| `count`           | `key`     | reads state `key` (JSON number, default 0), writes n+1, outputs `{"count":n+1}` |
| `fail`            | `until`   | attempt < until: retry `attempt <a> fails` after 1 ms; else outputs `{"attempt":a}` |
| `permanent`       |           | permanent error `asked to fail for good`                           |
| `write-then-fail` | `key`     | sets state `key` to `"written"`, then retry `wrote then failed`    |
| `fetch`           | `url`     | POSTs the event body to `url`; a 2xx outputs `{"status":s}`, else the SDK's error mapping |
| `copy`            | `key`, `copy`, `url` | stores the event body under `key`, stores `state.get(key)` under `copy`, POSTs the body to `url`; a 2xx outputs `{"status":s,"bytes":n}` (n: the bytes read back) |
| `peek`            | `url`, `bytes` | GETs `url` reading at most `bytes` of the body; outputs `{"status":s,"bytes":n}` |
| `spin`            |           | loops forever (hookd's timeout ends it)                            |
| `grow`            |           | allocates memory without bound (hookd's memory limit traps it)     |
| `output`          | `bytes`   | outputs that many `x`                                              |
| `log`             | `bytes`   | logs 1 KiB lines until that many bytes were logged, outputs `logged` |
| `stale`           |           | outputs `{"stale":<ev.stale>}`                                     |
| anything else     |           | permanent error `unknown op <op>`                                  |

JSON outputs are compact, as the Rust SDK's `output::json` writes them. Its Rust and
JavaScript twins implement the same table, and read arguments the same way: a missing or
mistyped number is 0, a missing or mistyped string is empty (so a body without a string `do`
is `unknown op `).
"""

from hookd import Permanent, Retry, http, log, state


def number(args, key):
    """`args[key]` if it is a whole number >= 0, else 0."""
    value = args.get(key)
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**64:
        return value
    return 0


def text(args, key):
    """`args[key]` if it is a string, else ""."""
    value = args.get(key)
    return value if isinstance(value, str) else ""


def count(ev, args):
    key = text(args, "key")
    n = state.get_json(key, 0) + 1
    state.set_json(key, n)
    return {"count": n}


def fail(ev, args):
    if ev.attempt < number(args, "until"):
        raise Retry("attempt %d fails" % ev.attempt, after_ms=1)
    return {"attempt": ev.attempt}


def permanent(ev, args):
    raise Permanent("asked to fail for good")


def write_then_fail(ev, args):
    state.set_json(text(args, "key"), "written")
    raise Retry("wrote then failed")


def fetch(ev, args):
    response = http.post(text(args, "url"), ev.body).error_for_status()
    return {"status": response.status}


def copy(ev, args):
    key = text(args, "key")
    state.set(key, ev.body)
    stored = state.get(key) or b""
    state.set(text(args, "copy"), stored)
    response = http.post(text(args, "url"), ev.body).error_for_status()
    return {"status": response.status, "bytes": len(stored)}


def peek(ev, args):
    response = http.get(text(args, "url"), response_body_limit=number(args, "bytes"))
    return {"status": response.status, "bytes": len(response.body)}


def spin(ev, args):
    while True:
        pass


def grow(ev, args):
    hoard = []
    while True:
        hoard.append(bytearray(1024 * 1024))


def output(ev, args):
    return "x" * number(args, "bytes")


def log_lines(ev, args):
    line = "l" * 1024
    logged = 0
    while logged < number(args, "bytes"):
        log.info(line)
        logged += len(line)
    return "logged"


def stale(ev, args):
    return {"stale": ev.stale}


OPS = {
    "count": count,
    "fail": fail,
    "permanent": permanent,
    "write-then-fail": write_then_fail,
    "fetch": fetch,
    "copy": copy,
    "peek": peek,
    "spin": spin,
    "grow": grow,
    "output": output,
    "log": log_lines,
    "stale": stale,
}


class Handler:
    def handle(self, ev):
        args = ev.json()  # not JSON: a permanent error
        if not isinstance(args, dict):
            args = {}
        op = text(args, "do")
        run = OPS.get(op)
        if run is None:
            raise Permanent("unknown op %s" % op)
        return run(ev, args)
