import calendar
import json
import unittest

from hookd import Event, Permanent, Retry, http
from hookd.http import _Url, parse_retry_after
from hookd.testing import Harness


class UrlTest(unittest.TestCase):
    def test_urls_split_into_authority_and_path(self):
        for url, authority, path in [
            ("http://127.0.0.1:9000/v1/chat?x=1#top", "127.0.0.1:9000", "/v1/chat?x=1"),
            ("HTTP://example.com", "example.com", "/"),
            ("http://example.com?q", "example.com", "/?q"),
            ("http://[::1]:80/", "[::1]:80", "/"),
        ]:
            got = _Url(url)
            self.assertEqual((got.authority, got.path_with_query), (authority, path), url)
        https = _Url("https://example.com:8443/v1?x")
        self.assertTrue(https.https)
        self.assertEqual(str(https), "https://example.com:8443/v1?x")
        self.assertFalse(_Url("http://example.com/").https)
        for bad in ["example.com/x", "ftp://x/", "http:///x", "http://u:p@x/", "http://a b/"]:
            with self.assertRaises(http.InvalidRequest, msg=bad):
                _Url(bad)

    def test_url_errors_show_no_path_query_or_credentials(self):
        for url, shown in [
            ("ftp://files.example/s3cret?k=v", "ftp://files.example/…"),
            ("discord.com/api/webhooks/1/s3cret", "discord.com/…"),
            ("http://user:s3cret@example.com/x", "http://…@example.com/…"),
            ("https://a b/s3cret", "https://a b/…"),
            ("http://a\tb?token=s3cret", "http://a\tb/…"),
            ("http://#s3cret", "http:///…"),
        ]:
            with self.assertRaises(http.InvalidRequest, msg=url) as caught:
                _Url(url)
            message = str(caught.exception)
            self.assertNotIn("s3cret", message)
            self.assertIn(json.dumps(shown, ensure_ascii=False), message)
        url = _Url("https://hooks.example/T0/s3cret?x=1")
        self.assertEqual(url.redacted(), "https://hooks.example/…")
        self.assertEqual(_Url("https://hooks.example").redacted(), "https://hooks.example/")

    def test_building_errors_surface_before_sending(self):
        with self.assertRaises(http.InvalidRequest):
            http.request("GET", "http://x/", b"no")
        with self.assertRaises(http.InvalidRequest):
            http.post("ftp://x/")
        with self.assertRaises(http.InvalidRequest):
            http.request("BREW", "http://x/")
        with self.assertRaises(http.InvalidRequest):
            http.post("http://x/", json={1, 2})
        with self.assertRaises(http.InvalidRequest):
            http.post("http://x/", b"body", json={})

    def test_a_json_body_holding_nan_or_an_infinity_is_refused(self):
        # Python would send `{"x":NaN}`, which no JSON parser reads.
        for value in ({"x": float("nan")}, [float("inf")], -float("inf")):
            with self.assertRaises(http.InvalidRequest, msg=repr(value)) as caught:
                http.post("http://x/", json=value)
            self.assertIn("holds NaN or an infinity", str(caught.exception))
        looped = []
        looped.append(looped)
        with self.assertRaises(http.InvalidRequest) as caught:
            http.post("http://x/", json=looped)
        self.assertNotIn("NaN", str(caught.exception))


class ResponseJsonTest(unittest.TestCase):
    def test_a_body_holding_nan_or_an_infinity_is_no_json(self):
        for body in (b"NaN", b'{"x":Infinity}', b"[-Infinity]", b"[1e400]", b"[" * 100000):
            with self.assertRaises(http.Body) as caught:
                http.Response(200, body).json()
            self.assertIn("not the JSON expected", str(caught.exception))
        self.assertEqual(http.Response(200, b'{"x":1e308,"y":"NaN"}').json(), {"x": 1e308, "y": "NaN"})


class HeaderCheckTest(unittest.TestCase):
    """A header hookd refuses is refused by the shared path before anything is sent: in a
    component wasi:http's `Fields` would refuse it, and every such event be dead-lettered."""

    url = "https://api.test/hook"

    def refused(self, headers):
        def send(ev):
            http.post(self.url, b"{}", headers)

        hookd = Harness().respond_to("POST", self.url, 200)
        with self.assertRaises(Permanent) as caught:
            hookd.handle(send, Event("s", "e", "t"))
        self.assertEqual(hookd.requests(), [], "nothing is sent")
        return caught.exception.reason

    def test_a_name_that_is_no_http_token_is_refused(self):
        for name in ("", "bad name", "x:y", "a\nb", "é", "(x)", 'a"b', "x/y"):
            self.assertEqual(
                self.refused({name: "v"}),
                "invalid request: header name %s is not a valid HTTP field name"
                % json.dumps(name, ensure_ascii=False),
            )

    def test_a_header_hookd_sets_is_refused(self):
        for name in ("Connection", "keep-alive", "Proxy-Authenticate", "proxy-authorization",
                     "Proxy-Connection", "Transfer-Encoding", "upgrade", "HOST", "HTTP2-Settings",
                     "Content-Length"):
            self.assertEqual(
                self.refused([(name, "x")]),
                'invalid request: header "%s" is hookd\'s to set (the framing and the '
                "connection): leave it out" % name,
            )

    def test_a_control_character_in_a_value_is_refused_without_showing_the_value(self):
        for value in ("s3cret\r\nX-Evil: 1", "s3cret\n", "s3cret\x00", "s3cret\x7f", b"s3cret\n"):
            reason = self.refused([("Authorization", value)])
            self.assertEqual(
                reason,
                'invalid request: the value of header "Authorization" holds a control character '
                "(a newline?)",
            )
            self.assertNotIn("s3cret", reason)

    def test_valid_headers_pass(self):
        def send(ev):
            return http.post(
                self.url,
                b"{}",
                [("X-Api_Key!#$%&'*+-.^`|~1", "tab\tok, é"), ("Idempotency-Key", "k"), ("x", b"\x80")],
            ).status

        hookd = Harness().respond_to("POST", self.url, 200)
        self.assertEqual(hookd.handle(send, Event("s", "e", "t")), "200")
        self.assertEqual(len(hookd.requests()[0].headers), 3)


class StatusTest(unittest.TestCase):
    def response(self, status, retry_after=None):
        r = http.Response(status, "x" * 2000)
        if retry_after is not None:
            r.with_header("Retry-After", retry_after)
        return r

    def test_status_errors_keep_retry_after_and_a_short_body(self):
        ok = self.response(204)
        self.assertIs(ok.error_for_status(), ok)
        with self.assertRaises(http.Status) as caught:
            self.response(429, "7").error_for_status()
        err = caught.exception
        self.assertEqual((err.status, err.retry_after_ms), (429, 7000))
        self.assertLess(len(err.body), 600)
        self.assertEqual(err.to_handle_error(), Retry("status 429: " + err.body, 7000))

    def test_a_long_body_is_cut_on_a_character_boundary(self):
        r = http.Response(500, "é" * 400)
        with self.assertRaises(http.Status) as caught:
            r.error_for_status()
        body = caught.exception.body
        self.assertTrue(body.endswith("…"))
        self.assertLessEqual(len(body[:-1].encode("utf-8")), 512)

    def test_retry_after_is_seconds_or_an_http_date(self):
        now = calendar.timegm((2015, 10, 21, 7, 28, 0, 0, 0, 0))
        parse = lambda v: parse_retry_after(v, now)  # noqa: E731
        self.assertEqual(parse(" 120 "), 120_000)
        # The three date forms RFC 9110 makes a recipient accept.
        self.assertEqual(parse("Wed, 21 Oct 2015 07:29:30 GMT"), 90_000)
        self.assertEqual(parse("Wednesday, 21-Oct-15 07:28:05 GMT"), 5_000)
        self.assertEqual(parse("Wed Oct 21 07:28:10 2015"), 10_000)
        self.assertEqual(parse("Wed, 21 Oct 2015 07:00:00 GMT"), 0)
        self.assertIsNone(parse("soon"))
        self.assertIsNone(parse("-5"))
        self.assertIsNone(parse("Wed, 21 Foo 2015 07:29:30 GMT"))

    def test_handler_errors_retry_only_what_may_change(self):
        def retry(err):
            return isinstance(err.to_handle_error(), Retry)

        self.assertTrue(retry(http.Timeout("t")))
        self.assertTrue(retry(http.Transport("t")))
        self.assertTrue(retry(http.Body("b")))
        self.assertTrue(retry(http.Status(503)))
        self.assertTrue(retry(http.Status(408)))
        self.assertTrue(retry(http.Status(429)))
        self.assertFalse(retry(http.Status(404)))
        self.assertFalse(retry(http.Status(302)))
        self.assertFalse(retry(http.Denied("d")))
        self.assertFalse(retry(http.Unsupported("u")))
        self.assertFalse(retry(http.Tls("certificate")))
        self.assertFalse(retry(http.TooLarge("big")))
        self.assertFalse(retry(http.InvalidRequest("bad")))

    def test_errors_read_as_the_rust_sdk_writes_them(self):
        self.assertEqual(str(http.Denied("hookd refused it")), "denied: hookd refused it")
        self.assertEqual(str(http.Timeout("x:1: ConnectionTimeout")), "timed out: x:1: ConnectionTimeout")
        self.assertEqual(str(http.Status(503, None, "down")), "status 503: down")
        self.assertEqual(
            http.Denied("d").to_handle_error(), Permanent("denied: d")
        )


def notify(ev):
    http.post("https://hooks.example.com/in", json={"event": ev.event_id}).error_for_status()
    return "sent"


class HarnessHttpTest(unittest.TestCase):
    def test_an_uncaught_http_error_fails_the_attempt_as_the_rust_sdk_maps_it(self):
        url = "https://hooks.example.com/in"
        ev = Event("orders", "evt_1", "order.paid", {"id": 7})
        hookd = Harness().respond_with("POST", url, http.Response(503).with_header("retry-after", "3"))
        with self.assertRaises(Retry) as caught:
            hookd.handle(notify, ev)
        self.assertEqual(caught.exception.after_ms, 3000)
        hookd.respond_to("POST", url, 404)
        with self.assertRaises(Permanent):
            hookd.handle(notify, ev)
        hookd.fail_with("POST", url, http.Timeout("hooks.example.com: HttpResponseTimeout"))
        with self.assertRaises(Retry):
            hookd.handle(notify, ev)
        hookd.respond_to("POST", url, 200)
        self.assertEqual(hookd.handle(notify, ev), "sent")
        sent = hookd.requests()
        self.assertEqual(len(sent), 4)
        self.assertEqual(sent[-1].json(), {"event": "evt_1"})
        self.assertEqual(sent[-1].header("Content-Type"), "application/json")

    def test_a_response_body_limit_keeps_the_start_of_the_body_as_in_the_rust_sdk(self):
        def peek(ev):
            response = http.get("https://api.test/", response_body_limit=4)
            return "%d %s" % (response.status, response.text())

        ev = Event("orders", "evt_1", "order.paid", {"id": 7})
        hookd = Harness().respond_with("GET", "https://api.test/", http.Response(200, b"long answer"))
        self.assertEqual(hookd.handle(peek, ev), "200 long")
        for bad in (-1, 1.5, True):
            with self.assertRaises(http.InvalidRequest, msg=repr(bad)):
                http.request("GET", "https://api.test/", response_body_limit=bad)

    def test_a_url_without_a_stub_is_refused_like_an_unlisted_host(self):
        with self.assertRaises(Permanent) as caught:
            Harness().handle(notify, Event("s", "e", "t"))
        self.assertTrue(caught.exception.reason.startswith("denied: hookd refused the request to hooks.example.com"))

    def test_the_refusal_names_host_and_port_but_not_the_path_or_query(self):
        for url, refusal in [
            (
                "https://API.test/hooks/s3cret?token=s3cret",
                "denied: hookd refused the request to API.test: api.test:443 is not in "
                "allow_hosts (no stub for GET https://API.test/…)",
            ),
            (
                "http://api.test",
                "denied: hookd refused the request to api.test: api.test:80 is not in "
                "allow_hosts (no stub for GET http://api.test/)",
            ),
            (
                "http://[::1]:9000/s3cret",
                "denied: hookd refused the request to [::1]:9000: [::1]:9000 is not in "
                "allow_hosts (no stub for GET http://[::1]:9000/…)",
            ),
        ]:
            with self.assertRaises(Permanent, msg=url) as caught:
                Harness().handle(lambda ev: http.get(url), Event("s", "e", "t"))
            self.assertEqual(caught.exception.reason, refusal)
            self.assertNotIn("s3cret", caught.exception.reason)

    def test_a_stubbed_body_over_the_cap_is_too_large_unless_a_limit_is_asked(self):
        url = "https://api.test:8443/big"
        big = http.Response(200, b"x" * (http.MAX_RESPONSE_BYTES + 1))
        hookd = Harness().respond_with("GET", url, big).respond_with(
            "GET", url + "/cap", http.Response(200, b"x" * http.MAX_RESPONSE_BYTES)
        )
        with self.assertRaises(Permanent) as caught:
            hookd.handle(lambda ev: http.get(url), Event("s", "e", "t"))
        self.assertEqual(
            caught.exception.reason, "response too large: api.test:8443 sent more than 8388608 bytes"
        )
        self.assertEqual(
            hookd.handle(lambda ev: len(http.get(url + "/cap").body), Event("s", "e", "t")), "8388608"
        )
        # With a limit asked, the first bytes and no error, however long the body (as hookd's
        # client reads it).
        for limit, kept in ((4, 4), (http.MAX_RESPONSE_BYTES * 2, http.MAX_RESPONSE_BYTES)):
            got = hookd.handle(
                lambda ev: len(http.get(url, response_body_limit=limit).body), Event("s", "e", "t")
            )
            self.assertEqual(got, str(kept))

    def test_the_65th_request_of_a_call_is_refused(self):
        url = "http://127.0.0.1:9000/x"

        def flood(ev):
            for _ in range(65):
                http.get(url)

        hookd = Harness().respond_to("GET", url, 200)
        with self.assertRaises(Permanent):
            hookd.handle(flood, Event("s", "e", "t"))
        self.assertEqual(len(hookd.requests()), 64)
        self.assertEqual(
            str(caught_reason(hookd, flood)),
            "denied: hookd refused the request to 127.0.0.1:9000: more than 64 requests in one attempt",
        )

    def test_a_refused_request_does_not_count_toward_the_64(self):
        # hookd counts only requests its allow-list let through; here, those a stub answers.
        ok, elsewhere = "https://api.test/ok", "https://elsewhere.test/x"
        refusals = []

        def tries(unstubbed, stubbed):
            def handler(ev):
                for _ in range(unstubbed):
                    try:
                        http.get(elsewhere)
                    except http.Denied as e:
                        refusals.append(str(e))
                for _ in range(stubbed):
                    http.get(ok)
                return "sent"

            return handler

        hookd = Harness().respond_to("GET", ok, 200)
        # 64 refused for want of a stub, then one stubbed: sent and answered.
        self.assertEqual(hookd.handle(tries(64, 1), Event("s", "e", "t")), "sent")
        self.assertEqual(len(refusals), 64)
        self.assertEqual(
            set(refusals),
            {
                "denied: hookd refused the request to elsewhere.test: elsewhere.test:443 is not in "
                "allow_hosts (no stub for GET https://elsewhere.test/…)"
            },
        )
        self.assertEqual(len(hookd.requests()), 65)
        # Refused ones in between, then the full 64 stubbed.
        self.assertEqual(hookd.handle(tries(10, 64), Event("s", "e", "t")), "sent")
        # Past the cap, an unstubbed URL is still refused as unlisted (allow_hosts comes first),
        # and a stubbed one for the cap.
        del refusals[:]

        def after(ev):
            for _ in range(64):
                http.get(ok)
            try:
                http.get(elsewhere)
            except http.Denied as e:
                refusals.append(str(e))
            http.get(ok)

        self.assertIn("more than 64 requests", caught_reason(hookd, after))
        self.assertEqual(len(refusals), 1)
        self.assertIn("is not in allow_hosts", refusals[0])


def caught_reason(hookd, handler):
    """The reason of the `Permanent` that `handler` ends in under `hookd`."""
    try:
        hookd.handle(handler, Event("s", "e", "t"))
    except Permanent as e:
        return e.reason
    raise AssertionError("no Permanent")


if __name__ == "__main__":
    unittest.main()
