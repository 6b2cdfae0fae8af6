"""Running user code as someone else: an unprivileged identity and the command line that confines
a program to it.

Invariant: user code (a trial, a custom searcher) never runs as the services' uid when they run
as root. :func:`confined_argv` prefixes a command so that it starts under :class:`Identity`
(``setpriv``: real and effective uid and gid, no supplementary groups, no new privileges) and,
without ``network``, in a network namespace of its own that holds only a loopback device
(``unshare --net``). The prefix programs exec the command, so its pid is theirs.
"""

from __future__ import annotations

import os
import pwd
from collections.abc import Sequence
from dataclasses import dataclass

UNPRIVILEGED_USERS = ("nobody",)
"""Accounts, first found first, whose uid and gid user code runs as when cairn runs as root."""


@dataclass(frozen=True)
class Identity:
    """A unix uid and gid that user code runs as."""

    uid: int
    gid: int


def default_identity() -> Identity | None:
    """The unprivileged identity of user code: ``nobody`` when this process is root, else
    ``None`` (an unprivileged process cannot change its uid; user code then runs as it).
    """
    if os.geteuid() != 0:
        return None
    for name in UNPRIVILEGED_USERS:
        try:
            entry = pwd.getpwnam(name)
        except KeyError:
            continue
        if entry.pw_uid != 0 and entry.pw_gid != 0:
            return Identity(entry.pw_uid, entry.pw_gid)
    return None


def confined_argv(
    argv: Sequence[str], *, identity: Identity | None, network: bool = True
) -> list[str]:
    """``argv`` prefixed to run as ``identity`` (unchanged when ``None``) and, unless ``network``,
    without a network.

    Example:
        >>> confined_argv(["python3", "x.py"], identity=Identity(65534, 65534), network=False)[:3]
        ['unshare', '--net', '--']
    """
    out = list(argv)
    if identity is not None:
        out = [
            "setpriv",
            f"--reuid={identity.uid}",
            f"--regid={identity.gid}",
            "--clear-groups",
            "--no-new-privs",
            "--",
            *out,
        ]
    if not network:
        namespaces = ["--net"] if os.geteuid() == 0 else ["--user", "--net"]
        out = ["unshare", *namespaces, "--", *out]
    return out
