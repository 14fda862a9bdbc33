"""The scenario protocol on CPython, through hookd's stand-in harness (`spin` and `grow` need
hookd's limits, so only the component test in hookd runs them):

    PYTHONPATH=plugin-sdk/python python3 -m unittest discover -s tests/plugins-py/scenario -t tests/plugins-py/scenario
"""

import json
import unittest

from hookd import Event, Permanent, Retry, http
from hookd.testing import Harness, StateRefused

import scenario


def ev(body, **fields):
    return Event("scenario", "e-1", "test", body, **fields)


class ScenarioTest(unittest.TestCase):
    def test_count(self):
        hookd = Harness()
        self.assertEqual(hookd.handle(scenario, ev({"do": "count", "key": "k"})), '{"count":1}')
        self.assertEqual(hookd.handle(scenario, ev({"do": "count", "key": "k"})), '{"count":2}')
        self.assertEqual(hookd.state("k"), b"2")

    def test_fail_until(self):
        hookd = Harness()
        with self.assertRaises(Retry) as caught:
            hookd.handle(scenario, ev({"do": "fail", "until": 3}, attempt=2))
        self.assertEqual(caught.exception, Retry("attempt 2 fails", 1))
        self.assertEqual(hookd.handle(scenario, ev({"do": "fail", "until": 3}, attempt=3)), '{"attempt":3}')

    def test_permanent_and_unknown(self):
        with self.assertRaises(Permanent) as caught:
            Harness().handle(scenario, ev({"do": "permanent"}))
        self.assertEqual(caught.exception, Permanent("asked to fail for good"))
        with self.assertRaises(Permanent) as caught:
            Harness().handle(scenario, ev({"do": "dance"}))
        self.assertEqual(caught.exception, Permanent("unknown op dance"))
        for body in ({}, {"do": 5}, [1]):
            with self.assertRaises(Permanent) as caught:
                Harness().handle(scenario, ev(body))
            self.assertEqual(caught.exception, Permanent("unknown op "))

    def test_missing_arguments_read_as_zero_or_empty(self):
        hookd = Harness()
        self.assertEqual(hookd.handle(scenario, ev({"do": "output"})), "")
        self.assertEqual(hookd.handle(scenario, ev({"do": "output", "bytes": -1})), "")
        self.assertEqual(hookd.handle(scenario, ev({"do": "log", "bytes": "9"})), "logged")
        self.assertEqual(hookd.logs(), [])
        self.assertEqual(hookd.handle(scenario, ev({"do": "fail"})), '{"attempt":1}')
        # An empty key is one hookd does not store: the attempt stops there, nothing kept.
        with self.assertRaises(StateRefused):
            hookd.handle(scenario, ev({"do": "count"}))
        self.assertEqual(hookd.state_keys(), [])
        with self.assertRaises(Permanent) as caught:
            hookd.handle(scenario, ev({"do": "fetch"}))
        self.assertTrue(caught.exception.reason.startswith("invalid request: URL"), caught.exception)

    def test_write_then_fail_leaves_no_trace(self):
        hookd = Harness()
        with self.assertRaises(Retry) as caught:
            hookd.handle(scenario, ev({"do": "write-then-fail", "key": "w"}))
        self.assertEqual(caught.exception, Retry("wrote then failed"))
        self.assertIsNone(hookd.state("w"))

    def test_fetch(self):
        url = "http://127.0.0.1:9100/in"
        body = json.dumps({"do": "fetch", "url": url})
        hookd = Harness().respond_to("POST", url, 201)
        self.assertEqual(hookd.handle(scenario, ev(body)), '{"status":201}')
        sent = hookd.requests()[0]
        self.assertEqual((sent.body, sent.header("content-type")), (body.encode(), None))
        hookd.respond_with("POST", url, http.Response(503).with_header("retry-after", "2"))
        with self.assertRaises(Retry) as caught:
            hookd.handle(scenario, ev(body))
        self.assertEqual(caught.exception, Retry("status 503: ", 2000))
        hookd.respond_to("POST", url, 400)
        with self.assertRaises(Permanent):
            hookd.handle(scenario, ev(body))
        with self.assertRaises(Permanent) as caught:
            Harness().handle(scenario, ev(body))
        self.assertTrue(caught.exception.reason.startswith("denied: hookd refused the request to 127.0.0.1:9100: "))

    def test_copy(self):
        url = "http://127.0.0.1:9100/copy"
        body = ('{"do": "copy", "key": "b", "copy": "b2", "url": "%s", "text": "\u00e9 \\u00e9"}' % url).encode()
        hookd = Harness().respond_to("POST", url, 200)
        self.assertEqual(hookd.handle(scenario, ev(body)), '{"status":200,"bytes":%d}' % len(body))
        self.assertEqual((hookd.state("b"), hookd.state("b2")), (body, body))
        sent = hookd.requests()[0]
        self.assertEqual((sent.body, sent.header("content-type")), (body, None))
        down = Harness().respond_to("POST", url, 503)
        with self.assertRaises(Retry):
            down.handle(scenario, ev(body))
        self.assertEqual(down.state_keys(), [])

    def test_output_log_and_stale(self):
        self.assertEqual(Harness().handle(scenario, ev({"do": "output", "bytes": 5})), "xxxxx")
        hookd = Harness()
        self.assertEqual(hookd.handle(scenario, ev({"do": "log", "bytes": 3000})), "logged")
        self.assertEqual([len(m) for _, m in hookd.logs()], [1024, 1024, 1024])
        self.assertEqual(Harness().handle(scenario, ev({"do": "stale"}, stale=True)), '{"stale":true}')
        self.assertEqual(Harness().handle(scenario, ev({"do": "stale"})), '{"stale":false}')


if __name__ == "__main__":
    unittest.main()
