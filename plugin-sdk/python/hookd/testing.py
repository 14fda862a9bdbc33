"""`Harness`: runs a handler in a unit test on CPython, standing in for hookd.

    import unittest
    from hookd import Event, Retry
    from hookd.testing import Harness

    import notify  # the handler module under test

    class NotifyTest(unittest.TestCase):
        def test_a_503_is_a_retry_that_leaves_no_trace(self):
            url = "https://hooks.example.com/in"
            hookd = (Harness()
                     .with_config("notify_url", url)
                     .with_state_json("sent", 41)
                     .respond_to("POST", url, 503))
            event = Event("orders", "evt_1", "order.paid", {"id": 7}, attempt=2)
            with self.assertRaises(Retry):
                hookd.handle(notify, event)
            self.assertEqual(hookd.state_json("sent"), 41)

It keeps hookd's rules:

- State: reads see committed state plus the call's own writes; the writes are committed only
  when `handle` returns (a `Retry`, a `Permanent` or any other exception leaves no trace).
  `with_state`/`with_state_json` commit a starting value; `state`, `state_json`, `state_keys`
  read what is committed.
- Config: `with_config(key, value)`, as `config = { … }` in the plugin's table.
- Logs: every line as `(level, message)` in `logs()`, failed calls' lines too.
- HTTP: `respond_to(method, url, status)`, `respond_with(method, url, http.Response(…))` and
  `fail_with(method, url, http.Timeout("…"))` answer every request to that method and URL (the
  latest stub wins); any other URL is refused with `http.Denied`, as hookd refuses a host
  missing from `allow_hosts` (naming its `host:port` and the URL cut to its scheme and host),
  and so is a stubbed request once the call has sent 64 (`MAX_REQUESTS`); as in hookd, a
  refused request does not count toward those 64. A header hookd refuses raises
  `http.InvalidRequest` before anything is sent, as in hookd; a stubbed body over `http.MAX_RESPONSE_BYTES` raises
  `http.TooLarge` unless the request asked for a `response_body_limit`. `requests()` lists what was
  sent (`method`, `url`, `headers`, `body`; hookd's `Idempotency-Key` and credentials are added
  after the plugin, so not there).

`handle(handler, event)` takes the handler's module, its `Handler` class or a function of one
event, and returns the output hookd would store, or raises the `Retry`/`Permanent` hookd would
record (an uncaught `http.HttpError` becomes one, as in hookd); any other exception propagates
(in hookd: a trap). A state call hookd refuses (an empty key to `state.set`, a key holding a
NUL character or over `MAX_KEY_BYTES` of UTF-8, a value over `MAX_VALUE_BYTES`) raises
`StateRefused` there, and `handle` raises it even if the handler caught it: hookd stops the
attempt at that call (`permanent`, error kind `state_limit`). It does not model hookd's per-call caps, time and memory limits or the re-run
of an attempt whose keys another delivery changed: the built component meets those in hookd.
"""

import json

from . import _dispatch, _host
from .http import MAX_RESPONSE_BYTES, Denied, HttpError, Response, _too_large, _Url

#: Requests one call may send before hookd refuses the rest.
MAX_REQUESTS = 64

#: The longest state key hookd stores, in UTF-8 bytes.
MAX_KEY_BYTES = 1024

#: The largest value hookd stores under one state key, in bytes.
MAX_VALUE_BYTES = 1024 * 1024


class StateRefused(Exception):
    """A state call hookd refuses: in hookd it stops the attempt there, recorded `permanent`
    with error kind `state_limit`, and none of the attempt's writes are kept."""


def _refusal(key, value=None, setting=False):
    """Why hookd refuses a state call on `key` (with `value`, for a set), or None."""
    if "\0" in key:
        return "state key %r holds a NUL character (U+0000), which hookd's databases do not store" % key
    size = len(key.encode("utf-8"))
    if size > MAX_KEY_BYTES:
        return "state key of %d bytes exceeds the %d-byte cap on a key" % (size, MAX_KEY_BYTES)
    if setting and key == "":
        return (
            'state key "" is empty: a key an operator could not name in the admin API, so hookd '
            "does not store one"
        )
    if value is not None and len(value) > MAX_VALUE_BYTES:
        return "state value of %d bytes for key %r exceeds the %d-byte cap on a value" % (
            len(value),
            key,
            MAX_VALUE_BYTES,
        )
    return None


class SentRequest:
    """One request a handler sent during a `Harness` call."""

    __slots__ = ("method", "url", "headers", "body")

    def __init__(self, method, url, headers, body):
        self.method = method
        self.url = url
        self.headers = headers
        self.body = body

    def header(self, name):
        name = name.lower()
        for n, v in self.headers:
            if n.lower() == name:
                return v
        return None

    def text(self):
        return self.body.decode("utf-8")

    def json(self):
        return json.loads(self.body)

    def __repr__(self):
        return "SentRequest(%r, %r, %d body bytes)" % (self.method, self.url, len(self.body))


class Harness:
    """Stands in for hookd while a handler runs in a unit test (see the module docs)."""

    def __init__(self):
        self._config = {}
        self._committed = {}
        self._pending = None
        self._logs = []
        self._stubs = {}
        self._requests = []
        self._sent_this_call = 0
        self._refused = None

    # -- set-up -------------------------------------------------------------------------------

    def with_config(self, key, value):
        """Sets config `key` (a str), as `config = { key = "value" }` does."""
        self._config[key] = str(value)
        return self

    def with_state(self, key, value):
        """Commits `value` (bytes or str) under state `key`."""
        self._committed[key] = value.encode("utf-8") if isinstance(value, str) else bytes(value)
        return self

    def with_state_json(self, key, value):
        """Commits `value` as JSON under state `key`."""
        self._committed[key] = json.dumps(value, separators=(",", ":")).encode("utf-8")
        return self

    def respond_to(self, method, url, status):
        """Answers every `method` request to `url` with `status` and an empty body."""
        return self.respond_with(method, url, Response(status))

    def respond_with(self, method, url, response):
        """Answers every `method` request to `url` with `response` (an `http.Response`)."""
        self._stubs[(method.upper(), str(_Url(url)))] = response
        return self

    def fail_with(self, method, url, error):
        """Fails every `method` request to `url` with `error` (an `http.HttpError`)."""
        if not isinstance(error, HttpError):
            raise TypeError("fail_with takes an http.HttpError, such as http.Timeout('…')")
        self._stubs[(method.upper(), str(_Url(url)))] = error
        return self

    # -- running ------------------------------------------------------------------------------

    def handle(self, handler, event):
        """Runs `handler` (a module, a `Handler` class or a function) on `event`, as hookd runs
        one attempt; see the module docs."""
        if _host.harness is not None:
            raise RuntimeError("a Harness call is already running (calls do not nest)")
        fn = _dispatch.handler_of(handler)
        self._pending = {}
        self._sent_this_call = 0
        self._refused = None
        _host.harness = self
        try:
            output = _dispatch.run(fn, event)
        except BaseException as e:
            self._pending = None
            if self._refused is not None and not isinstance(e, StateRefused):
                raise StateRefused(self._refused) from e
            raise
        finally:
            _host.harness = None
        if self._refused is not None:
            # The handler caught it and went on; hookd had stopped the attempt there.
            self._pending = None
            raise StateRefused(self._refused)
        for key, value in self._pending.items():
            if value is None:
                self._committed.pop(key, None)
            else:
                self._committed[key] = value
        self._pending = None
        return output

    # -- what happened ------------------------------------------------------------------------

    def state(self, key):
        """The committed bytes under `key`, or None."""
        return self._committed.get(key)

    def state_json(self, key):
        """The committed value under `key`, decoded from JSON, or None."""
        value = self._committed.get(key)
        return None if value is None else json.loads(value)

    def state_keys(self):
        """The committed keys, sorted."""
        return sorted(self._committed)

    def logs(self):
        """Every line logged, as `(level, message)`, levels `debug`/`info`/`warn`/`error`."""
        return list(self._logs)

    def requests(self):
        """Every request sent (`SentRequest`s), in order."""
        return list(self._requests)

    # -- what the SDK calls during `handle` ---------------------------------------------------

    def _log(self, level, message):
        self._logs.append((level, message))

    def _config_get(self, key):
        return self._config.get(key)

    def _refuse(self, why):
        if why is not None:
            if self._refused is None:
                self._refused = why
            raise StateRefused(why)

    def _state_get(self, key):
        self._refuse(_refusal(key))
        if key in self._pending:
            return self._pending[key]
        return self._committed.get(key)

    def _state_write(self, key, value):
        self._refuse(_refusal(key, value, setting=value is not None))
        self._pending[key] = value

    def _send(self, method, url, headers, body, body_limit=None):
        # hookd's order: a target not allowed (here: no stub) is refused without using up the
        # call's share; an allowed one past the cap is refused; else it counts and is sent.
        text = str(url)
        stub = self._stubs.get((method, text))
        if stub is None:
            self._requests.append(SentRequest(method, text, list(headers), body))
            # Not the URL itself: its path or query may hold a secret, and this reaches logs.
            raise Denied(
                "hookd refused the request to %s: %s is not in allow_hosts (no stub for %s %s)"
                % (url.authority, url.host_port(), method, url.redacted())
            )
        if self._sent_this_call >= MAX_REQUESTS:
            raise Denied(
                "hookd refused the request to %s: more than %d requests in one attempt"
                % (url.authority, MAX_REQUESTS)
            )
        self._sent_this_call += 1
        self._requests.append(SentRequest(method, text, list(headers), body))
        if isinstance(stub, HttpError):
            raise stub
        if body_limit is not None:
            # As hookd's client: the first bytes, the rest dropped, whatever the length.
            return Response(stub.status, stub.body[:body_limit], stub.headers)
        if len(stub.body) > MAX_RESPONSE_BYTES:
            raise _too_large(url.authority)
        return Response(stub.status, stub.body, stub.headers)
