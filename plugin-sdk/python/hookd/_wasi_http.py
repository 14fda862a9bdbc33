"""The `wasi:http` calls behind `hookd.http`: the only SDK code that touches wasi:http's
generated bindings. Imported only inside a component (see `_host`).

Resources are released explicitly (`with`), children before their parents, as wasi:http
requires: a garbage collector would drop them in any order.
"""

import dataclasses

from componentize_py_types import Err, Ok
from wit_world.imports import network, outgoing_handler
from wit_world.imports import streams
from wit_world.imports import wasi_http_types as t

from ._event import Header
from .http import (
    MAX_RESPONSE_BYTES,
    Body,
    Denied,
    InvalidRequest,
    Response,
    Timeout,
    Tls,
    TooLarge,
    Transport,
    _too_large,
)

_METHODS = {
    "GET": t.Method_Get,
    "HEAD": t.Method_Head,
    "POST": t.Method_Post,
    "PUT": t.Method_Put,
    "PATCH": t.Method_Patch,
    "DELETE": t.Method_Delete,
    "OPTIONS": t.Method_Options,
}

_WRITE_CHUNK = 4096
_READ_CHUNK = 64 * 1024


def _debug(value):
    """A generated variant case or record written as the Rust SDK's `{:?}` writes it
    (`ConnectionRefused`, `DnsError(DnsErrorPayload { rcode: Some("x"), info_code: None })`),
    so both SDKs give one failure the same words."""
    if value is None:
        return "None"
    if isinstance(value, str):
        return '"%s"' % value.replace("\\", "\\\\").replace('"', '\\"')
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if dataclasses.is_dataclass(value):
        name = type(value).__name__
        case = name.split("_", 1)[1] if "_" in name else name
        fields = dataclasses.fields(value)
        if not fields:
            return case
        if "_" in name and [f.name for f in fields] == ["value"]:
            return "%s(%s)" % (case, _some(value.value))
        return "%s { %s }" % (
            name,
            ", ".join("%s: %s" % (f.name, _some(getattr(value, f.name))) for f in fields),
        )
    return repr(value)


def _some(value):
    # Generated payloads are `Optional`s where the WIT says `option`; the Rust SDK's debug
    # output says `Some(..)`/`None` for them. Records and variants are never optional here.
    if value is None:
        return "None"
    if dataclasses.is_dataclass(value):
        return _debug(value)
    return "Some(%s)" % _debug(value)


def _close(resource):
    """Drops a resource now (a no-op for None)."""
    if resource is not None:
        resource.__exit__(None, None, None)


def send(method, url, headers, body, timeout_ms, body_limit=None):
    entries = [
        (name.lower(), value.encode("utf-8") if isinstance(value, str) else bytes(value))
        for name, value in headers
    ]
    if body or method in ("POST", "PUT"):
        entries.append(("content-length", str(len(body)).encode("ascii")))
    try:
        fields = t.Fields.from_list(entries)
    except Err as e:
        raise InvalidRequest("a header is invalid or not allowed: %s" % _debug(e.value)) from None

    request = t.OutgoingRequest(fields)  # takes the fields
    outgoing_body = None
    try:

        def invalid(what):
            return InvalidRequest("%s refused: %s" % (what, url.redacted()))

        for setter, value, what in (
            (request.set_method, _METHODS[method](), "method"),
            (request.set_scheme, t.Scheme_Https() if url.https else t.Scheme_Http(), "scheme"),
            (request.set_authority, url.authority, "host"),
            (request.set_path_with_query, url.path_with_query, "path"),
        ):
            try:
                setter(value)
            except Err:
                raise invalid(what) from None
        try:
            outgoing_body = request.body()
        except Err:
            raise invalid("body") from None
        options = None
        if timeout_ms is not None:
            options = t.RequestOptions()
            nanos = min(int(timeout_ms) * 1_000_000, 2**64 - 1)
            for setter in (
                options.set_connect_timeout,
                options.set_first_byte_timeout,
                options.set_between_bytes_timeout,
            ):
                try:
                    setter(nanos)
                except Err:
                    pass
        # Send first, then stream the body: hookd consumes it while the request is on the
        # wire, so a body larger than its buffer cannot block before sending starts.
        try:
            pending = outgoing_handler.handle(request, options)  # takes request and options
        except Err as e:
            request = None
            raise _from_code(e.value, url.authority) from None
        request = None
        # A server may answer before reading the whole body (e.g. 413); its answer wins, so
        # a failed write is not an error of its own.
        _write_body(outgoing_body, body)
        outgoing_body = None
    finally:
        _close(outgoing_body)
        _close(request)

    with pending:
        with pending.subscribe() as ready:
            ready.block()
        got = pending.get()
    if isinstance(got, Ok) and isinstance(got.value, Ok):
        response = got.value.value
    elif isinstance(got, Ok) and isinstance(got.value, Err):
        raise _from_code(got.value.value, url.authority)
    else:
        raise Transport("the response was lost")

    with response:
        status = response.status()
        with response.headers() as fields:
            headers = [
                Header(name.lower(), value.decode("utf-8", "replace"))
                for name, value in fields.entries()
            ]
        try:
            incoming = response.consume()
        except Err:
            raise Body("the response body was already taken") from None
        try:
            body = _read_body(incoming, url.authority, body_limit)
        finally:
            with t.IncomingBody.finish(incoming):
                pass
    return Response(status, body, headers)


def _write_body(outgoing, body):
    """Writes and finishes the request body; False if it could not (the answer decides)."""
    try:
        stream = outgoing.write()
    except Err:
        _close(outgoing)
        return False
    ok = True
    with stream:
        for start in range(0, len(body), _WRITE_CHUNK):
            try:
                stream.blocking_write_and_flush(body[start : start + _WRITE_CHUNK])
            except Err as e:
                _close_stream_error(e.value)
                ok = False
                break
    try:
        t.OutgoingBody.finish(outgoing, None)  # takes the body
    except Err:
        ok = False
    return ok


def _close_stream_error(error):
    if isinstance(error, streams.StreamError_LastOperationFailed):
        _close(error.value)


def _read_body(incoming, authority, limit=None):
    """Reads the body to its end, or only its first `limit` bytes (the rest is then dropped
    unread). A body over the cap is over any limit: with one, it ends the read with what
    arrived."""
    try:
        stream = incoming.stream()
    except Err:
        raise Body("the response body stream was already taken") from None
    chunks = []
    size = 0
    with stream:
        while True:
            if limit is not None and size >= limit:
                return b"".join(chunks)[:limit]
            try:
                chunk = stream.blocking_read(_READ_CHUNK)
            except Err as e:
                if isinstance(e.value, streams.StreamError_Closed):
                    return b"".join(chunks)
                error = _read_error(e.value.value, authority)
                if limit is not None and isinstance(error, TooLarge):
                    return b"".join(chunks)[:limit]
                raise error from None
            chunks.append(chunk)
            size += len(chunk)
            if limit is None and size > MAX_RESPONSE_BYTES:
                raise _too_large(authority)


def _read_error(error, authority):
    with error:
        code = t.http_error_code(error)
        if code is not None:
            return _from_code(code, authority)
        # hookd's wasi:http reports some body errors as plain messages rather than error
        # codes: read the message's first line (the rest may be a backtrace).
        lines = error.to_debug_string().splitlines()
    what = "reading the response body from %s: %s" % (authority, (lines[0] if lines else "").strip())
    if "body size exceeds limit" in what:
        # Its number is what had arrived when the host stopped reading: the cap is what to say.
        return _too_large(authority)
    if "timeout" in what:
        return Timeout(what)
    return Body(what)


def _from_code(code, authority):
    """An `http.HttpError` for a wasi:http error code, as the Rust SDK maps them."""
    if isinstance(
        code,
        (t.ErrorCode_HttpRequestDenied, t.ErrorCode_DestinationIpProhibited, t.ErrorCode_ConnectionLimitReached),
    ):
        # The error code carries no text; hookd says why when asked.
        why = network.last_refusal() or "no reason given"
        return Denied("hookd refused the request to %s: %s" % (authority, why))
    if isinstance(
        code,
        (
            t.ErrorCode_DnsTimeout,
            t.ErrorCode_ConnectionTimeout,
            t.ErrorCode_ConnectionReadTimeout,
            t.ErrorCode_ConnectionWriteTimeout,
            t.ErrorCode_HttpResponseTimeout,
        ),
    ):
        return Timeout("%s: %s" % (authority, _debug(code)))
    if isinstance(code, t.ErrorCode_HttpResponseBodySize):
        size = "too many" if code.value is None else str(code.value)
        return TooLarge(
            "%s sent %s bytes, over the %d-byte cap" % (authority, size, MAX_RESPONSE_BYTES)
        )
    if isinstance(code, t.ErrorCode_TlsCertificateError):
        return Tls(
            "%s: the server's certificate is not trusted, is for another name or has expired "
            "(TLS-certificate-error)" % authority
        )
    if isinstance(code, t.ErrorCode_TlsAlertReceived):
        alert = code.value
        return Tls(
            "%s: the server sent TLS alert %s%s"
            % (
                authority,
                "" if alert.alert_id is None else alert.alert_id,
                "" if alert.alert_message is None else " (%s)" % alert.alert_message,
            )
        )
    if isinstance(code, t.ErrorCode_TlsProtocolError):
        return Tls("%s: the TLS handshake failed" % authority)
    if isinstance(code, (t.ErrorCode_HttpRequestUriInvalid, t.ErrorCode_HttpRequestMethodInvalid)):
        return InvalidRequest("%s: %s" % (authority, _debug(code)))
    return Transport("%s: %s" % (authority, _debug(code)))
