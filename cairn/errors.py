"""Errors raised by the ``cairn`` package (CLI, Core API, local cluster).

Each error carries the CLI exit code it maps to (``docs/tracking.md``, "CLI"): 1 the operation
failed, 2 usage error, 3 authentication required or failed, 4 not found, 5 not allowed,
6 master unreachable.
"""

from __future__ import annotations

EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_AUTH = 3
EXIT_NOT_FOUND = 4
EXIT_NOT_ALLOWED = 5
EXIT_UNREACHABLE = 6


class CairnError(Exception):
    """Root of every error the ``cairn`` package raises on purpose."""

    exit_code = EXIT_FAILED


class UsageError(CairnError):
    """The user asked for something malformed (bad flag, bad file)."""

    exit_code = EXIT_USAGE


class AuthRequiredError(CairnError):
    """The master wants credentials the CLI does not have (or they were refused)."""

    exit_code = EXIT_AUTH


class UnreachableError(CairnError):
    """The master did not answer (connection refused, DNS failure, timeout)."""

    exit_code = EXIT_UNREACHABLE


def exit_code_for_status(status: int) -> int:
    """The CLI exit code for an HTTP error status: 401→3, 404→4, 403/409→5, otherwise 1."""
    if status == 401:
        return EXIT_AUTH
    if status == 404:
        return EXIT_NOT_FOUND
    if status in (403, 409):
        return EXIT_NOT_ALLOWED
    return EXIT_FAILED
