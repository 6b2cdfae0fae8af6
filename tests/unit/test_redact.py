"""Passwords in connection URLs are masked before anyone sees them."""

from __future__ import annotations

import pytest

from events.log.redact import redact_url


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        (
            "postgresql://postgres:s3cr-et_@127.0.0.1:5432/cairn",
            "postgresql://postgres:***@127.0.0.1:5432/cairn",
        ),
        ("nats://cairn:pw@127.0.0.1:4222", "nats://cairn:***@127.0.0.1:4222"),
        ("nats://T0KEN@127.0.0.1:4222", "nats://***@127.0.0.1:4222"),
        (
            "postgresql://postgres@127.0.0.1:5432/cairn",
            "postgresql://postgres@127.0.0.1:5432/cairn",
        ),
        ("nats://127.0.0.1:4222", "nats://127.0.0.1:4222"),
        (
            "nats://u:pw@a:4222,nats://T0KEN@b:4222,nats://c:4222?creds=/x.creds",
            "nats://u:***@a:4222,nats://***@b:4222,nats://c:4222?creds=/x.creds",
        ),
        (
            "postgresql://postgres:s3cret@h1:5432,h2:5432/cairn",
            "postgresql://postgres:***@h1:5432,h2:5432/cairn",
        ),
        ("", ""),
    ],
)
def test_redact_url_masks_only_the_secret(url: str, shown: str) -> None:
    """The password (or a NATS token) becomes ``***``; host, port, user and path stay."""
    assert redact_url(url) == shown
