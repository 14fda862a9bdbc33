"""score: how urgently should a person look at this event?

A handler for GitHub issue and Stripe events (and any JSON with a title, body or description)
that scores the event from its words and, for money, its amount, labels it (`incident`, `bug`,
`billing`, `feature` or `other`), and keeps a count of events per label in plugin state. Its
output, stored on the delivery and shown by the admin API:

    {"label":"bug","priority":"high","score":7,"reasons":["crash","error","amount 2500.00"],"seen":12}

`seen` is how many events this plugin instance has labelled so far with that label, this one
included. The scoring is a pure function (`score`), so it is tested without hookd; `Handler`
only adds the state and the output around it.

Config (`[plugins.<name>] config = { … }`):

- `high_amount`: an amount, in the currency's minor unit (cents), from which a payment event
  is urgent on its own (default `100000`, i.e. 1 000.00).
"""

import re

from hookd import Event, Permanent, config, log, state

# Words and phrases worth points, with the label they point to. A phrase counts once however
# often it appears; the label with the most points wins.
KEYWORDS = {
    "outage": ("incident", 5),
    "data loss": ("incident", 5),
    "security": ("incident", 4),
    "vulnerability": ("incident", 4),
    "down": ("incident", 3),
    "crash": ("bug", 3),
    "crashes": ("bug", 3),
    "exception": ("bug", 2),
    "error": ("bug", 2),
    "broken": ("bug", 2),
    "fails": ("bug", 2),
    "regression": ("bug", 2),
    "refund": ("billing", 2),
    "invoice": ("billing", 2),
    "charge": ("billing", 1),
    "feature": ("feature", 2),
    "would be nice": ("feature", 2),
    "support for": ("feature", 1),
}

# Stripe event types that need a person, whatever their words say.
STRIPE_TYPES = {
    "charge.dispute.created": ("billing", 4),
    "invoice.payment_failed": ("billing", 3),
    "charge.failed": ("billing", 2),
    "charge.refunded": ("billing", 1),
}

LABELS = ("incident", "bug", "billing", "feature", "other")

_PATTERNS = {word: re.compile(r"\b%s\b" % re.escape(word)) for word in KEYWORDS}


def text_of(payload):
    """The words of an event: a GitHub issue's or pull request's title and body, a comment's
    body, a Stripe object's description and failure message, or a top-level title, body,
    description or message."""
    parts = []
    for holder in ("issue", "pull_request", "comment"):
        item = payload.get(holder)
        if isinstance(item, dict):
            parts += [item.get("title"), item.get("body")]
    data = payload.get("data")
    obj = data.get("object") if isinstance(data, dict) else None
    if isinstance(obj, dict):
        parts += [obj.get("description"), obj.get("failure_message"), obj.get("reason")]
    for key in ("title", "body", "description", "message"):
        parts.append(payload.get(key))
    return " ".join(p for p in parts if isinstance(p, str)).lower()


def amount_of(payload):
    """A Stripe object's `amount` (minor units), if the event carries one."""
    data = payload.get("data")
    obj = data.get("object") if isinstance(data, dict) else None
    amount = obj.get("amount") if isinstance(obj, dict) else None
    return amount if isinstance(amount, int) and not isinstance(amount, bool) else None


def score(payload, event_type, high_amount=100_000):
    """Scores one event: `{"label", "priority", "score", "reasons"}`. Pure: no hookd needed."""
    points = dict.fromkeys(LABELS, 0)
    reasons = []
    if event_type in STRIPE_TYPES:
        label, p = STRIPE_TYPES[event_type]
        points[label] += p
        reasons.append(event_type)
    text = text_of(payload)
    for word, (label, p) in KEYWORDS.items():
        if _PATTERNS[word].search(text):
            points[label] += p
            reasons.append(word)
    amount = amount_of(payload)
    if amount is not None and amount >= high_amount // 10:
        points["billing"] += 3 if amount >= high_amount else 1
        reasons.append("amount %d.%02d" % divmod(amount, 100))
    total = sum(points.values())
    # The label with the most points; ties go to the more urgent label (LABELS' order).
    label = max(LABELS, key=lambda name: (points[name], -LABELS.index(name)))
    if total == 0:
        label = "other"
    priority = "high" if total >= 6 else "medium" if total >= 3 else "low"
    return {"label": label, "priority": priority, "score": total, "reasons": reasons}


class Handler:
    def handle(self, ev: Event):
        payload = ev.json()  # not JSON: a permanent error (a retry would read the same body)
        if not isinstance(payload, dict):
            payload = {}
        high_amount = config.get("high_amount", "100000")
        if not high_amount.isdigit():
            raise Permanent("config key `high_amount` must be a whole number, not %r" % high_amount)
        high_amount = int(high_amount)
        result = score(payload, ev.event_type, high_amount)

        # One counter per label. Reads see committed state; the write is committed only if
        # this attempt succeeds, and hookd re-runs the attempt if another delivery changed the
        # key meanwhile, so no count is lost or doubled.
        key = "seen:" + result["label"]
        seen = state.get_json(key, 0) + 1
        state.set_json(key, seen)
        result["seen"] = seen

        log.info("%s %s: %s (%d)" % (ev.event_type, ev.event_id, result["label"], result["score"]))
        return result  # stored as JSON
