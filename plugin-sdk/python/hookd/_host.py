"""Where the SDK's calls go: to hookd through the component's WIT imports or, in a unit test
on CPython, to the `testing.Harness` running the call.

This module and `_wasi_http` are the only code that touches the generated bindings
(`wit_world`, which componentize-py generates while it builds the component); no generated
type appears in the SDK's API.
"""

import sys

from ._errors import _escape_surrogates, utf8

try:  # Inside a component built by build.sh.
    from wit_world.imports import config as _config
    from wit_world.imports import log as _log
    from wit_world.imports import network as _network
    from wit_world.imports import state as _state

    _LEVELS = {
        "debug": _log.Level.DEBUG,
        "info": _log.Level.INFO,
        "warn": _log.Level.WARN,
        "error": _log.Level.ERROR,
    }
    IN_COMPONENT = True
except ImportError:  # CPython: unit tests.
    IN_COMPONENT = False

if IN_COMPONENT:
    from . import _wasi_http

# The `testing.Harness` whose `handle` is running, if any: it stands in for hookd.
harness = None


def _outside(what, key):
    raise RuntimeError(
        "hookd.%s(%r) needs the hookd host: in a component built by plugin-sdk/python/build.sh "
        "and run by hookd, or in a unit test during a hookd.testing.Harness call "
        "(Harness.handle), which stands in for it" % (what, key)
    )


def log(level, message):
    message = _escape_surrogates(message)
    if harness is not None:
        harness._log(level, message)
    elif IN_COMPONENT:
        _log.log(_LEVELS[level], message)
    else:
        print("[%s] %s" % (level.capitalize(), message), file=sys.stderr)


def config_get(key):
    key = utf8(key, "config key")
    if harness is not None:
        return harness._config_get(key)
    if IN_COMPONENT:
        return _config.get(key)
    _outside("config.get", key)


def state_get(key):
    key = utf8(key, "state key")
    if harness is not None:
        return harness._state_get(key)
    if IN_COMPONENT:
        return _state.get(key)
    _outside("state.get", key)


def state_set(key, value):
    key = utf8(key, "state key")
    if harness is not None:
        return harness._state_write(key, value)
    if IN_COMPONENT:
        return _state.set(key, value)
    _outside("state.set", key)


def state_delete(key):
    key = utf8(key, "state key")
    if harness is not None:
        return harness._state_write(key, None)
    if IN_COMPONENT:
        return _state.delete(key)
    _outside("state.delete", key)


def last_refusal():
    if IN_COMPONENT:
        return _network.last_refusal()
    return None


def send(method, url, headers, body, timeout_ms, body_limit=None):
    """Sends a request (`url` a parsed `http._Url`); returns an `http.Response` or raises an
    `http.HttpError`. `body_limit`: read at most that many bytes of the response's body."""
    if harness is not None:
        return harness._send(method, url, headers, body, body_limit)
    if IN_COMPONENT:
        return _wasi_http.send(method, url, headers, body, timeout_ms, body_limit)
    _outside("http.request", str(url))
