"""Log lines, attributed by hookd to the plugin and to the event being handled.

hookd caps the bytes logged per call (`log_kib`, 64 KiB by default) and drops lines beyond
that, so log what a person needs to understand a failure, not every step. Outside hookd,
during a `testing.Harness` call the lines are captured (`Harness.logs`); else they go to
stderr.

(This module is not Python's `logging`: a handler's `print` and `logging` output goes to a
stderr that hookd discards.)
"""

from . import _host


def debug(message):
    """Logs at debug level: detail for whoever debugs the plugin."""
    _host.log("debug", str(message))


def info(message):
    """Logs at info level: normal operation."""
    _host.log("info", str(message))


def warn(message):
    """Logs at warn level: something unexpected that the plugin worked around."""
    _host.log("warn", str(message))


def error(message):
    """Logs at error level: a failure."""
    _host.log("error", str(message))
