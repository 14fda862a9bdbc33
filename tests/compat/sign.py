#!/usr/bin/env python3
"""Signs a webhook body with a provider's OFFICIAL library and prints the headers as JSON.

hookd's integration tests (tests/it/ingest.rs) post the body with these headers to prove that
what the official libraries produce is accepted. The signing is done entirely by the library:
this script only reads the arguments and prints what the library returned.

    python3 tests/compat/sign.py --scheme standard-webhooks --secret whsec_... --id msg_1 BODY_FILE
    python3 tests/compat/sign.py --scheme stripe --secret whsec_... BODY_FILE

Schemes: `standard-webhooks` (PyPI `standardwebhooks`: `Webhook(secret).sign(msg_id,
timestamp, payload)`) and `stripe` (PyPI `stripe`:
`stripe.WebhookSignature.generate_signature_header(payload, secret)`). The body is read as
bytes and must be UTF-8 (both libraries sign text). Exit status 3 means a library is missing.
"""

import argparse
import json
import sys
from datetime import datetime, timezone

MISSING = 3


def need(module):
    try:
        return __import__(module)
    except ImportError as e:
        print(
            f"cannot import the official library {module!r} ({e}): "
            "pip install -r tests/compat/requirements.txt",
            file=sys.stderr,
        )
        sys.exit(MISSING)


def standard_webhooks(secret, msg_id, payload):
    standardwebhooks = need("standardwebhooks")
    now = datetime.now(tz=timezone.utc)
    signature = standardwebhooks.Webhook(secret).sign(msg_id, now, payload)
    return {
        "webhook-id": msg_id,
        "webhook-timestamp": str(int(now.timestamp())),
        "webhook-signature": signature,
    }


def stripe_signature(secret, payload):
    stripe = need("stripe")
    header = stripe.WebhookSignature.generate_signature_header(payload, secret)
    return {"Stripe-Signature": header}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scheme", required=True, choices=["standard-webhooks", "stripe"])
    parser.add_argument("--secret", required=True)
    parser.add_argument("--id", help="the webhook-id (standard-webhooks)")
    parser.add_argument("body", help="file holding the exact body to sign")
    args = parser.parse_args()

    with open(args.body, "rb") as f:
        payload = f.read().decode("utf-8")
    if args.scheme == "standard-webhooks":
        if not args.id:
            parser.error("--id is required for standard-webhooks")
        headers = standard_webhooks(args.secret, args.id, payload)
    else:
        headers = stripe_signature(args.secret, payload)
    json.dump(headers, sys.stdout)
    print()


if __name__ == "__main__":
    main()
