"""Webhook signing: every delivery carries an HMAC-SHA256 of ``"<timestamp>,<body>"``.

Each webhook has its own signing key, derived from the cluster's webhook secret (kept in the
tracker's ``webhook_secrets`` table, created with the schema, readable by the tracker and the
gateway only): ``hex(HMAC-SHA256(secret, "cairn webhook key v1:<webhook_id>"))``. Whoever may
edit a webhook may read its key (``GET /api/v1/webhooks/{id}/signing-key``); a receiver
verifies ``hex(HMAC-SHA256(key, "<timestamp>,<body>"))`` against the signature header and
rejects old timestamps. The headers come in cairn's names and in Determined's, so receivers
written for Determined work unchanged.
"""

from __future__ import annotations

import hashlib
import hmac

SIGNATURE = "X-Cairn-Signature"
TIMESTAMP = "X-Cairn-Signature-Timestamp"
DELIVERY = "X-Cairn-Delivery"
DETERMINED_SIGNATURE = "X-Determined-AI-Signature"
DETERMINED_TIMESTAMP = "X-Determined-AI-Signature-Timestamp"
CONTENT_TYPE = "application/json; charset=UTF-8"
USER_AGENT = "cairn-webhooks/1"
_LABEL = "cairn webhook key v1:"


def webhook_key(secret: bytes, webhook_id: int) -> str:
    """Webhook ``webhook_id``'s signing key (64 hex digits) under the cluster's webhook secret."""
    return hmac.new(secret, f"{_LABEL}{webhook_id}".encode(), hashlib.sha256).hexdigest()


def signature(key: str, timestamp: int, body: bytes) -> str:
    """``hex(HMAC-SHA256(key, "<timestamp>,<body>"))``."""
    return hmac.new(key.encode(), f"{timestamp},".encode() + body, hashlib.sha256).hexdigest()


def headers(key: str, timestamp: int, body: bytes, delivery_id: str) -> dict[str, str]:
    """The headers of one attempt: content type, delivery id, timestamp and signature."""
    mac = signature(key, timestamp, body)
    return {
        "Content-Type": CONTENT_TYPE,
        "User-Agent": USER_AGENT,
        DELIVERY: delivery_id,
        TIMESTAMP: str(timestamp),
        SIGNATURE: mac,
        DETERMINED_TIMESTAMP: str(timestamp),
        DETERMINED_SIGNATURE: mac,
    }


def verify(key: str, timestamp: str, body: bytes, given: str) -> bool:
    """Whether ``given`` is the signature of ``body`` at ``timestamp`` (what a receiver does)."""
    if not timestamp.isdigit() or len(timestamp) > 12:
        return False
    return hmac.compare_digest(signature(key, int(timestamp), body), given)
