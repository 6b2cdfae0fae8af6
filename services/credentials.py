"""How a service process holds its credentials: read from files, never from its environment
or command line, in a process that no other process of the same uid may inspect.

Whatever a process was started with stays readable in ``/proc/<pid>/environ`` and
``/proc/<pid>/cmdline`` for as long as it runs, so ``cairn up`` gives each service only the
paths of its secret files (mode 0600, in a 0700 directory of its own), in variables that hold
no secret: ``CAIRN_DB_FILE``, ``CAIRN_NATS_FILE``, ``CAIRN_ADMIN_PASSWORD_FILE`` (and
``CAIRN_JOIN_TOKEN_FILE``, ``CAIRN_NATS_AUTHORITY_FILE``; see :mod:`events.log.bus_auth`). The variables holding a secret itself (``CAIRN_DB``,
``CAIRN_NATS``, ...) are still read when no file is named, for services started by hand.

Every service (and the supervisor of ``cairn up``) calls :func:`make_undumpable` before it reads
a secret: its ``/proc/<pid>`` files (``environ``, ``mem``, ``fd``) then belong to root, and a
process of the same uid can neither read them nor attach to it with ptrace.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from collections.abc import Callable
from pathlib import Path
from typing import cast

from events import settings

FILE_SUFFIX = "_FILE"
"""``CAIRN_DB_FILE`` names the file that holds what ``CAIRN_DB`` would."""

SECRET_VARIABLES: tuple[str, ...] = tuple(
    s.name
    for s in (
        settings.DB,
        settings.NATS,
        settings.AGENT_TOKEN,
        settings.ADMIN_PASSWORD,
        settings.PASSWORD,
    )
)
"""Variables whose value is a secret: a launcher never passes them to a service it starts."""

_PR_SET_DUMPABLE = 4
_PR_GET_DUMPABLE = 3


class CredentialsError(Exception):
    """A secret file that was named cannot be read, or this process cannot protect itself."""


def secret(name: str, path: str | Path | None = None) -> str | None:
    """The secret ``name`` (e.g. ``CAIRN_DB``) as this process was given it.

    Args:
        name: the variable that would hold the secret itself.
        path: a file holding it (a flag's value); wins over the environment.

    Returns:
        The stripped contents of ``path``, else of the file ``$<name>_FILE`` names, else
        ``$<name>``; ``None`` when none is given.

    Raises:
        CredentialsError: a named file cannot be read or is empty.
        KeyError: ``name`` or its ``_FILE`` form is not declared in :mod:`events.settings`.
    """
    path = path or settings.by_name(name + FILE_SUFFIX).get()
    if path is None:
        return settings.by_name(name).get() or None
    try:
        value = Path(path).read_text().strip()
    except OSError as exc:
        raise CredentialsError(f"cannot read {name} from {path}: {exc.strerror}") from exc
    if not value:
        raise CredentialsError(f"{path} (for {name}) is empty")
    return value


def without_secrets(env: dict[str, str]) -> dict[str, str]:
    """``env`` less every variable of :data:`SECRET_VARIABLES` (their ``_FILE`` forms stay)."""
    return {k: v for k, v in env.items() if k not in SECRET_VARIABLES}


def _prctl() -> Callable[[int, int, int, int, int], int]:
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    prctl = libc.prctl
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    prctl.restype = ctypes.c_int
    return cast(Callable[[int, int, int, int, int], int], prctl)


def make_undumpable() -> None:
    """Clears this process's dumpable flag (``prctl(PR_SET_DUMPABLE, 0)``).

    Its ``/proc/<pid>`` files then belong to root, no process without ``CAP_SYS_PTRACE`` may
    read its memory, environment or descriptors or attach to it, and it leaves no core dump.
    Children it forks inherit the flag until they exec another program.

    Raises:
        CredentialsError: the kernel refused (only on a system without ``prctl``).
    """
    prctl = _prctl()
    if prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise CredentialsError(f"prctl(PR_SET_DUMPABLE, 0) failed: {os.strerror(err)}")


def dumpable() -> bool:
    """Whether this process may be inspected by others of its uid (its dumpable flag)."""
    return bool(_prctl()(_PR_GET_DUMPABLE, 0, 0, 0, 0))
