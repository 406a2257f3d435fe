#!/usr/bin/env python3
"""Check one lock-sensors webhook the way a receiver should, with Python's standard library
only: docs/receiving-webhooks.md explains it, and e2e/receivers_test.go runs it against real
deliveries.

    python3 verify.py SECRET WEBHOOK_ID WEBHOOK_TIMESTAMP WEBHOOK_SIGNATURE < body

exits 0 and prints the event's type and id when the signature is good, 1 otherwise.
"""
import base64
import binascii
import hashlib
import hmac
import json
import sys
import time

# How far a webhook-timestamp may be from now: older deliveries are refused, so that a
# captured request cannot be replayed later.
TOLERANCE_SECONDS = 5 * 60


class VerificationError(Exception):
    pass


def verify(secret, headers, body, now=None):
    """Return the event if body (bytes, exactly as received), with headers (a mapping with the
    lower-case keys webhook-id, webhook-timestamp and webhook-signature), was signed with
    secret (the client's signing_secret, whsec_<base64>) within TOLERANCE_SECONDS of now.
    During a secret rotation the header holds two signatures; one matching is enough."""
    if not secret.startswith("whsec_"):
        raise VerificationError("secret is not whsec_<base64>")
    try:
        key = base64.b64decode(secret[len("whsec_"):], validate=True)
    except binascii.Error as e:
        raise VerificationError("secret is not whsec_<base64>") from e
    msg_id = headers.get("webhook-id", "")
    timestamp = headers.get("webhook-timestamp", "")
    if not timestamp.isdigit():
        raise VerificationError("webhook-timestamp is not unix seconds")
    now = time.time() if now is None else now
    if abs(now - int(timestamp)) > TOLERANCE_SECONDS:
        raise VerificationError("webhook-timestamp is too far from now")
    expected = hmac.new(key, f"{msg_id}.{timestamp}.".encode() + body, hashlib.sha256).digest()
    for signature in headers.get("webhook-signature", "").split():
        version, _, b64 = signature.partition(",")
        if version != "v1":
            continue
        try:
            got = base64.b64decode(b64, validate=True)
        except binascii.Error:
            continue
        if hmac.compare_digest(got, expected):
            return json.loads(body)
    raise VerificationError("no valid signature")


def main():
    if len(sys.argv) != 5:
        print("usage: verify.py SECRET WEBHOOK_ID WEBHOOK_TIMESTAMP WEBHOOK_SIGNATURE < body", file=sys.stderr)
        return 2
    headers = {"webhook-id": sys.argv[2], "webhook-timestamp": sys.argv[3], "webhook-signature": sys.argv[4]}
    try:
        event = verify(sys.argv[1], headers, sys.stdin.buffer.read())
    except (VerificationError, ValueError) as e:
        print("rejected:", e, file=sys.stderr)
        return 1
    print("verified", event["type"], event["id"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
