"""What hookd hands a handler: one `Event`."""

import json
import re

from ._errors import Permanent

# How deep a body's arrays and objects may nest, as in the Rust SDK (serde_json takes 127
# levels and refuses 128). The
# parser recurses per level, and in a component the 512 KiB wasm stack runs out (a trap,
# retried) some thousands of levels before CPython's own recursion guard would speak.
MAX_JSON_DEPTH = 127
# A string to its closing quote, or to the end (so an unclosed one is one match, not one
# attempt per quote after it).
# Unrolled (runs of plain bytes, then an escape): an alternation per byte keeps backtracking
# state for every byte of a long string, about 100 bytes of memory each.
_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*(?:"|\Z)', re.DOTALL)
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")


def _nesting_over(body, limit):
    """Whether `body`'s brackets (outside strings) nest deeper than `limit`."""
    depth = 0
    for b in _JSON_STRING.sub(b"", body).translate(None, _NOT_BRACKETS):
        if b in b"[{":
            depth += 1
            if depth > limit:
                return True
        else:
            depth -= 1
    return False


def _no_constant(name):
    raise ValueError("%s is not a JSON value (JSON has no NaN or infinities)" % name)


def _finite(text):
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise ValueError("number %s is out of range (a 64-bit float ends near 1.8e308)" % text[:40])
    return value


def _loads(data):
    """`json.loads`, refusing the `NaN`, `Infinity` and `-Infinity` Python would read, and a
    number past a 64-bit float's range, which Python would read as infinity (as serde_json
    does): a `ValueError` like any other invalid JSON."""
    return json.loads(data, parse_constant=_no_constant, parse_float=_finite)


class Header:
    """One HTTP header as received (names lower-case; a header sent twice appears twice)."""

    __slots__ = ("name", "value")

    def __init__(self, name, value):
        self.name = name
        self.value = value

    def __eq__(self, other):
        return (
            isinstance(other, Header)
            and other.name == self.name
            and other.value == self.value
        )

    def __repr__(self):
        return "Header(%r, %r)" % (self.name, self.value)


def _find_header(headers, name):
    name = name.lower()
    for h in headers:
        if h.name.lower() == name:
            return h.value
    return None


class Event:
    """One deduplicated, durably stored event, handed to a handler once per attempt.

    - `source`: the source it arrived on (the `{source}` of `POST /hooks/{source}`);
    - `event_id`, `event_type`: from the source's parser (or scheme);
    - `ordering_key`, `sequence`: from the parser, or None;
    - `attempt`: which attempt this is for this handler, from 1, across retries and replays;
    - `received_at_ms`: when hookd received it, in milliseconds since the Unix epoch;
    - `headers`: the request's headers (`Header`s, names lower-cased), `header(name)` reads one;
    - `body`: the raw request body (bytes); `text()` and `json()` decode it;
    - `stale`: a newer `sequence` of this ordering key was already handled (see the README's
      "Stale events": only with `on_stale = "deliver"` or a forced replay).

    A test builds one with `Event("orders", "evt_1", "order.paid", body=b'{"id": 7}')`;
    `body` may also be a str (UTF-8) or, for convenience, a dict or list (JSON).
    """

    __slots__ = (
        "source",
        "event_id",
        "event_type",
        "ordering_key",
        "sequence",
        "attempt",
        "received_at_ms",
        "headers",
        "body",
        "stale",
    )

    def __init__(
        self,
        source,
        event_id,
        event_type,
        body=b"",
        *,
        headers=(),
        ordering_key=None,
        sequence=None,
        attempt=1,
        received_at_ms=0,
        stale=False,
    ):
        if isinstance(body, str):
            body = body.encode("utf-8")
        elif isinstance(body, (dict, list)):
            body = json.dumps(body).encode("utf-8")
        self.source = source
        self.event_id = event_id
        self.event_type = event_type
        self.ordering_key = ordering_key
        self.sequence = sequence
        self.attempt = attempt
        self.received_at_ms = received_at_ms
        self.headers = [
            h if isinstance(h, Header) else Header(h[0].lower(), h[1]) for h in headers
        ]
        self.body = bytes(body)
        self.stale = stale

    def header(self, name):
        """The first value of header `name` (any case), or None."""
        return _find_header(self.headers, name)

    def text(self):
        """The body as UTF-8 text; not UTF-8 is a `Permanent` error (a retry reads the same
        bytes)."""
        try:
            return self.body.decode("utf-8")
        except UnicodeDecodeError as e:
            raise Permanent("body is not valid UTF-8: %s" % e) from None

    def json(self):
        """The body parsed as JSON; not JSON (`NaN` and `Infinity` are not), or nested deeper
        than `MAX_JSON_DEPTH`, is a `Permanent` error."""
        body = bytes(self.body)
        if _nesting_over(body, MAX_JSON_DEPTH):
            raise Permanent(
                "body is not valid JSON: it nests deeper than %d levels" % MAX_JSON_DEPTH
            )
        try:
            return _loads(body)
        except (ValueError, RecursionError) as e:
            raise Permanent("body is not valid JSON: %s" % e) from None

    def __repr__(self):
        return "Event(%r, %r, %r, attempt=%r, %d body bytes)" % (
            self.source,
            self.event_id,
            self.event_type,
            self.attempt,
            len(self.body),
        )
