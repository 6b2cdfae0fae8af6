"""The CLI's side of :mod:`cairn.auth`: a client for the parsed ``-m/--master`` and
``-u/--user``."""

from __future__ import annotations

import argparse

from cairn.auth import forget, resolve_master, session, store, stored
from cairn.client import Client

__all__ = ["connect", "forget", "resolve_master", "store", "stored"]


def connect(args: argparse.Namespace) -> Client:
    """A client for ``args.master`` as ``args.as_user`` (the global ``-u``; see
    :func:`cairn.auth.session`).

    Raises:
        AuthRequiredError: no usable credentials (exit 3).
    """
    return session(getattr(args, "master", None), getattr(args, "as_user", None))
