"""Unit tests of the score handler, on CPython, with hookd's stand-in harness:

    python3 -m unittest discover -s plugins/score-py -t plugins/score-py
(with plugin-sdk/python on PYTHONPATH).
"""

import json
import unittest

from hookd import Event, Permanent
from hookd.testing import Harness

import score

ISSUE = {
    "action": "opened",
    "issue": {
        "number": 7,
        "title": "App crashes on start",
        "body": "Every launch ends with an error. Looks like a regression.",
    },
    "repository": {"full_name": "acme/widgets"},
}

DISPUTE = {
    "id": "evt_1",
    "type": "charge.dispute.created",
    "data": {"object": {"amount": 250000, "reason": "fraudulent"}},
}


class ScoreTest(unittest.TestCase):
    def test_a_crashing_issue_is_a_high_priority_bug(self):
        self.assertEqual(
            score.score(ISSUE, "issues.opened"),
            {"label": "bug", "priority": "high", "score": 7, "reasons": ["crashes", "error", "regression"]},
        )

    def test_a_large_dispute_is_urgent_billing(self):
        result = score.score(DISPUTE, "charge.dispute.created")
        self.assertEqual(result["label"], "billing")
        self.assertEqual(result["priority"], "high")
        self.assertEqual(result["reasons"], ["charge.dispute.created", "amount 2500.00"])
        # Below a tenth of high_amount the amount adds nothing.
        small = score.score(DISPUTE, "charge.dispute.created", high_amount=10_000_000)
        self.assertEqual((small["score"], small["priority"]), (4, "medium"))

    def test_words_count_whole_and_once(self):
        quiet = score.score({"title": "Downloads page: would be nice to sort"}, "x")
        self.assertEqual((quiet["label"], quiet["reasons"]), ("feature", ["would be nice"]))
        self.assertEqual(score.score({}, "ping")["label"], "other")


class HandlerTest(unittest.TestCase):
    def test_counts_per_label_in_state(self):
        hookd = Harness().with_state_json("seen:bug", 11)
        out = hookd.handle(score, Event("github", "d-1", "issues.opened", ISSUE))
        self.assertEqual(json.loads(out)["seen"], 12)
        self.assertEqual(json.loads(out)["label"], "bug")
        hookd.handle(score, Event("stripe", "evt_1", "charge.dispute.created", DISPUTE))
        self.assertEqual(hookd.state_keys(), ["seen:billing", "seen:bug"])
        self.assertEqual(hookd.logs()[0], ("info", "issues.opened d-1: bug (7)"))

    def test_high_amount_comes_from_config(self):
        hookd = Harness().with_config("high_amount", "300000")
        out = json.loads(hookd.handle(score, Event("stripe", "evt_1", "charge.dispute.created", DISPUTE)))
        self.assertEqual(out["score"], 5)

    def test_a_bad_high_amount_is_permanent(self):
        hookd = Harness().with_config("high_amount", "lots")
        with self.assertRaises(Permanent):
            hookd.handle(score, Event("stripe", "evt_1", "charge.dispute.created", DISPUTE))

    def test_a_body_that_is_not_json_is_permanent(self):
        with self.assertRaises(Permanent):
            Harness().handle(score, Event("github", "d-2", "issues.opened", b"not json"))


if __name__ == "__main__":
    unittest.main()
