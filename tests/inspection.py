"""What the kernel shows other processes about a process: its ``/proc`` files and their owner."""

from __future__ import annotations

import grp
import os

import psutil

NOGROUP = "nogroup"


def telling_identity() -> list[str]:
    """A command prefix under which a process's dumpability shows in who owns its ``/proc``
    files (see :func:`undumpable`): none for an ordinary user; for root, the group ``nogroup``
    (root's rights are unchanged, only the group its files and processes carry)."""
    if os.geteuid() != 0 or os.getegid() != 0:
        return []
    try:
        gid = grp.getgrnam(NOGROUP).gr_gid
    except KeyError:
        gid = 65534
    return ["setpriv", f"--regid={gid}", "--clear-groups", "--"]


def undumpable(pid: int) -> bool:
    """Whether the kernel treats ``pid`` as undumpable.

    Its ``/proc/<pid>`` files (``environ``, ``mem``, ``fd``...) then belong to root:root rather
    than to its effective uid and gid, and a process of the same uid may neither read them nor
    attach to it. Telling the two apart needs a process that is not itself root:root (see
    :func:`telling_identity`).
    """
    proc = psutil.Process(pid)
    identity = (proc.uids().effective, proc.gids().effective)
    assert identity != (0, 0), f"pid {pid} runs as root:root: its /proc files cannot tell"
    owner = os.stat(f"/proc/{pid}/environ")
    return (owner.st_uid, owner.st_gid) == (0, 0)


def environment_and_command(pid: int) -> str:
    """``pid``'s environment (as far as this process may read it) and command line, as text."""
    proc = psutil.Process(pid)
    try:
        environ = "\n".join(f"{k}={v}" for k, v in proc.environ().items())
    except psutil.AccessDenied:
        environ = ""  # nobody of its uid may read it either
    return environ + "\n" + "\n".join(proc.cmdline())
