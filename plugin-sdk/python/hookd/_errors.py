"""The ways a handler attempt can fail, as hookd understands them."""


class HandleError(Exception):
    """Why a handler attempt did not succeed: raise `Retry` or `Permanent`, not this."""

    def __init__(self, reason):
        # hookd takes UTF-8 text: a lone surrogate (from a `\\ud83d` JSON escape, or bytes
        # decoded with `surrogateescape`) is kept as its escape rather than crash the call.
        reason = _escape_surrogates(str(reason))
        super().__init__(reason)
        self.reason = reason


def _escape_surrogates(text):
    """`text` with each lone surrogate written as its escape (`\\ud83d`): UTF-8 as it is."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")


def utf8(text, what):
    """`text` (a str) as hookd takes it, or a `Permanent` error naming `what`: a str holding a
    lone surrogate is not UTF-8 text, and no retry changes that."""
    if not isinstance(text, str):
        raise TypeError("%s must be a str, not %s" % (what, type(text).__name__))
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        shown = ascii(text)
        if len(shown) > 200:
            shown = shown[:200] + "..."
        raise Permanent(
            "%s %s is not UTF-8 text: it holds a lone surrogate (U+%04X) at index %d"
            % (what, shown, ord(text[e.start]), e.start)
        ) from None
    return text


class Retry(HandleError):
    """A failure that may succeed later (a downstream service is down, a rate limit).

    The attempt is retried until the plugin's `max_attempts`, then the delivery is
    dead-lettered. `after_ms` asks for the next attempt no sooner than that (hookd keeps it
    within its own bounds); without it hookd uses exponential backoff with jitter.
    """

    def __init__(self, reason, after_ms=None):
        super().__init__(reason)
        if after_ms is not None:
            after_ms = int(after_ms)
            if after_ms < 0:
                raise ValueError("after_ms must not be negative")
            after_ms = min(after_ms, 2**64 - 1)
        self.after_ms = after_ms

    def __str__(self):
        if self.after_ms is None:
            return "retry: " + self.reason
        return "retry after %d ms: %s" % (self.after_ms, self.reason)

    def __repr__(self):
        return "Retry(%r, after_ms=%r)" % (self.reason, self.after_ms)

    def __eq__(self, other):
        return (
            type(other) is Retry
            and other.reason == self.reason
            and other.after_ms == self.after_ms
        )

    __hash__ = Exception.__hash__


class Permanent(HandleError):
    """A failure no retry can fix (the event is not one this handler understands, a bad
    config): the delivery is dead-lettered at once, and can be replayed once fixed."""

    def __str__(self):
        return "permanent failure: " + self.reason

    def __repr__(self):
        return "Permanent(%r)" % (self.reason,)

    def __eq__(self, other):
        return type(other) is Permanent and other.reason == self.reason

    __hash__ = Exception.__hash__
