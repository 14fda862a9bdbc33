"""Write hookd webhook handlers in Python; build.sh turns one into a WebAssembly component.

A handler module defines a class `Handler` whose `handle(self, ev)` reacts to one `Event`
(or a plain function `handle(ev)`):

    from hookd import Event, Permanent, Retry, log, state

    class Handler:
        def handle(self, ev: Event):
            count = state.get_json("count", 0) + 1   # reads see committed state
            state.set_json("count", count)           # kept only if this attempt succeeds
            log.info(f"{ev.event_id} is event number {count}")
            return {"count": count}                  # the output, stored as JSON

`handle` returns the output hookd stores on the delivery: a str, None, or any other JSON value
(see `output`). It fails by raising `Retry(reason, after_ms=None)` (try again later, up to the
plugin's `max_attempts`) or `Permanent(reason)` (dead-letter now; a human can replay). An
uncaught `http.HttpError` is one of the two as the Rust SDK maps it; any other uncaught
exception is a trap, reported with its location and message (retried with backoff, as a Rust
panic is).

A fresh instance runs every call: nothing is kept in memory between calls. Durable data goes
through `state`, settings come from `config`, diagnostics go to `log`, and a handler granted
`allow_hosts` reaches other services with `http`. `testing.Harness` runs a handler in a unit
test on CPython, standing in for hookd.

The SDK mirrors the Rust `plugin-sdk` and builds against the same WIT, `hookd:plugin@0.3.0`
(`plugin-sdk/wit/`).
"""

from . import config, http, log, output, state
from ._errors import HandleError, Permanent, Retry
from ._event import Event, Header

#: The WIT package version components built with this SDK export.
WIT_VERSION = "0.3.0"

__all__ = [
    "Event",
    "HandleError",
    "Header",
    "Permanent",
    "Retry",
    "WIT_VERSION",
    "config",
    "http",
    "log",
    "output",
    "state",
]
