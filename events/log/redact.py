"""Hiding the password of a connection URL before it reaches a log, an error or a user's screen."""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

MASK = "***"


def redact_url(url: str) -> str:
    """``url`` with the password of its user part replaced by ``***``.

    ``postgresql://postgres:s3cret@127.0.0.1:5432/cairn`` becomes
    ``postgresql://postgres:***@127.0.0.1:5432/cairn``; a URL without a password (or one that
    does not parse) comes back unchanged. For NATS a lone user part is a token
    (``nats://TOKEN@host``) and is masked too. A NATS cluster's URL (servers separated by commas,
    each with its scheme) has each server's part masked.
    """
    servers = url.split(",")
    if len(servers) > 1 and all("://" in server for server in servers):
        return ",".join(redact_url(server) for server in servers)
    try:
        parts = urlsplit(url)
    except ValueError:
        return url
    if "@" not in parts.netloc:
        return url
    userinfo, _, hostinfo = parts.netloc.rpartition("@")
    user, sep, _password = userinfo.partition(":")
    if sep:
        shown = f"{user}:{MASK}"
    elif parts.scheme.startswith(("nats", "tls", "ws")):
        shown = MASK
    else:
        return url
    return urlunsplit(parts._replace(netloc=f"{shown}@{hostinfo}"))
