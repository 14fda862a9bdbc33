"""The component's export of `hookd:plugin/handler@0.3.0`, around a handler author's module.

build.sh generates the module componentize-py builds from, which is just

    import <the author's module> as app
    from hookd._export import handler_export
    Handler = handler_export(app)

componentize-py imports it while it builds (so the interpreter, the SDK and the author's module
are initialised once, in the component's snapshot, not at every call) and calls
`Handler().handle(ev)` for every attempt.
"""

import os

from componentize_py_types import Err
from wit_world import exports
from wit_world.imports import hookd_plugin_types as wit

from . import _dispatch
from ._errors import Permanent, Retry
from ._event import Event, Header


def _event(ev):
    return Event(
        ev.source,
        ev.event_id,
        ev.event_type,
        ev.body,
        headers=[Header(h.name, h.value) for h in ev.headers],
        ordering_key=ev.ordering_key,
        sequence=ev.sequence,
        attempt=ev.attempt,
        received_at_ms=ev.received_at_ms,
        stale=ev.stale,
    )


def handler_export(module):
    """The `Handler` class componentize-py exports, running `module`'s handler."""
    handler = _dispatch.resolve(module)

    class Handler(exports.Handler):
        def handle(self, ev):
            try:
                return _dispatch.run(handler, _event(ev))
            except Retry as e:
                raise Err(wit.HandleError_Retry(wit.RetryLater(e.reason, e.after_ms))) from None
            except Permanent as e:
                raise Err(wit.HandleError_Permanent(e.reason)) from None
            except BaseException as e:  # noqa: BLE001 - every other failure is a trap
                # As a Rust panic: the report goes to stderr, which hookd reads when the call
                # traps, and the call traps (outcome `trap`, retried with backoff).
                _dispatch.report_crash(e, in_component=True)
                os.abort()

    return Handler
