"""Files only their owner may read (mode 0600): generated secrets and files that quote them."""

from __future__ import annotations

import contextlib
import os
import re
import secrets
from pathlib import Path

PRIVATE_MODE = 0o600

# What a generated secret is made of (``secrets.token_urlsafe``). A secret read back from a file
# must match it too: it goes verbatim into URLs, SQL literals and config files.
_SECRET_CHARS = re.compile(r"[A-Za-z0-9_.~-]+")


class SecretFileError(ValueError):
    """A secret file holds something that cannot be used as a secret."""


def write_private(path: Path, text: str) -> None:
    """Writes ``text`` to ``path`` atomically (temporary file, fsync, rename) with mode 0600.

    The file never exists with a wider mode, not even for a moment, whatever the umask.
    """
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, PRIVATE_MODE)
        with os.fdopen(fd, "w") as fh:
            os.fchmod(fh.fileno(), PRIVATE_MODE)
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


def read_or_create_secret(path: Path, nbytes: int = 32) -> str:
    """The secret kept in ``path``; a random one (``secrets``) is created there on first use.

    The file is mode 0600; one found with a wider mode is narrowed back to 0600.

    Raises:
        SecretFileError: the file holds characters other than letters, digits, ``_.~-``.
    """
    try:
        secret = path.read_text().strip()
    except FileNotFoundError:
        secret = ""
    if not secret:
        secret = secrets.token_urlsafe(nbytes)
        write_private(path, secret + "\n")
        return secret
    if not _SECRET_CHARS.fullmatch(secret):
        raise SecretFileError(
            f"{path} must hold one secret made of letters, digits and _.~- only; "
            "delete it to have a new one generated"
        )
    if path.stat().st_mode & 0o777 != PRIVATE_MODE:
        path.chmod(PRIVATE_MODE)
    return secret
