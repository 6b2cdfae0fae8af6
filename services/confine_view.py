"""The first program of a confined command line: builds user code's view of the filesystem, then
execs the rest of the command line in place (the pid stays the same).

Run by :func:`services.confine.confined_argv` as ``python -I -S confine_view.py PLAN -- ARGV...``
in a fresh mount namespace (``unshare --mount``), so it imports nothing beyond the standard
library and reads nothing from the environment. ``PLAN`` is JSON:

- ``covers``: paths hidden behind an empty tmpfs (a directory) or ``/dev/null`` (a file);
- ``exposes``: directories that stay reachable at their own path when a cover hides an ancestor
  (the original directory is bind-mounted back into the cover);
- ``proc``: mount a fresh ``/proc`` on which other users' processes are invisible
  (``hidepid=invisible``);
- ``umask``: the umask user code starts with;
- ``nest``: ``[uid, gid]`` to become in a nested user namespace before the exec (the degraded
  mode without root: the mounts made here then belong to a more privileged namespace, so the
  user code cannot unmount them to look behind a cover).

Every original directory is opened (``O_PATH``) before any cover is mounted and bound from its
descriptor, so a cover over an ancestor never hides what must stay reachable. The working
directory is re-entered by path at the end: a working directory inherited from before the
covers would lead, through ``..``, to what they hide.
"""

from __future__ import annotations

import ctypes
import json
import os
import sys
from typing import Any

MS_NOSUID = 0x2
MS_NODEV = 0x4
MS_NOEXEC = 0x8
MS_BIND = 0x1000
MS_REC = 0x4000
CLONE_NEWUSER = 0x10000000
COVER_OPTIONS = "mode=0755,size=64k"

_libc = ctypes.CDLL(None, use_errno=True)


class ViewError(Exception):
    """The view cannot be built (the message names the path)."""


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str) -> None:
    result = _libc.mount(
        source.encode() if source is not None else None,
        target.encode(),
        fstype.encode() if fstype is not None else None,
        ctypes.c_ulong(flags),
        data.encode() if data else None,
    )
    if result != 0:
        errno = ctypes.get_errno()
        raise ViewError(f"mount {fstype or 'bind'} on {target}: {os.strerror(errno)}")


def _depth(path: str) -> int:
    return 0 if path == "/" else path.rstrip("/").count("/")


def _inside(path: str, ancestor: str) -> bool:
    return path == ancestor or path.startswith(ancestor.rstrip("/") + "/")


def build(plan: dict[str, Any]) -> None:
    """Mounts the covers and re-exposes what lies under them, in order of depth.

    A cover inside another cover is already hidden and is skipped, unless an exposed directory
    in between brought it back; an exposed directory that no cover hides is visible already.

    Raises:
        ViewError: a mount failed.
    """
    covers = [str(p) for p in plan.get("covers") or []]
    exposes = [str(p) for p in plan.get("exposes") or []]
    handles = {}
    for path in exposes:
        try:
            handles[path] = os.open(path, os.O_PATH | os.O_CLOEXEC | os.O_DIRECTORY)
        except OSError:
            continue  # nothing to keep reachable
    steps = sorted(
        [(p, "cover") for p in covers] + [(p, "expose") for p in handles],
        key=lambda step: (_depth(step[0]), step[1]),
    )
    done: list[tuple[str, str]] = []
    for path, kind in steps:
        enclosing = [d for d in done if _inside(path, d[0]) and d[0] != path]
        hidden = bool(enclosing) and max(enclosing, key=lambda d: _depth(d[0]))[1] == "cover"
        if kind == "cover":
            if hidden or not os.path.lexists(path):
                continue
            if os.path.isdir(path) and not os.path.islink(path):
                _mount("tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV, COVER_OPTIONS)
            else:
                _mount("/dev/null", path, None, MS_BIND, "")
        else:
            if not hidden:
                continue
            os.makedirs(path, mode=0o755, exist_ok=True)
            _mount(f"/proc/self/fd/{handles[path]}", path, None, MS_BIND | MS_REC, "")
        done.append((path, kind))
    for handle in handles.values():
        os.close(handle)
    if plan.get("proc"):
        _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, "hidepid=invisible")


def nest(uid: int, gid: int) -> None:
    """Enters a new user namespace as ``uid``/``gid`` (mapped to this namespace's root).

    Raises:
        ViewError: the kernel refused.
    """
    if _libc.unshare(ctypes.c_int(CLONE_NEWUSER)) != 0:
        raise ViewError(f"unshare(CLONE_NEWUSER): {os.strerror(ctypes.get_errno())}")
    for name, text in (
        ("setgroups", "deny"),
        ("uid_map", f"{uid} 0 1"),
        ("gid_map", f"{gid} 0 1"),
    ):
        with open(f"/proc/self/{name}", "w") as fh:
            fh.write(text)


def main(argv: list[str]) -> int:
    """``PLAN -- ARGV...``: builds the view, then execs ``ARGV`` (returns only on failure)."""
    if len(argv) < 3 or argv[1] != "--":
        print("usage: confine_view.py PLAN -- ARGV...", file=sys.stderr)
        return 126
    plan = json.loads(argv[0])
    command = argv[2:]
    try:
        cwd = os.getcwd()
        build(plan)
        if plan.get("nest"):
            uid, gid = plan["nest"]
            nest(int(uid), int(gid))
        os.chdir(cwd)
    except (ViewError, OSError) as exc:
        print(f"cairn: cannot confine user code: {exc}", file=sys.stderr)
        return 126
    os.umask(int(plan.get("umask", 0o077)))
    try:
        os.execvp(command[0], command)
    except OSError as exc:
        print(f"cairn: cannot run {command[0]}: {exc}", file=sys.stderr)
        return 127
    return 127  # pragma: no cover - execvp does not return


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
