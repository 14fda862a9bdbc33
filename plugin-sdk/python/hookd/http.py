"""Outbound HTTP from a handler, over the standard `wasi:http/outgoing-handler` interface.

    from hookd import config, http

    class Handler:
        def handle(self, ev):
            url = config.require("notify_url")
            response = http.post(url, json={"event": ev.event_id}).error_for_status()
            return {"status": response.status}

`get(url)`, `post(url, body)` and `request(method, url, body)` send a request and block until
the whole response is read (at most `MAX_RESPONSE_BYTES`). Any status, 3xx to 5xx included,
is a `Response`; `Response.error_for_status()` raises `Status` for a non-2xx. What cannot be
sent or read raises an `HttpError` subclass.

An `HttpError` the handler does not catch fails the attempt the way the Rust SDK's `?` does:
transport failures, timeouts, an unreadable body and the statuses 5xx, 408 and 429 are a
`Retry` (honouring the server's `Retry-After`, seconds or an HTTP-date); a refused host
(`Denied`, with hookd's reason), a failed TLS handshake, an invalid or unsupported request,
another non-2xx status and an oversized response are `Permanent`. `err.to_handle_error()`
gives that mapping to a handler that catches the error to add context.

What hookd enforces on every request (only the plugin's `allow_hosts`, no internal addresses,
TLS verification, the `Idempotency-Key` header, 64 requests per attempt, an 8 MiB response
cap, no redirects followed) is the README's "Outbound HTTP" and the Rust SDK's `http` module
documentation. In a unit test, `testing.Harness` answers requests from its stubs.
"""

import calendar
import json as _json
import re
import time

from . import _host
from ._errors import Permanent, Retry
from ._event import Header, _find_header, _loads

#: The most response body bytes the client reads (hookd enforces the same cap).
MAX_RESPONSE_BYTES = 8 * 1024 * 1024

#: The methods this client sends.
METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")


class HttpError(Exception):
    """Why a request produced no usable response; see the subclasses."""

    #: The prefix of `str(err)`, as the Rust SDK's `HttpError` displays.
    label = "HTTP error"
    #: Whether a later attempt may meet a different outcome.
    retryable = False

    def __init__(self, message):
        super().__init__(message)
        self.message = message

    def __str__(self):
        return "%s: %s" % (self.label, self.message)

    def __eq__(self, other):
        return type(other) is type(self) and other.message == self.message

    __hash__ = Exception.__hash__

    def to_handle_error(self):
        """The `Retry` or `Permanent` this error is when a handler does not catch it."""
        if self.retryable:
            return Retry(str(self))
        return Permanent(str(self))


class InvalidRequest(HttpError):
    """The request cannot be sent as built: a malformed URL, a header hookd refuses, a body
    that does not serialise. Permanent."""

    label = "invalid request"


class Unsupported(HttpError):
    """Something hookd's client does not do. Permanent."""

    label = "unsupported"


class Tls(HttpError):
    """The TLS handshake failed: the certificate is untrusted, for another name or expired,
    the server sent an alert, or the protocol failed. Permanent."""

    label = "TLS"


class Denied(HttpError):
    """hookd refused to send it; the message is hookd's reason (`localhost:9100 is not in
    allow_hosts`). Permanent: fix `allow_hosts` or the URL, then replay."""

    label = "denied"


class Timeout(HttpError):
    """Connecting, the response head or the body took too long. A retry."""

    label = "timed out"
    retryable = True


class TooLarge(HttpError):
    """The response body exceeds `MAX_RESPONSE_BYTES`. Permanent."""

    label = "response too large"


class Transport(HttpError):
    """DNS, connection or protocol failure. A retry."""

    label = "transport error"
    retryable = True


class Body(HttpError):
    """The response body could not be read or decoded. A retry."""

    label = "bad response body"
    retryable = True


class Status(HttpError):
    """A non-2xx status, from `Response.error_for_status()`: a retry for 5xx, 408 and 429
    (no sooner than `retry_after_ms`, the server's `Retry-After`), else permanent."""

    def __init__(self, status, retry_after_ms=None, body=""):
        super().__init__("status %d: %s" % (status, body))
        self.status = status
        self.retry_after_ms = retry_after_ms
        self.body = body

    def __str__(self):
        return self.message

    def __eq__(self, other):
        return (
            type(other) is Status
            and (other.status, other.retry_after_ms, other.body)
            == (self.status, self.retry_after_ms, self.body)
        )

    __hash__ = Exception.__hash__

    @property
    def retryable(self):
        return self.status >= 500 or self.status in (408, 429)

    def to_handle_error(self):
        if self.retryable:
            return Retry(str(self), self.retry_after_ms)
        return Permanent(str(self))


class Response:
    """A response, read in full: `status`, `headers` (`Header`s, names lower-cased, in the
    order received) and `body` (bytes)."""

    __slots__ = ("status", "headers", "body")

    def __init__(self, status, body=b"", headers=()):
        if isinstance(body, str):
            body = body.encode("utf-8")
        self.status = status
        self.body = bytes(body)
        self.headers = [
            h if isinstance(h, Header) else Header(h[0].lower(), h[1]) for h in headers
        ]

    def with_header(self, name, value):
        """Adds a header (the name lower-cased, as received headers are); returns self."""
        self.headers.append(Header(name.lower(), value))
        return self

    def is_success(self):
        """Whether the status is 2xx."""
        return 200 <= self.status < 300

    def header(self, name):
        """The first value of header `name` (any case), or None."""
        return _find_header(self.headers, name)

    def text(self):
        """The body as UTF-8 text (else `Body`)."""
        try:
            return self.body.decode("utf-8")
        except UnicodeDecodeError as e:
            raise Body("the response body is not UTF-8: %s" % e) from None

    def json(self):
        """The body parsed as JSON (else `Body`; `NaN` and `Infinity` are not JSON, as for the
        Rust and TypeScript SDKs)."""
        try:
            return _loads(self.body)
        except (ValueError, RecursionError) as e:
            raise Body("the response body is not the JSON expected: %s" % e) from None

    def error_for_status(self):
        """Returns self for a 2xx, else raises `Status` (with the server's `Retry-After`, if
        it sent one, and the start of the body)."""
        if self.is_success():
            return self
        retry_after = self.header("retry-after")
        retry_after_ms = None
        if retry_after is not None:
            retry_after_ms = parse_retry_after(retry_after, time.time())
        body = self.body.decode("utf-8", "replace")
        if len(body.encode("utf-8")) > 512:
            body = body.encode("utf-8")[:512].decode("utf-8", "ignore") + "…"
        raise Status(self.status, retry_after_ms, body)

    def __repr__(self):
        return "Response(%d, %d body bytes)" % (self.status, len(self.body))


_MONTHS = {
    m: i + 1
    for i, m in enumerate(
        ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"]
    )
}
_DAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
_DAY_NAMES = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
_IMF_FIXDATE = re.compile(
    r"(\w{3}), (\d{2}) (\w{3}) (\d{4}) (\d{2}):(\d{2}):(\d{2}) GMT\Z", re.ASCII
)
_RFC850 = re.compile(
    r"(\w{6,9}), (\d{2})-(\w{3})-(\d{2}) (\d{2}):(\d{2}):(\d{2}) GMT\Z", re.ASCII
)
_ASCTIME = re.compile(
    r"(\w{3}) (\w{3}) ([ \d]\d) (\d{2}):(\d{2}):(\d{2}) (\d{4})\Z", re.ASCII
)
_SECONDS = re.compile(r"\+?[0-9]+\Z", re.ASCII)


def _http_date(value):
    """Seconds since the epoch of an HTTP-date (RFC 9110 §5.6.7, its three forms), or None."""
    m = _IMF_FIXDATE.match(value)
    if m and m.group(1) in _DAYS:
        day, mon, year, hh, mm, ss = m.group(2, 3, 4, 5, 6, 7)
    else:
        m = _RFC850.match(value)
        if m and m.group(1) in _DAY_NAMES:
            day, mon, yy, hh, mm, ss = m.group(2, 3, 4, 5, 6, 7)
            # Two-digit years: 70-99 are 19xx (as httpdate reads them).
            year = ("19" if int(yy) >= 70 else "20") + yy
        else:
            m = _ASCTIME.match(value)
            if not (m and m.group(1) in _DAYS):
                return None
            mon, day, hh, mm, ss, year = m.group(2, 3, 4, 5, 6, 7)
    if mon not in _MONTHS:
        return None
    try:
        fields = (int(year), _MONTHS[mon], int(day), int(hh), int(mm), int(ss))
    except ValueError:
        return None
    if not (1 <= fields[2] <= 31 and fields[3] < 24 and fields[4] < 60 and fields[5] < 61):
        return None
    return calendar.timegm(fields + (0, 0, 0))


def parse_retry_after(value, now):
    """A `Retry-After` value (RFC 9110 §10.2.3) in milliseconds: delay-seconds, or an
    HTTP-date read as the time left from `now` (seconds since the epoch; 0 if it has passed).
    Anything else is None, as if absent."""
    value = value.strip()
    if _SECONDS.match(value):
        seconds = int(value)
        return seconds * 1000 if seconds < 2**64 else None
    at = _http_date(value)
    if at is None:
        return None
    return max(0, int((at - now) * 1000))


def _shown(url):
    """`url` as an error message may show it: the scheme and the host, with any user
    information and everything after the host cut to `…`. A webhook URL often carries its
    secret in the path or the query, and error messages reach the log, the admin API and the
    dashboard."""
    scheme, sep, rest = url.partition("://")
    shown = scheme + sep if sep else ""
    if not sep:
        rest = url
    end = min([i for i in (rest.find(c) for c in "/?#") if i != -1] or [len(rest)])
    authority = rest[:end]
    at = authority.rfind("@")
    if at != -1:
        shown += "…@"
        authority = authority[at + 1 :]
    return shown + authority + ("/…" if end < len(rest) else "")


class _Url:
    """An `http://` or `https://` URL split the way `wasi:http` wants it."""

    __slots__ = ("https", "authority", "path_with_query")

    def __init__(self, url):
        def invalid(why):
            shown = _json.dumps(_shown(url), ensure_ascii=False)
            return InvalidRequest("URL %s: %s" % (shown, why))

        scheme, sep, rest = url.partition("://")
        if not sep:
            raise invalid("expected http(s)://host[:port]/path")
        if scheme.lower() not in ("http", "https"):
            raise invalid("only http:// and https:// URLs are supported")
        self.https = scheme.lower() == "https"
        rest = rest.split("#", 1)[0]
        end = len(rest)
        for sep in "/?":
            i = rest.find(sep)
            if i != -1:
                end = min(end, i)
        authority, path = rest[:end], rest[end:]
        if not authority:
            raise invalid("no host")
        if "@" in authority:
            raise invalid("credentials in the URL are not supported; send them in a header")
        if any(c.isspace() or ord(c) < 32 or ord(c) == 127 for c in authority):
            raise invalid("the host contains whitespace")
        if path == "":
            path = "/"
        elif path.startswith("?"):
            path = "/" + path
        self.authority = authority
        self.path_with_query = path

    def host_port(self):
        """`host:port` as hookd's allow-list names the target (`api.test:443`): the host
        lower-cased, the port the scheme's default when the URL gives none."""
        authority = self.authority
        bracket = authority.rfind("]")
        colon = authority.rfind(":")
        if colon > bracket:
            host, port = authority[:colon], authority[colon + 1 :]
        else:
            host, port = authority, "443" if self.https else "80"
        return "%s:%s" % (host.lower(), port)

    def redacted(self):
        """This URL as an error message may show it: see `_shown`."""
        return "%s://%s%s" % (
            "https" if self.https else "http",
            self.authority,
            "/" if self.path_with_query == "/" else "/…",
        )

    def __str__(self):
        return "%s://%s%s" % (
            "https" if self.https else "http",
            self.authority,
            self.path_with_query,
        )


def _too_large(authority):
    """The `TooLarge` for a response body over `MAX_RESPONSE_BYTES` with no limit asked (the
    client's words, and the harness's)."""
    return TooLarge("%s sent more than %d bytes" % (authority, MAX_RESPONSE_BYTES))


# RFC 9110 §5.6.2: a field name is a token, one or more tchar.
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+\Z", re.ASCII)

#: The headers hookd sets itself (the framing and the connection); a request giving one is
#: refused (wasi:http's `Fields` refuses them, and hookd sets `content-length` from the body).
HOOKD_HEADERS = frozenset(
    (
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "transfer-encoding",
        "upgrade",
        "host",
        "http2-settings",
        "content-length",
    )
)


def _control(value):
    """Whether a header value holds a character hookd refuses there: one below 0x20 other than
    tab, or DEL."""
    codes = value if isinstance(value, bytes) else map(ord, value)
    return any((c < 0x20 and c != 0x09) or c == 0x7F for c in codes)


def _check_header(name, value):
    """Refuses, before anything is sent, a header hookd would refuse (which would fail every
    attempt): a name that is no HTTP token, a header hookd sets itself, a control character
    in the value. The value is never shown: it may be a secret."""
    quoted = _json.dumps(name, ensure_ascii=False)
    if not _TOKEN.match(name):
        raise InvalidRequest("header name %s is not a valid HTTP field name" % quoted)
    if name.lower() in HOOKD_HEADERS:
        raise InvalidRequest(
            "header %s is hookd's to set (the framing and the connection): leave it out" % quoted
        )
    if _control(value):
        raise InvalidRequest(
            "the value of header %s holds a control character (a newline?)" % quoted
        )


def _header_list(headers):
    if headers is None:
        return []
    items = headers.items() if hasattr(headers, "items") else headers
    out = []
    for name, value in items:
        if not isinstance(name, str) or not isinstance(value, (str, bytes)):
            raise InvalidRequest("a header's name and value must be str (%r)" % (name,))
        _check_header(name, value)
        out.append((name, value))
    return out


_NO_JSON = object()


def _json_body(value):
    """`value` as compact JSON text, else `InvalidRequest`. NaN and the infinities have no
    JSON form (Python would write `NaN`, which no JSON parser reads): refused, as a value
    that does not serialise."""
    try:
        return _json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except TypeError as e:
        raise InvalidRequest("the JSON body does not serialise: %s" % e) from None
    except ValueError as e:
        try:  # Only out-of-range floats pass with allow_nan on.
            _json.dumps(value, allow_nan=True)
        except (TypeError, ValueError):
            raise InvalidRequest("the JSON body does not serialise: %s" % e) from None
        raise InvalidRequest(
            "the JSON body does not serialise: it holds NaN or an infinity, which JSON has no "
            "number for"
        ) from None


def request(
    method,
    url,
    body=None,
    headers=None,
    *,
    json=_NO_JSON,
    timeout_ms=None,
    response_body_limit=None,
):
    """Sends a request and reads the whole response (up to `MAX_RESPONSE_BYTES`, or
    `response_body_limit`).

    - `method`: one of `METHODS`, any case;
    - `url`: `https://host[:port]/path?query` or `http://…`;
    - `body`: bytes, or a str (sent as UTF-8); `json=value` sends `value` as JSON with
      `content-type: application/json` instead;
    - `headers`: a dict or a list of `(name, value)` pairs, sent as given (`Idempotency-Key`
      is replaced by hookd's value); a name that is no HTTP token, one of `HOOKD_HEADERS`
      (`Host`, `Content-Length`, `Connection`, `Transfer-Encoding`, …: hookd sets the framing
      and the connection) or a value holding a control character (a newline, say) raises
      `InvalidRequest` before anything is sent, the harness as hookd;
    - `timeout_ms`: bounds connecting, waiting for the response head and each wait between
      body chunks (the attempt's own `timeout_ms` bounds everything regardless);
    - `response_body_limit`: read at most this many bytes of the response's body (at most
      `MAX_RESPONSE_BYTES`) and drop the rest unread, however long it is: a longer body is then
      no error, and the response's `body` holds its first bytes (all of it, if shorter). For a call that needs the status and at most the start
      of the body, such as a relay whose target may answer a success with a large document:
      without it, a body over the cap raises `TooLarge`, and the status is lost with it.

    Returns a `Response` for any status; raises an `HttpError` when there is none.
    """
    name = method.upper() if isinstance(method, str) else ""
    if name not in METHODS:
        raise InvalidRequest("method %r is not one this client sends (%s)" % (method, ", ".join(METHODS)))
    target = _Url(url)
    header_list = _header_list(headers)
    if json is not _NO_JSON:
        if body is not None:
            raise InvalidRequest("give a body or json=, not both")
        body = _json_body(json)
        header_list.append(("content-type", "application/json"))
    if body is None:
        body = b""
    elif isinstance(body, str):
        body = body.encode("utf-8")
    elif isinstance(body, (bytes, bytearray, memoryview)):
        body = bytes(body)
    else:
        raise InvalidRequest(
            "the body must be bytes or str (pass json=… to send %s as JSON)" % type(body).__name__
        )
    if name in ("GET", "HEAD") and body:
        raise InvalidRequest("a GET or HEAD request has no body")
    if timeout_ms is not None and timeout_ms < 0:
        raise InvalidRequest("timeout_ms must not be negative")
    if response_body_limit is not None:
        if isinstance(response_body_limit, bool) or not isinstance(response_body_limit, int):
            raise InvalidRequest("response_body_limit must be an int")
        if response_body_limit < 0:
            raise InvalidRequest("response_body_limit must not be negative")
        response_body_limit = min(response_body_limit, MAX_RESPONSE_BYTES)
    return _host.send(name, target, header_list, body, timeout_ms, response_body_limit)


def get(url, headers=None, *, timeout_ms=None, response_body_limit=None):
    """Sends a `GET` request to `url`; see `request`."""
    return request(
        "GET",
        url,
        None,
        headers,
        timeout_ms=timeout_ms,
        response_body_limit=response_body_limit,
    )


def post(
    url, body=None, headers=None, *, json=_NO_JSON, timeout_ms=None, response_body_limit=None
):
    """Sends a `POST` request to `url`; see `request`."""
    return request(
        "POST",
        url,
        body,
        headers,
        json=json,
        timeout_ms=timeout_ms,
        response_body_limit=response_body_limit,
    )
