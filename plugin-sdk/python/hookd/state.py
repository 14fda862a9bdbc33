"""Durable key-value state, private to the plugin instance.

Reads see committed state plus this attempt's own writes. Writes are buffered and committed
atomically with the delivery's success: an attempt that fails (a `Retry`, a `Permanent`, an
uncaught exception), traps or times out leaves no trace, so a read-modify-write here is safe to
retry. If another delivery changed a key this attempt read, hookd re-runs the attempt, so
concurrent updates are not lost.

Writes are bounded by the plugin instance's settings (`attempt_state_keys`,
`attempt_state_kib`, `state_max_keys`, `state_max_mib`); a write over a limit stops the
attempt at that call, and none of its writes are kept (see the README's "Plugin limits").
"""

import json

from . import _host
from ._errors import Permanent, utf8
from ._event import _loads


def get(key):
    """The bytes stored under `key`, or None."""
    value = _host.state_get(key)
    return None if value is None else bytes(value)


def set(key, value):
    """Stores `value` (bytes, or a str stored as UTF-8) under `key`; committed only if the
    attempt succeeds."""
    if isinstance(value, str):
        value = utf8(value, "the value of state key %s" % ascii(key)).encode("utf-8")
    elif not isinstance(value, (bytes, bytearray, memoryview)):
        raise TypeError(
            "state.set takes bytes or str, not %s (state.set_json stores any JSON value)"
            % type(value).__name__
        )
    _host.state_set(key, bytes(value))


def delete(key):
    """Removes `key`; committed only if the attempt succeeds."""
    _host.state_delete(key)


def get_json(key, default=None):
    """The JSON value stored under `key`, decoded, or `default` if there is none.

    A value that is not JSON (`NaN` and `Infinity` are not) is a `Permanent` error: a retry
    would read the same bytes.
    """
    value = _host.state_get(key)
    if value is None:
        return default
    try:
        return _loads(bytes(value))
    except ValueError as e:
        raise Permanent("state key `%s` does not hold valid JSON: %s" % (key, e)) from None


def set_json(key, value):
    """Stores `value` as (compact) JSON under `key`; a value JSON cannot encode is a
    `Permanent` error."""
    try:
        encoded = json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as e:
        raise Permanent("cannot encode state key `%s` as JSON: %s" % (key, e)) from None
    _host.state_set(key, utf8(encoded, "the JSON of state key %s" % ascii(key)).encode("utf-8"))
