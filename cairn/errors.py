"""Errors raised by the ``cairn`` package (CLI, Core API, local cluster)."""

from __future__ import annotations


class CairnError(Exception):
    """Root of every error the ``cairn`` package raises on purpose."""

    exit_code = 1


class UsageError(CairnError):
    """The user asked for something malformed (bad flag, bad file)."""

    exit_code = 2
