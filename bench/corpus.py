#!/usr/bin/env python3
"""Writes a pre-signed corpus of GitHub `issues` webhook bodies for the ingest benchmark.

One line per body: `<X-Hub-Signature-256 value>\t<JSON body>`. GitHub signs only the body, so
the wrk script (bench/ingest.lua) pairs each body with a fresh `X-GitHub-Delivery` id per
request (and re-sends an earlier id with its body for the duplicates).

With `--standard-webhooks RUN`, one line per *message* instead, for bench/sw.lua:
`<webhook-id>\t<webhook-timestamp>\t<webhook-signature>\t<JSON body>`, ids RUN-0, RUN-1, ...
(a Standard Webhooks signature covers the id and the timestamp, so every message is signed
here; `--secret` is then a `whsec_<base64>` key and the bodies carry a top-level `type`).

Usage: corpus.py OUT [--count N] [--size BYTES] [--secret S] [--standard-webhooks RUN]
"""

import argparse
import base64
import hashlib
import hmac
import json
import random
import time

WORDS = (
    "app crashes on start error when saving settings the build fails with a panic in the "
    "worker thread after upgrading to the new release timeout while uploading large files "
    "dark mode toggle does not persist feature request add export to csv question about "
    "billing invoice wrong amount charged twice login redirect loops forever on safari"
).split()


def issue_body(rng: random.Random, n: int, size: int, extra: dict = None) -> bytes:
    """A GitHub `issues.opened`-shaped payload of about `size` bytes (compact JSON), with the
    top-level fields of `extra` first."""
    number = 1000 + n
    login = f"user{rng.randrange(100000)}"
    payload = dict(extra or {})
    payload.update({
        "action": rng.choice(["opened", "edited", "closed", "labeled"]),
        "issue": {
            "url": f"https://api.github.com/repos/acme/widgets/issues/{number}",
            "id": 900000000 + n,
            "number": number,
            "title": " ".join(rng.choice(WORDS) for _ in range(8)),
            "user": {"login": login, "id": rng.randrange(10**7), "type": "User"},
            "labels": [],
            "state": "open",
            "comments": rng.randrange(20),
            "created_at": "2026-05-01T12:00:00Z",
            "updated_at": "2026-05-01T12:00:00Z",
            "author_association": "NONE",
            "body": "",
        },
        "repository": {
            "id": 123456789,
            "name": "widgets",
            "full_name": "acme/widgets",
            "private": False,
            "owner": {"login": "acme", "id": 4242, "type": "Organization"},
            "html_url": "https://github.com/acme/widgets",
            "default_branch": "main",
        },
        "sender": {"login": login, "id": rng.randrange(10**7), "type": "User"},
    })
    text = []
    while len(json.dumps(payload, separators=(",", ":"))) < size:
        text.append(rng.choice(WORDS))
        payload["issue"]["body"] = " ".join(text)
    return json.dumps(payload, separators=(",", ":")).encode()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out")
    parser.add_argument("--count", type=int, default=1000)
    parser.add_argument("--size", type=int, default=1500)
    parser.add_argument("--secret", default="bench-github-secret")
    parser.add_argument("--standard-webhooks", metavar="RUN")
    parser.add_argument("--fail-for-ms", type=int, metavar="MS",
                        help="every body asks the `flaky` test handler to fail, retrying MS later")
    args = parser.parse_args()
    extra = {"fail_times": 1_000_000, "after_ms": args.fail_for_ms} if args.fail_for_ms else None
    rng = random.Random(42)
    if args.standard_webhooks:
        write_standard_webhooks(args, rng)
        return
    with open(args.out, "w", encoding="utf-8") as out:
        for n in range(args.count):
            body = issue_body(rng, n, args.size, extra)
            digest = hmac.new(args.secret.encode(), body, hashlib.sha256).hexdigest()
            out.write(f"sha256={digest}\t{body.decode()}\n")


def write_standard_webhooks(args, rng: random.Random) -> None:
    key = base64.b64decode(args.secret.removeprefix("whsec_"))
    timestamp = str(int(time.time()))
    # A few hundred distinct bodies, each message signed with its own id.
    bodies = []
    for n in range(min(args.count, 500)):
        payload = json.loads(issue_body(rng, n, args.size))
        bodies.append(json.dumps({"type": "issue." + payload["action"], **payload},
                                 separators=(",", ":")))
    with open(args.out, "w", encoding="utf-8") as out:
        for n in range(args.count):
            msg_id, body = f"{args.standard_webhooks}-{n}", bodies[n % len(bodies)]
            signed = f"{msg_id}.{timestamp}.{body}".encode()
            signature = base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()
            out.write(f"{msg_id}\t{timestamp}\tv1,{signature}\t{body}\n")


if __name__ == "__main__":
    main()
