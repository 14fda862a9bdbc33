"""Calling a handler author's code and turning what it did into hookd's terms; shared by the
component's export (`_export`) and `testing.Harness`, so a unit test sees what hookd would."""

import inspect
import re
import sys
import traceback

from . import output
from ._errors import HandleError, Permanent, utf8
from .http import HttpError


def resolve(module):
    """The handler a module defines, as a function of one `Event`: a class `Handler` with a
    `handle(self, ev)` method (one instance per call, as hookd runs every call in a fresh
    instance), else a function `handle(ev)`."""
    cls = getattr(module, "Handler", None)
    if cls is not None:
        if not callable(getattr(cls, "handle", None)):
            raise TypeError("%s.Handler has no handle(self, ev) method" % module.__name__)
        return lambda ev: cls().handle(ev)
    fn = getattr(module, "handle", None)
    if callable(fn):
        return fn
    raise TypeError(
        "%s defines neither a class Handler (with handle(self, ev)) nor a function handle(ev)"
        % module.__name__
    )


def handler_of(obj):
    """`resolve` for a module, a `Handler` class, or a function of one event."""
    if isinstance(obj, type):
        return lambda ev: obj().handle(ev)
    if hasattr(obj, "__name__") and type(obj).__name__ == "module":
        return resolve(obj)
    if callable(obj):
        return obj
    raise TypeError("not a handler: %r" % (obj,))


def as_output(value):
    """What `handle` returned, as the output hookd stores: a str as is, None as none, bytes
    as UTF-8 text, any other value as compact JSON. A coroutine (an `async def handle`) is
    refused for good, saying so: handlers run synchronously."""
    if inspect.iscoroutine(value):
        value.close()
        raise Permanent(
            "handle is a coroutine function (async def): hookd calls handlers synchronously, "
            "so define it with a plain def (hookd.http calls block until the response is read)"
        )
    if value is None:
        return value
    if isinstance(value, str):
        return utf8(value, "the output")
    if isinstance(value, (bytes, bytearray)):
        try:
            return bytes(value).decode("utf-8")
        except UnicodeDecodeError as e:
            raise Permanent("the output is not UTF-8 text: %s" % e) from None
    return utf8(output.json(value), "the output")


def run(handler, event):
    """Runs `handler` on `event`: returns its output, raises the `Retry` or `Permanent` it
    failed with (an uncaught `http.HttpError` becomes one, as the Rust SDK's `?` makes it);
    anything else it raised propagates (in hookd: a trap, see `crash_report`)."""
    try:
        return as_output(handler(event))
    except HandleError:
        raise
    except HttpError as e:
        raise e.to_handle_error() from e


def crash_report(exc, in_component=False):
    """An uncaught exception as the report hookd reads from a trapped call's stderr (the form
    of a Rust panic's, which it parses: `panicked at FILE:LINE:\\nMESSAGE`): where it was raised
    (the innermost frame) and the exception, then the frames that led there, innermost first."""
    frames = traceback.extract_tb(exc.__traceback__)
    # Leave out the SDK's own frames (the dispatch), keep the author's.
    frames = [f for f in frames if not _is_sdk(f.filename)] or frames
    where = "%s:%d" % (_short(frames[-1].filename), frames[-1].lineno) if frames else "<unknown>"
    what = "".join(traceback.format_exception_only(type(exc), exc)).strip()
    if in_component and isinstance(exc, ImportError):
        what += (
            " (a component imports at run time only what was imported while it was built: "
            "import the module at the top of yours)"
        )
    elif in_component and any(_is_stdlib_network(f.filename) for f in frames):
        what += (
            " (the standard library's networking, socket, urllib, http.client and what is "
            "built on them, has no sockets in a component: send requests with hookd.http)"
        )
    chain = " <- ".join(
        "%s (%s:%d)" % (f.name, _short(f.filename), f.lineno) for f in reversed(frames)
    )
    return "thread 'python' panicked at %s:\n%s | at %s\n" % (where, what, chain)


def _short(filename):
    # Inside a component, componentize-py names a module's file by the index of its search
    # path directory (`/1/score.py`): the path inside that directory is the useful part.
    return re.sub(r"\A/[0-9]+/", "", filename)


def _is_stdlib_network(filename):
    return re.search(r"/(socket|ssl|http/client|urllib/request)\.py\Z", filename) is not None


def _is_sdk(filename):
    return "/hookd/_dispatch.py" in filename or "/hookd/_export.py" in filename


def report_crash(exc, in_component=False):
    """Writes `crash_report(exc)` to stderr."""
    try:
        sys.stderr.write(crash_report(exc, in_component))
        sys.stderr.flush()
    except Exception:
        pass
